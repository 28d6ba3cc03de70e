"""`domain_labelled` (tasks/domains.py): classification on the class column of [class, domain] labels."""
import jax.numpy as jnp
import numpy as np

from fedjax_flat.tasks import base, domains


def test_loss_and_metrics_are_classification_on_the_class_column():
  logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0], [0.5, 0.2, 3.0]])
  y = jnp.array([[0, 5], [2, 1], [2, 0]])
  mask = jnp.array([1.0, 1.0, 0.0])
  task = base.get_task('domain_labelled')
  assert isinstance(task, domains.DomainLabelled)
  want = base.Classification()
  np.testing.assert_allclose(task.loss_sums(logits, y, mask), want.loss_sums(logits, y[:, 0], mask))
  got = task.eval_sums(logits, y, mask)
  assert float(got['correct']) == 1.0 and float(got['count']) == 2.0
  lse = np.log(np.exp([2.0, 0.0, -1.0]).sum())
  np.testing.assert_allclose(float(got['loss_sum']), (lse - 2.0) + (np.log(np.exp([0, 1.0, 0]).sum()) - 0.0),
                             rtol=1e-6)
  np.testing.assert_array_equal(domains.domains(y), [5, 1, 0])
