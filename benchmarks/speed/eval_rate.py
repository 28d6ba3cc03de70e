r"""Evaluation images/s against training examples/s of the same model, before and after issue 39's evaluator.

A forward pass costs about a third of a training step (forward + backward), so evaluation should run >= 2.5x the
training examples/s of the same model (issue 39's target). Two models, each as a user runs its protocol:

  pfl_cnn     configs/pfl_cifar10.py (benchmarks/speed/pfl_cifar10.py): 1000 users x 50, cohort 50, B=10, the
              pfl CNN; evaluation batches of the config's eval_batch_size (1000) over the 10,000 test images
  cifar_cnn   configs/fedsam_cifar.py (the paper CNN): 100 users x 500, cohort 5, B=64; eval_batch_size 256

Per model, built and warmed up first, then timed interleaved (round-robin, --repeats, median) in one invocation:

  train       `Trainer.train(num_rounds=K)` (the trainer as a user runs it, evaluation left out): examples/s
  before      `LegacyEvaluator` at the config's batch size: the evaluation before this change (one device)
  same_batch  `Evaluator` at the config's batch size (sharded over the host devices, metrics on the device)
  auto        `Evaluator(batch_size='auto')`: the batch size measured once (the choice and its rates recorded)
  auto_1dev   the same on the first device only (when there are several: what sharding brings)
  many3       `Evaluator.evaluate_many` of three models (global, SWA, WiMA-like) at the auto batch size:
              images/s counts the three models' images (3 x test images per call)

Reported: images/s (examples/s for train), the ratio to train, the chosen batch size, uptime and the fp32 GEMM
rate before and after (bench_util), the machine record. Data: random uint8 images in the CIFAR10 layout (the
rate does not depend on pixel values).

  python -m benchmarks.speed.eval_rate [--out=benchmarks/speed/eval_rate_cpu] [--repeats=3] [--models=...]
      [--timed_rounds=5] [--test_images=10000] [--host_devices=N] [--smoke]

--smoke: 16x16 images, tiny populations, 200 test images, one repeat: a check of the script end to end.
"""
from __future__ import annotations

import os
import sys

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py), as the binaries.
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from absl import logging  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.paths import REPO  # noqa: E402
from benchmarks.speed import bench_util  # noqa: E402
from benchmarks.speed import pfl_cifar10 as pfl  # noqa: E402
from fedjax_flat.config import families as config_strings  # noqa: E402
from fedjax_flat.data.federated import FederatedDataset  # noqa: E402
from fedjax_flat.data.sources import cifar  # noqa: E402
from fedjax_flat.evaluation import evaluator as ev_lib  # noqa: E402

CONFIGS = {'pfl_cnn': os.path.join(REPO, 'configs', 'pfl_cifar10.py'),
           'cifar_cnn': os.path.join(REPO, 'configs', 'fedsam_cifar.py')}


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', default=None, help='PREFIX of PREFIX.json / PREFIX.md')
  ap.add_argument('--repeats', type=int, default=None, help='timed repetitions (default 3; smoke 1)')
  ap.add_argument('--timed_rounds', type=int, default=None, help='rounds per timed training call (default 5)')
  ap.add_argument('--models', default=','.join(CONFIGS), help='comma list of ' + ', '.join(CONFIGS))
  ap.add_argument('--test_images', type=int, default=None, help='test images evaluated (default 10000)')
  ap.add_argument('--smoke', action='store_true')
  a = ap.parse_args(argv)
  a.repeats = a.repeats or (1 if a.smoke else 3)
  a.timed_rounds = a.timed_rounds or (2 if a.smoke else 5)
  a.test_images = a.test_images or (200 if a.smoke else 10000)
  a.out = a.out or os.path.join(bench_util.SPEED, 'eval_rate_cpu' + ('_smoke' if a.smoke else ''))
  a.models = [m for m in a.models.split(',') if m]
  return a


def protocol(model: str, smoke: bool):
  """The model's config (smoke: shrunk) and its users: random uint8 CIFAR10-layout images."""
  c = config_strings.load_config(CONFIGS[model])
  if smoke:
    c.data.num_clients, c.data.examples_per_client = 40, 20
    c.clients_per_round, c.client.batch_size = 4, 4
  c.progress_every_s = 1e9
  return c


def make_data(c, smoke: bool, n_test: int) -> FederatedDataset:
  shape = (16, 16, 3) if smoke else (32, 32, 3)     # the paper CNN's two 5x5 VALID convs need >= 16
  n_train = c.data.num_clients * c.data.examples_per_client
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (n_train,) + shape, dtype=np.uint8)
  y = rng.integers(0, 10, n_train).astype(np.int32)
  tx = rng.integers(0, 256, (n_test,) + shape, dtype=np.uint8)
  ty = rng.integers(0, 10, n_test).astype(np.int32)
  users = cifar.random_split(n_train, c.data.num_clients, c.data.examples_per_client, 0)
  return FederatedDataset.from_client_indices(x, y, users, tx, ty, num_classes=10, name='cifar10-layout random')


def _timed(fn, units: int):
  def run():
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / units
  return run


def variants(model: str, a) -> tuple:
  """name -> seconds per example (interleavable), and the rows' facts."""
  c = protocol(model, a.smoke)
  data = make_data(c, a.smoke, a.test_images)
  prob = pfl.TrainerProblem(c, data, a.timed_rounds)
  t = prob.t
  per_round = c.clients_per_round * c.data.examples_per_client * c.client.local_epochs
  # The evaluated params: copies (the trainer donates its server state), three different models for many3.
  base = jax.device_get(t.algorithm.eval_models(t.server_state)['global'][0])
  models = {n: jax.device_put(jax.tree_util.tree_map(lambda p, s=s: p * s, base))
            for n, s in (('global', 1.0), ('swa', 0.9), ('wima', 1.1))}
  tx, ty = data.test_examples()
  n = len(ty)
  b = ev_lib.fixed_batch_size(c.eval_batch_size)
  before = ev_lib.LegacyEvaluator(t.model, tx, ty, b, preprocess=t.plan.eval_transform, task=t.task)
  same = ev_lib.Evaluator(t.model, tx, ty, b, preprocess=t.plan.eval_transform, task=t.task)
  auto = ev_lib.Evaluator(t.model, tx, ty, 'auto', preprocess=t.plan.eval_transform, task=t.task)
  one = (ev_lib.Evaluator(t.model, tx, ty, 'auto', preprocess=t.plan.eval_transform, task=t.task,
                         devices=jax.local_devices()[:1]) if jax.local_device_count() > 1 else None)
  g = models['global']
  tm = time.perf_counter()
  auto(g)                      # the measurement (once per run) and the chosen program's compilation
  facts = {'eval_batch_size': b, 'auto_choice': auto.batch_choice, 'auto_setup_s': time.perf_counter() - tm,
           'devices_eval': int(same.mesh.devices.size), 'devices_train': jax.device_count(),
           'train_examples_per_round': per_round, 'test_images': n, 'strategy': t.plan.strategy,
           'rounds_per_call': t.plan.rounds_per_call}
  if one is not None:
    one(g)
    facts['auto_1dev_choice'] = one.batch_choice
  before_res, same_res, auto_res = before(g), same(g), auto(g)
  facts['same_bits'] = before_res == same_res     # the same batch size: the same per-batch sums and order
  facts['auto_max_rel_diff'] = max(abs(auto_res[k] - before_res[k]) / max(abs(before_res[k]), 1e-30)
                                   for k in ('loss', 'accuracy'))   # another batch size: fp32 rounding
  fns = {'train': _timed(lambda: (prob.round(), prob.sync()), a.timed_rounds * per_round),
         'before': _timed(lambda: before(g), n), 'same_batch': _timed(lambda: same(g), n),
         'auto': _timed(lambda: auto(g), n), 'many3': _timed(lambda: auto.evaluate_many(models), 3 * n)}
  if one is not None:
    fns['auto_1dev'] = _timed(lambda: one(g), n)
  for name, fn in fns.items():  # compile + warm-up
    fn()
  return fns, facts


def _markdown(res):
  L = [f"# Evaluation images/s against training examples/s: {res['cpu']} x{res['cpus']} ({res['backend']}), "
       f"jax {res['jax']}", '',
       f"median of {res['repeats']}, interleaved; {res['host_devices'].get('devices', '?')} host device(s)  ",
       f"fp32 GEMM 2048^3: {res['gemm_gflops_2048'][0]:.0f} / {res['gemm_gflops_2048'][1]:.0f} GFLOP/s "
       f"(before / after)  ", f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
       'SMOKE RUN (tiny sizes, not a measurement)' if res['smoke'] else '', '',
       '| model | variant | images/s | x train | batch | note |', '|---|---|---:|---:|---:|---|']
  for m, r in res['models'].items():
    f = r['facts']
    for v, row in r['rows'].items():
      batch = {'before': f['eval_batch_size'], 'same_batch': f['eval_batch_size'],
               'auto': f['auto_choice']['batch_size'], 'many3': f['auto_choice']['batch_size'],
               'auto_1dev': (f.get('auto_1dev_choice') or {}).get('batch_size', '')}.get(v, '')
      note = {'train': f"{f['train_examples_per_round']} examples/round, {f['devices_train']} device(s)",
              'before': 'LegacyEvaluator, one device', 'same_batch': f"{f['devices_eval']} device(s)",
              'auto': 'measured: ' + ', '.join(f'{k}: {v:.0f}' for k, v in f['auto_choice']['images_per_s'].items()),
              'many3': '3 models in one pass, images of all three',
              'auto_1dev': 'one device, measured: ' + ', '.join(
                  f'{k}: {v:.0f}' for k, v in (f.get('auto_1dev_choice') or {}).get('images_per_s', {}).items())
              }.get(v, '')
      L.append(f"| {m} | {v} | {row['per_s']:.0f} | {row['x_train']:.2f} | {batch} | {note} |")
    L.append(f"| {m} | | | | | same_batch's metrics equal before's bit for bit: {f['same_bits']}; auto's "
             f"largest relative difference: {f['auto_max_rel_diff']:.1e} |")
  return '\n'.join(L) + '\n'


def main(argv=None):
  a = _args(argv)
  logging.set_verbosity(logging.WARNING)
  built = {}
  for m in a.models:
    print(f'building {m} ... ({bench_util.uptime()})', file=sys.stderr, flush=True)
    built[m] = variants(m, a)
  info = bench_util.machine_info()
  gemm, up = [bench_util.gemm_gflops()], [bench_util.uptime()]
  fns = {f'{m}/{v}': fn for m, (vs, _) in built.items() for v, fn in vs.items()}
  times = bench_util.interleave(fns, a.repeats)
  up.append(bench_util.uptime())
  gemm.append(bench_util.gemm_gflops())
  out = {}
  for m, (vs, facts) in built.items():
    rows = {v: {'per_s': 1 / statistics.median(times[f'{m}/{v}']), 's_per_item_all': times[f'{m}/{v}']}
            for v in vs}
    for r in rows.values():
      r['x_train'] = r['per_s'] / rows['train']['per_s']
    out[m] = {'rows': rows, 'facts': facts}
  res = {**info, 'smoke': a.smoke, 'repeats': a.repeats, 'uptime': up, 'gemm_gflops_2048': gemm, 'models': out,
         'command': 'python -m benchmarks.speed.eval_rate ' + ' '.join(argv if argv is not None else sys.argv[1:])}
  return bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  main()
