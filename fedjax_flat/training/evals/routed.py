"""A run clustered by client styles (LADD, k > 1): 'routed/test_<metric>' at every evaluation, every test image
scored by the model of the cluster whose style centroid is nearest to the image's own style (thesis §5.3;
evaluation/routed.py), one pooled confusion matrix over the test set. The cluster models are the algorithm's
eval models 'cluster0'..'cluster{k-1}'; routes are computed once. Running BatchNorm statistics, full-image
forward (the test-client groups / BN test policy / tiling of the global evaluator are not applied here)."""
import jax
import jax.numpy as jnp

from fedjax_flat.evaluation import routed
from fedjax_flat.evaluation.evaluator import fixed_batch_size
from fedjax_flat.training.evals.registry import Evaluation, register


def evaluate(trainer) -> dict:
  clusters = trainer.plan.style_clusters
  if clusters is None or int(clusters.k) < 2:
    return {}
  models = trainer.algorithm.eval_models(trainer.server_state)
  names = [f'cluster{c}' for c in range(int(clusters.k))]
  if not all(n in models for n in names):
    return {}
  state = trainer.recorder.plugin_state
  if 'routed' not in state:        # routes computed once per run
    tx, ty = trainer.data.test_examples()
    state['routed'] = routed.RoutedEvaluator(
        trainer.model, tx, ty, routed.routes(tx, clusters.centroids, b=trainer.plan.style_fda_b), task=trainer.task,
        preprocess=trainer.plan.eval_transform, batch_size=fixed_batch_size(trainer.config.eval_batch_size))
  view = (lambda p: p) if trainer.plan.placement is None else trainer.plan.placement.local_view
  stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[view(models[n][0]) for n in names])
  res = state['routed'](stacked)
  out = {'routed/test_accuracy': res['accuracy'], 'routed/test_loss': res['loss']}
  out.update({f'routed/test_{k}': v for k, v in res.items() if k not in ('accuracy', 'loss', 'count')})
  return out


register(Evaluation('routed', order=10, applies=lambda p: p.style_clusters is not None,
                    periodic=evaluate, models=('cluster0', 'cluster1', '...')))
