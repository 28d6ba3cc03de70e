"""group_labelled (tasks/groups.py): the per-group accuracies, their mean and their minimum equal a NumPy
computation on known predictions, padding counts nowhere, an absent group is nan and left out; the evaluator
computes them for every model in its one compiled program."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.evaluation.evaluator import Evaluator
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.tasks.groups import GroupLabelled, group_keys

G = 5


def _numpy_groups(pred, cls, grp, mask):
  out = {}
  for g in range(G):
    sel = (grp == g) & mask
    out[g] = np.mean(pred[sel] == cls[sel]) if sel.any() else np.nan
  present = [a for a in out.values() if not np.isnan(a)]
  return out, min(present), float(np.mean(present))


def test_eval_metrics_match_numpy_with_padding_and_an_absent_group():
  rng = np.random.default_rng(0)
  n = 64
  logits = rng.normal(size=(n, 3)).astype(np.float32)
  cls = rng.integers(0, 3, n)
  grp = rng.integers(0, G - 1, n)           # group G-1 never occurs
  mask = rng.random(n) < 0.8
  grp[~mask] = G - 1                        # padding rows in the absent group must not make it present
  task = tasks_lib.get_task('group_labelled', num_groups=G)
  y = jnp.asarray(np.stack([cls, grp], 1), jnp.int32)
  m = task.eval_metrics(task.eval_sums(jnp.asarray(logits), y, jnp.asarray(mask, jnp.float32)))
  want, worst, avg = _numpy_groups(logits.argmax(-1), cls, grp, mask)
  for g, key in enumerate(group_keys(G)):
    if np.isnan(want[g]):
      assert np.isnan(float(m[key]))
    else:
      np.testing.assert_allclose(float(m[key]), want[g], rtol=1e-6)
  np.testing.assert_allclose(float(m['worst_group_acc']), worst, rtol=1e-6)
  np.testing.assert_allclose(float(m['avg_group_acc']), avg, rtol=1e-6)
  np.testing.assert_allclose(float(m['accuracy']), np.mean(logits.argmax(-1)[mask] == cls[mask]), rtol=1e-6)
  # the loss and accuracy are classification's on the class column
  plain = tasks_lib.Classification()
  ref = plain.eval_metrics(plain.eval_sums(jnp.asarray(logits), jnp.asarray(cls), jnp.asarray(mask, jnp.float32)))
  np.testing.assert_allclose(float(m['loss']), float(ref['loss']), rtol=1e-6)


class _Linear:
  """A model whose logits are x @ params (what the evaluator calls: apply(params, x, train=False))."""

  def apply(self, params, x, train=False):
    return x @ params


def test_evaluator_reports_groups_for_every_model_in_one_program():
  rng = np.random.default_rng(1)
  n = 70                                          # not a multiple of the batch: a padded last batch
  x = rng.normal(size=(n, 4)).astype(np.float32)
  y = np.stack([rng.integers(0, 3, n), rng.integers(0, G, n)], 1).astype(np.int32)
  ev = Evaluator(_Linear(), x, y, batch_size=16, task=GroupLabelled(num_groups=G), devices=jax.local_devices()[:1])
  params = {name: rng.normal(size=(4, 3)).astype(np.float32) for name in ('global', 'swa')}
  out = ev.evaluate_many({k: jnp.asarray(v) for k, v in params.items()})
  assert ev._cache_size() == 1
  for name, w in params.items():
    want, worst, avg = _numpy_groups((x @ w).argmax(-1), y[:, 0], y[:, 1], np.ones(n, bool))
    for g in range(G):
      np.testing.assert_allclose(out[name][f'group_acc/{g}'], want[g], rtol=1e-6)
    np.testing.assert_allclose(out[name]['worst_group_acc'], worst, rtol=1e-6)
    np.testing.assert_allclose(out[name]['avg_group_acc'], avg, rtol=1e-6)
