"""FedCG's domains (algorithms/fedcg.py): summary.json `domains` records what the run found — the domain the
server's student assigns to every test image, how many of the D domains it uses, the student-by-planted-domain
table and its purity (and the teacher's), the test accuracy of the reported model per planted domain and, with
algo.domains='kmeans', the clients' k-means domains with their purity — and says in summary.md that the 'global'
model weighs the domain-specific layers by the student's soft probabilities ('hard': by its argmax) unless
algo.soft=False. Planted domains are the test labels' second column (tasks/domains.py); without one only the
assignment counts are reported."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import fedcg
from fedjax_flat.tasks.domains import purity
from fedjax_flat.training.evals.registry import Evaluation, register


def per_domain_accuracy(model, params, x, y, batch: int = 1024) -> list:
  """Test accuracy of `params` on the images of each planted domain (y = [class, domain]), in domain order."""
  fn = jax.jit(lambda p, a: jnp.argmax(model.apply(p, a), axis=-1))
  pred = np.concatenate([np.asarray(fn(params, jnp.asarray(x[i:i + batch], jnp.float32)))
                         for i in range(0, len(x), batch)])
  correct = pred == y[:, 0]
  return [float(np.mean(correct[y[:, 1] == d])) if np.any(y[:, 1] == d) else float('nan')
          for d in range(int(y[:, 1].max()) + 1)]


def _final(trainer, summary, reported):
  model, d = trainer.model, int(trainer.model.num_domains)
  tx, ty = trainer.data.test_examples()
  ty = np.asarray(ty)
  assigned = fedcg.domain_assignments(model, trainer.server_state, np.asarray(tx))
  student = assigned['student'].astype(np.int64)
  out = {'num_domains': d, 'domains_used': int(len(np.unique(student))),
         'student_counts': np.bincount(student, minlength=d).tolist(),
         'soft': bool(trainer.algorithm.hparams['soft'])}
  soft = 'soft probabilities' if out['soft'] else 'argmax'
  fact = (f"FedCG: 'global' weighs the domain-specific layers by the student's {soft}; the student assigns the "
          f"test images to {out['domains_used']} of its {d} domains")
  if ty.ndim == 2 and ty.shape[1] >= 2:          # planted domains in the labels
    planted = ty[:, 1].astype(np.int64)
    n_planted = int(planted.max()) + 1
    out['planted_domains'] = n_planted
    out['purity_student'] = purity(student, planted, d, n_planted)
    out['purity_teacher'] = purity(assigned['teacher'].astype(np.int64), planted, d, n_planted)
    out['student_vs_planted'] = np.histogram2d(student, planted, bins=(d, n_planted),
                                               range=((0, d), (0, n_planted)))[0].astype(int).tolist()
    models = trainer.algorithm.eval_models(trainer.server_state)
    name = reported if reported in models else 'global'
    out['per_domain_accuracy'] = {'model': name, 'accuracy': per_domain_accuracy(model, models[name][0], tx, ty)}
    fact += (f"; purity against the {n_planted} planted domains {out['purity_student']:.3f} (teacher "
             f"{out['purity_teacher']:.3f}); {name} accuracy per planted domain "
             f"{' / '.join(f'{a:.3f}' for a in out['per_domain_accuracy']['accuracy'])}")
  kmeans = getattr(trainer, 'client_domains', None)
  if kmeans is not None:
    kmeans = np.asarray(kmeans, np.int64)
    out['client_domains'] = kmeans.tolist()
    planted_of = getattr(trainer, 'client_planted_domains', None)   # (the training labels now hold k-means')
    if planted_of is not None:
      planted_of = np.asarray(planted_of, np.int64)
      keep = planted_of >= 0
      kmeans, planted_of = kmeans[keep], planted_of[keep]
      out['purity_kmeans_clients'] = purity(kmeans, planted_of, d, int(planted_of.max()) + 1)
      fact += f"; the clients' k-means domains have purity {out['purity_kmeans_clients']:.3f}"
  summary['domains'] = out
  summary.setdefault('facts', {})['domains'] = fact


EVALUATION = register(Evaluation('domains', order=17, applies=lambda p: 'domain_assignments' in p.algorithm.needs,
                                 final=_final, models=('global', 'hard', 'soft')))
