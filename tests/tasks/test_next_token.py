"""text_tasks.NextToken: the loss and every accuracy against numpy formulas (pad / oov / bos / eos handling)."""
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.tasks import base as tasks, next_token as text_tasks

V = 6                                  # words 1..6; pad 0, oov 7, bos 8, eos 9
PAD, OOV, BOS, EOS = 0, 7, 8, 9


def _np_ce(logits, labels):
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, labels[..., None], -1)[..., 0]


def _case(seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.standard_normal((5, 4, V + 4)).astype(np.float32)
  y = np.array([[1, 2, OOV, EOS], [3, EOS, PAD, PAD], [OOV, OOV, 4, 5], [6, 6, 6, 6], [2, 3, EOS, PAD]])
  mask = np.array([1, 1, 1, 1, 0], np.float32)          # the last example is padding
  logits[4] = np.inf                                      # ... whose logits must reach nothing
  # make some predictions right, including an oov and an eos target
  logits[0, 2, OOV] = 50.0
  logits[1, 1, EOS] = 50.0
  logits[3, 0, 6] = 50.0
  logits[2, 3, OOV] = 60.0                               # predicts oov where the target is 5
  logits[2, 3, 5] = 55.0                                  # ... the in-vocabulary argmax is right
  return logits, y, mask


def _task(**kw):
  return text_tasks.NextToken(ignore_index=PAD, oov_ids=(OOV,), bos_id=BOS, eos_id=EOS, **kw)


def test_loss_is_mean_over_non_pad_targets_of_valid_examples():
  logits, y, mask = _case()
  t = _task()
  s, n = t.loss_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask))
  valid = (y != PAD) & (mask[:, None] > 0)
  ce = _np_ce(np.where(np.isinf(logits), 0, logits), np.where(valid, y, 0))
  np.testing.assert_allclose(float(s), np.sum(ce[valid]), rtol=1e-6)
  assert float(n) == valid.sum() == 14          # 4 + 2 + 4 + 4 non-pad targets of the valid examples
  assert float(t.unit_count(jnp.asarray(y), jnp.asarray(mask))) == 14


def test_metrics_match_numpy_formulas():
  logits, y, mask = _case()
  t = _task()
  m = t.eval_metrics(t.eval_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask)))
  ok_ex = mask[:, None] > 0
  non_pad = (y != PAD) & ok_ex
  pred = np.argmax(np.where(np.isinf(logits), 0, logits), -1)
  hit = pred == y
  head = non_pad & ~np.isin(y, [OOV, BOS, EOS])           # TFF: without pad / oov / bos / eos
  np.testing.assert_allclose(float(m['accuracy']), hit[head].mean(), rtol=1e-6)
  np.testing.assert_allclose(float(m['accuracy_no_pad']), hit[non_pad].mean(), rtol=1e-6)
  masked = np.where(np.isinf(logits), 0, logits).copy()
  masked[..., [PAD, OOV, BOS, EOS]] = -np.inf               # FedJAX: never predict a special id
  iv = non_pad & (y != EOS)
  np.testing.assert_allclose(float(m['accuracy_in_vocab']), (np.argmax(masked, -1) == y)[iv].mean(), rtol=1e-6)
  np.testing.assert_allclose(float(m['oov_rate']), np.isin(y, [OOV])[non_pad].mean(), rtol=1e-6)
  assert float(m['tokens']) == non_pad.sum() and float(m['count']) == head.sum()
  assert head.sum() == 9                       # by hand: 1, 2 | 3 | 4, 5 | 6, 6, 6, 6
  assert not hit[2, 3] and (np.argmax(masked, -1) == y)[2, 3]   # oov predicted: wrong, in-vocab: right


def test_pad_only_exclusion_is_tff_shakespeare_metric():
  logits, y, mask = _case(1)
  t = _task(accuracy_excludes=('pad',))
  m = t.eval_metrics(t.eval_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask)))
  np.testing.assert_allclose(float(m['accuracy']), float(m['accuracy_no_pad']))


def test_registered_and_validated():
  assert isinstance(tasks.get_task('next_token', oov_ids=(7,)), text_tasks.NextToken)
  with pytest.raises(ValueError, match='contains pad'):
    _task(accuracy_excludes=('oov',))
  with pytest.raises(ValueError, match='subset'):
    _task(accuracy_excludes=('pad', 'unk'))


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_hessian_analysis_uses_the_task():
  """analysis.analyze with the dataset's task: its loss is the task's (pad targets excluded), not a crash."""
  import jax
  from fedjax_flat import analysis
  from fedjax_flat.evaluation.evaluator import Evaluator
  from fedjax_flat.models import registry
  m = registry.get_model('char_lstm', V + 4, (5,), embed=3, hidden=4, num_layers=1)
  p = jax.jit(m.init)(jax.random.key(0), jnp.zeros((1, 5)))
  rng = np.random.default_rng(0)
  x = rng.integers(1, V + 1, (9, 5)).astype(np.int16)
  y = np.concatenate([x[:, 1:], rng.integers(1, V + 1, (9, 1))], 1)
  y[:3, 3:] = PAD
  t = _task()
  rep = analysis.analyze(m, p, x, y, batch_size=4, top_k=1, num_iters=2, task=t)
  ev = Evaluator(m, x, y, batch_size=4, task=t)(p)
  np.testing.assert_allclose(rep['loss'], ev['loss'], rtol=1e-5)
  np.testing.assert_allclose(rep['accuracy'], ev['accuracy_no_pad'], rtol=1e-5)
  assert np.isfinite(rep['lambda_max'])
