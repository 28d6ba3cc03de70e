"""Config validation: every field checked before anything is built or compiled.

Each problem raises `ConfigError` naming the field, the bad value and what is allowed; the binary turns
it into one message and exit status 2.
"""
from __future__ import annotations

import math
import numbers
import os

from absl import logging
import ml_collections

from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.algorithms.wrappers import swa as swa_lib
from fedjax_flat.algorithms.local import MAN_CONVENTIONS
from fedjax_flat.config import centralized
from fedjax_flat.config import source_pretrain
from fedjax_flat.config.run_dir import is_run_dir
from fedjax_flat.core.contract import WEIGHTINGS
from fedjax_flat.data import registry as data_registry
from fedjax_flat.errors import ConfigError
from fedjax_flat.core.engine import STRATEGIES
from fedjax_flat.models import registry as model_registry
from fedjax_flat.optimizers.server import SERVER_OPTIMIZERS
from fedjax_flat.config import data_fields
from fedjax_flat.optimizers.server import ADAPTIVE_FORMS
from fedjax_flat.core.client_state import STORE_KINDS
from fedjax_flat.grouping import distances, estimators, groupers
from fedjax_flat.optimizers.schedules import LR_SCHEDULES
from fedjax_flat.tasks.segmentation import OHEM_MODES
from fedjax_flat.models.tiling import EVAL_MODES
from fedjax_flat.models.base import COMPUTE_DTYPES
from fedjax_flat.core import batch_stats
from fedjax_flat.data import attacks
from fedjax_flat.data import validation_steps
from fedjax_flat.data.registry import OPTIONAL_FIELDS


def _get(cfg, path):
  node = cfg
  for p in path.split('.'):
    node = node[p]
  return node


def _num(cfg, path, *, lo=None, hi=None, lo_open=False, hi_open=False, integer=False):
  v = _get(cfg, path)
  if isinstance(v, bool) or not isinstance(v, numbers.Number) or (integer and not isinstance(v, numbers.Integral)):
    raise ConfigError(path, v, f'must be {"an integer" if integer else "a number"}')
  if not math.isfinite(v):
    raise ConfigError(path, v, 'must be a finite number')
  if lo is not None and (v <= lo if lo_open else v < lo):
    raise ConfigError(path, v, f'must be {">" if lo_open else ">="} {lo}')
  if hi is not None and (v >= hi if hi_open else v > hi):
    raise ConfigError(path, v, f'must be {"<" if hi_open else "<="} {hi}')
  return v


def _choice(cfg, path, allowed):
  v = _get(cfg, path)
  if v not in allowed:
    raise ConfigError(path, v, f'allowed values: {sorted(allowed)}')
  return v


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


AUGMENTS = ('none', 'cifar', 'cifar_cutout', 'cifar_mixup', 'landmarks', 'segmentation')
NORMALIZE = ('none', 'cifar10', 'cifar100', 'imagenet', 'feddrive')


def validate_config(cfg) -> None:
  """Static checks (no data loaded). `validate_against_data` checks the population-dependent fields."""

  _check_finite(cfg.to_dict())
  _num(cfg, 'seed', lo=0, integer=True)
  _choice(cfg, 'dataset', data_registry.names())
  _choice(cfg, 'model', model_registry.names())
  _choice(cfg, 'augment', AUGMENTS)
  _choice(cfg, 'normalize', NORMALIZE)
  # every data.* field, before any data are loaded: the segmentation datasets' declared fields first (their
  # own rules and messages), then the generic rules of every builder argument
  _validate_segmentation_data(cfg)
  data_fields.validate(cfg)
  if 'shuffle' in cfg.data and not isinstance(cfg.data.shuffle, bool):
    raise ConfigError('data.shuffle', cfg.data.shuffle, 'must be True or False')
  if cfg.augment.startswith('cifar') and cfg.normalize == 'none':
    raise ConfigError('normalize', cfg.normalize, f'augment={cfg.augment!r} needs the dataset statistics: '
                      "'cifar10' or 'cifar100'")
  algo = _choice(cfg, 'algorithm', alg_registry.names())
  # the algorithm's declared rules: hyperparameter names and values, client optimizer, its own cross-field
  # rules (algorithms/registry.py)
  alg_registry.spec(algo).validate(cfg)
  if cfg.get('attack') is not None:
    _validate_attack(cfg.attack)
  _num(cfg, 'rounds', lo=1, integer=True)
  _num(cfg, 'clients_per_round', lo=1, integer=True)

  _choice(cfg, 'client.optimizer', ('sgd', 'sam', 'asam'))
  _choice(cfg, 'client.base_optimizer', ('sgd', 'adam'))
  if cfg.client.base_optimizer == 'adam':
    _num(cfg, 'client.adam_b1', lo=0, hi=1, hi_open=True)
    _num(cfg, 'client.adam_b2', lo=0, hi=1, hi_open=True)
    _num(cfg, 'client.adam_eps', lo=0, lo_open=True)
    if cfg.client.momentum:
      raise ConfigError('client.momentum', cfg.client.momentum,
                        'must be 0 with client.base_optimizer=adam (Adam\'s first moment is client.adam_b1)')
  _num(cfg, 'client.lr', lo=0, lo_open=True)
  _num(cfg, 'client.momentum', lo=0, hi=1, hi_open=True)
  _num(cfg, 'client.weight_decay', lo=0)
  _num(cfg, 'client.batch_size', lo=1, integer=True)
  _num(cfg, 'client.local_epochs', lo=1, integer=True)
  _num(cfg, 'client.local_steps', lo=0, integer=True)
  _num(cfg, 'client.max_local_steps', lo=0, integer=True)
  if cfg.client.get('full_batches', False) not in (True, False):
    raise ConfigError('client.full_batches', cfg.client.full_batches, 'must be True or False')
  if cfg.client.local_steps and (cfg.client.get('full_batches', False) or cfg.client.get('max_local_steps', 0)):
    raise ConfigError('client.local_steps', cfg.client.local_steps,
                      'is a fixed step count: set it to 0 to use client.full_batches / client.max_local_steps '
                      '(the epochs mode), or unset those')
  _num(cfg, 'client.rho', lo=0)
  _num(cfg, 'client.rho0', lo=0)
  _num(cfg, 'client.rho_warmup_rounds', lo=0, integer=True)
  _num(cfg, 'client.asam_eta', lo=0)
  _num(cfg, 'client.grad_clip', lo=0)
  if 'lr_schedule' in cfg.client:
    _validate_lr_schedule(cfg)
  if 'microbatches' in cfg.client:
    k = _num(cfg, 'client.microbatches', lo=1, integer=True)
    if cfg.client.batch_size % k:
      raise ConfigError('client.microbatches', k, f'must divide client.batch_size={cfg.client.batch_size}')

  _choice(cfg, 'server.optimizer', SERVER_OPTIMIZERS)
  _num(cfg, 'server.lr', lo=0, lo_open=True)
  _num(cfg, 'server.momentum', lo=0, hi=1, hi_open=True)
  _num(cfg, 'server.b1', lo=0, hi=1, hi_open=True)
  _num(cfg, 'server.b2', lo=0, hi=1, hi_open=True)
  _num(cfg, 'server.eps', lo=0, lo_open=True)
  _choice(cfg, 'server.adaptive_form', ADAPTIVE_FORMS)
  if 'weighting' in cfg.server:
    _choice(cfg, 'server.weighting', WEIGHTINGS)

  _num(cfg, 'swa.start_fraction', lo=0, hi=1, hi_open=True)
  _num(cfg, 'swa.cycle', lo=1, integer=True)
  _num(cfg, 'swa.lr1', lo=0, lo_open=True)
  _num(cfg, 'swa.lr2', lo=0, lo_open=True)
  if cfg.swa.enabled and not (cfg.swa.average or cfg.swa.cyclic_lr):
    raise ConfigError('swa.average', cfg.swa.average, 'swa.average and swa.cyclic_lr cannot both be False '
                      'when swa.enabled (disable SWA instead)')
  if cfg.swa.enabled and cfg.swa.average and swa_lib.planned_averages(cfg) == 0:
    s = swa_lib.swa_start_round(cfg)
    logging.warning('swa: rounds=%d is too few for swa.start_fraction=%g and swa.cycle=%d: the first SWA average '
                    'would come in round %d, so the SWA model is never averaged (it stays the model after round '
                    '%d); lower swa.start_fraction or swa.cycle, or raise rounds', cfg.rounds, cfg.swa.start_fraction,
                    cfg.swa.cycle, s + cfg.swa.cycle + 1, s)
  _num(cfg, 'wima.window', lo=1, integer=True)
  _choice(cfg, 'wima.subset', ('all', 'classifier', 'features'))
  if not isinstance(cfg.wima.get('classifier', ''), str):
    raise ConfigError('wima.classifier', cfg.wima.classifier, "must be a string ('' = auto)")
  _num(cfg, 'man.zeta', lo=0)
  if cfg.man.get('convention', 'paper') not in MAN_CONVENTIONS:
    raise ConfigError('man.convention', cfg.man.convention, f'allowed values: {list(MAN_CONVENTIONS)} (paper: zeta '
                      'is Eq. 15\'s coefficient; code: zeta is the release\'s mu_mean, applied as mu_mean / 2)')

  _choice(cfg, 'engine.strategy', ('auto',) + STRATEGIES)
  _num(cfg, 'engine.clients_per_chunk', lo=0, integer=True)
  unroll = cfg.engine.unroll
  if not (unroll is True or (isinstance(unroll, numbers.Integral) and not isinstance(unroll, bool) and unroll >= 1)):
    raise ConfigError('engine.unroll', unroll, 'must be an integer >= 1 or True (full unroll)')
  _choice(cfg, 'engine.step_bucketing', ('exact', 'pow2'))
  shard = cfg.engine.get('shard_clients', 'auto')
  if not (shard == 'auto' or isinstance(shard, bool)):
    raise ConfigError('engine.shard_clients', shard, "allowed values: 'auto', True, False")
  if not isinstance(cfg.engine.get('stream_batches', False), bool):
    raise ConfigError('engine.stream_batches', cfg.engine.stream_batches, 'must be True or False')
  rpc = cfg.engine.get('rounds_per_call', 'auto')
  if not (rpc == 'auto' or (isinstance(rpc, numbers.Integral) and not isinstance(rpc, bool) and rpc >= 1)):
    raise ConfigError('engine.rounds_per_call', rpc, "must be 'auto' or an integer >= 1")
  dd = cfg.engine.get('device_data', 'auto')
  if not (dd == 'auto' or isinstance(dd, bool)):
    raise ConfigError('engine.device_data', dd, "allowed values: 'auto', True, False")
  if 'device_data_max_mb' in cfg.engine:
    _num(cfg, 'engine.device_data_max_mb', lo=0)
  if 'compute_dtype' in cfg.engine:
    _choice(cfg, 'engine.compute_dtype', COMPUTE_DTYPES)

  if cfg.get('init') is not None:           # training/init.py
    _validate_init(cfg.init)
  if cfg.get('corruption_eval') is not None:
    _choice(cfg, 'corruption_eval.name', ('', 'cifar10_c', 'cifar100_c'))
    if cfg.corruption_eval.name and not set(cfg.corruption_eval.severities) <= {1, 2, 3, 4, 5}:
      raise ConfigError('corruption_eval.severities', cfg.corruption_eval.severities, 'a subset of 1..5')
  _num(cfg, 'eval_every', lo=1, integer=True)
  _num(cfg, 'eval_every_last', lo=0, integer=True)
  _num(cfg, 'eval_batch_size', lo=1, integer=True)
  _num(cfg, 'summary_last_k', lo=1, integer=True)
  _num(cfg, 'checkpoint_every', lo=0, integer=True)
  _num(cfg, 'keep_checkpoints', lo=1, integer=True)
  keep_rounds = cfg.get('keep_rounds', ())
  if (not isinstance(keep_rounds, (tuple, list))
      or any(isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 1 <= r <= cfg.rounds
             for r in keep_rounds)):
    raise ConfigError('keep_rounds', keep_rounds, f'must be a tuple of rounds in [1, rounds={cfg.rounds}] '
                      '(e.g. --config.keep_rounds="(100, 500)")')
  _choice(cfg, 'client_state_store', STORE_KINDS)
  _num(cfg, 'client_state_device_max_mb', lo=0)
  if 'centralized' in cfg:                 # the centralized upper bound / rounds-to-X (training/centralized.py)
    centralized.validate(cfg)
  if 'segmentation' in cfg:
    _validate_segmentation(cfg)
  if 'source_pretrain' in cfg:             # the server's source pre-training (training/source_pretrain.py)
    _validate_source_pretrain(cfg)
  if 'fedvc' in cfg:                       # FedVC's virtual clients (data/virtual_clients.py)
    _num(cfg, 'fedvc.virtual_size', lo=0, integer=True)
  if 'retrieval' in cfg:                   # FedVPR's triplet loss and Recall@K (tasks/retrieval.py)
    _num(cfg, 'retrieval.margin', lo=0)
    _num(cfg, 'retrieval.num_negatives', lo=1, integer=True)
    _num(cfg, 'retrieval.threshold', lo=0, lo_open=True)
    if not isinstance(cfg.retrieval.get('cache_pass', True), bool):
      raise ConfigError('retrieval.cache_pass', cfg.retrieval.cache_pass, 'True or False')
  if 'bn' in cfg:
    _validate_bn(cfg, model_registry)
  if 'personalized' in cfg:                # end-of-training personalized evaluation (evaluation/personalized.py)
    _num(cfg, 'personalized.finetune_epochs', lo=0, integer=True)
    _num(cfg, 'personalized.finetune_lr', lo=0)
    _num(cfg, 'personalized.finetune_batch_size', lo=0, integer=True)
    _choice(cfg, 'personalized.auc_scores', ('softmax', 'logits'))
  if 'grouping' in cfg:                    # superclients (fedjax_flat/grouping/)
    validate_grouping(cfg)


def _finite(cfg, path, **kw):
  v = _num(cfg, path, **kw)
  if not math.isfinite(v):
    raise ConfigError(path, v, 'must be a finite number')
  return v


def per_position_task(cfg) -> str:
  """The task of config.dataset when it labels every position (next_token, segmentation), else ''."""
  task = data_registry.task_name(cfg.dataset, cfg.data)
  return task if task in ('next_token', 'segmentation') else ''


def validate_grouping(cfg) -> None:
  """config.grouping (fedjax_flat/grouping/): choices, pairings, ranges, probe files."""
  g = cfg.grouping
  method = _choice(cfg, 'grouping.method', groupers.METHODS)
  est = _choice(cfg, 'grouping.estimator', estimators.ESTIMATORS)
  dist = _choice(cfg, 'grouping.distance', ('auto',) + tuple(distances.DISTANCES))
  if method in ('kmeans', 'icg') and dist not in ('auto', 'euclidean'):
    raise ConfigError('grouping.distance', dist, f'grouping.method={method!r} clusters with the Euclidean '
                      "distance: use 'euclidean' or 'auto' (other distances are for method='greedy')")
  if method != 'random' and dist in distances.PROBABILITY_ONLY and est != 'conf':
    raise ConfigError('grouping.distance', dist, f'is defined on probability vectors: it needs '
                      f"grouping.estimator='conf', not {est!r} (use 'cosine', 'normalized_cosine' or 'euclidean')")
  task = per_position_task(cfg)
  if task and method != 'random' and est in ('conf', 't2v'):   # grouping/superclients.check_task, before loading
    raise ConfigError('grouping.estimator', est, f"needs one label per example; dataset {cfg.dataset!r} has the "
                      f"per-position task {task!r}: use 'clf' or grouping.method='random'")
  _num(cfg, 'grouping.min_examples', lo=1, integer=True)
  _num(cfg, 'grouping.max_clients', lo=0, integer=True)
  _num(cfg, 'grouping.pretrain_epochs', lo=1, integer=True)
  _finite(cfg, 'grouping.pretrain_lr', lo=0)
  _finite(cfg, 'grouping.probe_lr', lo=0, lo_open=True)
  _num(cfg, 'grouping.public_per_class', lo=1, integer=True)
  _finite(cfg, 'grouping.pca_variance', lo=0, hi=1)
  if not isinstance(g.pca_standardize, bool):
    raise ConfigError('grouping.pca_standardize', g.pca_standardize, 'must be True or False')
  _num(cfg, 'grouping.num_clusters', lo=0, integer=True)
  _num(cfg, 'grouping.icg_iterations', lo=1, integer=True)
  _choice(cfg, 'grouping.fisher', estimators.FISHER_MODES)
  _num(cfg, 'grouping.seed', lo=-1, integer=True)
  if g.probe_model:
    _choice(cfg, 'grouping.probe_model', model_registry.names())
  for name in ('probe_model', 'probe_pretrained', 'probe_checkpoint'):
    if not isinstance(g[name], str):
      raise ConfigError(f'grouping.{name}', g[name], 'must be a string (empty = off)')
  if g.probe_pretrained and g.probe_checkpoint:
    raise ConfigError('grouping.probe_checkpoint', g.probe_checkpoint,
                      f'grouping.probe_pretrained={g.probe_pretrained!r} is set too: use one of the two')
  if g.probe_pretrained and not os.path.isfile(g.probe_pretrained):
    raise ConfigError('grouping.probe_pretrained', g.probe_pretrained, 'no such file (a .npz or msgpack params file)')
  if g.probe_checkpoint:
    if not is_run_dir(g.probe_checkpoint):
      raise ConfigError('grouping.probe_checkpoint', g.probe_checkpoint,
                        'must be a fedjax_flat run directory (config.json + checkpoints/)')


def _validate_lr_schedule(cfg) -> None:
  sched = _choice(cfg, 'client.lr_schedule', LR_SCHEDULES)
  _num(cfg, 'client.lr_power', lo=0, lo_open=True)
  _num(cfg, 'client.lr_poly_max', lo=0, integer=True)
  if sched != 'constant' and cfg.client.lr_poly_max < 1:
    raise ConfigError('client.lr_poly_max', cfg.client.lr_poly_max,
                      f'client.lr_schedule={sched} needs T >= 1 ({"local steps" if sched == "poly_step" else "rounds"}'
                      f'; FedDrive: poly_step with 10000 x local epochs x steps per epoch)')


def _validate_segmentation(cfg) -> None:
  _choice(cfg, 'segmentation.ohem', OHEM_MODES)
  _num(cfg, 'segmentation.ohem_fraction', lo=0, lo_open=True, hi=1)
  _num(cfg, 'segmentation.ohem_thresh', lo=0, lo_open=True, hi=1, hi_open=True)
  _num(cfg, 'segmentation.aux_weight', lo=0)
  _choice(cfg, 'segmentation.eval_mode', EVAL_MODES)
  _num(cfg, 'segmentation.eval_scale', lo=0, lo_open=True, hi=1)
  _num(cfg, 'segmentation.eval_overlap', lo=0, hi=1, hi_open=True)
  tile = cfg.segmentation.eval_tile
  if (not isinstance(tile, (tuple, list)) or len(tile) != 2
      or any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in tile)):
    raise ConfigError('segmentation.eval_tile', tile, 'must be (height, width), integers >= 0 ((0, 0) = the '
                      "model's input size)")
  if not isinstance(cfg.segmentation.by_test_client, bool):
    raise ConfigError('segmentation.by_test_client', cfg.segmentation.by_test_client, 'must be True or False')
  _num(cfg, 'segmentation.predictions', lo=0, hi=64, integer=True)


def _validate_bn(cfg, model_registry) -> None:
  policy = _choice(cfg, 'bn.test_policy', batch_stats.TEST_POLICIES)
  _num(cfg, 'bn.test_batch_size', lo=1, integer=True)
  if not model_registry.uses_batch_stats(cfg.model, cfg.model_kwargs.to_dict()):
    return
  needs = alg_registry.needs(cfg.algorithm)
  if 'batch_stats' not in needs:
    raise ConfigError('algorithm', cfg.algorithm,
                      f'with a BatchNorm model (model={cfg.model}, model_kwargs.norm=bn) the running statistics '
                      'are averaged through the FedAvg pseudo-gradient: allowed '
                      f'{alg_registry.with_need("batch_stats")} '
                      '(any client / server optimizer, SWA, WiMA); use model_kwargs.norm=gn for the others')
  if policy == 'running' and 'local_batch_stats' in needs:
    raise ConfigError('bn.test_policy', policy,
                      f'{cfg.algorithm} keeps the statistics on the clients, the server never holds any: use '
                      "'batch' (FedDrive) or 'client'")


def _validate_init(init) -> None:
  ckpt, pre = init.get('checkpoint', ''), init.get('pretrained', '')
  for name, v in (('checkpoint', ckpt), ('pretrained', pre), ('classifier_key', init.get('classifier_key', ''))):
    if not isinstance(v, str):
      raise ConfigError(f'init.{name}', v, 'must be a string (a path; empty = off)')
  if ckpt and pre:
    raise ConfigError('init.pretrained', pre, f'init.checkpoint={ckpt!r} is set too: use one of the two')
  if ckpt:
    if not is_run_dir(ckpt):
      raise ConfigError('init.checkpoint', ckpt, 'must be a fedjax_flat run directory (config.json + checkpoints/)')
  if pre and not os.path.isfile(pre):
    raise ConfigError('init.pretrained', pre, 'no such file (a .npz or msgpack params file)')
  if init.get('model', 'global') not in ('global', 'swa', 'wima'):
    raise ConfigError('init.model', init.get('model'), "allowed values: ['global', 'swa', 'wima']")
  if init.get('reinit_classifier', 'auto') not in ('auto', 'always', 'never'):
    raise ConfigError('init.reinit_classifier', init.get('reinit_classifier'),
                      "allowed values: ['auto', 'always', 'never']")


def _finite_number(v, integer=False) -> bool:
  if isinstance(v, bool) or not isinstance(v, (numbers.Integral if integer else numbers.Number)):
    return False
  return integer or math.isfinite(v)


def _validate_attack(a) -> None:
  if a.kind not in attacks.KINDS:
    raise ConfigError('attack.kind', a.kind, f'allowed values: {list(attacks.KINDS)}')
  if a.kind == 'none':
    return
  for name in ('malicious_superclients', 'attackers'):
    v = a[name]
    if not (_finite_number(v) and 0 < v <= 1):
      raise ConfigError(f'attack.{name}', v, 'must be a fraction in (0, 1]')
  why = attacks.check_classes(a.classes)
  if why:
    raise ConfigError('attack.classes', a.classes, why)
  if a.swap not in attacks.SWAPS:
    raise ConfigError('attack.swap', a.swap, f'allowed values: {list(attacks.SWAPS)}')
  if not isinstance(a.get('clean_workdir', ''), str):
    raise ConfigError('attack.clean_workdir', a.clean_workdir, "must be a string (a run directory; '' = none)")


def validate_against_data(cfg, data) -> None:
  chains = 'chains' in alg_registry.needs(cfg.algorithm)
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
    why = attacks.check_classes(cfg.attack.classes, data.num_classes)
    if why:
      raise ConfigError('attack.classes', cfg.attack.classes, why)
  sizes = data.client_sizes()
  if (sizes == 0).all():
    raise ConfigError('data', dict(cfg.data), 'every client has 0 examples')
  src = validation_steps.round_validation_source(cfg, alg_registry.default_hparams(cfg.algorithm))
  if src:                                  # FedSoup's validation split must exist in the data
    validation_steps.check_validation_data(data, src)
  # the algorithm's own data rules (its population N) and its warnings (algorithms/registry.py)
  alg_registry.spec(cfg.algorithm).validate_data(cfg, data)


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
    if k not in declared and not (k in OPTIONAL_FIELDS and d[k] is None):
      raise ConfigError(f'data.{k}', d[k], f'not a field of dataset {cfg.dataset!r}; its fields: {sorted(declared)}')
  get = lambda k: d.get(k, declared[k])

  def num(k, lo=None, hi=None, lo_open=False, integer=False):
    v = get(k)
    if (isinstance(v, bool) or not isinstance(v, numbers.Number) or not math.isfinite(v)
        or (integer and not isinstance(v, numbers.Integral))):
      raise ConfigError(f'data.{k}', v, f'must be a finite {"integer" if integer else "number"}')
    if lo is not None and (v <= lo if lo_open else v < lo):
      raise ConfigError(f'data.{k}', v, f'must be {">" if lo_open else ">="} {lo}')
    if hi is not None and v > hi:
      raise ConfigError(f'data.{k}', v, f'must be <= {hi}')

  def pair(k, allow_empty, integer, lo_open=True):
    v = get(k)
    ok = isinstance(v, (tuple, list)) and (len(v) == 2 or (allow_empty and len(v) == 0)) and all(
        not isinstance(e, bool) and isinstance(e, numbers.Integral if integer else numbers.Number)
        and math.isfinite(e) and (e > 0 if lo_open else e >= 0) for e in v)
    if not ok:
      what = 'positive integers (h, w)' if integer else 'positive numbers (lo, hi)'
      raise ConfigError(f'data.{k}', v, f'must be two {what}' + (' or () for none' if allow_empty else ''))

  def choice(k, allowed):
    if get(k) not in allowed:
      raise ConfigError(f'data.{k}', get(k), f'allowed values: {sorted(allowed)}')

  def flag(k):
    if not isinstance(get(k), bool):
      raise ConfigError(f'data.{k}', get(k), 'must be True or False')

  if 'crop' not in declared:   # declared whole without the image + label-map augmentation (vpr_synthetic)
    own = data_registry.DATASETS.entry(cfg.dataset).meta.get('check')
    if own is not None:
      own({k: get(k) for k in declared})
    return
  pair('crop', True, True)
  pair('scale', False, False)
  lo, hi = get('scale')
  if lo > hi:
    raise ConfigError('data.scale', get('scale'), 'must be (lo, hi) with lo <= hi')
  choice('scale_mode', ('scale_crop', 'resized_crop'))
  flag('flip')
  num('jitter', lo=0, hi=1)
  choice('style', ('none', 'cfsi', 'lab'))
  if get('style') != 'none' and cfg.augment != 'segmentation':
    raise ConfigError('data.style', get('style'), "style transfer runs in augment='segmentation'")
  num('style_fraction', lo=0, hi=1)
  num('cfsi_window', lo=0, hi=0.5, lo_open=True)
  num('style_max_per_client', lo=0, integer=True)
  flag('shuffle')
  num('seed', lo=0, integer=True)
  own_check = data_registry.DATASETS.entry(cfg.dataset).meta.get('check')
  if own_check is not None:     # a segmentation dataset that checks its own fields (data/registry.py `check`)
    own_check({k: get(k) for k in declared})
    return
  if cfg.dataset == 'seg_synthetic':
    pair('image_size', False, True)
    if min(get('image_size')) < 8:
      raise ConfigError('data.image_size', get('image_size'), 'must be at least (8, 8)')
    num('num_domains', lo=2, integer=True)
    num('unseen_domains', lo=1, hi=get('num_domains') - 1, integer=True)
    for k in ('clients_per_domain', 'examples_per_client', 'client_test_examples', 'unseen_test_per_domain',
              'max_shapes'):
      num(k, lo=1, integer=True)
    num('class_alpha', lo=0, lo_open=True)
    num('client_jitter', lo=0)
    flag('ignore_border')
    return
  for k in ('data_dir', 'root', 'split_dir'):
    if not isinstance(get(k), str):
      raise ConfigError(f'data.{k}', get(k), 'must be a string (a path; empty = default)')
  choice('distribution', ('uniform', 'heterogeneous'))
  choice('split_source', ('generate', 'released'))
  pair('image_size', True, True)
  flag('double')
  num('num_workers', lo=1, integer=True)
  num('cache_clients', lo=0, integer=True)
  if cfg.dataset == 'cityscapes':
    num('uniform_clients', lo=1, integer=True)
    num('clients_per_city', lo=1, integer=True)
  else:
    choice('setting', ('country', 'rainy', 'bus'))
