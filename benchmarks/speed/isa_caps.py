r"""Can a machine with AVX-512 stand in for one without? What the instruction-set caps of XLA:CPU and torch change.

Each stack is run in a subprocess per cap (the caps are read when a library starts), timing three kernels
that the CNN rounds spend their time in:

  gemm         fp32 2048^3 matmul (GFLOP/s, best of 5)
  conv_grad    the gradient of two 3x3 convolutions (3->32->64 channels) on a 10x32x32x3 batch (ms, median of 30):
               the pfl CNN's first block at its client batch size
  elementwise  tanh(v) * exp(v) + v * v over 4096^2 floats (ms, median of 10): a fused loop the compiler emits

Caps: XLA `XLA_FLAGS=--xla_cpu_max_isa=AVX2|SSE4_2`; torch `ATEN_CPU_CAPABILITY=avx2|default` with
`ONEDNN_MAX_CPU_ISA` and `MKL_ENABLE_INSTRUCTIONS` at the same level. If a stack's GEMM and convolution
rates do not drop under its cap, its libraries pick their kernels from the CPU's own flags, and timing it under
the cap does not reproduce a machine that lacks the instructions.

  .venv/bin/python -m benchmarks.speed.isa_caps [--out=benchmarks/speed/isa_caps_cpu] [--stacks=xla,torch] [--smoke]

writes PREFIX.json and PREFIX.md (machine, ISA, uptime before and after).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.paths import REPO
from benchmarks.speed import bench_util
from fedjax_flat import cpu_paths

XLA_CAPS = {'none': {}, 'AVX2': {'XLA_FLAGS': '--xla_cpu_max_isa=AVX2'},
            'SSE4_2': {'XLA_FLAGS': '--xla_cpu_max_isa=SSE4_2'}}
TORCH_CAPS = {'none': {},
              'AVX2': {'ATEN_CPU_CAPABILITY': 'avx2', 'ONEDNN_MAX_CPU_ISA': 'AVX2', 'MKL_ENABLE_INSTRUCTIONS': 'AVX2'},
              'SSE4_2': {'ATEN_CPU_CAPABILITY': 'default', 'ONEDNN_MAX_CPU_ISA': 'SSE41',
                         'MKL_ENABLE_INSTRUCTIONS': 'SSE4_2'}}

# The child programs: print one JSON line {gemm_gflops, conv_grad_ms, elementwise_ms, isa}.
_XLA_CHILD = r'''
import json, statistics, sys, time
import jax, jax.numpy as jnp
N, E, R = map(int, sys.argv[1:4])
def best(f, *a, n=5):
  jax.block_until_ready(f(*a)); ts = []
  for _ in range(n):
    t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
  return ts
a = jnp.ones((N, N))
gemm = 2 * N ** 3 / min(best(jax.jit(lambda a, b: a @ b), a, a)) / 1e9
dn = ('NHWC', 'HWIO', 'NHWC')
def loss(ks, x):
  y = jax.nn.relu(jax.lax.conv_general_dilated(x, ks[0], (1, 1), 'SAME', dimension_numbers=dn))
  y = jax.nn.relu(jax.lax.conv_general_dilated(y, ks[1], (1, 1), 'SAME', dimension_numbers=dn))
  return (y ** 2).mean()
ks = (jnp.ones((3, 3, 3, 32)) * 0.1, jnp.ones((3, 3, 32, 64)) * 0.1); x = jnp.ones((10, 32, 32, 3))
conv = 1e3 * statistics.median(best(jax.jit(jax.grad(loss)), ks, x, n=3 * R))
v = jnp.ones((E, E)) * 0.5
elem = 1e3 * statistics.median(best(jax.jit(lambda v: jnp.tanh(v) * jnp.exp(v) + v * v), v, n=R))
print(json.dumps({'gemm_gflops': gemm, 'conv_grad_ms': conv, 'elementwise_ms': elem, 'isa': 'xla: ' + jax.__version__}))
'''
_TORCH_CHILD = r'''
import json, statistics, sys, time
import torch
N, E, R = map(int, sys.argv[1:4])
def best(f, n=5):
  f(); ts = []
  for _ in range(n):
    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
  return ts
a = torch.ones(N, N)
gemm = 2 * N ** 3 / min(best(lambda: a @ a)) / 1e9
c1, c2 = torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.Conv2d(32, 64, 3, padding=1)
x = torch.ones(10, 3, 32, 32)
def step():
  c1.zero_grad(); c2.zero_grad()
  (torch.relu(c2(torch.relu(c1(x)))) ** 2).mean().backward()
conv = 1e3 * statistics.median(best(step, n=3 * R))
v = torch.ones(E, E) * 0.5
with torch.no_grad():
  elem = 1e3 * statistics.median(best(lambda: torch.tanh(v) * torch.exp(v) + v * v, n=R))
print(json.dumps({'gemm_gflops': gemm, 'conv_grad_ms': conv, 'elementwise_ms': elem,
                  'isa': 'torch ' + torch.__version__ + ': ' + torch.backends.cpu.get_cpu_capability()}))
'''


def _child(python: str, program: str, env: dict, sizes) -> dict:
  base = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS',) + bench_util.ISA_CAP_ENV}
  p = subprocess.run([python, '-c', program, *map(str, sizes)], env={**base, **env}, cwd=REPO,
                     capture_output=True, text=True, timeout=900)
  if p.returncode != 0:
    return {'error': p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f'exit {p.returncode}'}
  return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', default=os.path.join(bench_util.SPEED, 'isa_caps_cpu'))
  ap.add_argument('--stacks', default='xla,torch')
  ap.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script end to end')
  a = ap.parse_args(argv)
  sizes = (128, 256, 2) if a.smoke else (2048, 4096, 10)   # GEMM n, elementwise n, repeats
  stacks = [s for s in a.stacks.split(',') if s]
  res = {'cpu': bench_util.cpu_model(), 'isa': cpu_paths.isa()['features'], 'cpus': os.cpu_count(), 'smoke': a.smoke,
         'uptime': [bench_util.uptime()], 'rows': []}
  for stack in stacks:
    python, program, caps = ((sys.executable, _XLA_CHILD, XLA_CAPS) if stack == 'xla'
                             else (bench_util.torch_python(), _TORCH_CHILD, TORCH_CAPS))
    for cap, env in caps.items():
      row = {'stack': stack, 'cap': cap, 'env': env, **_child(python, program, env, sizes)}
      print(json.dumps(row), flush=True)
      res['rows'].append(row)
  res['uptime'].append(bench_util.uptime())
  L = [f"# Instruction-set caps: {res['cpu']} x{res['cpus']} ({', '.join(res['isa'])})", '',
       f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
       'SMOKE RUN (tiny sizes, not a measurement)' if a.smoke else '', '',
       '| stack | cap | GEMM GFLOP/s | conv grad ms | elementwise ms | reported | env |',
       '|---|---|---:|---:|---:|---|---|']
  for r in res['rows']:
    if 'error' in r:
      L.append(f"| {r['stack']} | {r['cap']} | error: {r['error']} | | | | |")
      continue
    env = ' '.join(f'{k}={v}' for k, v in r['env'].items()) or '-'
    L.append(f"| {r['stack']} | {r['cap']} | {r['gemm_gflops']:.0f} | {r['conv_grad_ms']:.2f} | "
             f"{r['elementwise_ms']:.1f} | {r['isa']} | `{env}` |")
  bench_util.write_report(a.out, res, lambda _: '\n'.join(L) + '\n')


if __name__ == '__main__':
  main()
