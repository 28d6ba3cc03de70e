r"""What the virtual clock costs a round (issue 37): configs/quickstart.py's rounds (digits_cnn, 5 clients of the
embedded digits, B=16, E=1) through the run's own driver, with config.system off and with a clock that cuts no
work (log-normal speeds, no deadline: the same steps, plus the host schedule of every round and the masks), timed
interleaved in one process (round-robin, `--repeats`, median), on both round paths:

  host     HostDriver: one round per call, batches built on the host (the clock masks them there)
  device   DeviceDriver: blocks of `--block` rounds in one program (the clock's [rounds, cohort] limits passed in)

Ratio = median time(clock) / median time(off), wall and this process's CPU time (steadier on a shared machine).
`clock_deadline` (configs/system.py's deadline setting: steps cut by the deadline, so less work) is timed beside
them for information: its ratio is the work the deadline removes, not an overhead.

  python -m benchmarks.speed.system_overhead [--repeats=7] [--rounds=5] [--block=5] [--json=PATH]
"""
from __future__ import annotations

import argparse
import json
import time

from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from benchmarks.speed import bench_util  # noqa: E402
from configs import quickstart  # noqa: E402
from configs import system as system_configs  # noqa: E402
from fedjax_flat.data import registry as data_registry  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

VARIANTS = {'off': {}, 'clock': {'speed': 'lognormal', 'speed_sigma': 0.5},
            'clock_deadline': {**system_configs.CLOCK, **system_configs.SETTING['deadline']}}


def _trainer(variant: str, device: bool, data):
  c = quickstart.get_config()
  c.rounds, c.eval_every, c.progress_every_s = 100000, 100000, 1e9
  c.engine.device_data = device
  for k, v in VARIANTS[variant].items():
    c.system[k] = v
  return trainers.make_trainer(c, data=data)


def _timer(t, rounds: int, block: int, device: bool):
  def run():
    t0 = time.perf_counter()
    done = 0
    while done < rounds:
      n = min(block, rounds - done) if device else 1
      t.server_state, _ = t.driver.step(t.server_state, t.store, t.round, n, t.round + n)
      t.round += n
      done += n
    return (time.perf_counter() - t0) / rounds
  return run


def measure(path: str, repeats: int, rounds: int, block: int, data) -> dict:
  device = path == 'device'
  fns = {}
  for v in VARIANTS:
    t = _trainer(v, device, data)
    if device:
      assert t.plan.device_rounds, 'the device path must be taken'
    fns[v] = _timer(t, rounds, block, device)
    fns[v]()                            # compile
  cpu = {}
  wall = bench_util.interleave(fns, repeats, cpu_times=cpu)
  med, med_cpu, ratio_wall, ratio_cpu = bench_util.medians_and_ratios(wall, cpu, 'off', cpu_per=rounds)
  return {'path': path, 'repeats': repeats, 'rounds_per_call': rounds, 'block': block if device else 1,
          'median_s_per_round': med, 'median_cpu_s_per_round': med_cpu, 'ratio_wall': ratio_wall,
          'ratio_cpu': ratio_cpu}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--repeats', type=int, default=7)
  ap.add_argument('--rounds', type=int, default=5, help='rounds per timed call')
  ap.add_argument('--block', type=int, default=5, help='device path: rounds per block program call')
  ap.add_argument('--paths', default='host,device')
  ap.add_argument('--json', default='')
  a = ap.parse_args()
  c = quickstart.get_config()
  data = data_registry.get_dataset(c.dataset, **c.data.to_dict())
  res = {'machine': bench_util.machine_info(), 'host_devices': HOST_DEVICES and HOST_DEVICES.as_dict(),
         'results': [measure(p, a.repeats, a.rounds, a.block, data) for p in a.paths.split(',')]}
  for r in res['results']:
    print(f"{r['path']}: " + ', '.join(
        f"{k} {r['median_s_per_round'][k] * 1e3:.1f} ms/round (x{r['ratio_wall'][k]:.3f} wall, "
        f"x{r['ratio_cpu'][k]:.3f} cpu)" for k in VARIANTS))
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(res, f, indent=1)


if __name__ == '__main__':
  main()
