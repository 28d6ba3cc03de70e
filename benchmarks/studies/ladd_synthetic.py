r"""FFREEDA on the synthetic source/target set: source-only vs FedAvg + self-training vs LADD(cls) / LADD(all), and
the supervised federated oracle, over seeds; clusters found vs planted.

Per seed s (the data are fixed: `seg_synthetic_da` with --data_seed; the seed keys the model init, the source
pre-training, the client sampling and the batches):
  1. client styles (data/transforms/fda.py, b = 1) -> k-means + silhouette over k = 2..min(19, K-1)
     (grouping/style_clusters.py; --force_k overrides) -> clusters found vs planted (Rand agreement)
  2. source-only: seg_cnn trained on the source alone; FDA pre-training: the same with every source image
     restyled by a random client style (training/source_pretrain.py); both --source_steps steps, SGD momentum
     0.9, poly lr
  3. from the FDA pre-trained model, --rounds rounds of --clients_per_round clients, 1 local epoch, batch
     --batch_size, client SGD momentum 0.9, in the compiled round engine (core/engine.py, one program per run):
       fedavg_st  LADD with one cluster (FedAvg + self-training)
       ladd_cls   LADD, classifier cluster-specific      ladd_all  LADD, everything cluster-specific
       ftda       FedAvg with the target labels (supervised), from the same pre-trained model
     and oracle     FedAvg with the target labels from the random init (the federated oracle)
         central_oracle  the target clients' images pooled with their labels, trained centrally from the random
                         init (the centralized oracle): the source pre-training's trainer without style transfer
                         (training/source_pretrain.py: same steps, batch, lr, loss), on the target data
         central_oracle_fedbudget  the same with the federated oracle's budget: rounds x local steps SGD steps of
                         --batch_size at the client --lr (poly decay). The federated oracle is far below the
                         centralized one because of its budget (defaults: 30 x 2 = 60 steps at lr 0.01 from a
                         random init vs 300 steps at lr 0.05), which this cell shows: README.ladd.md section 2
  4. target test mIoU (global test set, every planted style): single-model methods on every image; LADD with
     test-time routing (each image to its nearest style centroid's cluster model, evaluation/routed.py)
  Each method's final parameters are recorded as a digest (SHA-256) and the JSON records the machine (usable
  cores, XLA_FLAGS, versions): the same seed gives the same bits on one machine, in one process or several;
  XLA:CPU's bits change with the usable core count (README.ladd.md section 2).

  PYTHONPATH=. .venv/bin/python -m benchmarks.studies.ladd_synthetic --seeds=0,1,2 \
      --json=benchmarks/studies/ladd_synthetic.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

from fedjax_flat.algorithms import fedavg as fedavg_lib
from fedjax_flat.algorithms import ladd as ladd_lib
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.core.batch_stats import average_batch_stats
from fedjax_flat.data.sources import seg_synthetic_da
from fedjax_flat.data.transforms import fda
from fedjax_flat.evaluation import routed
from fedjax_flat.grouping import style_clusters
from fedjax_flat.models.registry import get_model
from fedjax_flat.tasks.segmentation import Segmentation
from fedjax_flat.training import source_pretrain

METHODS = ('source_only', 'fda_pretrained', 'fedavg_st', 'ladd_cls', 'ladd_all', 'ftda', 'oracle', 'central_oracle',
           'central_oracle_fedbudget')
NEEDS_PRETRAINED = ('fda_pretrained', 'fedavg_st', 'ladd_cls', 'ladd_all', 'ftda')


def round_batches(ds, ids, round_idx, seed, batch_size, prep):
  """[C, S, B, ...] batches of one local epoch per client (order keyed by (seed, round, client)) + weights."""
  sizes = ds.client_sizes()[ids]
  steps = int(np.ceil(sizes.max() / batch_size))
  h, w = ds.x.shape[1:3]
  x = np.zeros((len(ids), steps, batch_size, h, w, 3), np.float32)
  y = np.zeros((len(ids), steps, batch_size, h, w), np.uint8)
  m = np.zeros((len(ids), steps, batch_size), np.float32)
  for i, k in enumerate(ids):
    xk, yk = ds.client_examples(int(k))
    order = np.random.default_rng([seed, round_idx, int(k)]).permutation(len(xk))
    n = len(order)
    x[i].reshape(-1, h, w, 3)[:n] = np.asarray(prep(xk[order]))
    y[i].reshape(-1, h, w)[:n] = yk[order]
    m[i].reshape(-1)[:n] = 1.0
  return {'x': jnp.asarray(x), 'y': jnp.asarray(y), 'mask': jnp.asarray(m)}, sizes.astype(np.float32)


def digest(tree) -> str:
  """SHA-256 (first 16 hex digits) of a pytree's leaves (path, dtype, shape, bytes): equal digests = the same
  parameters to the last bit."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f'{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|'.encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def machine() -> dict:
  """What the bits depend on beyond the code and the seed: XLA:CPU's results change with the number of usable
  cores (its intra-op thread pool splits the work; measured: README.ladd.md section 2), so a run records them."""
  return {'usable_cores': len(os.sched_getaffinity(0)), 'cpu_count': os.cpu_count(),
          'xla_flags': os.environ.get('XLA_FLAGS', ''), 'jax': jax.__version__, 'jaxlib': jaxlib.__version__,
          'numpy': np.__version__, 'backend': jax.default_backend()}


def run_federated(alg, params, ds, *, seed, rounds, clients_per_round, batch_size, prep, cluster_of=None):
  round_fn = engine.make_round_fn(alg, chunk=1)       # donates the server state: start from a copy
  state = alg.server_init(jax.tree_util.tree_map(jnp.copy, params), jax.random.PRNGKey(seed))
  t0 = time.time()
  for r in range(rounds):
    ids = np.sort(np.random.default_rng([seed, 99, r]).choice(ds.num_clients, clients_per_round, replace=False))
    batches, weights = round_batches(ds, ids, r, seed, batch_size, prep)
    cs = None if cluster_of is None else ladd_lib.initial_client_states(cluster_of[ids])
    rngs = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), r), clients_per_round)
    state, _, metrics = round_fn(state, batches, cs, rngs, jnp.asarray(weights), jnp.ones(clients_per_round, bool),
                                 jnp.int32(r))
    if not bool(np.all(np.asarray(metrics['finite']))):
      raise FloatingPointError(f'non-finite loss in round {r}')
  jax.block_until_ready(state)
  return state, time.time() - t0


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--seeds', default='0')
  ap.add_argument('--data_seed', type=int, default=0)
  ap.add_argument('--num_styles', type=int, default=4)
  ap.add_argument('--clients_per_style', type=int, default=4)
  ap.add_argument('--examples_per_client', type=int, default=12)
  ap.add_argument('--source_examples', type=int, default=96)
  ap.add_argument('--test_per_style', type=int, default=16)
  ap.add_argument('--image_size', type=int, default=32)
  ap.add_argument('--width', type=int, default=8)
  ap.add_argument('--source_steps', type=int, default=300)
  ap.add_argument('--source_lr', type=float, default=0.05)
  ap.add_argument('--rounds', type=int, default=30)
  ap.add_argument('--clients_per_round', type=int, default=4)
  ap.add_argument('--batch_size', type=int, default=8)
  ap.add_argument('--lr', type=float, default=0.01)
  ap.add_argument('--lambda_kd', type=float, default=20.0)
  ap.add_argument('--teacher_step', type=int, default=1)
  ap.add_argument('--swa_teacher_start', type=int, default=-1)
  ap.add_argument('--force_k', type=int, default=0)
  ap.add_argument('--methods', default=','.join(METHODS))
  ap.add_argument('--json', default='')
  return ap.parse_args(argv)


def setting(args) -> dict:
  """What every seed shares: the data (fixed by --data_seed), the client styles, the model, the optimizers."""
  size = (args.image_size, args.image_size)
  ds = seg_synthetic_da.load(num_styles=args.num_styles, clients_per_style=args.clients_per_style,
                             examples_per_client=args.examples_per_client, source_examples=args.source_examples,
                             test_per_style=args.test_per_style, image_size=size, seed=args.data_seed)
  cfg = default_config().client
  cfg.lr, cfg.momentum, cfg.weight_decay = args.lr, 0.9, 0.0
  return {'ds': ds, 'size': size, 'task': Segmentation(ignore_index=255), 'prep': source_pretrain.normalize,
          'styles': fda.client_styles(ds), 'cfg': cfg, 'server_tx': average_batch_stats(optax.sgd(1.0)),
          'model': get_model('seg_cnn', num_classes=4, input_shape=size + (3,), width=args.width)}


def run_seed(args, seed: int, env: dict) -> dict:
  """One seed of the study: clusters found, every method's target test mIoU (fractions) and wall times."""
  methods = args.methods.split(',')
  ds, size, task, prep, styles, cfg, server_tx, model = (env[k] for k in (
      'ds', 'size', 'task', 'prep', 'styles', 'cfg', 'server_tx', 'model'))
  clus = style_clusters.cluster_styles(styles, ks=range(2, min(20, ds.num_clients)), force_k=args.force_k,
                                       seed=seed)
  found = {'k': clus.k, 'planted': args.num_styles, 'agreement': style_clusters.agreement(clus.labels,
                                                                                         ds.client_style),
           'scores': {int(k): round(v, 4) for k, v in clus.scores.items()}, 'labels': clus.labels.tolist()}
  print(f'seed {seed}: clusters found {clus.k} (planted {args.num_styles}), agreement {found["agreement"]:.3f}, '
        f'silhouettes {found["scores"]}', flush=True)
  test_routes = routed.routes(ds.test_x, clus.centroids)
  params0 = model.init(jax.random.PRNGKey(seed), jnp.zeros((1,) + size + (3,)))
  t0 = time.time()     # (each pre-training only when a method asked for needs it: the oracles alone skip both)
  if 'source_only' in methods:
    src_only, _ = source_pretrain.pretrain_source(model, params0, ds.source_x, ds.source_y,
                                                  steps=args.source_steps, lr=args.source_lr, seed=seed)
  if any(m in methods for m in NEEDS_PRETRAINED):
    pre, _ = source_pretrain.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=args.source_steps,
                                             lr=args.source_lr, seed=seed, styles=styles)
  t_pre = time.time() - t0
  single = np.zeros(len(ds.test_x), np.int32)

  def evaluate(params_of, routes):
    return float(routed.evaluate_routed(model, params_of, ds.test_x, ds.test_y, task, routes, prep=prep)['miou'])
  # 'digest': each method's final parameters (LADD: the shared ones and every cluster's), to compare runs bit for bit
  row = {'seed': seed, 'clusters': found, 'pretrain_s': round(t_pre, 1), 'miou': {}, 'train_s': {}, 'digest': {}}
  if 'source_only' in methods:
    row['miou']['source_only'] = evaluate(lambda c: src_only, single)
    row['digest']['source_only'] = digest(src_only)
  if 'fda_pretrained' in methods:
    row['miou']['fda_pretrained'] = evaluate(lambda c: pre, single)
    row['digest']['fda_pretrained'] = digest(pre)
  fed = dict(seed=seed, rounds=args.rounds, clients_per_round=args.clients_per_round, batch_size=args.batch_size,
             prep=prep)
  st = dict(lambda_kd=args.lambda_kd, teacher_step=args.teacher_step, swa_teacher_start=args.swa_teacher_start)
  if 'fedavg_st' in methods:
    alg = ladd_lib.ladd(model, *client_parts(cfg), server_tx, num_clusters=1, pretrained=pre, **st)
    state, dt = run_federated(alg, pre, ds, cluster_of=np.zeros(ds.num_clients, np.int32), **fed)
    row['miou']['fedavg_st'], row['train_s']['fedavg_st'] = evaluate(lambda c: state['params'], single), dt
    row['digest']['fedavg_st'] = digest(state['params'])
  for layers in ('cls', 'all'):
    name = f'ladd_{layers}'
    if name not in methods:
      continue
    alg = ladd_lib.ladd(model, *client_parts(cfg), server_tx, num_clusters=clus.k, pretrained=pre,
                        cluster_layers=layers, **st)
    state, dt = run_federated(alg, pre, ds, cluster_of=clus.labels, **fed)
    flags = ladd_lib.leaf_flags(pre, ladd_lib.cluster_layer_select(layers))
    row['miou'][name] = evaluate(lambda c: ladd_lib.cluster_params(state, c, flags), test_routes)
    row['miou'][name + '_global'] = evaluate(lambda c: state['params'], single)
    row['train_s'][name] = dt
    row['digest'][name] = digest((state['params'], state['cluster']))
  for name in ('ftda', 'oracle'):
    if name not in methods:
      continue
    start = pre if name == 'ftda' else params0
    alg = fedavg_lib.fedavg(model, local_lib.make_loss(model, task=task), *client_parts(cfg), server_tx)
    state, dt = run_federated(alg, start, ds, **fed)
    row['miou'][name], row['train_s'][name] = evaluate(lambda c: state['params'], single), dt
    row['digest'][name] = digest(state['params'])
  if 'central_oracle' in methods:   # every target training image with its label, one central model
    t0 = time.time()
    central, _ = source_pretrain.pretrain_source(model, params0, ds.x, ds.y, steps=args.source_steps,
                                                 lr=args.source_lr, seed=seed)
    row['miou']['central_oracle'], row['train_s']['central_oracle'] = evaluate(lambda c: central, single), \
        time.time() - t0
    row['digest']['central_oracle'] = digest(central)
  if 'central_oracle_fedbudget' in methods:
    # The centralized oracle given the federated oracle's optimisation budget: as many SGD steps of the same
    # batch and lr as one client takes over the run (rounds x local steps; FedAvg's mean of the clients'
    # updates moves about as far as one client's). Separates the budget from federation itself.
    steps = args.rounds * int(np.ceil(args.examples_per_client / args.batch_size))
    t0 = time.time()
    central, _ = source_pretrain.pretrain_source(model, params0, ds.x, ds.y, steps=steps, batch_size=args.batch_size,
                                                 lr=args.lr, seed=seed)
    row['miou']['central_oracle_fedbudget'] = evaluate(lambda c: central, single)
    row['train_s']['central_oracle_fedbudget'] = time.time() - t0
    row['digest']['central_oracle_fedbudget'] = digest(central)
  print(f'seed {seed}: ' + ', '.join(f'{k} {100 * v:.2f}' for k, v in row['miou'].items()), flush=True)
  return row


def main(argv=None):
  args = parse_args(argv)
  env = setting(args)
  results = [run_seed(args, int(s), env) for s in args.seeds.split(',')]
  summary = {}
  for k in results[0]['miou']:
    v = np.array([100 * r['miou'][k] for r in results])
    summary[k] = {'mean': round(float(v.mean()), 2), 'std': round(float(v.std(ddof=1)), 2) if len(v) > 1 else None}
  print('mIoU % over seeds: ' + ', '.join(f'{k} {s["mean"]:.2f} +- {s["std"]}' for k, s in summary.items()))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'args': vars(args), 'runs': results, 'summary': summary, 'machine': machine(),
                 'backend': jax.default_backend()}, f, indent=1)


if __name__ == '__main__':
  main()
