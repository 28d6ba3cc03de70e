"""FedLESAM (-S, -D), FedGF, FedWMSAM, FedNSAM, FedSWA / FedMoSWA against THE RELEASES' OWN CODE, run by torch.

For each method the driver writes one problem to an .npz (a 2-layer MLP, Linear(6, 5) ReLU Linear(5, 3), its
initial weights; 4 clients x 3 local steps x batch 8, the same batches every round as a client's data loader
replays them; a 3-round schedule of 3 of the 4 clients, so that partial participation and the client states
are exercised; the method's hyperparameters), runs this library's algorithm on it through the round engine
(core/engine.make_round_fn, the clients' local models from the algorithm's own client_init / client_step), and
runs the release's code on it in a subprocess of .venv-torch (benchmarks/reference/flat2024_torch_side.py, with
the release's checkout on PYTHONPATH: the shims it needs are listed in that file and returned per method). It
compares, per round, every sampled client's local model after its steps (the client step) and the server model
after the update (the round), and reports the max relative error over the entries (|a - b| / max|b| per tensor,
the max over tensors: an entry near zero does not blow the ratio up).

  .venv/bin/python -m benchmarks.reference.flat2024_releases --releases=/tmp/rel
      # --releases: one exported checkout per repository (git archive HEAD), named FedLESAM, Official-FedGF,
      # NeurlPS_FedWMSAM, FedNSAM, FedSWA; writes flat2024_releases.json next to this file (--out)

Tolerance 1e-5: both sides compute in float32 (torch CPU and XLA CPU sum in different orders), 3 rounds of 3
steps each, SAM-type ascents that divide by a norm; measured errors are ~1e-7 - 1e-6, and a rule that differs
(one missed term, a wrong scale) moves the result by >= 1e-3 here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.paths import REPO
from benchmarks.speed.bench_util import torch_python
from fedjax_flat.algorithms import registry
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.core.client_state import HostClientStateStore
from fedjax_flat.models.registry import get_model

D, H, K = 6, 5, 3                    # the MLP
C, S, B = 4, 3, 8                    # clients, local steps, batch
SCHEDULE = [[0, 1, 2], [1, 2, 3], [0, 2, 3]]
LR, WD = 0.1, 1e-3
TOL = 1e-5
REPOS = {'FedLESAM': 'MediaBrain-SJTU/FedLESAM', 'Official-FedGF': 'hwan-sig/Official-FedGF',
         'NeurlPS_FedWMSAM': 'Huang-Yongzhi/NeurlPS_FedWMSAM', 'FedNSAM': 'junkangLiu0/FedNSAM',
         'FedSWA': 'junkangLiu0/FedSWA'}
MODEL = get_model('mlp', K, (D, 1, 1), hidden=(H,))


def to_tree(vec):
  """torch order [W1 (H, D), b1, W2 (K, H), b2] -> the flax tree (kernels transposed)."""
  v, i, out = np.asarray(vec, np.float32), 0, {}
  for name, (o, n) in (('Dense_0', (H, D)), ('Dense_1', (K, H))):
    w = v[i:i + o * n].reshape(o, n)
    i += o * n
    out[name] = {'kernel': jnp.asarray(w.T), 'bias': jnp.asarray(v[i:i + o])}
    i += o
  return out


def to_vec(tree):
  p = tree
  return np.concatenate([np.asarray(p[n][k], np.float64).T.ravel() if k == 'kernel' else
                         np.asarray(p[n][k], np.float64).ravel()
                         for n in ('Dense_0', 'Dense_1') for k in ('kernel', 'bias')])


def problem(seed, x_scale):
  rng = np.random.default_rng(seed)
  w0 = np.concatenate([rng.normal(0, 0.5, H * D), rng.normal(0, 0.1, H), rng.normal(0, 0.5, K * H),
                       rng.normal(0, 0.1, K)]).astype(np.float32)
  x = (rng.normal(size=(C, S, B, D)) * x_scale).astype(np.float32)
  y = rng.integers(0, K, size=(C, S, B)).astype(np.int32)
  return w0, x, y


def config(name, rho, **algo):
  c = default_config()
  c.dataset, c.model, c.algorithm = 'synthetic', 'mlp', name
  c.data.num_clients = C
  c.client.optimizer, c.client.rho = 'sgd', rho
  c.client.lr, c.client.weight_decay, c.client.batch_size, c.client.local_epochs = LR, WD, B, 1
  c.engine.strategy = 'vmap'
  for k, v in algo.items():
    c.algo[k] = v
  return c


def ours(cfg, w0, x, y):
  """The library's rounds through the round engine; per round the sampled clients' local models (the
  algorithm's client_init / client_step from the round's broadcast) and the server model after it."""
  alg = registry.build_algorithm(cfg, MODEL)
  n = len(SCHEDULE[0])
  fn = engine.make_round_fn(alg, chunk=n, donate=False)
  state = alg.server_init(to_tree(w0), jax.random.key(0))
  store = HostClientStateStore(alg.client_state_init(to_tree(w0))) if alg.client_state_init is not None else None
  rounds, clients, extras = [], [], []
  xs = x[..., None, None]
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(n))
  for r, ids in enumerate(SCHEDULE):
    ids = np.asarray(ids)
    cs = store.gather(ids) if store is not None else None
    bcast = alg.broadcast(state, r)
    locals_ = []
    for i, c in enumerate(ids):
      csi = jax.tree_util.tree_map(lambda a: a[i], cs) if cs is not None else None
      local = alg.client_init(bcast, csi, rngs[i])
      for s in range(S):
        batch = {'x': jnp.asarray(xs[c, s]), 'y': jnp.asarray(y[c, s]), 'mask': jnp.ones((B,), jnp.float32)}
        local, _ = alg.client_step(bcast, local, batch, rngs[i])
      locals_.append(to_vec(local.params))
    clients.append(np.stack(locals_))
    batches = {'x': jnp.asarray(xs[ids]), 'y': jnp.asarray(y[ids]), 'mask': jnp.ones((n, S, B), jnp.float32)}
    state, new_cs, _ = fn(state, batches, cs, rngs, jnp.full((n,), float(S * B)), jnp.ones((n,), bool), r)
    if store is not None:
      store.scatter(ids, new_cs)
    rounds.append(to_vec(state['params']))
    extras.append(state)
  return {'rounds': np.stack(rounds), 'clients': np.stack(clients), 'states': extras}


def theirs(method, release_dir, w0, x, y, hp, variant='per_tensor'):
  with tempfile.TemporaryDirectory() as tmp:
    inp, out = os.path.join(tmp, 'in.npz'), os.path.join(tmp, 'out.npz')
    np.savez(inp, w0=w0, x=x, y=y, schedule=np.asarray(SCHEDULE),
             **{f'hp_{k}': v for k, v in {'hidden': H, 'classes': K, 'lr': LR, 'wd': WD, **hp}.items()})
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([REPO, release_dir]), 'RELEASE_DIR': release_dir,
           'OMP_NUM_THREADS': '1'}
    proc = subprocess.run([torch_python(), '-m', 'benchmarks.reference.flat2024_torch_side', f'--method={method}',
                           f'--variant={variant}', f'--inp={inp}', f'--out={out}'],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f'{method}: the release side failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    z = np.load(out)
    return {k: z[k] for k in z.files}


SLICES = [(0, H * D), (H * D, H * D + H), (H * D + H, H * D + H + K * H), (H * D + H + K * H, None)]
TENSORS = ('Dense_0.kernel', 'Dense_0.bias', 'Dense_1.kernel', 'Dense_1.bias')


def rel_err(got, want):
  """max over tensors of max|got - want| / max|want| (got, want [..., P] in torch order)."""
  out = {}
  for name, (a, b) in zip(TENSORS, SLICES):
    g, w = np.asarray(got)[..., a:b], np.asarray(want)[..., a:b]
    out[name] = float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))
  return out


def compare(name, mine, rel):
  """{'client step': per tensor, 'round': per tensor, 'max': over both, 'shims': the release side's}."""
  res = {'client step': rel_err(mine['clients'], rel['clients']), 'round': rel_err(mine['rounds'], rel['rounds'])}
  res['max'] = max(max(v.values()) for v in res.values())
  res['shims'] = [str(s) for s in rel['shims']]
  print(f"{name}: client step {max(res['client step'].values()):.2e}, round {max(res['round'].values()):.2e}")
  return res


def lesam_cases(releases):
  out = {}
  d = os.path.join(releases, 'FedLESAM')
  for method, extra, x_scale in (('fedlesam', {}, 20.0), ('fedlesam_s', {'lamb': 0.3}, 20.0),
                                 ('fedlesam_d', {'alpha': 0.3}, 1.0)):
    w0, x, y = problem(1, x_scale)
    cfg = config(method, 0.2, direction='server', norm='layers', **extra)
    cfg.client.grad_clip = 10.0
    if method != 'fedlesam':
      cfg.algo.population = C
    mine = ours(cfg, w0, x, y)
    hp = {'rho': 0.2, 'lamb': extra.get('lamb', extra.get('alpha', 0.1))}
    out[method] = compare(method, mine, theirs(method, d, w0, x, y, hp))
    if method == 'fedlesam':   # the release as released: the flat g_update indexed per scalar
      raw = theirs(method, d, w0, x, y, hp, variant='as_released')
      out[method + ' (flat g_update, as released)'] = compare(method + ' as released', mine, raw)
  return out


def wmsam_cases(releases):
  w0, x, y = problem(2, 20.0)   # inputs x 20: clip_grad_norm_(10) acts
  cfg = config('fedwmsam', 0.2, alpha=0.3, norm='layers', population=C)
  cfg.client.grad_clip = 10.0
  mine = ours(cfg, w0, x, y)
  d = os.path.join(releases, 'NeurlPS_FedWMSAM')
  out = {'fedwmsam': compare('fedwmsam', mine, theirs('fedwmsam', d, w0, x, y, {'rho': 0.2, 'alpha': 0.3}))}
  raw = theirs('fedwmsam', d, w0, x, y, {'rho': 0.2, 'alpha': 0.3}, variant='as_released')
  out['fedwmsam (flat differ_vector, as released)'] = compare('fedwmsam as released', mine, raw)
  return out


def fedgf_cases(releases, threshold):
  w0, x, y = problem(3, 3.0)
  cfg = config('fedgf', 0.1, rho_global=0.3, threshold=threshold, window=2)
  cfg.client.optimizer = 'sam'
  mine = ours(cfg, w0, x, y)
  rel = theirs('fedgf', os.path.join(releases, 'Official-FedGF'), w0, x, y,
               {'rho': 0.1, 'rho_global': 0.3, 'threshold': threshold, 'window': 2})
  res = compare(f'fedgf (T_D={threshold})', mine, rel)
  res['perturbed model w~'] = rel_err(np.stack([to_vec(s['w_tilde']) for s in mine['states']]), rel['perturbed'])
  res['c per round (release)'] = [float(v) for v in rel['c_used']]
  res['c per round (ours)'] = [0.0] + [float(s['c']) for s in mine['states']]
  res['divergence per round (ours)'] = [float(s['divergence']) for s in mine['states']]
  res['max'] = max(res['max'], max(res['perturbed model w~'].values()))
  print(f"  w~ {max(res['perturbed model w~'].values()):.2e}, c {res['c per round (release)']} / "
        f"{res['c per round (ours)']}, D {res['divergence per round (ours)']}")
  return res


def script_cases(releases):
  out = {}
  w0, x, y = problem(4, 20.0)
  cfg = config('fednsam', 0.05, variant='release', gamma=0.85)
  cfg.client.optimizer, cfg.client.grad_clip = 'sam', 10.0
  out['fednsam (variant=release)'] = compare('fednsam', ours(cfg, w0, x, y),
                                             theirs('fednsam', os.path.join(releases, 'FedNSAM'), w0, x, y, {}))
  d = os.path.join(releases, 'FedSWA')
  w0, x, y = problem(5, 20.0)
  cfg = config('fedswa', 0.0, cycle_steps=S, lr_ratio=0.0)
  cfg.client.lr, cfg.client.grad_clip = 2 * LR, 10.0   # update_FedSWA: SGD(lr * 2), clip 10
  out['fedswa'] = compare('fedswa', ours(cfg, w0, x, y), theirs('fedswa', d, w0, x, y, {}))
  w0, x, y = problem(6, 1.0)   # the release clips the raw gradient, this library the corrected one: no clip here
  cfg = config('fedmoswa', 0.0, cycle_steps=S, lr_ratio=0.0, beta=0.4)
  mo_theirs = theirs('fedmoswa', d, w0, x, y, {})
  out['fedmoswa (update_FedMoSWA), cv_lr=steps (the default)'] = compare('fedmoswa', ours(cfg, w0, x, y), mo_theirs)
  cfg.algo.cv_lr = 'release'
  out['fedmoswa cv_lr=release (update_FedMoSWA)'] = compare('fedmoswa', ours(cfg, w0, x, y), mo_theirs)
  cfg = config('fedmoswa', 0.0, cycle_steps=S, lr_ratio=1.0, beta=0.4)
  out['fedmoswa lr_ratio=1 (update_scafplus, the registered MoFedSWA)'] = compare(
      'scafplus', ours(cfg, w0, x, y), theirs('scafplus', d, w0, x, y, {}))
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--releases', required=True, help='a directory with one exported checkout per repository')
  ap.add_argument('--out', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                'flat2024_releases.json'))
  ap.add_argument('--methods', default='lesam,fedgf,fedwmsam,fednsam,fedswa')
  ap.add_argument('--commits', default='', help='NAME=commit,... : the exported commits, recorded in the JSON')
  a = ap.parse_args()
  results = {}
  todo = a.methods.split(',')
  if 'lesam' in todo:
    results.update(lesam_cases(a.releases))
  if 'fedgf' in todo:
    results['fedgf (T_D=0: c = 1 from round 2)'] = fedgf_cases(a.releases, 0.0)
    results['fedgf (T_D=0.7: c = 1, then 0.5)'] = fedgf_cases(a.releases, 0.7)
  if 'fedwmsam' in todo:
    results.update(wmsam_cases(a.releases))
  if 'fednsam' in todo or 'fedswa' in todo:
    results.update(script_cases(a.releases))
  print(json.dumps({k: v['max'] for k, v in results.items()}, indent=1))
  torch_version = subprocess.run([torch_python(), '-c', 'import torch; print(torch.__version__)'],
                                 capture_output=True, text=True).stdout.strip()
  commits = dict(kv.split('=', 1) for kv in a.commits.split(',') if kv)
  doc = {'command': 'python -m benchmarks.reference.flat2024_releases --releases=DIR',
         'torch': torch_version, 'jax': jax.__version__, 'tolerance': TOL,
         'releases': {REPOS[n]: commits.get(n, '') for n in REPOS},
         'problem': {'model': f'Linear({D},{H}) ReLU Linear({H},{K})', 'clients': C, 'steps': S, 'batch': B,
                     'schedule': SCHEDULE, 'lr': LR, 'weight_decay': WD},
         'results': results}
  with open(a.out, 'w') as f:
    json.dump(doc, f, indent=1)
  bad = {k: v['max'] for k, v in results.items() if v['max'] > TOL and 'as released' not in k
         and 'cv_lr=steps' not in k}
  print('within tolerance' if not bad else f'OVER {TOL}: {bad}')


if __name__ == '__main__':
  main()
