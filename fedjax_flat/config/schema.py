"""The whole config schema: every section in config order, collected from the modules that declare them.

`SCHEMA` is the config's layout: the run's own top-level fields (declared here: they are read by every layer)
and the sections, each declared next to the code that reads it (fedjax_flat/schema.py says how):

  client   optimizers/client.py        server   optimizers/server.py        swa  optimizers/schedules.py
  wima     algorithms/wrappers/wima.py  engine   core/engine.py              centralized  config/centralized.py
  dp       privacy/mechanism.py (applied by algorithms/wrappers/dp.py)   system  systems/clock.py (training/plan.py)
  upload   systems/compress.py (applied by algorithms/wrappers/compress.py)
  the others (man, init, corruption_eval, personalized, grouping, attack, segmentation, retrieval, fedvc, bn) here.

`config.algo` is the algorithm's `hparams=` (algorithms/registry.py) and `config.data` the dataset's fields
(config/data_fields.py, data/registry.py): both are sections a config replaces whole (tag WHOLE), checked by
config/validate.py. `default_config()` builds the ConfigDict from `SCHEMA`; `validate_config` runs every section's
rules, then the rules that span sections; the kind tables (`WHOLE_SECTIONS`, checkpoint's COMPUTATION_FIELDS, ...)
are `fedjax_flat.schema.tagged(SCHEMA, tag)`; configs/README.md's field reference is `field_reference()`.
A new field is one line in its section.
"""
from __future__ import annotations

import os
from typing import Collection, List, Tuple

import ml_collections

from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.algorithms.local import MAN_CONVENTIONS
from fedjax_flat.algorithms.wrappers import dp as dp_wrapper
from fedjax_flat.algorithms.wrappers import swa as swa_wrapper
from fedjax_flat.algorithms.wrappers import wima as wima_wrapper
from fedjax_flat.config import centralized
from fedjax_flat.config.run_dir import is_run_dir
from fedjax_flat.core import batch_stats
from fedjax_flat.core import engine
from fedjax_flat.core.client_state import HOST_MAX_MB, STORE_KINDS
from fedjax_flat.data import attacks
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.registry import OPTIONAL_FIELDS
from fedjax_flat.data.sampling import SAMPLERS
from fedjax_flat.errors import ConfigError
from fedjax_flat.grouping import distances, estimators, groupers
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.tiling import EVAL_MODES
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.optimizers import server as server_opt
from fedjax_flat.systems import clock as system_clock
from fedjax_flat.systems import compress as system_compress
from fedjax_flat.schema import (EXECUTION, INPUT, LOG, RESULT, RESUME, WHOLE, Choice, Field, Flag, Int, Num, Pair,
                                Section, String, Test, is_number)
from fedjax_flat.tasks.segmentation import OHEM_MODES

AUGMENTS = ('none', 'cifar', 'cifar_cutout', 'cifar_mixup', 'landmarks', 'segmentation')
NORMALIZE = ('none', 'cifar10', 'cifar100', 'imagenet', 'feddrive')


def data_section(**values) -> ml_collections.ConfigDict:
  """A `config.data` with the OPTIONAL fields (data/registry.OPTIONAL_FIELDS) declared (None) and `values` set."""
  d = ml_collections.ConfigDict()
  for name, typ in OPTIONAL_FIELDS.items():
    d[name] = ml_collections.FieldReference(None, field_type=typ)
  for k, v in values.items():
    d[k] = v
  return d


def _keep_rounds(cfg) -> None:
  keep_rounds, rounds = cfg.get('keep_rounds', ()), cfg.get('rounds')
  if (not isinstance(keep_rounds, (tuple, list))
      or any(not is_number(r, integer=True) or not 1 <= r <= rounds for r in keep_rounds)):
    raise ConfigError('keep_rounds', keep_rounds, f'must be a tuple of rounds in [1, rounds={rounds}] '
                      '(e.g. --config.keep_rounds="(100, 500)")')


# The run's top-level fields before the sections: what is trained, on what, for how long.
RUN = Section('', (
    Field('seed', Int(0, lo=0), 'run seed (init, sampling, batch order, augmentation all derive from it)',
          {RESULT, INPUT}),
    Field('dataset', Choice('digits', data_registry.names, sort=True), 'dataset name (data/registry.py)', {RESULT}),
    Field('data', None, "the dataset builder's kwargs (config/data_fields.py; the segmentation datasets declare "
          'theirs: data/registry.py `fields=`)', {RESULT, WHOLE},
          default=lambda: data_section(num_clients=20, alpha=0.0, shuffle=True)),
    Field('model', Choice('digits_cnn', model_registry.names, sort=True), 'model name (models/registry.py)',
          {RESULT}),
    Field('model_kwargs', None, "the model builder's kwargs (e.g. conv_impl)", {RESULT, WHOLE},
          default=lambda: {'conv_impl': 'auto'}),
    Field('augment', Choice('none', AUGMENTS, sort=True), 'on-device augmentation preset', {RESULT}),
    Field('normalize', Choice('none', NORMALIZE, sort=True),
          "normalization preset for train and eval ('feddrive' = mean 0.5 / std 0.5)", {RESULT}),
    Field('algorithm', Choice('fedavg', alg_registry.names, sort=True), 'algorithm name (algorithms/registry.py)',
          {RESULT}),
    Field('algo', None, "the algorithm's hyperparameters (its `hparams=` rules; --config.algo.<k>=<v>)",
          {RESULT, WHOLE}),
    Field('rounds', Int(100, lo=1), 'training rounds', {RESUME}),
    Field('clients_per_round', Int(5, lo=1), 'clients sampled each round', {RESULT}),
    Field('sampler', Choice('sort', SAMPLERS),
          "uniform client sampling: 'sort' (O(population) per round) | 'floyd' (O(cohort^2), other clients; "
          'data/sampling.py)', {RESULT}),
))

MAN = Section('man', (
    Field('zeta', Num(0.0, lo=0), 'activation-norm regularizer coefficient (MAN); 0 = off'),
    Field('convention', Choice('paper', MAN_CONVENTIONS, note=" (paper: zeta is Eq. 15's coefficient; code: zeta is "
                               "the release's mu_mean, applied as mu_mean / 2)"),
          "'paper': zeta is Eq. 15's coefficient | 'code': the release's mu_mean, applied / 2 "
          '(algorithms/local.man_coefficient)'),
), tags={RESULT}, doc='the activation-norm regularizer (MAN)')


def _init_check(cfg) -> None:
  init = cfg.init
  ckpt, pre = init.get('checkpoint', ''), init.get('pretrained', '')
  if ckpt and pre:
    raise ConfigError('init.pretrained', pre, f'init.checkpoint={ckpt!r} is set too: use one of the two')
  if ckpt and not is_run_dir(ckpt):
    raise ConfigError('init.checkpoint', ckpt, 'must be a fedjax_flat run directory (config.json + checkpoints/)')


def check_init_files(cfg, pending: Collection[str] = ()) -> None:
  """init.pretrained exists, unless an earlier stage of the sweep declared it as its output (`pending`: a pipeline's
  run is validated before that stage has run; sweeps/sweep.py checks the file when the run's stage starts)."""
  pre = cfg.init.get('pretrained', '') if 'init' in cfg else ''
  if pre and pre not in pending and not os.path.isfile(pre):
    raise ConfigError('init.pretrained', pre, 'no such file (a .npz or msgpack params file)')


_PATH = 'must be a string (a path; empty = off)'
INIT = Section('init', (
    Field('checkpoint', String('', _PATH), 'a fedjax_flat run directory (or its checkpoints/) to start from'),
    Field('model', Choice('global', ('global', 'swa', 'wima')), "which of that run's models"),
    Field('pretrained', String('', _PATH), 'or a .npz / msgpack params file (models/pretrained.py)'),
    Field('reinit_classifier', Choice('auto', ('auto', 'always', 'never')),
          "'auto': re-init when the class count differs"),
    Field('classifier_key', String('', _PATH), "'' = models/pretrained.find_classifier_key"),
), check=_init_check, doc='initial params (training/init.py; before round 0, never on resume); one source at most')

CORRUPTION_EVAL = Section('corruption_eval', (
    Field('name', Choice('', ('', 'cifar10_c', 'cifar100_c'), sort=True), "'' = off; 'cifar10_c' | 'cifar100_c'"),
    Field('data_dir', String(''), 'the directory of the corrupted test sets'),
    Field('corruptions', String('all'), "'all' present, or a comma-separated list"),
    Field('severities', Test((1, 2, 3, 4, 5), ok=lambda v: set(v) <= {1, 2, 3, 4, 5}, message='a subset of 1..5',
                             what='subset of 1..5'),
          'severities evaluated', when=lambda cfg: bool(cfg.corruption_eval.name)),
    Field('check_official_sizes', Flag(True), 'require the official example counts'),
), doc='CIFAR-10-C / 100-C evaluation of the reported model at the end of training (evaluation/corruption.py)')

# The run's top-level fields after the sections: evaluation, checkpoints, logging, client-state stores.
RUN_TAIL = Section('', (
    Field('eval_every', Int(10, lo=1), 'evaluate every N rounds'),
    Field('eval_every_last', Int(0, lo=0), 'also evaluate every round of the last N rounds (papers: 100)'),
    Field('eval_batch_size', Test(256, ok=lambda v: v == 'auto' or (is_number(v, integer=True) and v >= 1),
                                  message="must be 'auto' or an integer >= 1", what="'auto' | integer >= 1"),
          "evaluation batch size; 'auto': the fastest, measured once per machine, model and test set (kept "
          "beside the compilation cache; evaluation/evaluator.py, summary.json 'evaluation')", {EXECUTION}, ref=True),
    Field('eval_clients', Flag(False), "also evaluate on each sampled client's training data"),
    Field('summary_last_k', Int(10, lo=1), 'summary.json averages the last K evaluations'),
    Field('checkpoint_every', Int(0, lo=0), 'orbax checkpoint every N rounds; 0 = only at the end', {EXECUTION}),
    Field('keep_checkpoints', Int(2, lo=1), 'checkpoints kept (the last K)', {EXECUTION}),
    Field('keep_rounds', Test((), ok=lambda v: True, what='tuple of rounds in [1, rounds]'),
          'rounds whose checkpoints are also saved and never deleted (analyses)', {EXECUTION}, after=_keep_rounds),
    Field('progress_every_s', Num(10.0, lo=0), 'seconds between progress lines', {EXECUTION, LOG}),
    Field('client_state_store', Choice('auto', STORE_KINDS, sort=True),
          "stateful algorithms: 'host' | 'device' | 'disk' | 'auto' (core/client_state.py)", {EXECUTION}),
    Field('client_state_device_max_mb', Num(256, lo=0), 'auto: device store if population * state bytes <= this',
          {EXECUTION}),
    Field('client_state_host_max_mb', Num(HOST_MAX_MB, lo=0),
          'auto: host store if population * state bytes <= this, else memmaps in workdir/client_states',
          {EXECUTION}),
))

PERSONALIZED = Section('personalized', (
    Field('enabled', Flag(False), "evaluate personalized models at the end -> summary.json 'personalized'"),
    Field('finetune_epochs', Int(0, lo=0), 'K extra local epochs per client, protocols after each'),
    Field('finetune_lr', Num(0.0, lo=0), '0 = client.lr'),
    Field('finetune_batch_size', Int(0, lo=0), '0 = client.batch_size'),
    Field('auc_scores', Choice('softmax', ('softmax', 'logits'), sort=True),
          "'softmax' | 'logits' (the FedSoup reference code)"),
    Field('per_client', Flag(True), 'per-client rows in the summary'),
), doc='end-of-training personalized / OOD evaluation (evaluation/personalized.py)')


def _probe_model(v):
  if not isinstance(v, str):
    return 'must be a string (empty = off)'
  if v and v not in model_registry.names():
    return f'allowed values: {sorted(model_registry.names())}'
  return None


def _grouping_check(cfg) -> None:
  g = cfg.grouping
  method, est, dist = g.method, g.estimator, g.distance
  if method in ('kmeans', 'icg') and dist not in ('auto', 'euclidean'):
    raise ConfigError('grouping.distance', dist, f'grouping.method={method!r} clusters with the Euclidean '
                      "distance: use 'euclidean' or 'auto' (other distances are for method='greedy')")
  if method != 'random' and dist in distances.PROBABILITY_ONLY and est != 'conf':
    raise ConfigError('grouping.distance', dist, f'is defined on probability vectors: it needs '
                      f"grouping.estimator='conf', not {est!r} (use 'cosine', 'normalized_cosine' or 'euclidean')")
  if g.probe_pretrained and g.probe_checkpoint:
    raise ConfigError('grouping.probe_checkpoint', g.probe_checkpoint,
                      f'grouping.probe_pretrained={g.probe_pretrained!r} is set too: use one of the two')
  if g.probe_pretrained and not os.path.isfile(g.probe_pretrained):
    raise ConfigError('grouping.probe_pretrained', g.probe_pretrained, 'no such file (a .npz or msgpack params file)')
  if g.probe_checkpoint and not is_run_dir(g.probe_checkpoint):
    raise ConfigError('grouping.probe_checkpoint', g.probe_checkpoint,
                      'must be a fedjax_flat run directory (config.json + checkpoints/)')


_OFF = 'must be a string (empty = off)'
GROUPING = Section('grouping', (
    Field('method', Choice('random', groupers.METHODS, sort=True), "phi: 'random' | 'kmeans' | 'greedy' | 'icg'"),
    Field('estimator', Choice('clf', estimators.ESTIMATORS, sort=True),
          "psi: 'clf' (classifier weights + PCA) | 'conf' (confidence, eq. 5.1) | 't2v'"),
    Field('distance', Choice('auto', ('auto',) + tuple(distances.DISTANCES), sort=True),
          "tau; 'auto': euclidean for kmeans / icg; greedy: cosine (clf), kl (conf), normalized_cosine (t2v)"),
    Field('min_examples', Int(1000, lo=1), '|D_S|_min (thesis CIFAR: 1000)'),
    Field('max_clients', Int(11, lo=0), 'K_S,max (thesis CIFAR: 11); 0 = no cap'),
    Field('pretrain_epochs', Int(10, lo=1), 'e: local epochs of the pre-training (t2v: of the head fine-tuning)'),
    Field('pretrain_lr', Num(0.0, lo=0), '0 = client.lr (the client optimizer without SAM / ASAM)'),
    Field('public_per_class', Int(10, lo=1), "J: test examples per class in the public set of 'conf'"),
    Field('pca_variance', Num(0.9, lo=0, hi=1), "'clf': explained variance kept by PCA (0 or 1 = no reduction)"),
    Field('pca_standardize', Flag(True), "'clf': unit-variance columns before PCA (the reference code)"),
    Field('num_clusters', Int(0, lo=0), 'kmeans: clusters (0 = the number of classes)'),
    Field('icg_iterations', Int(10, lo=1), 'icg: equal-size k-means iterations'),
    Field('fisher', Choice('montecarlo', estimators.FISHER_MODES, sort=True),
          "t2v: 'montecarlo' (one y ~ p(y|x) per example) | 'exact' (sum over y)"),
    Field('probe_model', Test('', why=_probe_model, what='model name or empty'),
          "t2v: probe architecture ('' = config.model with config.model_kwargs)"),
    Field('probe_model_kwargs', None, "t2v: the probe model's kwargs", {WHOLE}),
    Field('probe_lr', Num(4e-4, lo=0, lo_open=True), "t2v: Adam lr of the probe head's fine-tuning (Task2Vec's)"),
    Field('probe_pretrained', String('', _OFF), 't2v: probe params file (models/pretrained.py formats)'),
    Field('probe_checkpoint', String('', _OFF), 't2v: or a run directory; neither (and no config.init): random'),
    Field('seed', Int(-1, lo=-1), 'grouper / pre-training randomness; -1 = config.seed'),
), check=_grouping_check, doc='clients -> superclients (fedjax_flat/grouping/, FedSeq; thesis 5.2.2); cached in '
   'WORKDIR/grouping/')


def _attack_on(cfg) -> bool:
  return cfg.attack.kind != 'none'


def _fraction(v) -> bool:
  return is_number(v) and 0 < v <= 1      # nan compares False


ATTACK = Section('attack', (
    Field('kind', Choice('none', attacks.KINDS), "'none' | 'label_flip'"),
    Field('malicious_superclients', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]',
                                         what='fraction in (0, 1]'), 'L_S', when=_attack_on),
    Field('attackers', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]', what='fraction in (0, 1]'),
          'L', when=_attack_on),
    Field('classes', Test('0,2', why=attacks.check_classes, what="ids '0,2' | 'intra_sc' | 'extra_sc'"),
          "swapped classes: ids '0,2' | '3,5' | '0,2,3,5' ... | 'intra_sc' | 'extra_sc'", when=_attack_on),
    Field('swap', Choice('fixed', attacks.SWAPS), "'fixed' (one pairing for every attacker) | 'random'",
          when=_attack_on),
    Field('clean_workdir', String('', "must be a string (a run directory; '' = none)"),
          "the clean run's workdir: summary.json reports the accuracy drop", when=_attack_on),
), tags={RESULT}, doc='label-flipping attack (data/attacks.py; thesis Table 5.5)')

_TILE = "must be (height, width), integers >= 0 ((0, 0) = the model's input size)"
SEGMENTATION = Section('segmentation', (
    Field('ohem', Choice('topk', OHEM_MODES, sort=True), "'topk' (FedDrive: per image, the hardest ohem_fraction of "
          "pixels) | 'thresh' (CoinCheung: CE > -log(ohem_thresh)) | 'none'"),
    Field('ohem_fraction', Num(0.25, lo=0, lo_open=True, hi=1), "'topk': share of pixels kept"),
    Field('ohem_thresh', Num(0.7, lo=0, lo_open=True, hi=1, hi_open=True), "'thresh': probability threshold"),
    Field('aux_weight', Num(1.0, lo=0), "weight of each booster head's loss"),
    Field('eval_mode', Choice('full', EVAL_MODES, sort=True), "'full' | 'downscale' (input x eval_scale) | 'tiles'"),
    Field('eval_scale', Num(0.5, lo=0, lo_open=True, hi=1), "'downscale': input scale"),
    Field('eval_tile', Pair((0, 0), integer=True, lo_open=False, message=_TILE), "'tiles': window (0, 0 = the "
          "model's input size)"),
    Field('eval_overlap', Num(1 / 3, lo=0, hi=1, hi_open=True), "'tiles': overlap of the windows"),
    Field('by_test_client', Flag(True), "metrics per held-out test client group ('seen' / 'unseen') as well"),
    Field('predictions', Int(4, lo=0, hi=64), 'predictions.png: test images with true / predicted masks'),
), doc="the 'segmentation' task's loss (OHEM, booster heads) and evaluation (tasks/segmentation.py)")

RETRIEVAL = Section('retrieval', (
    Field('margin', Num(0.1, lo=0), 'triplet margin'),
    Field('num_negatives', Int(5, lo=1), 'hardest negative candidates per query tuple used in the loss'),
    Field('threshold', Num(25.0, lo=0, lo_open=True), 'metres: a database image within it is a match (Recall@K)'),
    Field('cache_pass', Flag(True, message='True or False'),
          'mine from a gradient-free pass, train on the mined slots only'),
), doc="the 'retrieval' task (tasks/retrieval.py: FedVPR)")

FEDVC = Section('fedvc', (
    Field('virtual_size', Int(0, lo=0), '> 0: virtual clients of this many examples (data/virtual_clients.py)'),
), doc="FedVC's virtual clients")

BN = Section('bn', (
    Field('test_policy', Choice('auto', batch_stats.TEST_POLICIES, sort=True),
          "BatchNorm statistics of unseen test clients: 'auto' | 'running' | 'batch' | 'client'"),
    Field('test_batch_size', Int(8, lo=1), "'batch': the test batch whose statistics normalize it (FedDrive: 8)"),
), doc='BatchNorm models: test-time statistics (core/batch_stats.py)')

# The fields config.published can hold (percent unless said; each number may have a `<field>_std`): what
# sweeps/report.py puts beside the measured ones (its METRICS / HESSIAN / targets, kept equal by its test), and the
# families' descriptive extras. Errors naming a missing published field list them (training/cli.missing_field).
PUBLISHED_FIELDS = (
    'source', 'accuracy', 'model', 'target_accuracy', 'rounds_to_target', 'bits_to_target_B', 'lambda_max',
    'hessian_trace', 'miou', 'miou_seen', 'miou_unseen', 'recall@5', 'recall@10', 'local_acc', 'local_auc',
    'global_auc', 'centralized_accuracy', 'num_superclients', 'mean_num_superclients', 'drop',
    'lambda_local_<k>', 'lambda_global_<k>')

PUBLISHED = Section('', (
    Field('published', None, "the paper's number for this setting (documentation only: "
          f"{', '.join(PUBLISHED_FIELDS)}; numbers may add <field>_std)", {WHOLE, EXECUTION, LOG}),
))

# The config's layout, in order.
SCHEMA: Tuple[Section, ...] = (
    RUN, client_opt.SECTION, server_opt.SECTION, swa_wrapper.SECTION, wima_wrapper.SECTION, dp_wrapper.SECTION, MAN,
    engine.SECTION, system_clock.SECTION, system_compress.SECTION,
    INIT, CORRUPTION_EVAL, RUN_TAIL, PERSONALIZED, GROUPING, centralized.SECTION, ATTACK, SEGMENTATION, RETRIEVAL,
    FEDVC, BN, PUBLISHED)


def build(sections=SCHEMA) -> ml_collections.ConfigDict:
  """The default config: every section's fields with their defaults, in layout order."""
  c = ml_collections.ConfigDict()
  for s in sections:
    if s.name:
      c[s.name] = s.build()
    else:
      for f in s.fields:
        c[f.name] = f.value()
  return c


def field_reference(sections=SCHEMA) -> List[str]:
  """Markdown lines: every field of the sections with its default, what it allows, its tags and its doc."""
  out = ['| field | default | allowed | tags | what |', '|---|---|---|---|---|']
  for s in sections:
    for f in s.fields:
      default = '(section)' if f.rule is None else repr(f.rule.default)
      allowed = '' if f.rule is None else f.rule.describe()
      tags = ', '.join(sorted(f.tags | s.tags))
      out.append(f'| `{s.path(f)}` | `{default}` | {_cell(allowed)} | {tags} | {_cell(f.doc)} |')
  return out


def algo_reference() -> List[str]:
  """Markdown lines: every registered algorithm's `config.algo` fields (its `hparams=` rules) with defaults."""
  out = ['| algorithm | config.algo fields (default; allowed) |', '|---|---|']
  for name in alg_registry.names():
    rules = alg_registry.spec(name).hparams
    fields = '; '.join(f'`{k}={r.default!r}` ({r.describe()})' for k, r in rules.items()) or '(none)'
    out.append(f'| `{name}` | {_cell(fields)} |')
  return out


def _cell(text: str) -> str:
  return text.replace('|', '\\|')    # a Markdown table cell
