r"""Throughput of a FedSeq round against a FedAvg round doing the same number of model updates.

Problems (C = 0.2 of the clients train one epoch per round in both; FedSeq: C N_S chains of K / N_S clients):
  digits      configs/fedseq_digits.py: digits CNN, 100 clients x 13-15 images, B = 16: FedAvg 20 clients x 1
              step, FedSeq 2 chains of 10 clients (N_S = 10)
  cifar_cnn   the FedSeq CIFAR CNN on CIFAR-shaped synthetic images, 50 clients x 100 images, B = 64: FedAvg 10
              clients x 2 steps, FedSeq 1 chain of 10 clients (N_S = 5)

Variants, each built, compiled and warmed up, then timed round-robin (`--repeats` times, median per round):
  program   the compiled round program alone on inputs already on the device (FedAvg: engine.make_round_fn, the
            host path's program; FedSeq: core/chains.make_chain_round_fn), `--rounds` rounds back to back
  train     Trainer.train(num_rounds=N) with evaluation off: FedAvg's default path (data on the device, blocks
            of rounds per call) vs FedSeq's (host lane layout prefetched on a thread, one round per call)
The ratio is FedSeq throughput / FedAvg throughput (rounds per second): the median over repetitions of the
paired ratio FedAvg time / FedSeq time (same process, interleaved, neighbours in time), by wall time and by
this process's CPU time (less sensitive to other processes on a shared machine); the local steps per round
of both are printed (they must be equal).

  python -m benchmarks.speed.fedseq_throughput [--problems=digits,cifar_cnn] [--rounds=30] [--repeats=5] [--json=PATH]
"""
from __future__ import annotations

import json
import os
import statistics
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from benchmarks.paths import REPO  # noqa: E402

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_flat.data.sources import builtin  # noqa: E402
from fedjax_flat.data import registry as data_registry  # noqa: E402
from fedjax_flat.config import families as config_strings  # noqa: E402
from fedjax_flat.training import loop, trainers  # noqa: E402

_PROBLEMS = flags.DEFINE_list('problems', ['digits', 'cifar_cnn'], 'problems')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'rounds per timed repetition')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'timed repetitions (median)')
_JSON = flags.DEFINE_string('json', None, 'write results here')


def problem(name, method):
  if name == 'digits':
    c = config_strings.load_config(os.path.join(REPO, 'configs', f'fedseq_digits.py:{method}'))
    data = data_registry.get_dataset(c.dataset, **c.data.to_dict())
    groups = np.array_split(np.random.default_rng(0).permutation(100), 10)
  else:
    c = config_strings.load_config(os.path.join(REPO, 'configs', f'fedseq_digits.py:{method}'))
    c.dataset, c.model = 'synthetic', 'cifar_cnn'
    c.client.batch_size, c.client.lr = 64, 0.01
    c.clients_per_round = 10
    data = builtin.synthetic(50, 100, input_shape=(32, 32, 3), num_classes=10, test_size=64, seed=0)
    groups = np.array_split(np.random.default_rng(0).permutation(50), 5)
  c.eval_every = 10**6
  c.progress_every_s = 1e9
  return c, data, groups


def build(name, method, **engine):
  c, data, groups = problem(name, method)
  for k, v in engine.items():
    c.engine[k] = v
  kw = {} if method == 'fedavg' else {'superclients': groups}
  return trainers.make_trainer(c, data=data, **kw)


def block(tree):
  jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, 'block_until_ready') else a, tree)


def program_timer(t, rounds):
  """Returns run() timing `rounds` compiled round programs on device-resident inputs."""
  if isinstance(t, loop.Trainer) and hasattr(t, 'lane_shape'):
    inputs = [jax.device_put(t.driver.prepare_round(r).inputs) for r in range(rounds)]

    def run():
      for r in range(rounds):
        t.server_state, m = t.driver.round_fn(t.server_state, inputs[r], t.driver.dev_arrays, t.plan.key,
                                              jnp.asarray(r, jnp.int32))
      block(t.server_state)
    steps = np.mean([t.plan.chain_stats(r)['local_steps'] for r in range(rounds)])
  else:
    rbs = [t.driver.prepare_round(r) for r in range(rounds)]
    inputs = [jax.device_put((rb.as_dict(), None, t.plan.client_keys(r, rb.client_ids), rb.num_examples,
                              rb.client_ids >= 0)) for r, rb in enumerate(rbs)]

    def run():
      for r in range(rounds):
        t.server_state, _, m = t.driver.round_fn(t.server_state, *inputs[r], jnp.asarray(r, jnp.int32))
      block(t.server_state)
    steps = np.mean([rb.mask.any(axis=-1).sum() for rb in rbs])
  return run, float(steps)


def train_timer(t, rounds):
  def run():
    t.round = 0
    t.train(num_rounds=rounds)
    block(t.server_state)
  return run


def main(argv):
  del argv
  out = {'uptime': os.popen('uptime').read().strip(), 'backend': jax.default_backend(), 'problems': {}}
  print(out['uptime'])
  for name in _PROBLEMS.value:
    timers, steps = {}, {}
    fa_prog = build(name, 'fedavg', device_data=False)     # the host path's one-round program
    fs = build(name, 'fedseq')
    timers['fedavg/program'], steps['fedavg'] = program_timer(fa_prog, _ROUNDS.value)
    timers['fedseq/program'], steps['fedseq'] = program_timer(fs, _ROUNDS.value)
    timers['fedavg/train'] = train_timer(build(name, 'fedavg'), _ROUNDS.value)
    timers['fedseq/train'] = train_timer(build(name, 'fedseq'), _ROUNDS.value)
    for run in timers.values():          # compile + warm up
      run()
    times = {k: [] for k in timers}
    cpu = {k: [] for k in timers}
    for _ in range(_REPEATS.value):
      for k, run in timers.items():
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        times[k].append((time.perf_counter() - t0) / _ROUNDS.value)
        cpu[k].append((time.process_time() - c0) / _ROUNDS.value)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    # Paired ratios: FedAvg / FedSeq time of the same repetition (neighbours in time), then the median.
    paired = lambda d, kind: statistics.median(a / b for a, b in zip(d[f'fedavg/{kind}'], d[f'fedseq/{kind}']))
    res = {'local_steps_per_round': steps, 'seconds_per_round_median': med, 'seconds_per_round_all': times,
           'cpu_seconds_per_round_median': med_cpu, 'cpu_seconds_per_round_all': cpu,
           'throughput_ratio_program': paired(times, 'program'), 'throughput_ratio_train': paired(times, 'train'),
           'cpu_throughput_ratio_program': paired(cpu, 'program'), 'cpu_throughput_ratio_train': paired(cpu, 'train')}
    out['problems'][name] = res
    print(f"{name}: local steps/round FedAvg {steps['fedavg']:.1f} FedSeq {steps['fedseq']:.1f}; wall "
          + '; '.join(f'{k} {v * 1e3:.2f} ms/round' for k, v in med.items())
          + f"; FedSeq/FedAvg throughput (paired medians), wall: program {res['throughput_ratio_program']:.3f}x, "
            f"train {res['throughput_ratio_train']:.3f}x; CPU time: program {res['cpu_throughput_ratio_program']:.3f}x,"
            f" train {res['cpu_throughput_ratio_train']:.3f}x", flush=True)
  out['uptime_end'] = os.popen('uptime').read().strip()
  print(out['uptime_end'])
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(out, f, indent=1)


if __name__ == '__main__':
  app.run(main)
