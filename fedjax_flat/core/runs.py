"""Many runs in one compiled program: the existing block of rounds (core/rounds.py) vmapped over a runs axis.

R runs whose programs have the same structure and differ only in values (the seed, client / server learning
rates, momentum, weight decay, SAM / ASAM radius, SWA's learning rates, WiMA's window when `wima.buffer` holds
the largest and its subset when `wima.buffer_all` buffers every parameter, DP's clip and noise, the data partition,
client sizes and number of clients, the virtual clock's numbers: each lane's step limits, the attackers' fraction
and strength) execute as

  runs_block(values [R], server_states [R], stores [R], templates [R], data_runs [R], data_shared, keys [R],
             start_round, num_rounds[, limits [R]]) -> (server_states', stores', per-run per-round metrics [R, n, ...])

one `jax.vmap` of `rounds.make_block_fn(jit=False)` over R, sharded over the local devices along R when there
are several (`shard_map`: each device runs its R / D lanes; on CPU one host device per core keeps both cores
busy). The round program inside is the one a run alone executes: the algorithm is built by the same
`algorithms.registry.build_algorithm` from the run's config, except that the fields in `VALUE_FIELDS` are
traced per-run values (`RunValue`), so the one compiled program serves every run of the batch.

Why a value wrapper and not a second engine: the algorithms, optimizers and wrappers read their
hyperparameters from the config while they are built (`optax.sgd(client_cfg.lr, ...)`); handing them a
traced value in place of the float makes every use a traced computation without touching the algorithms.
`RunValue` refuses what would silently freeze one run's value into the shared program (`float()`, `int()`,
comparisons, truthiness of a field whose truth is not part of the program's structure), so a builder that
converts a value to Python fails loudly instead of giving every run the first run's value. Fields whose
zero / non-zero changes the program structure (momentum, weight decay: an optimizer stage or not) keep
their truth static: it is part of the compatibility key (`compat_key`), the value is traced.

Compatibility: two runs can share a program iff their configs are equal once `VALUE_FIELDS` are removed
(`compat_key`) and, after the data are loaded, their batch plans and data shapes agree (training/batched.py
splits a pack whose partitions give other shapes).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_flat.core import rounds as rounds_lib
from fedjax_flat.core import window_average
from fedjax_flat.data import attacks
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.optimizers import schedules
from fedjax_flat.optimizers import server as server_opt
from fedjax_flat.privacy import mechanism as dp_mechanism
from fedjax_flat.schema import INPUT, TRUTH, VALUE, tagged
from fedjax_flat.systems import clock as clock_lib
from fedjax_flat.systems import compress

# The fields a batched program treats specially, from the tags of the sections that declare them (fedjax_flat/
# schema.py): per-run traced values (VALUE) and the fields whose truth (zero or not) changes the program's
# structure, so that the truth stays in the compatibility key (TRUTH). The client / server optimizers and SWA's
# cyclic lr declare theirs in optimizers/, DP's clip and noise multiplier in privacy/mechanism.py, WiMA's window
# in core/window_average.py, the compressed uploads' fraction and bits in systems/compress.py (k and s are traced:
# a mask over the full-size ranking). A value that sizes an array unless another field does (window_average.SIZED_BY:
# the window, unless wima.buffer is set) stays static and in the key when that field is 0.
# The attackers' strength (data/attacks.py: attack.scale) is traced too.
_SECTIONS = (client_opt.SECTION, server_opt.SECTION, schedules.SWA_SECTION, window_average.SECTION,
             dp_mechanism.SECTION, compress.SECTION, attacks.SECTION)
VALUE_FIELDS = tagged(_SECTIONS, VALUE)
STATIC_TRUTH = tagged(_SECTIONS, TRUTH)
# 'seed' and the data partition ('data.num_clients', 'data.alpha', 'data.seed') never reach the round builder as
# config values: they select the run's key and its client index arrays, which are per-run inputs of the program
# (INPUT); a population K is each lane's traced count of clients (the sampler draws from its own K of a population
# padded to the pack's largest, `make_runs_block_fn(population_size=)`; algorithms scaling by N read it); so do
# the virtual clock's numbers (deadline, speeds' spread, availability rate, dropout, bandwidths: systems/clock.py
# tags them): the host computes each run's schedule from them and the program takes its step limits per lane.
# So do attack.fraction (it draws the run's attackers, whose flags are its own client-state rows, written on the
# host by the attack wrapper's initial_client_states as when the run trains alone) and the label-flipping fields
# (the run's own labels, flipped on the host: its lane's data).
# Fields that do not change the computation nor the blocks of rounds (LOG: how often the host logs). The seed's and
# the partition's are declared above this layer (config/schema.py, config/data_fields.py): tests/config/
# test_schema.py checks these equal their tags.
INPUT_FIELDS = (('seed',) + tagged((clock_lib.SECTION, attacks.SECTION), INPUT)
                + ('data.num_clients', 'data.alpha', 'data.seed'))
# Neither do the published numbers a cell is compared with (config.published: each paper-table cell has its own),
# nor the host's evaluations at evaluation rounds that leave the model alone: every client evaluated
# (evaluation/client_eval.py) and the landscape lab (analysis/lab.py), whole sections.
IGNORED_FIELDS = ('progress_every_s', 'client_eval', 'lab', 'published')
AXIS = 'runs'
POPULATION = 'num_clients'     # data_runs' per-lane population when the runs of a program have other ones


class RunValueError(TypeError):
  pass


def _arr(v):
  return v.value if isinstance(v, RunValue) else v


class RunValue:
  """A config value traced per run: behaves as a jnp scalar in arithmetic and in jnp functions.

  `bool()` answers the static truth shared by every run of the batch (STATIC_TRUTH fields only);
  float() / int() / comparisons raise: they would bake one run's value into the program of all runs.
  """
  __slots__ = ('value', 'field', 'truth')

  def __init__(self, value, field: str, truth: Optional[bool] = None):
    self.value, self.field, self.truth = value, field, truth

  def __jax_array__(self):
    return self.value

  def __bool__(self):
    if self.truth is None:
      raise RunValueError(f'{self.field} is a per-run traced value in a batched program; its truth value is '
                          'not static (add the field to core/runs.STATIC_TRUTH or drop it from VALUE_FIELDS)')
    return self.truth

  def _refuse(self, *a):
    raise RunValueError(f'{self.field} is a per-run traced value in a batched program: converting it to a '
                        'Python number would give every run the same value (use jnp operations)')

  __float__ = __int__ = __index__ = _refuse
  __lt__ = __le__ = __gt__ = __ge__ = _refuse

  def __repr__(self):
    return f'RunValue({self.field})'

  # Arithmetic: delegate to the traced array (jax defers to these for a type it does not know).
  def __neg__(self): return -self.value
  def __pos__(self): return self.value
  def __abs__(self): return abs(self.value)
  def __add__(self, o): return self.value + _arr(o)
  def __radd__(self, o): return _arr(o) + self.value
  def __sub__(self, o): return self.value - _arr(o)
  def __rsub__(self, o): return _arr(o) - self.value
  def __mul__(self, o): return self.value * _arr(o)
  def __rmul__(self, o): return _arr(o) * self.value
  def __truediv__(self, o): return self.value / _arr(o)
  def __rtruediv__(self, o): return _arr(o) / self.value
  def __pow__(self, o): return self.value ** _arr(o)
  def __rpow__(self, o): return _arr(o) ** self.value


def _get(cfg, dotted: str):
  for part in dotted.split('.'):
    if cfg is None or part not in cfg:
      return None
    cfg = cfg[part]
  return cfg


def _sizes_array(config, f: str) -> bool:
  """True when the value of field f is an array's size in this config (window_average.SIZED_BY)."""
  return f in window_average.SIZED_BY and not _get(config, window_average.SIZED_BY[f])


# Each VALUE field's `when` (schema.Field): a field its config does not read (attack.scale without a model-poisoning
# attack, a SAM variant's knob under plain SGD) is not traced, so a feature that is off adds nothing to the program.
_WHEN = {s.path(f): f.when for s in _SECTIONS for f in s.fields if VALUE in f.tags and f.when is not None}


def _read(config, f: str) -> bool:
  when = _WHEN.get(f)
  if when is None:
    return True
  try:
    return bool(when(config))
  except (AttributeError, KeyError):     # a partial config (a test's): the field counts as read
    return True


def present_value_fields(config) -> tuple:
  """The VALUE_FIELDS this config has (numbers, or names of window_average.CODES), reads (`_WHEN`) and traces
  (not those sizing an array: `_sizes_array`)."""
  def traced(v, f):
    if f in window_average.CODES:
      return isinstance(v, str)
    return isinstance(v, (int, float)) and not isinstance(v, bool)
  return tuple(f for f in VALUE_FIELDS
               if traced(_get(config, f), f) and not _sizes_array(config, f) and _read(config, f))


def run_values(config, fields: Sequence[str], num_leaves: int = 0) -> Dict[str, float]:
  """Each traced field's value for this run (a name: its index in window_average.CODES). num_leaves: the model's
  parameter arrays (a per-run target epsilon under dp.per_tensor is calibrated with them)."""
  code = lambda f, v: float(window_average.CODES[f].index(v)) if f in window_average.CODES else float(v)
  out = {f: code(f, _get(config, f)) for f in fields}
  if 'dp.noise_multiplier' in out and 'dp.target_epsilon' in out and config.dp.mode != 'off':
    # A per-run target epsilon: the run's noise multiplier is calibrated here, on the host, from the run's own
    # config (privacy/mechanism.noise_multiplier), and traced as its dp.noise_multiplier.
    out['dp.noise_multiplier'] = float(dp_mechanism.noise_multiplier(config, num_leaves=num_leaves))
  return out


def traced_config(config, values: Dict[str, Any]):
  """A copy of `config` whose `values` fields (dotted -> traced scalar) are RunValues. Not type-safe: the
  copy exists only while the batched program is traced."""
  d = config.to_dict()
  for f, v in values.items():
    node = d
    parts = f.split('.')
    for p in parts[:-1]:
      node = node[p]
    truth = bool(node[parts[-1]]) if f in STATIC_TRUTH else None
    node[parts[-1]] = RunValue(v, f, truth)
  return ml_collections.ConfigDict(d, type_safe=False)


def _jsonable(x):
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, dict):
    return {k: _jsonable(v) for k, v in x.items()}
  if isinstance(x, float) and not math.isfinite(x):
    return repr(x)
  return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)


def compat_key(config) -> str:
  """The config with the per-run fields removed (their static truth kept): equal keys -> one program. Whether
  the run has a virtual clock stays in the key (its program takes per-lane step limits; one without does not)."""
  d = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  if isinstance(d.get('system'), dict):
    d['system'] = {**d['system'], 'clock?': clock_lib.enabled(d)}
  for f in VALUE_FIELDS + INPUT_FIELDS + IGNORED_FIELDS:
    if _sizes_array(config, f):
      continue
    node, parts = d, f.split('.')
    for p in parts[:-1]:
      node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict) and parts[-1] in node:
      v = node.pop(parts[-1])
      if f in STATIC_TRUTH:
        node[parts[-1] + '?'] = bool(v)
  return json.dumps(_jsonable(d), sort_keys=True)


def runs_mesh(num_lanes: int, devices=None) -> Optional[Mesh]:
  """A 1-D mesh over the local devices along the runs axis (None: one device, or lanes not divisible)."""
  devices = list(devices if devices is not None else jax.local_devices())
  if len(devices) < 2 or num_lanes % len(devices):
    return None
  return Mesh(np.array(devices), (AXIS,))


def lanes_for(num_runs: int, num_devices: int) -> int:
  """Lanes of a program: the runs rounded up to a multiple of the devices (padding lanes are copies)."""
  d = max(int(num_devices), 1)
  return -(-int(num_runs) // d) * d


def make_runs_block_fn(build_round_fn: Callable[..., Callable], *, plan, num_clients: int,
                       clients_per_round: int, cohort: int, rounds_per_call: int, has_store: bool,
                       mesh: Optional[Mesh] = None, has_limits: bool = False, population_size: Optional[int] = None):
  """Jitted runs_block(values, server_states, stores, templates, data_runs, data_shared, keys, start, n[, limits]).

  build_round_fn(values, population) -> the un-jitted one-round program (engine.make_round_fn(jit=False)) of a run
  whose VALUE_FIELDS are `values` (dotted name -> traced scalar) and whose population is `population` (the static
  num_clients, or the lane's traced count). Leaves of every argument but data_shared, start and n carry the leading
  runs axis. has_limits: the runs have a virtual clock; `limits` is each lane's {'fit': [R, rounds_per_call,
  cohort], 'reports': ...} (rounds.make_block_fn's, per lane). population_size: the runs have other populations
  (data.num_clients): every per-client array is padded to this many clients (the pack's largest) and data_runs
  holds each lane's own count as 'num_clients' (int32), from which its sampler draws (padded clients are never
  sampled). Returns (server_states, stores, metrics) with metrics leaves [R, rounds_per_call, ...] as
  rounds.make_block_fn's with a leading R.
  """
  def one_run(values, server_state, store, template, data_runs, data_shared, key, start_round, num_rounds,
              limits=None):
    data_runs = dict(data_runs)
    k = num_clients if population_size is None else data_runs.pop(POPULATION)
    block = rounds_lib.make_block_fn(build_round_fn(values, k), plan=plan, num_clients=k,
                                     clients_per_round=clients_per_round, cohort=cohort,
                                     rounds_per_call=rounds_per_call, has_store=has_store, jit=False,
                                     population_size=population_size)
    return block(server_state, store, template, {**data_shared, **data_runs}, key, start_round, num_rounds,
                 limits)

  extra = (0,) if has_limits else ()
  batched = jax.vmap(one_run, in_axes=(0, 0, 0, 0, 0, None, 0, None, None) + extra)
  if mesh is not None:
    r, s = P(AXIS), P()
    batched = jax.shard_map(batched, mesh=mesh, in_specs=(r, r, r, r, r, s, r, s, s) + (r,) * len(extra),
                            out_specs=(r, r, r), check_vma=False)
  # No donation: the trainer dispatches the next block from these outputs while it still reads them
  # (training/batched.py pipelines the host's evaluation and writes with the next block).
  return jax.jit(batched)


def place(tree, mesh: Optional[Mesh]):
  """Stacked [R, ...] inputs sharded along R over the mesh (or left on the default device)."""
  if mesh is None:
    return tree
  return jax.device_put(tree, NamedSharding(mesh, P(AXIS)))


def replicate(tree, mesh: Optional[Mesh]):
  if mesh is None:
    return tree
  return jax.device_put(tree, NamedSharding(mesh, P()))


def stack(trees: Sequence[Any]):
  """[R, ...] leaves from R equal-structure pytrees (host numpy or device arrays; PRNG keys included)."""
  def st(*xs):
    if isinstance(xs[0], jax.Array) and jnp.issubdtype(xs[0].dtype, jax.dtypes.prng_key):
      return jnp.stack(xs)
    return np.stack([np.asarray(x) for x in xs])
  return jax.tree_util.tree_map(st, *trees)


def pad_rows(a, n: int):
  """Host array `a` with its leading axis padded to n rows of zeros (a pack's per-client arrays: rows past a run's
  own population or examples, which no index of the run reaches)."""
  a = np.asarray(a)
  if a.shape[0] >= n:
    return a
  return np.concatenate([a, np.zeros((n - a.shape[0],) + a.shape[1:], a.dtype)])


def unstack(tree, i: int):
  return jax.tree_util.tree_map(lambda a: a[i], tree)


def tree_nbytes(tree) -> int:
  return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(tree)
                 if hasattr(a, 'shape') and not jnp.issubdtype(a.dtype, jax.dtypes.prng_key)))


def estimate_run_bytes(*, server_state, store_arrays, batch_bytes: int, data_run_bytes: int) -> int:
  """Device bytes one lane adds to a batched program: its server state (in, out and the round's working
  copies: x4), its client-state store (in + out), one round's batches (gathered, augmented: x2) and its index
  arrays. An estimate for splitting packs, not a bound: activations of a step are a few batches' worth."""
  return (4 * tree_nbytes(server_state) + 2 * tree_nbytes(store_arrays) + 2 * int(batch_bytes)
          + int(data_run_bytes))


def device_memory_bytes() -> int:
  """Memory the runs may use: the accelerator's limit, or the host's physical memory on CPU."""
  dev = jax.local_devices()[0]
  try:
    stats = dev.memory_stats() or {}
  except Exception:  # noqa: BLE001 -- CPU devices have no memory stats
    stats = {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit']) * len(jax.local_devices())
  return int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
