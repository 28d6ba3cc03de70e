"""Compares `dirichlet_split` with the reference Hsu et al. splits released with FedSAM.

    python -m benchmarks.reference.dirichlet_reference [--reference_dir=.../fedsam/data] [--seeds=40]

Without --reference_dir it compares against the summary statistics below (computed from the released
`federated_train_alpha_*.json` files, client ids = generation order). With it, it also reads the files and
reports two-sample Kolmogorov-Smirnov distances between the reference clients and ours (pooled over
seeds) for classes per client and dominant-class fraction. "pct" is where the reference value falls in
the distribution of our statistic over seeds (0.5 = typical, <0.05 or >0.95 = at the edge).
"""
import json
import os

from absl import app
from absl import flags
import numpy as np

from fedjax_flat.data.partition import dirichlet_split

flags.DEFINE_string('reference_dir', None, 'fedsam `data/` dir holding cifar10/ and cifar100/ (optional)')
flags.DEFINE_integer('seeds', 40, 'seeds of our generator per setting')
FLAGS = flags.FLAGS

# (classes, alpha): classes/client mean, min, max; dominant-class fraction median; per-class count
# variance over clients that hold >= 95 % of the classes (None where not meaningful).
REFERENCE = {
    (10, 0.05): (1.32, 1, 3, 1.000, None),
    (10, 0.1): (1.54, 1, 4, 1.000, None),
    (10, 0.2): (2.19, 1, 5, 0.975, None),
    (10, 0.5): (3.57, 1, 7, 0.773, None),
    (10, 1.0): (4.78, 1, 9, 0.681, None),
    (10, 10.0): (9.28, 3, 10, 0.284, None),
    (10, 100.0): (9.90, 6, 10, 0.150, 214.2),
    (100, 0.5): (5.13, 2, 13, 0.735, None),
    (100, 1000.0): (98.82, 42, 100, 0.020, 2.60),
}


def client_counts(labels, splits, num_classes):
  return np.array([np.bincount(labels[s], minlength=num_classes) for s in splits])


def summarize(m):
  ncls = (m > 0).sum(1)
  dom = m.max(1) / m.sum(1)
  full = m[ncls >= 0.95 * m.shape[1]]
  return ncls, dom, (float(full.var()) if len(full) else float('nan'))


def ks(a, b):
  a, b = np.sort(a), np.sort(b)
  xs = np.union1d(a, b)
  return float(np.max(np.abs(np.searchsorted(a, xs, 'right') / len(a) -
                             np.searchsorted(b, xs, 'right') / len(b))))


def reference_counts(ref_dir, k, alpha):
  name = 'cifar10' if k == 10 else 'cifar100'
  path = os.path.join(ref_dir, name, 'data', 'train', f'federated_train_alpha_{alpha:.2f}.json')
  with open(path) as f:
    d = json.load(f)
  users = sorted(d['user_data'], key=int)
  return np.array([np.bincount(d['user_data'][u]['y'], minlength=k) for u in users])


def main(_):
  print('| classes | alpha | ref classes/client (min-max) | ours mean [5-95 % over seeds] (mean min-max) | pct '
        '| ref dominant median | ours [5-95 %] | pct | ref count var | ours | KS classes | KS dominant |')
  print('|---|---|---|---|---|---|---|---|---|---|---|---|')
  for (k, alpha), (rmean, rmin, rmax, rdom, rvar) in REFERENCE.items():
    labels = np.repeat(np.arange(k), 50000 // k)
    means, meds, mins, maxs, vars_, all_n, all_d = [], [], [], [], [], [], []
    for seed in range(FLAGS.seeds):
      m = client_counts(labels, dirichlet_split(labels, 100, alpha, examples_per_client=500, seed=seed), k)
      n, d, v = summarize(m)
      means.append(n.mean()); meds.append(np.median(d)); mins.append(n.min()); maxs.append(n.max())
      vars_.append(v); all_n.append(n); all_d.append(d)
    ks_n = ks_d = '-'
    if FLAGS.reference_dir:
      n_ref, d_ref, _ = summarize(reference_counts(FLAGS.reference_dir, k, alpha))
      ks_n, ks_d = f'{ks(n_ref, np.concatenate(all_n)):.3f}', f'{ks(d_ref, np.concatenate(all_d)):.3f}'
    q = lambda xs: f'{np.quantile(xs, .05):.3g}-{np.quantile(xs, .95):.3g}'
    ours_var = f'{np.nanmean(vars_):.3g}' if rvar is not None else '-'
    print(f'| {k} | {alpha:g} | {rmean} ({rmin}-{rmax}) | {np.mean(means):.2f} [{q(means)}] '
          f'({np.mean(mins):.1f}-{np.mean(maxs):.1f}) | {np.mean(np.array(means) <= rmean):.2f} | {rdom:.3f} | '
          f'{np.mean(meds):.3f} [{q(meds)}] | {np.mean(np.array(meds) <= rdom):.2f} | '
          f'{rvar if rvar is not None else "-"} | {ours_var} | {ks_n} | {ks_d} |')


if __name__ == '__main__':
  app.run(main)
