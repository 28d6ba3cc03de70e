"""XLA:CPU's kernel path per machine: which library (none, oneDNN, XNNPACK, YNNPACK) runs the convolutions
and dots, chosen by measurement and kept per machine.

XLA:CPU reads its flags once, when a process opens the CPU backend, so a path is a set of XLA_FLAGS applied
before jax starts (the binaries do it in `devices.configure_or_exit`). `--cpu_path` (or FEDJAX_FLAT_CPU_PATH):

  default   nothing added: XLA:CPU's own choice for the installed jaxlib (bit-identical to earlier runs)
  auto      the path `benchmarks/speed/xla_paths.py --record` measured fastest on this machine (same CPU model,
            instruction set and jaxlib), kept in `record_path()` beside the compilation cache; `default` when
            this machine has no record, or its record names the default (the shipped behaviour)
  <name>    one of CANDIDATES

A path may also change the program jax traces rather than XLA's flags (`PROGRAM`): 'dense_direct' traces every
Dense layer's kernel gradient straight into [in, out] (models/layers.py `grad_impl`), which the one-client CPU
path otherwise computes as [out, in] and transposes: the same products, the same bits for plain SGD-family steps,
fp32 rounding where the step reduces over the gradient (SAM's norm, per-tensor DP clipping). It is read when the
model is traced, from this process's applied path (env FEDJAX_FLAT_CPU_PATH), so a sweep's children inherit it.

A recorded winner must compile another program than the default (parameters not bit-identical), beat it by
MARGIN on every measured workload and keep the parameters within 1e-5 (relative) of the default's after a
client's local steps; otherwise `default` is kept, so that a path wins only where it is clearly faster and its
results differ by fp32 rounding alone. A user's own XLA_FLAGS
naming any of these flags wins over every choice here. A checkpoint keeps `applied()` (the path, and XLA's
`--xla_cpu_max_isa` cap): a resume under another one is said to agree with the uninterrupted run to fp32 rounding.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
from typing import Mapping, MutableMapping, Optional

ENV = 'FEDJAX_FLAT_CPU_PATH'
FLAG = '--cpu_path'
MARGIN = 1.10            # a path must be this much faster than the default on every workload to be kept: two
                         # bit-identical programs in two worker processes differ by up to 4% (README.xla_paths.md)
EQUAL_RTOL = 1e-5        # and its parameters this close to the default's

# name -> XLA_FLAGS. The experimental flags exist in jaxlib 0.10.x; another jaxlib may reject one (the
# benchmark reports it; `auto` never applies a path that was not measured with the running jaxlib).
CANDIDATES = {
    'default': '',
    'onednn': '--xla_cpu_use_onednn=true',
    'onednn_cc': '--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true',
    'onednn_dot': '--xla_cpu_experimental_onednn_fusion_type=dot',
    'xnn_off': '--xla_cpu_use_xnnpack=false',
    'xnn_dot': '--xla_cpu_experimental_xnn_fusion_type=dot',
    'ynn_off': '--xla_cpu_experimental_ynn_fusion_type=',
    'ynn_conv': '--xla_cpu_experimental_ynn_fusion_type=+individual_convolution',
    'legacy_emitters': '--xla_cpu_use_fusion_emitters=false',
    'dense_direct': '',
}
# name -> the program options a path sets (read at trace time: `program_option`).
PROGRAM = {'dense_direct': {'dense_grad': 'direct'}}
_PATH_FLAGS = {f.split('=', 1)[0] for c in CANDIDATES.values() for f in c.split()}   # the flags a path sets
_ISA_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_bf16')


class CpuPathError(ValueError):
  """A bad --cpu_path / FEDJAX_FLAT_CPU_PATH value."""


def flags_of(name: str) -> str:
  if name not in CANDIDATES:
    raise CpuPathError(f'{FLAG}={name}: unknown path; use auto, or one of {", ".join(CANDIDATES)}')
  return CANDIDATES[name]


def program_option(key: str, default: str, env: Mapping[str, str] = os.environ) -> str:
  """A program option of the path this process applied (env[ENV], set by `configure`), else `default`."""
  return PROGRAM.get(env.get(ENV, '').strip(), {}).get(key, default)


def isa(cpuinfo: str = '/proc/cpuinfo') -> dict:
  """The CPU model and the vector instruction sets XLA:CPU cares about (x86 flags; the machine type elsewhere)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith('model name') and ':' in line:
          model = line.split(':', 1)[1].strip()
        elif line.startswith('flags') and ':' in line:
          flags = set(line.split(':', 1)[1].split())
          break
  except OSError:
    pass
  return {'model': model, 'machine': platform.machine(), 'features': [f for f in _ISA_FLAGS if f in flags]}


def max_isa(env: Mapping[str, str] = os.environ) -> str:
  """XLA_FLAGS' `--xla_cpu_max_isa` (the last one wins), '' when not set. It caps the instruction set of the code
  XLA:CPU emits itself (the fused elementwise loops), not of its GEMM / convolution libraries, which pick their
  kernels from the CPU's own flags: measured on an AVX-512 EPYC, GEMM 304 / 326 / 307 GFLOP/s with no cap / AVX2 /
  SSE4_2 (benchmarks/speed/README.xla_paths.md, isa_caps.py). So an AVX-512 machine under the cap is not an AVX2
  machine."""
  value = ''
  for f in env.get('XLA_FLAGS', '').split():
    if f.startswith('--xla_cpu_max_isa='):
      value = f.split('=', 1)[1].strip().upper()
  return value


def _user_path_flags(xla_flags: str, own: str = '') -> list:
  """The flags in `xla_flags` that set a path's flag, less the applied path's `own` flags."""
  return [f for f in xla_flags.split() if f.split('=', 1)[0] in _PATH_FLAGS and f not in own.split()]


def applied(env: Mapping[str, str] = os.environ) -> str:
  """The kernel path this process runs under, as a label a checkpoint keeps: a CANDIDATES name ('default' when
  nothing was configured), 'user: FLAGS' when the user's XLA_FLAGS name a path's flag, plus ' max_isa=X'."""
  name = env.get(ENV, '').strip()
  user = _user_path_flags(env.get('XLA_FLAGS', ''), CANDIDATES.get(name, ''))
  label = f"user: {' '.join(user)}" if user else (name if name in CANDIDATES else 'default')
  cap = max_isa(env)
  return f'{label} max_isa={cap}' if cap else label


def machine_key(jaxlib_version: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
  """What a record is valid for: CPU model, instruction sets (and XLA's --xla_cpu_max_isa cap, which changes the
  emitted code), jaxlib version (read from its metadata, so jax is not started)."""
  if jaxlib_version is None:
    try:
      from importlib import metadata
      jaxlib_version = metadata.version('jaxlib')
    except Exception:  # noqa: BLE001 (no jaxlib metadata: the record is still keyed by the machine)
      jaxlib_version = '?'
  i, cap = isa(), max_isa(env)
  features = ','.join(i['features']) + (f' max_isa={cap}' if cap else '')
  return f"{i['model']}|{i['machine']}|{features}|jaxlib {jaxlib_version}"


def cache_home(env: Mapping[str, str] = os.environ) -> str:
  """$XDG_CACHE_HOME/fedjax_flat, else ~/.cache/fedjax_flat: where the compilation cache and this record live."""
  base = env.get('XDG_CACHE_HOME', '').strip() or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'fedjax_flat')


def record_path(env: Mapping[str, str] = os.environ) -> str:
  """cache_home()/cpu_paths.json, beside the compilation cache's xla/."""
  return os.path.join(cache_home(env), 'cpu_paths.json')


def _load(path: str) -> dict:
  try:
    with open(path) as f:
      rec = json.load(f)
    return rec if isinstance(rec, dict) else {}
  except (OSError, ValueError):
    return {}


def recorded(env: Mapping[str, str] = os.environ, key: Optional[str] = None) -> Optional[str]:
  """The path kept for this machine, or None."""
  entry = _load(record_path(env)).get(key or machine_key(env=env))
  name = entry.get('path') if isinstance(entry, dict) else None
  return name if name in CANDIDATES else None


def keep(name: str, env: Mapping[str, str] = os.environ, key: Optional[str] = None, evidence=None) -> str:
  """Writes `name` as this machine's path (atomically); returns the record's file."""
  flags_of(name)
  path = record_path(env)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rec = _load(path)
  rec[key or machine_key(env=env)] = {'path': name, 'flags': CANDIDATES[name], 'evidence': evidence or {}}
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.cpu_paths-')
  with os.fdopen(fd, 'w') as f:
    json.dump(rec, f, indent=1)
  os.replace(tmp, path)
  return path


def choose(rows: Mapping[str, Mapping[str, dict]], paths) -> str:
  """The measured winner from the benchmark's table: rows maps a workload to its columns, the column
  'PATH|im2col' holding {'examples_per_s', 'max_rel_diff'}. A path wins when it is >= MARGIN x the default on
  every workload and equal within EQUAL_RTOL; among winners the best geometric-mean speed-up; else 'default'.
  A path whose parameters are bit-identical to the default's on every workload ('bit_equal') compiled the same
  program: any speed difference is noise, so it never wins."""
  best, best_gain = 'default', 1.0
  for p in paths:
    if p == 'default':
      continue
    mine = [r.get(f'{p}|im2col') or {} for r in rows.values()]
    if mine and all(m.get('bit_equal') for m in mine):
      continue
    gains = []
    for r in rows.values():
      base, mine = r.get('default|im2col'), r.get(f'{p}|im2col')
      if not base or not mine or mine.get('max_rel_diff', 1.0) > EQUAL_RTOL:
        gains = []
        break
      gains.append(mine['examples_per_s'] / base['examples_per_s'])
    if gains and min(gains) >= MARGIN:
      gain = math.exp(sum(math.log(g) for g in gains) / len(gains))
      if gain > best_gain:
        best, best_gain = p, gain
  return best


def resolve(value: str, env: Mapping[str, str] = os.environ) -> tuple:
  """(path name, why) for a --cpu_path value."""
  value = value.strip()
  if value == 'auto':
    kept = recorded(env)
    if kept:
      return kept, f'auto: measured fastest on this machine ({record_path(env)})'
    return 'default', 'auto: no measurement kept for this machine (benchmarks/speed/xla_paths.py --record)'
  flags_of(value)
  return value, f'{FLAG}={value}'


def configure(value: Optional[str] = None, env: MutableMapping[str, str] = os.environ,
              jax_started: Optional[bool] = None) -> dict:
  """Applies the path to env['XLA_FLAGS'] (before jax starts); returns the record for config.json.

  value None: env[ENV], else 'auto'. A user's XLA_FLAGS that already name one of the candidates' flags win.
  """
  jax_started = ('jax' in sys.modules) if jax_started is None else jax_started
  value = value if value is not None else (env.get(ENV, '').strip() or 'auto')
  name, why = resolve(value, env)
  flags = CANDIDATES[name]
  user = env.get('XLA_FLAGS', '')
  if _user_path_flags(user):
    return {'path': 'user', 'why': 'XLA_FLAGS set by the user name a kernel-path flag', 'xla_flags': ''}
  if jax_started and flags:
    return {'path': 'default', 'why': why + ' (jax already started: nothing applied)', 'xla_flags': ''}
  if flags:
    env['XLA_FLAGS'] = f'{user} {flags}'.strip()
  env[ENV] = name        # the children (a sweep's runs) make the same choice
  return {'path': name, 'why': why, 'xla_flags': flags}
