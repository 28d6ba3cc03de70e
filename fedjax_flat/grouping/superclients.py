"""Superclients from a config: estimator psi -> distance tau -> grouper phi (thesis 5.2.2, G_S).

  build_superclients(config, ctx, workdir, num_superclients=None) -> [np.ndarray of client ids, ...]

ctx: anything with `model` (models/base.Model) and `data` (or `dataset`: the FederatedDataset /
ClientDataSource), optionally `params0` (the common initial params w_0; default: exactly what the Trainer
starts from: model.init with key fold_in(key(config.seed), 0), then config.init when set) and `config`.
`GroupingContext.from_config(config)` builds one from the registries; with config.init set, or for
grouping.probe_checkpoint, training/init.grouping_context builds it (params0 and the run loader).

Client representations come from `representations`: psi_clf and psi_conf from one pre-training pass (every
client trains w_0 for grouping.pretrain_epochs epochs), psi_t2v from the probe network (classifier
fine-tuning pass + Fisher pass). All passes are cached in WORKDIR/grouping/ (workdir=None: the last few in
memory), so regrouping (FedSeq2Par calls this with a growing num_superclients) and resumed runs compute
nothing again; the groupers themselves are cheap and deterministic from grouping.seed, so a resumed run gets
the same superclients. Each call also writes WORKDIR/grouping/superclients[-n<N>].json (ids + statistics).

num_superclients (FedSeq2Par's growth function) overrides the number of superclients that the constraints
grouping.min_examples / max_clients would give: exactly min(N, K) superclients of K // N or K // N + 1
clients, constraints not applied (groupers.py).

The probe of psi_t2v: grouping.probe_pretrained (a params file, models/pretrained.py formats) or
grouping.probe_checkpoint (a run directory), loaded with the pretrained loader; with neither, and when the
probe is the run's own model with config.init set, the run's initial params. Its classifier is always
re-initialized (Task2Vec fits a new head per task) and fine-tuned on each client with Task2Vec's optimizer
(Adam, lr grouping.probe_lr, weight decay 1e-4). Without any of the three the probe is a RANDOMLY
INITIALIZED network (a warning says so): its Fisher still separates clients by their data through the
fine-tuned head (digits at alpha=0, exact Fisher: as well as a pretrained probe; benchmarks/studies/README.fedseq.md),
but it cannot reflect the semantic and taxonomic similarity that Task2Vec gets from pretrained features (the
thesis used an ImageNet ResNet18).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.data.transforms.transform import on_inputs
from fedjax_flat.errors import ConfigError
from fedjax_flat.grouping import estimators, groupers, pretrain, stats
from fedjax_flat.models import pretrained
from fedjax_flat.models import registry as model_registry
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.schema import WHOLE, Choice, Field, Flag, Int, Num, Section, String, Test
from fedjax_flat.grouping import distances
from fedjax_flat.run_dir import is_run_dir

# Table 5.3's pairing of each estimator with its greedy distance (distance='auto').
GREEDY_DISTANCE = {'clf': 'cosine', 'conf': 'kl', 't2v': 'normalized_cosine'}
PROBE_KEY = 0x7062          # fold_in of the seed key for a probe's fresh initialization


@dataclasses.dataclass(frozen=True)
class GroupingContext:
  model: Any
  data: Any
  config: Any = None
  params0: Any = None        # w_0; None: model.init as the Trainer does (config.init needs it given)
  load_run: Any = None       # path -> (params, round, run dir): grouping.probe_checkpoint's loader

  @classmethod
  def from_config(cls, config, data=None, **kw) -> 'GroupingContext':
    if data is None:
      data = data_registry.get_dataset(config.dataset, **config.data.to_dict())
    model = model_registry.get_model(config.model, data.num_classes, data.input_shape,
                                     compute_dtype=model_registry.compute_dtype(config),
                                     **config.model_kwargs.to_dict())
    return cls(model, data, config, **kw)


@dataclasses.dataclass
class Grouping:
  groups: List[np.ndarray]
  method: str
  estimator: Optional[str]
  distance: Optional[str]
  num_superclients: Optional[int]
  info: Dict[str, Any]


def _data_of(ctx):
  data = getattr(ctx, 'data', None)
  return data if data is not None else getattr(ctx, 'dataset')


def grouping_seed(config) -> int:
  s = int(config.grouping.seed)
  return int(config.seed) if s < 0 else s


def resolved_distance(method: str, estimator: str, distance: str) -> str:
  if distance != 'auto':
    return distance
  return GREEDY_DISTANCE[estimator] if method == 'greedy' else 'euclidean'


def init_requested(config) -> bool:
  init = config.get('init')
  return init is not None and bool(init.get('checkpoint') or init.get('pretrained'))


def initial_params(config, model, data):
  """w_0 as the Trainer builds it (training/loop.py). With config.init set, w_0 comes from another run or a
  file: the caller loads it (training/init.grouping_context) and passes it as the context's params0."""
  if init_requested(config):
    raise ValueError('config.init is set: pass the initial params as GroupingContext.params0 '
                     '(training/init.grouping_context builds such a context)')
  return fresh_params(config, model, data)


def fresh_params(config, model, data):
  """model.init exactly as the Trainer's round 0 (key fold_in(key(seed), 0)), before any config.init."""
  key = jax.random.key(config.seed)
  return model.init(jax.random.fold_in(key, 0), jnp.zeros((1,) + tuple(data.input_shape), jnp.float32))


def _classifier_key(config, model, params) -> str:
  key = config.init.get('classifier_key', '') if config.get('init') is not None else ''
  return key or pretrained.find_classifier_key(params, model.num_classes)


def _engine_kw(config):
  ec = config.engine
  return dict(strategy=ec.strategy, clients_per_chunk=ec.clients_per_chunk, unroll=ec.unroll,
              progress_every_s=float(config.get('progress_every_s', 10.0)))


def _common_spec(config, data, client_cfg) -> Dict[str, Any]:
  g = config.grouping
  return {'data': pretrain.data_fingerprint(data), 'client': client_cfg.to_dict(),
          'epochs': int(g.pretrain_epochs), 'seed': grouping_seed(config), 'augment': config.augment,
          'normalize': config.normalize}


# Without a workdir, the last results of this process by cache key, so that regroupings (FedSeq2Par plans
# every regrouping of a run at its start) do not redo the passes. A pure memo: same key, same arrays.
_MEMO: 'collections.OrderedDict[str, Dict[str, np.ndarray]]' = collections.OrderedDict()
MEMO_SIZE = 4


def _cached_pass(workdir, kind, spec, names, num_clients, compute) -> Dict[str, np.ndarray]:
  key = pretrain.cache_key(spec)
  if not workdir:
    if key not in _MEMO:
      _MEMO[key] = compute()
      while len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)
    return {k: np.array(v) for k, v in _MEMO[key].items()}
  path = pretrain.cache_path(workdir, kind, key)
  hit = pretrain.load_cached(path, names, num_clients)
  if hit is not None:
    logging.info('grouping: %s reused from %s', kind, path)
    return hit
  out = compute()
  pretrain.save_cached(path, out, spec)
  return out


def check_task(estimator: str, data) -> None:
  """psi_conf and psi_t2v score one label per example: a per-position task (next_token, segmentation) is a
  ConfigError; psi_clf (the output layer's weights) and random grouping work with any task."""
  task = tasks_lib.task_of(data)
  if estimator in ('conf', 't2v') and isinstance(task, tasks_lib.DenseClassification):
    raise ConfigError('grouping.estimator', estimator, f'needs one label per example; the data\'s task '
                               f'is {task.name!r} (one label per position): use \'clf\' or method=\'random\'')


def pretrain_outputs(config, model, data, params0, workdir) -> Dict[str, np.ndarray]:
  """{'clf': [K, d], 'conf': [K, C]}: psi_clf (before PCA) and psi_conf after the pre-training phase.
  conf is zeros for per-position tasks (check_task refuses it there)."""
  g = config.grouping
  seed = grouping_seed(config)
  ccfg = pretrain.plain_client_cfg(config.client, g.pretrain_lr)
  ckey = _classifier_key(config, model, params0)
  tx, ty = data.test_examples()
  per_example = not isinstance(tasks_lib.task_of(data), tasks_lib.DenseClassification)
  pub = (estimators.public_set(ty, data.num_classes, int(g.public_per_class), seed) if per_example
         else np.zeros((0,), np.int64))
  spec = {**_common_spec(config, data, ccfg), 'kind': 'pretrain', 'model': model.name,
          'params0': pretrain.params_fingerprint(params0), 'classifier_key': ckey,
          'public': pretrain.fingerprint(pub)}

  def compute():
    train_fn, eval_fn = transforms.make_transforms(config, data.num_classes, data)
    pub_x, pub_y = eval_fn(jnp.asarray(np.asarray(tx)[pub])), jnp.asarray(np.asarray(ty)[pub], jnp.int32)

    def summarize(params):
      conf = (estimators.confidence_vector(model.apply(params, pub_x), pub_y, data.num_classes) if per_example
              else jnp.zeros((data.num_classes,), jnp.float32))
      return {'clf': estimators.classifier_vector(params, ckey), 'conf': conf}
    alg = pretrain.training_algorithm(model, ccfg, summarize, task=tasks_lib.task_of(data))
    bcast = {'params': params0, 'hparams': pretrain.hparams(ccfg)}
    return pretrain.run_pass(alg, bcast, data, None, batch_size=int(ccfg.batch_size),
                             epochs=int(g.pretrain_epochs), seed=seed, augment_fn=train_fn,
                             label='pre-training', **_engine_kw(config))
  return _cached_pass(workdir, 'pretrain', spec, ('clf', 'conf'), data.num_clients, compute)


def _probe_classifier_key(config, model, params) -> str:
  if config.grouping.probe_model:   # another architecture: config.init.classifier_key is the run model's
    return pretrained.find_classifier_key(params, model.num_classes)
  return _classifier_key(config, model, params)


def probe_network(config, data, params0=None, load_run=None) -> Tuple[Any, Any, str]:
  """(probe model, its params, where they came from) for psi_t2v (module docstring)."""
  g = config.grouping
  name = g.probe_model or config.model
  kwargs = g.probe_model_kwargs.to_dict() if g.probe_model else config.model_kwargs.to_dict()
  # float32 whatever engine.compute_dtype: the Fisher is a curvature estimate, as the Hessian tools (analysis/hvp.py)
  model = model_registry.get_model(name, data.num_classes, data.input_shape, **kwargs)
  fresh = model.init(jax.random.fold_in(jax.random.key(grouping_seed(config)), PROBE_KEY),
                     jnp.zeros((1,) + tuple(data.input_shape), jnp.float32))
  # Task2Vec fits a new classifier for the task: the probe's head is always the fresh one (a head trained on
  # the same classes is already certain, and its Fisher carries no information on the client).
  ckey = _probe_classifier_key(config, model, fresh)
  if g.probe_pretrained:
    params = pretrained.fit_params(model, fresh, pretrained.read_params(g.probe_pretrained),
                                   source=g.probe_pretrained, reinit_classifier=True, classifier_key=ckey)
    return model, params, g.probe_pretrained
  if g.probe_checkpoint:
    if load_run is None:
      raise ValueError('grouping.probe_checkpoint needs a run loader: GroupingContext.load_run '
                       '(training/init.grouping_context sets it)')
    src, step, run_dir = load_run(g.probe_checkpoint)
    params = pretrained.fit_params(model, fresh, src, source=f'{g.probe_checkpoint} (round {step})',
                                   reinit_classifier=True, classifier_key=ckey)
    return model, params, f'{run_dir} (round {step})'
  if not g.probe_model and init_requested(config):
    params = params0 if params0 is not None else initial_params(config, model, data)
    params = estimators.merge(params, estimators.subtree(fresh, estimators.split_paths(fresh, ckey)[1]))
    return model, params, 'config.init'
  logging.warning('grouping.estimator=t2v without a pretrained probe (grouping.probe_pretrained, '
                  'grouping.probe_checkpoint or config.init): the Task2Vec embeddings are those of a randomly '
                  'initialized %s; they reflect each client\'s data through the fine-tuned classifier but not '
                  'the semantic similarity a pretrained probe gives', name)
  return model, fresh, 'random init (no pretrained probe)'


def task2vec_outputs(config, data, workdir, params0=None, load_run=None) -> Dict[str, np.ndarray]:
  """{'t2v': [K, d]}: Task2Vec vectors of the probe network (module docstring)."""
  g = config.grouping
  seed = grouping_seed(config)
  ccfg = pretrain.probe_client_cfg(config.client, g.probe_lr)
  model, params, source = probe_network(config, data, params0, load_run)
  ckey = _probe_classifier_key(config, model, params)
  feat, clf = estimators.split_paths(params, ckey)
  spec = {**_common_spec(config, data, ccfg), 'kind': 't2v', 'probe_model': model.name,
          'probe': pretrain.params_fingerprint(params), 'probe_source': source, 'classifier_key': ckey,
          'fisher': g.fisher}

  def compute():
    train_fn, eval_fn = transforms.make_transforms(config, data.num_classes, data)
    kw = dict(seed=seed, batch_size=int(ccfg.batch_size), **_engine_kw(config))
    bcast = {'params': params, 'hparams': pretrain.hparams(ccfg)}
    tune = pretrain.training_algorithm(model, ccfg, lambda p: estimators.subtree(p, clf), trainable=clf,
                                      task=tasks_lib.task_of(data))
    heads = pretrain.run_pass(tune, bcast, data, None, epochs=int(g.pretrain_epochs), augment_fn=train_fn,
                              label='t2v classifier fine-tuning', **kw)
    apply_fn = lambda p, x: model.apply(p, x, train=False)
    fisher = pretrain.fisher_algorithm(apply_fn, feat, mode=g.fisher)
    vec = pretrain.run_pass(fisher, bcast, data, heads, epochs=1, augment_fn=on_inputs(lambda rng, x: eval_fn(x)),
                            label='t2v Fisher', **kw)
    return {'t2v': vec}
  return _cached_pass(workdir, 't2v', spec, ('t2v',), data.num_clients, compute)


def representations(config, ctx, workdir, estimator: Optional[str] = None) -> Tuple[np.ndarray, Dict]:
  """psi(clients) [K, d] for `estimator` (default config.grouping.estimator), with PCA for psi_clf."""
  g = config.grouping
  estimator = estimator or g.estimator
  model, data = ctx.model, _data_of(ctx)
  check_task(estimator, data)
  params0 = getattr(ctx, 'params0', None)
  if estimator == 't2v':
    reps, info = task2vec_outputs(config, data, workdir, params0, getattr(ctx, 'load_run', None))['t2v'], {}
  elif estimator in ('clf', 'conf'):
    params0 = params0 if params0 is not None else initial_params(config, model, data)
    reps, info = pretrain_outputs(config, model, data, params0, workdir)[estimator], {}
    if estimator == 'clf':
      reps, pca = estimators.pca_reduce(reps, float(g.pca_variance), standardize=bool(g.pca_standardize))
      info['pca'] = pca
      logging.info('grouping: PCA kept %d of %d dimensions (%.1f%% of the variance)', pca['components'],
                   pca['dims'], 100 * pca['explained'])
  else:
    raise ValueError(f'grouping estimator={estimator!r} is unknown; allowed: {estimators.ESTIMATORS}')
  return np.asarray(reps, np.float64), {**info, 'dims': int(reps.shape[1])}


def make_grouping(config, ctx, workdir=None, num_superclients: Optional[int] = None, *,
                  method: Optional[str] = None, estimator: Optional[str] = None,
                  distance: Optional[str] = None) -> Grouping:
  """The grouping of config.grouping (method / estimator / distance overridable, e.g. to compare)."""
  g = config.grouping
  method, estimator = method or g.method, estimator or g.estimator
  distance = resolved_distance(method, estimator, distance or g.distance)
  data = _data_of(ctx)
  sizes = np.asarray(data.client_sizes())
  reps, info = (None, {}) if method == 'random' else representations(config, ctx, workdir, estimator)
  num_clusters = int(g.num_clusters) or data.num_classes
  groups = groupers.make_groups(method, sizes, reps, distance=distance, num_clusters=num_clusters,
                                min_examples=int(g.min_examples), max_clients=int(g.max_clients),
                                seed=grouping_seed(config), num_superclients=num_superclients,
                                icg_iterations=int(g.icg_iterations))
  return Grouping(groups, method, None if method == 'random' else estimator,
                  None if method == 'random' else distance, num_superclients, info)


def describe(grouping: Grouping, data, config) -> Dict:
  """A JSON-able record: what was used, the superclients and their statistics."""
  g = config.grouping
  st = stats.grouping_stats(grouping.groups, stats.label_histograms(data), sizes=data.client_sizes(),
                            min_examples=int(g.min_examples),
                            max_clients=0 if grouping.num_superclients else int(g.max_clients))
  return {'method': grouping.method, 'estimator': grouping.estimator, 'distance': grouping.distance,
          'num_superclients_requested': grouping.num_superclients, 'seed': grouping_seed(config),
          'min_examples': int(g.min_examples), 'max_clients': int(g.max_clients), 'info': grouping.info,
          'groups': [[int(i) for i in s] for s in grouping.groups], **st}


def build_superclients(config, ctx, workdir: Optional[str], num_superclients: Optional[int] = None
                       ) -> List[np.ndarray]:
  """Client ids of every superclient (module docstring); writes WORKDIR/grouping/superclients[-n<N>].json.
  config.grouping is validated by config/validate.py before this is called."""
  grouping = make_grouping(config, ctx, workdir, num_superclients)
  data = _data_of(ctx)
  if workdir and jax.process_index() == 0:
    rec = describe(grouping, data, config)
    name = 'superclients' + (f'-n{num_superclients}' if num_superclients else '') + '.json'
    path = os.path.join(workdir, 'grouping', name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      json.dump(rec, f, indent=1)
    s = rec['summary']
    logging.info('grouping: %d superclients (%s%s), clients %.1f [%d, %d], examples %.0f [%d, %d], classes '
                 '%.2f, label entropy %.3f bits (all data %.3f) -> %s', s['num_superclients'], grouping.method,
                 f', {grouping.estimator}/{grouping.distance}' if grouping.estimator else '',
                 s['clients']['mean'], s['clients']['min'], s['clients']['max'], s['examples']['mean'],
                 s['examples']['min'], s['examples']['max'], s['classes']['mean'], s['entropy_bits']['mean'],
                 s['global_entropy_bits'], path)
  return grouping.groups


# config.grouping: declared with the code that reads it (config/schema.py collects it)
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


SECTION = Section('grouping', (
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
