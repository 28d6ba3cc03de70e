"""Per-client sharpness: lambda_max of a local model on its own data vs on the global data.

Thesis Table 4.13: lambda_{1,l} is the top Hessian eigenvalue of client k's model on its local dataset D_k,
lambda_{1,g} on the overall dataset D. Both use the same deflated power iteration as the global model.
"""
from __future__ import annotations

from typing import Mapping

import jax

from fedjax_flat.analysis.eigen import top_eigenpairs_power
from fedjax_flat.analysis.hvp import make_hvp, param_dim


def client_lambda_max(model, params_k, client_batches: Mapping, global_batches: Mapping, *,
                      num_iters: int = 20, tol: float = 1e-4, rng=None, init: str = 'normal', task=None) -> dict:
  """lambda_max of `params_k` on the client's own batches and on the global batches.

  Args:
    model: the `Model`.
    params_k: client k's local model.
    client_batches / global_batches: stacked padded batches ({'x': [nb, B, ...], 'y', 'mask'}).
    num_iters, tol, init: power-iteration settings (thesis: 20 steps, tol 1e-4).
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
