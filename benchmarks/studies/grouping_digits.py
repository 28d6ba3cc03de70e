"""Groupings of the embedded digits at alpha=0 (one class per client): classes and label entropy per
superclient for every grouper x estimator, 3 seeds (benchmarks/studies/README.fedseq.md, section "Groupings").

  .venv/bin/python -m benchmarks.studies.grouping_digits --workdir=/tmp/grouping_digits [--seeds=0,1,2]

100 clients of 13-15 digits, 10 clients per class; |D_S|_min = 140, K_S,max = 11: 10 superclients of 10
clients (a perfect grouping holds all 10 classes, label entropy log2(10) = 3.32 bits). Pre-training: 10
epochs of SGD (lr 0.05, batch 16, wd 4e-4) from the run's w_0. t2v (head: 10 epochs of Adam lr 4e-4) is run
with a random probe (what happens without pretrained weights) and with a probe pretrained centrally on the 359
held-out test digits (a stand-in for the ImageNet ResNet18 the thesis used; the test split is the server-side
public data, as D_pub of conf), each with the Monte-Carlo and the exact Fisher.
Prints one Markdown table (mean +- std over seeds) and writes WORKDIR/groupings.json.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
import numpy as np

_WORKDIR = flags.DEFINE_string('workdir', '/tmp/grouping_digits', 'Cache and results.')
_SEEDS = flags.DEFINE_string('seeds', '0,1,2', 'Comma-separated seeds (config.seed: w_0, pre-training, groupers).')
_PROBE_EPOCHS = flags.DEFINE_integer('probe_epochs', 40, 'Epochs of the centrally trained t2v probe.')

# (estimator, t2v probe, t2v Fisher)
ESTIMATORS = (('clf', None, None), ('conf', None, None), ('t2v', 'random', 'montecarlo'), ('t2v', 'random', 'exact'),
              ('t2v', 'test-split', 'montecarlo'), ('t2v', 'test-split', 'exact'))
METHODS = ('kmeans', 'greedy', 'icg')


def config_for(seed):
  from configs.quickstart import get_config
  c = get_config()
  c.seed = seed
  c.data.alpha = 0.0
  c.data.num_clients = 100
  c.grouping.min_examples = 140
  c.grouping.max_clients = 11
  return c


def train_probe(config, data, seed, epochs, path):
  """The digits CNN trained centrally on the test split (SGD, batch 32): the t2v probe."""
  import jax
  import jax.numpy as jnp
  import optax
  from fedjax_flat.algorithms import local as local_lib
  from fedjax_flat.models import pretrained
  from fedjax_flat.models import registry as model_registry
  model = model_registry.get_model(config.model, data.num_classes, data.input_shape, **config.model_kwargs.to_dict())
  x, y = data.test_examples()
  params = model.init(jax.random.key(1000 + seed), jnp.zeros((1,) + data.input_shape))
  tx = optax.sgd(0.05, momentum=0.9)
  loss = local_lib.make_loss(model)
  state = tx.init(params)

  @jax.jit
  def step(params, state, xb, yb):
    g = jax.grad(lambda p: loss(p, {'x': xb, 'y': yb, 'mask': jnp.ones(len(yb))})[0])(params)
    u, state = tx.update(g, state, params)
    return optax.apply_updates(params, u), state
  rng = np.random.default_rng(seed)
  n = len(y) // 32 * 32
  for _ in range(epochs):
    perm = rng.permutation(len(y))[:n].reshape(-1, 32)
    for idx in perm:
      params, state = step(params, state, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
  acc = float(np.mean(np.argmax(np.asarray(model.apply(params, jnp.asarray(x))), -1) == y))
  pretrained.save_params(path, params)
  return acc


def mean_std(v, fmt):
  v = np.asarray(v, np.float64)
  return f'{fmt.format(v.mean())} ± {fmt.format(v.std())}'


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from fedjax_flat.grouping import superclients as sc
  seeds = [int(s) for s in _SEEDS.value.split(',')]
  rows = {}
  probe_acc = []
  for seed in seeds:
    config = config_for(seed)
    ctx = sc.GroupingContext.from_config(config)
    wd = os.path.join(_WORKDIR.value, f'seed{seed}')
    os.makedirs(wd, exist_ok=True)
    probe = os.path.join(wd, 'probe.npz')
    probe_acc.append(train_probe(config, ctx.data, seed, _PROBE_EPOCHS.value, probe))

    def record(name, g):
      s = sc.describe(g, ctx.data, config)['summary']
      assert s['each_client_once']
      rows.setdefault(name, []).append(s)
    record(('random', '', ''), sc.make_grouping(config, ctx, wd, method='random'))
    for est, probe_kind, fisher in ESTIMATORS:
      config.grouping.probe_pretrained = probe if probe_kind == 'test-split' else ''
      config.grouping.fisher = fisher or 'montecarlo'
      label = est + (f' ({probe_kind} probe, {fisher})' if probe_kind else '')
      for m in METHODS:
        g = sc.make_grouping(config, ctx, wd, method=m, estimator=est, distance='auto')
        record((m, label, g.distance), g)
      if est == 't2v':     # greedy with the other distances on the Fisher vectors
        for dist in ('cosine', 'euclidean'):
          record(('greedy', label, dist), sc.make_grouping(config, ctx, wd, method='greedy', estimator=est,
                                                          distance=dist))
      if est == 'conf':   # the other probability-vector diversity score of the reference code
        record(('greedy', 'conf', 'gini'), sc.make_grouping(config, ctx, wd, method='greedy', estimator='conf',
                                                            distance='gini'))
      if est == 'clf':
        record(('greedy', 'clf', 'euclidean'), sc.make_grouping(config, ctx, wd, method='greedy', estimator='clf',
                                                                distance='euclidean'))
    print(f'seed {seed} done', file=sys.stderr)
  lines = ['| grouper | estimator | distance | N_S | clients | classes per superclient | min classes | '
           'label entropy (bits) | below min |', '|---|---|---|---:|---:|---:|---:|---:|---:|']
  for (m, est, dist), ss in rows.items():
    lines.append(f"| {m} | {est or '-'} | {dist or '-'} | {mean_std([s['num_superclients'] for s in ss], '{:.0f}')} | "
                 f"{mean_std([s['clients']['mean'] for s in ss], '{:.1f}')} | "
                 f"{mean_std([s['classes']['mean'] for s in ss], '{:.2f}')} | "
                 f"{mean_std([s['classes']['min'] for s in ss], '{:.1f}')} | "
                 f"{mean_std([s['entropy_bits']['mean'] for s in ss], '{:.3f}')} | "
                 f"{mean_std([s['below_min_examples'] for s in ss], '{:.1f}')} |")
  print('\n'.join(lines))
  print(f'\nprobe accuracy on its own training data (test split): {mean_std(probe_acc, "{:.3f}")}')
  with open(os.path.join(_WORKDIR.value, 'groupings.json'), 'w') as f:
    json.dump({'seeds': seeds, 'probe_train_accuracy': probe_acc,
               'rows': [{'method': k[0], 'estimator': k[1], 'distance': k[2], 'per_seed': v} for k, v in rows.items()]},
              f, indent=1)


if __name__ == '__main__':
  app.run(main)
