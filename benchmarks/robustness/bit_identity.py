r"""Digests of a few short runs, to show that a refactor changes no bit of what the library computes.

Each case trains a config for a few rounds in this process and prints one JSON line: the SHA-256 of the final
server state's arrays (every leaf's dtype, shape and bytes, in tree order) and of the evaluation records
(every number of every record, wall-clock fields left out). Run it on two checkouts and compare the lines:

  python -m benchmarks.robustness.bit_identity --out=/tmp/after.jsonl
  python -m benchmarks.robustness.bit_identity --out=/tmp/before.jsonl --repo=<an older checkout>
  python -m benchmarks.robustness.bit_identity --compare=/tmp/before.jsonl     # exit 1 on a difference

The cases cover the round paths: the quickstart (FedAvg, device rounds), SCAFFOLD (client states), FedSeq
(chain trainer), one LADD round on the synthetic domain-adaptation set (segmentation, style clusters), a
batched pair of runs (the runs axis, training/batched.py), a FedVPR round (retrieval, two-pass mining) and
client-level DP in its central, local, distributed and adaptive-clip forms, and two CNNs with large dense layers
(the pfl protocol's, the FedSAM paper's with SAM) on synthetic 32x32x3 clients.
Bits depend on the number of usable cores (XLA:CPU's reductions): compare runs on the same machine.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import dp, fedseq_digits, ladd, pfl_cifar10, quickstart, quickstart_vpr  # noqa: E402
from fedjax_flat.config.default_config import data_section  # noqa: E402
from fedjax_flat.training import batched, trainers  # noqa: E402

_OUT = flags.DEFINE_string('out', None, 'write the JSON lines here too')
_CASES = flags.DEFINE_list('cases', None, 'cases to run (default: all)')
_REPO = flags.DEFINE_string('repo', None, 'run the cases with another checkout (a subprocess with its PYTHONPATH)')
_COMPARE = flags.DEFINE_string('compare', None, 'a JSON-lines file of an earlier invocation: exit 1 on a difference')

TIME_KEYS = ('elapsed_s', 'wall_s', 'rounds_per_s', 'time', 'eta_s', 'eval_s', 'round_s', 'timestamp')


def _tree_digest(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    a = np.asarray(jax.device_get(leaf))
    if a.dtype == object or str(a.dtype).startswith('key'):
      a = np.asarray(jax.random.key_data(leaf))
    h.update(f'{a.dtype}{a.shape}'.encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def _records_digest(records) -> str:
  def numbers(v, key=''):
    if isinstance(v, dict):
      for k in sorted(v):
        if not any(t in k for t in TIME_KEYS):
          yield from numbers(v[k], k)
    elif isinstance(v, (list, tuple)):
      for x in v:
        yield from numbers(x, key)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      yield f'{key}={float(v)!r}'
  return hashlib.sha256('\n'.join(x for r in records for x in numbers(r)).encode()).hexdigest()


def _configs():
  qs = quickstart.get_config()
  qs.rounds, qs.eval_every = 3, 3
  sc = quickstart.get_config('scaffold')
  sc.rounds, sc.eval_every = 3, 3
  fs = fedseq_digits.get_config('fedseq')
  fs.rounds, fs.eval_every = 2, 2
  ld = ladd.get_config('synthetic,ladd_all')
  ld.rounds, ld.eval_every = 1, 1
  ld.algo.random_init = True      # one round from random weights (the flag only lets it pass validation)
  vp = quickstart_vpr.get_config()
  vp.rounds, vp.eval_every = 1, 1
  b1, b2 = quickstart.get_config(), quickstart.get_config()
  for c, lr in ((b1, 0.05), (b2, 0.1)):
    c.rounds, c.eval_every, c.client.lr = 3, 3, lr
  # Client-level DP: the server's noise (central), each client's (local), its share (distributed, per-tensor
  # clipping of DP-FedSAM's release), and the adaptive clip.
  private = {}
  for name, arg in (('dp_central', 'fedavg,eps=8'), ('dp_local', 'small,eps=200,local'),
                    ('dp_distributed', 'fedsam,eps=8,release'), ('dp_adaptive', 'fedavg,eps=8,adaptive')):
    private[name] = dp.get_config(arg)
    private[name].rounds, private[name].eval_every = 3, 3
  # The CNNs with large dense layers under the one-client-at-a-time CPU path (Dense's weight gradient): the pfl
  # protocol's CNN with dropout, and the FedSAM paper's CIFAR CNN with SAM, on 32x32x3 synthetic clients.
  wide = {}
  for name, model, opt, classes in (('pfl_round', 'pfl_cnn', 'sgd', 10), ('cifar_sam', 'cifar_cnn', 'sam', 100)):
    c = pfl_cifar10.get_config()
    c.dataset, c.model, c.normalize, c.client.optimizer, c.client.rho = 'synthetic', model, 'none', opt, 0.05
    c.data = data_section(num_clients=8, examples_per_client=20, input_shape=(32, 32, 3), num_classes=classes,
                          test_size=40, seed=0)
    c.rounds, c.eval_every, c.clients_per_round = 2, 2, 4
    wide[name] = c
  return {'quickstart': qs, 'scaffold': sc, 'fedseq': fs, 'ladd_round': ld, 'fedvpr_round': vp,
          'batched_pair': (b1, b2), **private, **wide}


def _run_case(name, cfg, root):
  if isinstance(cfg, tuple):
    specs = [batched.RunSpec(f'{name}{i}', c, os.path.join(root, f'{name}{i}')) for i, c in enumerate(cfg)]
    results = batched.run_batch(specs, fresh=True)
    out = []
    for spec in specs:
      with open(os.path.join(spec.workdir, 'metrics.jsonl')) as f:
        recs = [json.loads(line) for line in f if line.strip()]
      out.append({'records': _records_digest(recs)})
    return {'case': name, 'runs': out, 'programs': len(results)}
  trainer = trainers.make_trainer(cfg, None)
  trainer.train()
  return {'case': name, 'params': _tree_digest(trainer.server_state), 'records': _records_digest(trainer.records)}


def main(argv):
  del argv
  if _REPO.value:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(_REPO.value))
    # This file run by path: the library and configs come from the other checkout (PYTHONPATH, cwd).
    cmd = [sys.executable, os.path.abspath(__file__)]
    cmd += [f'--cases={",".join(_CASES.value)}'] if _CASES.value else []
    cmd += [f'--out={_OUT.value}'] if _OUT.value else []
    cmd += [f'--compare={_COMPARE.value}'] if _COMPARE.value else []
    sys.exit(subprocess.call(cmd, cwd=_REPO.value, env=env))
  cases = _configs()
  names = _CASES.value or list(cases)
  lines = []
  with tempfile.TemporaryDirectory() as root:
    for n in names:
      line = json.dumps(_run_case(n, cases[n], root), sort_keys=True)
      print(line, flush=True)
      lines.append(line)
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      f.write('\n'.join(lines) + '\n')
  if _COMPARE.value:
    with open(_COMPARE.value) as f:
      before = {json.loads(x)['case']: json.loads(x) for x in f if x.strip()}
    diff = [n for n in names if before.get(n) != json.loads(lines[names.index(n)])]
    print('identical: ' + ', '.join(n for n in names if n not in diff))
    if diff:
      print('DIFFERENT: ' + ', '.join(diff))
      sys.exit(1)


if __name__ == '__main__':
  app.run(main)
