"""Per-client sharpness: lambda_max of a local model on its own data vs on the global data.

Thesis Table 4.13: lambda_{1,l} is the top Hessian eigenvalue of client k's model on its local dataset D_k,
lambda_{1,g} on the overall dataset D. Both use the same deflated power iteration as the global model.
FedSoup Fig. 2a: `client_lambda_max_estimates`, the paper's median over training batches and the release's
full-data lambda_max of a client's model, side by side.
"""
from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from fedjax_flat.analysis.eigen import top_eigenpairs_power
from fedjax_flat.analysis.hvp import make_hvp, param_dim


def client_lambda_max(model, params_k, client_batches: Mapping, global_batches: Mapping, *,
                      num_iters: int = 20, tol: float = 1e-4, rng=None, init: str = 'normal', task=None) -> dict:
  """lambda_max of `params_k` on the client's own batches and on the global batches.

  Args:
    model: the `Model`.
    params_k: client k's local model.
    client_batches: the client's stacked padded batches ({'x': [nb, B, ...], 'y', 'mask'}).
    global_batches: the global stacked padded batches, the same layout.
    num_iters: power-iteration steps (thesis: 20).
    tol: power-iteration early-stopping threshold (thesis: 1e-4).
    init: the start vector's distribution (`eigen.top_eigenpairs_power`).
    rng: PRNG key for the start vector (the same one is used for both).

  Returns:
    {'lambda_local': float, 'lambda_global': float, 'iters_local': int, 'iters_global': int}.
    lambda is the largest-magnitude eigenvalue (power iteration).
  """
  rng = jax.random.PRNGKey(0) if rng is None else rng
  dim = param_dim(params_k)
  out = {}
  for name, batches in (('local', client_batches), ('global', global_batches)):
    lams, _, iters = top_eigenpairs_power(make_hvp(model, params_k, batches, task=task), dim, k=1, num_iters=num_iters,
                                          tol=tol, rng=rng, init=init, return_num_iters=True)
    out[f'lambda_{name}'] = float(lams[0])
    out[f'iters_{name}'] = int(iters[0])
  return out


def _batch(batches: Mapping, i: int) -> dict:
  """Batch i of stacked batches, kept stacked ([1, B, ...]): every batch has the same shapes (one compile)."""
  return {k: v[i:i + 1] for k, v in batches.items()}


def client_lambda_max_estimates(model, params_k, client_batches: Mapping, *, num_iters: int = 20, tol: float = 1e-4,
                                rng=None, init: str = 'normal', task=None) -> dict:
  """FedSoup Fig. 2a's two sharpness estimates of one client's model on its own training data, named.

  'batch_median' (the paper's): lambda_max of each training batch's loss, the median across the batches (batches
  that are all padding are skipped). 'full_data' (the release's): lambda_max of the loss over the client's whole
  training set (every batch at once). The two differ: the Hessian of a mean is the mean of the batch Hessians,
  and lambda_max is convex in the matrix, so full_data <= the mean of the batch values.

  Args: as `client_lambda_max` (client_batches: stacked padded {'x': [nb, B, ...], 'y', 'mask'}).
  Returns: {'lambda_batch_median', 'lambda_full_data', 'lambda_batches' (one per non-empty batch)}.
  """
  rng = jax.random.PRNGKey(0) if rng is None else rng
  dim = param_dim(params_k)

  def top(batches):
    lams, _ = top_eigenpairs_power(make_hvp(model, params_k, batches, task=task), dim, k=1, num_iters=num_iters,
                                   tol=tol, rng=rng, init=init)
    return float(lams[0])
  nb = int(np.shape(client_batches['mask'])[0])
  per_batch = [top(_batch(client_batches, i)) for i in range(nb) if float(np.sum(client_batches['mask'][i])) > 0]
  if not per_batch:
    raise ValueError('client_lambda_max_estimates: every batch is padding (the client has no examples)')
  return {'lambda_batch_median': float(np.median(per_batch)), 'lambda_full_data': top(client_batches),
          'lambda_batches': per_batch}
