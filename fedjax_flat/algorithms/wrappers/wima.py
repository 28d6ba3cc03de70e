"""WiMA, window-based model averaging (thesis Section 4.5, Eq. 4.12): `with_wima(alg, config)`.

The evaluated model is the uniform average of the last W global models produced by ANY algorithm / server
optimizer; the clients keep receiving the algorithm's own global model (the thesis' derivation, Eq. 4.13,
treats WiMA as a side average over an unchanged chain). Usable from round 0.

  after the server update of round t (global model w^{t+1}), with a ring buffer B[0..W-1] and a sum S:
      j = t mod W
      S <- S - B[j] + w^{t+1}          (B[j] is the model leaving the window; zeros while the window fills)
      B[j] <- w^{t+1}
      w_WiMA = S / min(t + 1, W)       = mean of {w^{max(1, t-W+2)}, ..., w^{t+1}}

Before the window is full (t + 1 < W models seen) w_WiMA is the mean of all global models so far,
w^1..w^{t+1} (the thesis leaves t < W unspecified; this is the natural running mean). The initial model
w^0 is never part of the window. Every W rounds (when the ring wraps around) S is recomputed exactly from
the buffer (a lax.cond, so it costs O(W) model adds once per W rounds) to stop float32 drift of the
running sum over thousands of rounds.

wima.subset (thesis Table 4.25; with wima.buffer_all every parameter is buffered and the subset chosen when the
average is read, so that a subset grid is one batched program):
  'all'         every parameter is averaged;
  'classifier'  only the classifier (the output Dense layer) is averaged, the rest is the current global model;
  'features'    everything but the classifier is averaged, the classifier is the current global model.
The classifier is the top-level module named by `wima.classifier`; '' = auto: the module named
'classifier' if there is one, else the last top-level module holding a 'kernel', in the creation order of
the freshly initialized parameters (MLP: Dense_1, CIFAR CNN: Dense_2). Only the averaged parameters are
buffered, so 'classifier' costs W copies of the classifier only.

The wrapped server state is the algorithm's state dict plus the key 'wima' = {'buf', 'sum', 'count'}; buf
and sum are nested dicts like the parameters restricted to the averaged leaves (buf leaves have a leading
wima.buffer or W). The ring buffer's arithmetic and config.wima live in core/window_average.py, below the
batched runs: W is a per-run value there (a window grid with wima.buffer = its largest W is one program).
"""
from __future__ import annotations

import flax.traverse_util
import jax.numpy as jnp

from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers.server_entry import with_server_entry
from fedjax_flat.core import window_average
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.core.runs import RunValue
from fedjax_flat.core.window_average import SECTION  # noqa: F401  (config.wima, declared with its ring buffer)

KEY = 'wima'
SEP = '/'
SUBSETS = window_average.SUBSETS


def _flatten(params, sep=SEP):
  return flax.traverse_util.flatten_dict(params, sep=sep)


def _tuple(path):
  return tuple(path.split(SEP))


def classifier_key(params, override: str = '') -> str:
  """Top-level key of the classifier module (see the module docstring)."""
  keys = list(params.keys())
  if override:
    if override not in params:
      raise ValueError(f'wima.classifier={override!r} is not a top-level parameter module; have {keys}')
    return override
  if 'classifier' in params:
    return 'classifier'
  with_kernel = [k for k in keys if any(p.split(SEP)[-1] == 'kernel' for p in _flatten({k: params[k]}))]
  if not with_kernel:
    raise ValueError(f'cannot find the classifier among the top-level modules {keys}; set wima.classifier')
  return with_kernel[-1]


def selected_paths(params, subset: str, classifier: str = '') -> list:
  """'/'-joined paths of the parameters WiMA averages."""
  if subset not in SUBSETS:
    raise ValueError(f'wima.subset={subset!r}; allowed: {SUBSETS}')
  paths = list(_flatten(params))
  if subset == 'all':
    return paths
  head = classifier_key(params, classifier)
  in_head = [p for p in paths if p.split(SEP)[0] == head]
  return in_head if subset == 'classifier' else [p for p in paths if p.split(SEP)[0] != head]


def subset_mask(params, subset, classifier: str = '') -> dict:
  """{'/'-joined path: whether WiMA averages it} for every parameter; subset is a name of SUBSETS or, in a batched
  program, its traced index (a bool scalar per path then)."""
  paths = list(_flatten(params))
  if isinstance(subset, str):
    chosen = set(selected_paths(params, subset, classifier))
    return {p: p in chosen for p in paths}
  head = classifier_key(params, classifier)
  code = jnp.round(subset).astype(jnp.int32)
  return {p: (code == 0) | (code == (1 if p.split(SEP)[0] == head else 2)) for p in paths}


def with_wima(alg: FederatedAlgorithm, config) -> FederatedAlgorithm:
  wcfg = config.wima
  window = wcfg.window
  if isinstance(window, RunValue):          # a per-run value of a batched program (traced float32): as an index
    window = jnp.round(window.value).astype(jnp.int32)
  slots = window_average.capacity(wcfg)
  # wima.buffer_all: every parameter is buffered and the subset is a mask when the average is read (the averages
  # are the same: each parameter's window sum is its own), so the subset may be a per-run traced value.
  buffer_all = bool(wcfg.get('buffer_all', False))
  subset = wcfg.subset.value if isinstance(wcfg.subset, RunValue) else str(wcfg.subset)
  classifier = str(wcfg.get('classifier', ''))
  last_phase = alg.num_phases - 1

  def init(inner, params, rng):
    del inner, rng
    flat = _flatten(params, sep=None)
    buffered = selected_paths(params, 'all' if buffer_all else subset, classifier)
    paths = [_tuple(p) for p in buffered]       # creation order of fresh params
    nest = flax.traverse_util.unflatten_dict
    return {'buf': nest({p: jnp.zeros((slots,) + flat[p].shape, flat[p].dtype) for p in paths}),
            'sum': nest({p: jnp.zeros_like(flat[p]) for p in paths}),
            'count': jnp.zeros((), jnp.int32)}

  def server_update(inner, w, agg, round_idx, phase=0):
    inner = alg.server_update(inner, agg, round_idx, phase)
    if phase != last_phase:
      return inner, w
    new = _flatten(alg.eval_models(inner)['global'][0], sep=None)
    buf, tot = window_average.push(_flatten(w['buf'], sep=None), _flatten(w['sum'], sep=None), w['count'], new,
                                   window)
    nest = flax.traverse_util.unflatten_dict
    return inner, {'buf': nest(buf), 'sum': nest(tot), 'count': w['count'] + 1}

  def wima_params(inner, w):
    params = alg.eval_models(inner)['global'][0]
    flat = dict(_flatten(params, sep=None))
    means = window_average.mean(_flatten(w['sum'], sep=None), w['count'], window)
    if buffer_all:
      mask = {_tuple(p): m for p, m in subset_mask(params, subset, classifier).items()}
      means = {p: (v if mask[p] is True else jnp.where(mask[p], v, flat[p])) for p, v in means.items()
               if mask[p] is not False}
    flat.update(means)
    return flax.traverse_util.unflatten_dict(flat)

  def eval_models(inner, w):
    models = dict(alg.eval_models(inner))
    models[KEY] = (wima_params(inner, w), w['count'] > 0)
    return models

  return with_server_entry(alg, KEY, init=init, server_update=server_update, eval_models=eval_models,
                           wrappers=alg.wrappers + (KEY,), reported_models=(KEY,) + alg.reported_models)


# Last: the window of the server's models, whatever made them.
FEATURE = features.register(features.Feature(
    KEY, order=50, switch='wima.enabled', enabled=lambda config: bool(config.wima.enabled),
    wrap=lambda alg, config, ctx: with_wima(alg, config)))
