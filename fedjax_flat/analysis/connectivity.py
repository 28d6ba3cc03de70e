"""Mode connectivity: the loss barrier along the linear path between two models and along a trained quadratic
Bezier curve.

  loss_barrier(eval_fn, w1, w2, n)   along w(t) = (1 - t) w1 + t w2, t in linspace(0, 1, n) (landscape.
                                     interpolate_1d): barrier = max_t [L(w(t)) - ((1 - t) L(w1) + t L(w2))]
                                     (Frankle et al. 2020, "Linear Mode Connectivity and the Lottery Ticket
                                     Hypothesis": the rise above the straight line between the end losses), and
                                     max_loss = max_t L(w(t)), the raw height
  bezier_point(w1, theta, w2, t)     phi_theta(t) = (1 - t)^2 w1 + 2 t (1 - t) theta + t^2 w2 (Garipov et al.
                                     2018, "Loss Surfaces, Mode Connectivity, and Fast Ensembling of DNNs", Eq. 2's
                                     quadratic Bezier with the ends fixed)
  bezier_curve(loss_fn, w1, w2, ...) trains the middle control point theta from (w1 + w2) / 2: each step samples
                                     t ~ U(0, 1) and takes an optax step on loss_fn(phi_theta(t)) (their Eq. 3's
                                     stochastic estimate of E_t L(phi_theta(t))); then the barrier along the
                                     trained curve, as `loss_barrier` measures it along the line
  barrier_table(eval_fn, clients, global, n) / barrier_markdown(rows)
                                     the barrier between every pair of client models and each client and the
                                     global model (experiments/hessian.py --connectivity)

`eval_fn(params) -> (loss, accuracy)` (or a scalar loss) as the rest of the package (`hvp.make_eval_fn`);
`loss_fn(params, key) -> scalar` is the training loss of one step (e.g. the loss over a fixed set of batches, the
key unused, or over a batch the key draws).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from fedjax_flat.analysis._util import as_partial
from fedjax_flat.analysis.landscape import _split_eval, _to_jnp, interpolate_1d

PyTree = Any


def _barrier(ts, loss) -> dict:
  ts, loss = np.asarray(ts, np.float64), np.asarray(loss, np.float64)
  rise = loss - ((1.0 - ts) * loss[0] + ts * loss[-1])
  i = int(np.argmax(rise))
  return {'barrier': float(rise[i]), 't_barrier': float(ts[i]), 'max_loss': float(np.max(loss)),
          'end_losses': (float(loss[0]), float(loss[-1]))}


def loss_barrier(eval_fn: Callable, w1: PyTree, w2: PyTree, n: int = 21, *, chunk_size: int = 1) -> dict:
  """The linear path's loss at n points of [0, 1] ('ts', 'loss', 'accuracy' when eval_fn returns it) with
  'barrier' (Frankle et al. 2020; 0 when the loss never rises above the line between the ends), 't_barrier', the
  raw 'max_loss' and the 'end_losses'."""
  if int(n) < 2:
    raise ValueError(f'n={n}: the path needs at least its two ends (n >= 2)')
  res = interpolate_1d(eval_fn, w1, w2, np.linspace(0.0, 1.0, int(n)), chunk_size=chunk_size)
  ts = res.pop('alphas')
  return {'ts': ts, **res, **_barrier(ts, res['loss'])}


def bezier_point(w1: PyTree, theta: PyTree, w2: PyTree, t) -> PyTree:
  """phi_theta(t) = (1 - t)^2 w1 + 2 t (1 - t) theta + t^2 w2."""
  return jax.tree_util.tree_map(
      lambda a, b, c: ((1 - t) ** 2 * a + 2 * t * (1 - t) * b + t ** 2 * c).astype(a.dtype), w1, theta, w2)


@functools.partial(jax.jit, static_argnames=('steps', 'tx'))
def _train(loss_fn, w1, w2, key, *, steps, tx):
  theta = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, w1, w2)

  def step(carry, k):
    th, opt = carry
    kt, kl = jax.random.split(k)
    t = jax.random.uniform(kt)
    loss, g = jax.value_and_grad(lambda p: loss_fn(bezier_point(w1, p, w2, t), kl))(th)
    upd, opt = tx.update(g, opt, th)
    return (optax.apply_updates(th, upd), opt), loss
  (theta, _), losses = lax.scan(step, (theta, tx.init(theta)), jax.random.split(key, steps))
  return theta, losses


@jax.jit
def _curve_eval(eval_fn, w1, theta, w2, ts):
  return lax.map(lambda t: eval_fn(bezier_point(w1, theta, w2, t)), ts)


def bezier_curve(loss_fn: Callable, eval_fn: Callable, w1: PyTree, w2: PyTree, key, *, steps: int = 200,
                 lr: float = 1e-2, n: int = 21, optimizer: optax.GradientTransformation = None) -> dict:
  """Trains the Bezier curve's middle point (Garipov et al. 2018) for `steps` steps of `optimizer` (default
  Adam(lr)) and measures it: {'theta', 'train_loss' [steps], 'ts', 'loss', ('accuracy'), 'barrier', 't_barrier',
  'max_loss', 'end_losses'} along phi_theta(t) at n points of [0, 1]."""
  if int(steps) < 1 or int(n) < 2:
    raise ValueError(f'steps={steps}, n={n}: need steps >= 1 and n >= 2')
  tx = optimizer if optimizer is not None else optax.adam(float(lr))
  w1, w2 = _to_jnp(w1), _to_jnp(w2)
  theta, losses = _train(as_partial(loss_fn), w1, w2, key, steps=int(steps), tx=tx)
  ts = np.linspace(0.0, 1.0, int(n))
  res = _split_eval(_curve_eval(as_partial(eval_fn), w1, theta, w2, jnp.asarray(ts, jnp.float32)))
  return {'theta': theta, 'train_loss': np.asarray(losses), 'ts': ts, **res, **_barrier(ts, res['loss'])}


def barrier_table(eval_fn: Callable, clients: dict, global_params: PyTree = None, n: int = 21) -> list:
  """`loss_barrier` between every pair of `clients` ({name: params}) and between each client and
  `global_params` (when given): rows {'a', 'b', 'barrier', 'max_loss', 't_barrier', 'end_losses', 'ts', 'loss'}."""
  names = list(clients)
  pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
  pairs += [(a, 'global') for a in names] if global_params is not None else []
  models = {**clients, 'global': global_params}
  rows = []
  for a, b in pairs:
    r = loss_barrier(eval_fn, models[a], models[b], n)
    rows.append({'a': a, 'b': b, **{k: r[k] for k in ('barrier', 'max_loss', 't_barrier', 'end_losses')},
                 'ts': np.asarray(r['ts']).tolist(), 'loss': np.asarray(r['loss']).tolist()})
  return rows


def barrier_markdown(rows: list) -> str:
  """The rows of `barrier_table` as a Markdown table (the paths' curves left out)."""
  out = ['| path | barrier | max loss | t at the barrier | end losses |', '|---|---:|---:|---:|---|']
  for r in rows:
    out.append(f"| {r['a']} - {r['b']} | {r['barrier']:.4f} | {r['max_loss']:.4f} | {r['t_barrier']:.2f} | "
               f"{r['end_losses'][0]:.4f}, {r['end_losses'][1]:.4f} |")
  return '\n'.join(out) + '\n'
