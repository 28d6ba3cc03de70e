"""Config validation: every field checked before anything is built or compiled.

Each problem raises `ConfigError` naming the field, the bad value and what is allowed; the binary turns
it into one message and exit status 2. `validate_config` runs every section's declared rules (config/schema.py
collects the sections from the modules that declare them), then the rules that span sections, below.
"""
from __future__ import annotations

import math
import numbers
from typing import Collection

import ml_collections

from fedjax_flat.algorithms import features
from fedjax_flat.config import data_fields
from fedjax_flat.config import schema
from fedjax_flat.config import source_pretrain
from fedjax_flat.data import attacks
from fedjax_flat.data import registry as data_registry
from fedjax_flat.errors import ConfigError
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.cnn import MAN_MEASURES
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT_RULES, number

AUGMENTS, NORMALIZE = schema.AUGMENTS, schema.NORMALIZE

# Numeric fields where infinity is a meaningful value (anything else must be finite; NaN never is).
INFINITY_MEANS = {'data.alpha': 'IID clients'}


def _check_finite(node, prefix='') -> None:
  """NaN and +-inf anywhere in the config (command-line 'nan', 'inf', '1e400') are refused before anything runs."""
  items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, (list, tuple)) else ()
  for k, v in items:
    path = f'{prefix}.{k}' if isinstance(k, str) else f'{prefix}[{k}]'
    path = path.lstrip('.')
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)) and not math.isfinite(v):
      if math.isnan(v) or path not in INFINITY_MEANS:
        allowed = ', '.join(f'{p} (inf = {m})' for p, m in INFINITY_MEANS.items())
        raise ConfigError(path, v, f'must be a finite number; only {allowed} may be infinite')
    elif isinstance(v, (dict, list, tuple)):
      _check_finite(v, path)


def validate_config(cfg, pending_files: Collection[str] = ()) -> None:
  """Static checks (no data loaded). `validate_against_data` checks the population-dependent fields.
  pending_files: paths an earlier stage of a sweep will write (sweeps/sweep.py): not required to exist yet."""
  _check_finite(cfg.to_dict())
  for section in schema.SCHEMA:          # every section's own rules and cross-field checks
    section.validate(cfg)
  schema.check_init_files(cfg, pending_files)
  # the rules that span sections
  _validate_data(cfg)                    # dataset x data x augment x normalize
  # the algorithm's declared rules: hyperparameter names and values, client optimizer, its own cross-field
  # rules (algorithms/registry.py)
  algorithm = schema.declared(cfg)
  algorithm.spec.validate(cfg)
  # the features the config turns on (algorithms/features.py): the algorithm's declared upload against the one each
  # acts on, then each feature's rules across sections (dp x server weighting, upload x dp, swa x rounds, ...)
  features.check(cfg, algorithm.upload)
  _refuse_floyd_where_unused(cfg, algorithm.needs)   # sampler x algorithm
  _validate_man_measure(cfg)             # model x model_kwargs.man_measure, before the model is built
  if 'bn' in cfg:
    _validate_bn(cfg, algorithm.needs)   # bn x model x algorithm
  if 'grouping' in cfg:
    _validate_grouping_task(cfg)         # grouping x dataset
  if 'source_pretrain' in cfg:           # the server's source pre-training (training/source_pretrain.py)
    _validate_source_pretrain(cfg)


def _refuse_floyd_where_unused(cfg, needs) -> None:
  """sampler='floyd' changes the uniform draw only: an algorithm that samples otherwise (H-FL's groups) would
  ignore it, so it is refused rather than recorded as used."""
  if cfg.get('sampler', 'auto') in ('sort', 'auto'):      # 'auto' means the group draw for these
    return
  if 'client_groups' in needs:
    raise ConfigError('sampler', cfg.sampler, f"{cfg.algorithm!r} samples a fixed number per client group "
                      "(stratified); the sampler applies to uniform sampling: use the default sampler='auto' or 'sort'")


def _validate_data(cfg) -> None:
  # every data.* field, before any data are loaded: the segmentation datasets' declared fields first (their
  # own rules and messages), then the generic rules of every builder argument
  _validate_segmentation_data(cfg)
  data_fields.validate(cfg)
  if 'shuffle' in cfg.data and not isinstance(cfg.data.shuffle, bool):
    raise ConfigError('data.shuffle', cfg.data.shuffle, 'must be True or False')
  if cfg.augment.startswith('cifar') and cfg.normalize == 'none':
    raise ConfigError('normalize', cfg.normalize, f'augment={cfg.augment!r} needs the dataset statistics: '
                      "'cifar10' or 'cifar100'")


def per_position_task(cfg) -> str:
  """The task of config.dataset when it labels every position (next_token, segmentation), else ''."""
  task = data_registry.task_name(cfg.dataset, cfg.data)
  return task if task in ('next_token', 'segmentation') else ''


def _validate_grouping_task(cfg) -> None:
  """config.grouping's estimator against the dataset's task (grouping/superclients.check_task, before loading)."""
  g = cfg.grouping
  task = per_position_task(cfg)
  if task and g.method != 'random' and g.estimator in ('conf', 't2v'):
    raise ConfigError('grouping.estimator', g.estimator, f"needs one label per example; dataset {cfg.dataset!r} has "
                      f"the per-position task {task!r}: use 'clf' or grouping.method='random'")


def _validate_bn(cfg, needs) -> None:
  policy = cfg.bn.test_policy
  if not model_registry.uses_batch_stats(cfg.model, cfg.model_kwargs.to_dict()):
    return
  if 'batch_stats' not in needs:
    raise ConfigError('algorithm', cfg.algorithm,
                      f'with a BatchNorm model (model={cfg.model}, model_kwargs.norm=bn) the running statistics '
                      'are averaged through the FedAvg pseudo-gradient: allowed '
                      f'{schema.algorithms_with_need("batch_stats")} '
                      '(any client / server optimizer, SWA, WiMA); use model_kwargs.norm=gn for the others')
  if policy == 'running' and 'local_batch_stats' in needs:
    raise ConfigError('bn.test_policy', policy,
                      f'{cfg.algorithm} keeps the statistics on the clients, the server never holds any: use '
                      "'batch' (FedDrive) or 'client'")


def _validate_man_measure(cfg) -> None:
  m = cfg.model_kwargs.get('man_measure') if 'model_kwargs' in cfg else None
  if m is None:
    return
  if cfg.model != 'man_convnet':
    raise ConfigError('model_kwargs.man_measure', m, f"is man_convnet's (MAN's ConvNet), not model={cfg.model!r}'s: "
                      'remove it')
  if m not in MAN_MEASURES:
    raise ConfigError('model_kwargs.man_measure', m, f"must be one of {', '.join(MAN_MEASURES)} ('paper': Eq. 17, "
                      "block 3 before its pool; 'release': after it)")


def validate_against_data(cfg, data) -> None:
  algorithm = schema.declared(cfg)
  chains = 'chains' in algorithm.needs
  if cfg.clients_per_round > data.num_clients and not chains:   # chains sample by algo.fraction
    raise ConfigError('clients_per_round', cfg.clients_per_round,
                      f'must be <= the population of {data.num_clients} clients of dataset {cfg.dataset!r}')
  readout = cfg.model_kwargs.get('readout')          # sequence models (models/rnn.py): one output per label
  if readout is not None:
    want = 'last' if tuple(getattr(data, 'label_shape', ())) == () else 'sequence'
    if readout != want:
      raise ConfigError('model_kwargs.readout', readout,
                        f'the labels of {cfg.dataset!r} have shape {tuple(getattr(data, "label_shape", ()))}: '
                        f'use {want!r}')
  if cfg.get('attack') is not None and cfg.attack.kind != 'none':
    bad = attacks.check_data(cfg.attack, data)       # label_flip's classes, backdoor's target and trigger
    if bad:
      raise ConfigError(*bad)
  sizes = data.client_sizes()
  if (sizes == 0).all():
    raise ConfigError('data', dict(cfg.data), 'every client has 0 examples')
  # the features against the population (dp: delta < 1 / N, the reachable target epsilon)
  features.check(cfg, algorithm.upload, data.num_clients)
  # the algorithm's own data rules (its population N, FedSoup's validation split) and its warnings
  # (algorithms/registry.py)
  algorithm.spec.validate_data(cfg, data)


def _validate_source_pretrain(cfg) -> None:
  """config.source_pretrain: its scalar fields (config/source_pretrain.py), then its source's data section against
  the source dataset's declared fields (the same rules as config.data), errors named source_pretrain.data.<k>."""
  source_pretrain.validate(cfg)
  s = cfg.source_pretrain
  if not s.dataset:
    if len(s.data):
      raise ConfigError('source_pretrain.data', s.data.to_dict(), "must be empty when source_pretrain.dataset='' "
                        '(the target dataset carries its source)')
    return
  if s.dataset not in data_registry.declaring_datasets():
    raise ConfigError('source_pretrain.dataset', s.dataset, 'must be a segmentation dataset declaring its fields: '
                      f'{data_registry.declaring_datasets()}')
  view = ml_collections.ConfigDict({'dataset': s.dataset, 'data': s.data.to_dict(), 'augment': 'segmentation'})
  try:
    _validate_segmentation_data(view)
  except ConfigError as e:
    raise ConfigError(f'source_pretrain.{e.field}', e.value, e.allowed) from None


def _validate_segmentation_data(cfg) -> None:
  """config.data of the segmentation datasets (declared whole by their modules: data/registry.py `fields`)
  and augment='segmentation'."""
  seg_names = data_registry.declaring_datasets()
  seg = cfg.dataset in seg_names
  if cfg.augment == 'segmentation' and not seg:
    raise ConfigError('augment', cfg.augment, f'is for the segmentation datasets {seg_names}, '
                      f'not dataset={cfg.dataset!r}')
  if not seg:
    return
  if cfg.augment not in ('segmentation', 'none'):
    raise ConfigError('augment', cfg.augment, f"dataset={cfg.dataset!r} has label maps: use 'segmentation' "
                      "(or 'none')")
  declared, d = data_registry.declared_fields(cfg.dataset), cfg.data
  for k in d.keys():
    if k not in declared and not (k in data_registry.OPTIONAL_FIELDS and d[k] is None):
      raise ConfigError(f'data.{k}', d[k], f'not a field of dataset {cfg.dataset!r}; its fields: {sorted(declared)}')
  get = lambda k: d.get(k, declared[k])

  def check(k, rule):
    why = rule.why_not(get(k))
    if why:
      raise ConfigError(f'data.{k}', get(k), why)

  entry = data_registry.DATASETS.entry(cfg.dataset)
  own_check = entry.meta.get('check')
  if 'crop' not in declared:   # declared whole without the image + label-map augmentation (vpr_synthetic)
    if own_check is not None:
      own_check({k: get(k) for k in declared})
    return
  for k, rule in SEG_AUGMENT_RULES.items():   # the augmentation fields (data/transforms/pipeline.py)
    check(k, rule)
  if get('scale')[0] > get('scale')[1]:
    raise ConfigError('data.scale', get('scale'), 'must be (lo, hi) with lo <= hi')
  if get('style') != 'none' and cfg.augment != 'segmentation':
    raise ConfigError('data.style', get('style'), "style transfer runs in augment='segmentation'")
  check('seed', number(0, integer=True))
  for k, rule in entry.meta.get('rules', {}).items():   # the dataset's own fields (its module declares them)
    check(k, rule)
  if own_check is not None:     # what spans the dataset's fields (data/registry.py `check`)
    own_check({k: get(k) for k in declared})
