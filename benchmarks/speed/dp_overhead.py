r"""What client-level DP costs a round (issue 36): the engine's one-round program with config.dp off, central,
central with adaptive clipping and local, timed interleaved in one process (round-robin, `--repeats`, median),
on two settings:

  digits   configs/quickstart.py's round: digits_cnn, 5 clients of the embedded digits (B=16, E=1)
  cifar    the paper CIFAR round of benchmarks/speed/round_overhead.py: cifar_cnn, 10 clients x 500 synthetic
           32x32x3 examples (B=64, E=1, lr 0.01, wd 4e-4)

Ratio = median time(dp mode) / median time(off), in wall time and in this process's CPU time (steadier on a
shared machine). The DP work per round: a norm and a scale per client, one Gaussian draw of the model's size
(central: once on the server; local: once per client) and, adaptive, one count draw.

  python -m benchmarks.speed.dp_overhead [--repeats=7] [--settings=digits,cifar] [--json=PATH]
"""
from __future__ import annotations

import argparse
import json

from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from benchmarks.speed import bench_util  # noqa: E402
from configs import quickstart  # noqa: E402
from fedjax_flat.data import registry as data_registry  # noqa: E402
from fedjax_flat.data.sources.builtin import synthetic  # noqa: E402

MODES = {'off': {}, 'central': {'mode': 'central'}, 'central_adaptive': {'mode': 'central', 'adaptive': True,
                                                                          'noise_multiplier': 0.1},
         'local': {'mode': 'local'}}


def _setting(name):
  if name == 'digits':
    c = quickstart.get_config()
    data = data_registry.get_dataset(c.dataset, **c.data.to_dict())
    return c, data, int(data.num_classes)
  c = bench_util.round_config('cifar_cnn')
  sizes = [500] * 10
  return c, synthetic(10, sizes, input_shape=(32, 32, 3), num_classes=10, seed=0), 10


def measure(setting: str, repeats: int) -> dict:
  fns = {}
  for mode, dp in MODES.items():
    c, data, classes = _setting(setting)
    c.server.weighting = 'uniform'       # the same aggregation weights in every variant
    c.dp.delta = 1e-6
    for k, v in dp.items():
      c.dp[k] = v
    run, _ = bench_util.engine_round_variant(c, data, classes)
    run()                                # compile
    fns[mode] = run
  cpu = {}
  wall = bench_util.interleave(fns, repeats, cpu_times=cpu)
  med, med_cpu, ratio_wall, ratio_cpu = bench_util.medians_and_ratios(wall, cpu, 'off')
  return {'setting': setting, 'repeats': repeats, 'median_s': med, 'median_cpu_s': med_cpu, 'ratio_wall': ratio_wall,
          'ratio_cpu': ratio_cpu}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--repeats', type=int, default=7)
  ap.add_argument('--settings', default='digits,cifar')
  ap.add_argument('--json', default='')
  a = ap.parse_args()
  res = {'machine': bench_util.machine_info(), 'host_devices': HOST_DEVICES and HOST_DEVICES.as_dict(),
         'results': [measure(s, a.repeats) for s in a.settings.split(',')]}
  for r in res['results']:
    print(f"{r['setting']}: " + ', '.join(f"{k} {r['median_s'][k] * 1e3:.1f} ms (x{r['ratio_wall'][k]:.3f} wall, "
                                           f"x{r['ratio_cpu'][k]:.3f} cpu)" for k in MODES))
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(res, f, indent=1)


if __name__ == '__main__':
  main()
