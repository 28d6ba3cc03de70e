"""WiMA's window: its config section and the ring buffer of the last W models (thesis Section 4.5, Eq. 4.12).

Declared here, below the batched runs (core/runs.py), because the window is a per-run value of a batched
program: runs that differ only in `wima.window` share one program when they share the buffer's capacity
(`wima.buffer`: the largest window of a window grid; 0 = the run's own window, a program per window). The
wrapper that averages any algorithm's models is algorithms/wrappers/wima.py.

  push:  j = count mod W;  S <- S - B[j] + w;  B[j] <- w;  every W pushes S is summed again from B[:W]
  mean:  S / min(max(count, 1), W)

with a buffer of capacity >= W whose slots >= W stay zero (never written). W may be a traced per-run value; so
may the subset of parameters averaged when the buffer holds them all (`wima.buffer_all`: a mask when read).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import RESULT, VALUE, Choice, Field, Flag, Int, Section, String


SUBSETS = ('all', 'classifier', 'features')


def _check(cfg) -> None:
  w = cfg.wima
  if w.enabled and int(w.get('buffer', 0)) and int(w.buffer) < int(w.window):
    raise ConfigError('wima.buffer', w.buffer, f'must hold the window: >= wima.window={w.window} (0: the window)')


SECTION = Section('wima', (
    Field('enabled', Flag(False), 'window model averaging (WiMA)'),
    Field('window', Int(100, lo=1), 'W: the last W server models averaged', {VALUE}),
    Field('buffer', Int(0, lo=0), 'the ring buffer\'s capacity (0 = the window); a window grid whose runs set it '
          'to the largest window shares one batched program'),
    Field('subset', Choice('all', SUBSETS, sort=True),
          "the parameters averaged: 'all' | 'classifier' | 'features'", {VALUE}),
    Field('buffer_all', Flag(False), 'buffer every parameter and apply wima.subset as a mask when the average is '
          'read (same averages; W copies of the whole model): a subset grid whose runs set it shares one batched '
          'program'),
    Field('classifier', String('', message="must be a string ('' = auto)"),
          "top-level module of the classifier for wima.subset; '' = auto"),
), check=_check, tags={RESULT}, doc='window averaging of the server models (WiMA)')

# A VALUE field that sizes an array when the field named here is 0: it stays static (and in the compatibility
# key) then, since an array's shape cannot be a per-run value (core/runs.py reads this). The subset chooses the
# buffered parameters unless every parameter is buffered (wima.buffer_all).
SIZED_BY = {'wima.window': 'wima.buffer', 'wima.subset': 'wima.buffer_all'}
# A VALUE field whose values are names: traced as the name's index here (core/runs.run_values).
CODES = {'wima.subset': SUBSETS}


def capacity(wcfg) -> int:
  """The buffer's slots: wima.buffer, or the window itself (a static int then)."""
  return int(wcfg.get('buffer', 0)) or int(wcfg.window)


def push(buf, tot, count, new, window):
  """One model into the window: (buffer, running sum) of flat {path: leaf} dicts -> the new pair."""
  j = jnp.mod(count, window)
  out_buf, out_tot = {}, {}
  for p in buf:
    leaving = jax.lax.dynamic_index_in_dim(buf[p], j, 0, keepdims=False)
    out_buf[p] = jax.lax.dynamic_update_index_in_dim(buf[p], new[p].astype(buf[p].dtype), j, 0)
    out_tot[p] = tot[p] - leaving + new[p]
  # Exact re-sum when the ring wraps (j == W-1: the first W slots hold exactly the last W models); float32 drift
  # of the running sum stays bounded over thousands of rounds.
  return out_buf, jax.lax.cond(j == window - 1, lambda: {p: _window_sum(out_buf[p], window) for p in out_buf},
                               lambda: out_tot)


def _window_sum(b, window):
  if isinstance(window, int) and window == b.shape[0]:
    return jnp.sum(b, axis=0)                     # the buffer is the window (the run's own program)
  mask = (jnp.arange(b.shape[0]) < window).reshape((-1,) + (1,) * (b.ndim - 1))
  return jnp.sum(jnp.where(mask, b, jnp.zeros_like(b)), axis=0)


def mean(tot, count, window):
  """The window's average from the running sum: S / min(max(count, 1), W)."""
  denom = jnp.minimum(jnp.maximum(count, 1), window).astype(jnp.float32)
  return {p: s / denom.astype(s.dtype) for p, s in tot.items()}
