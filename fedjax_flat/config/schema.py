"""The whole config schema: every section in config order, collected from the modules that declare them.

`SCHEMA` is the config's layout: the run's own top-level fields (declared here: they are read by every layer)
and the sections, each declared next to the code that reads it (fedjax_flat/schema.py says how):

  client   optimizers/client.py          server   optimizers/server.py       swa      optimizers/schedules.py
  wima     core/window_average.py        engine   core/engine.py             centralized  config/centralized.py
  dp       privacy/mechanism.py (applied by algorithms/wrappers/dp.py)    system   systems/clock.py
  upload   systems/compress.py (applied by algorithms/wrappers/compress.py)
  man      algorithms/local.py           init     models/pretrained.py       corruption_eval  evaluation/corruption.py
  client_eval  evaluation/client_eval.py (applied by training/evals/client_eval.py)
  lab      analysis/lab.py (applied by training/evals/lab.py)
  personalized  evaluation/personalized.py            grouping  grouping/superclients.py
  attack   data/attacks.py               segmentation  tasks/segmentation.py  retrieval  tasks/retrieval.py
  fedvc    data/virtual_clients.py       bn       core/batch_stats.py
Only the run's own top-level fields (RUN, RUN_TAIL, PUBLISHED) are declared here.

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
from fedjax_flat.algorithms.local import SECTION as MAN
from fedjax_flat.analysis.lab import SECTION as LAB
from fedjax_flat.config import centralized
from fedjax_flat.core import engine
from fedjax_flat.core.batch_stats import SECTION as BN
from fedjax_flat.core.client_state import HOST_MAX_MB, STORE_KINDS
from fedjax_flat.core.window_average import SECTION as WIMA
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.attacks import SECTION as ATTACK
from fedjax_flat.data.registry import OPTIONAL_FIELDS
from fedjax_flat.data.sampling import SAMPLERS
from fedjax_flat.data.virtual_clients import SECTION as FEDVC
from fedjax_flat.errors import ConfigError
from fedjax_flat.evaluation.client_eval import SECTION as CLIENT_EVAL
from fedjax_flat.evaluation.corruption import SECTION as CORRUPTION_EVAL
from fedjax_flat.evaluation.personalized import SECTION as PERSONALIZED
from fedjax_flat.grouping.superclients import SECTION as GROUPING
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.pretrained import SECTION as INIT
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.optimizers import server as server_opt
from fedjax_flat.optimizers.schedules import SWA_SECTION as SWA
from fedjax_flat.privacy.mechanism import SECTION as DP
from fedjax_flat.schema import (EXECUTION, INPUT, LOG, RESULT, RESUME, WHOLE, Choice, Field, Flag, Int, Num, Section,
                                Test, is_number)
from fedjax_flat.systems import clock as system_clock
from fedjax_flat.systems import compress as system_compress
from fedjax_flat.tasks.retrieval import SECTION as RETRIEVAL
from fedjax_flat.tasks.segmentation import SECTION as SEGMENTATION

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
    Field('sampler', Choice('auto', SAMPLERS),
          "uniform client sampling: 'auto' ('sort' up to 10,000 clients, 'floyd' above) | 'sort' (O(population) "
          "per round) | 'floyd' (O(cohort^2), other clients; data/sampling.py)", {RESULT}),
))


def check_init_files(cfg, pending: Collection[str] = ()) -> None:
  """init.pretrained exists, unless an earlier stage of the sweep declared it as its output (`pending`: a pipeline's
  run is validated before that stage has run; sweeps/sweep.py checks the file when the run's stage starts)."""
  pre = cfg.init.get('pretrained', '') if 'init' in cfg else ''
  if pre and pre not in pending and not os.path.isfile(pre):
    raise ConfigError('init.pretrained', pre, 'no such file (a .npz or msgpack params file)')


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
    RUN, client_opt.SECTION, server_opt.SECTION, SWA, WIMA, DP, MAN,
    engine.SECTION, system_clock.SECTION, system_compress.SECTION,
    INIT, CORRUPTION_EVAL, RUN_TAIL, CLIENT_EVAL, LAB, PERSONALIZED, GROUPING, centralized.SECTION, ATTACK,
    SEGMENTATION, RETRIEVAL, FEDVC, BN, PUBLISHED)


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


# The configured algorithm as the config sees it: config.algo's rules are the algorithm's declared hyperparameters,
# so the schema is the config layer's one reader of the algorithm registry (validation and --config.algo.* flags
# ask it).

def algorithm_names() -> List[str]:
  """The registered algorithm names (the `algorithm` field's allowed values)."""
  return list(alg_registry.names())


def declared(config) -> 'alg_registry.Declared':
  """The static declarations of config.algorithm (a config, or a name: its defaults), or None when unknown."""
  return alg_registry.declared(config)


def algorithms_with_need(need: str) -> List[str]:
  """The registered algorithms that declare `need`, sorted."""
  return alg_registry.with_need(need)


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
