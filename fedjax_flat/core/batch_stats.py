"""BatchNorm running statistics in federated training: what the server does with them, and at test time.

A BatchNorm model carries its running statistics inside params (models/base.py):
params = {'params': trainable, 'batch_stats': {... 'mean', 'var'}}. Local training overwrites them after
every step with the BatchNorm update of that step's forward pass (algorithms/local.py), so they are
statistics, never optimized. Three policies (FedDrive, thesis Table 4.10; digest item 6):

  fedavg   everything aggregated: the trainable params by the algorithm and the server optimizer, the
           statistics by the example-weighted average of the clients' (`average_batch_stats`: whatever the
           server optimizer, as FedDrive's server loads the averaged `running_*` buffers after its optimizer
           step, src/fed_setting/server.py)
  silobn   statistics local, affine params shared (SiloBN, Andreux et al. 2020): algorithm 'silobn'
  fedbn    statistics and affine params local (FedBN, Li et al. 2021): algorithm 'fedbn'
The local leaves live in each client's state (algorithms/wrappers/local_norm.with_local_norm over the client-state
store,
core/client_state.py); a client starts from the server's values on its first visit.

Reference quirk (not reproduced): FedDrive selects SiloBN's local tensors by the substring 'bn' in the
PyTorch parameter name; only ConvBNReLU and the context block's norms are called '.bn', so the statistics
of the norms inside the GE layers and the aggregation layer (nn.Sequential indices) are averaged there.
Here every BatchNorm statistic is local.

Test-time policy (`config.bn.test_policy`), for test clients whose statistics no training client holds:
  running  the evaluated model's running statistics (fedavg: the average of the clients'); refused for
           silobn/fedbn, whose server never receives statistics (it holds its initial ones)
  batch    every test batch normalized with its own statistics (FedDrive's protocol for SiloBN on unseen
           domains: BN layers in training mode at test time, `dd_batch_size` 8); depends on the test batch
           size (`bn.test_batch_size`) and composition
  client   each test client's statistics over ALL its images, then evaluation with them (AdaBN-style,
           `adapt_statistics`): one extra pass, independent of the batching
  auto     running for fedavg, batch for silobn / fedbn (FedDrive's protocols)
"""
from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp
import optax
from fedjax_flat.schema import Choice, Field, Int, Section

tmap = jax.tree_util.tree_map

# Which algorithms BatchNorm models may use is declared by each algorithm (need 'batch_stats': its server
# update is a server optimizer on the FedAvg pseudo-gradient, which `average_batch_stats` turns into the exact
# average of the statistics; algorithms/registry.py). Others (control variates, duals, their own gradient
# loops) would treat statistics as parameters: refused by config/validate.py.
TEST_POLICIES = ('auto', 'running', 'batch', 'client')


def average_batch_stats(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """The server optimizer for BatchNorm models: `inner` on params['params']; on params['batch_stats'] the
  update is minus the pseudo-gradient, so the new statistics are the clients' weighted average
  (w - (w - sum_k p_k w_k) = sum_k p_k w_k) whatever `inner` is (momentum, Adam, a server lr)."""

  def init(params):
    return inner.init(params['params'])

  def update(updates, state, params=None):
    u, state = inner.update(updates['params'], state, None if params is None else params['params'])
    return {'params': u, 'batch_stats': tmap(jnp.negative, updates['batch_stats'])}, state

  return optax.GradientTransformation(init, update)


def resolve_test_policy(policy: str, local_stats: bool) -> str:
  """'auto': 'batch' when the algorithm keeps the statistics on the clients (its need 'local_batch_stats':
  FedBN, SiloBN; FederatedAlgorithm.local_batch_stats), else 'running'."""
  if policy == 'auto':
    return 'batch' if local_stats else 'running'
  return policy


def pooled_moments(moment_sums, count):
  """Per-layer (mean, biased var) from sums of n_b * mean_b and n_b * (var_b + mean_b^2) over batches."""
  n = jnp.maximum(count, 1.0)

  def one(s):
    mean = s['mean'] / n
    return {'mean': mean, 'var': jnp.maximum(s['sq'] / n - jnp.square(mean), 0.0)}
  return jax.tree_util.tree_map(one, moment_sums, is_leaf=_is_layer)


def _is_layer(t) -> bool:
  return isinstance(t, dict) and ('var' in t or 'sq' in t)


def adapt_statistics(model, params, batches: Iterable, preprocess=None, moments_fn=None):
  """params with their running statistics replaced by the pooled statistics of the given batches (the
  test-time policy 'client'). `batches`: dicts {'x', 'y', 'mask'} of one fixed shape."""
  moments_fn = moments_fn or jax.jit(make_raw_moments_fn(model, preprocess))
  acc, total = None, 0.0
  for batch in batches:
    m, n = moments_fn(params, batch)
    acc = m if acc is None else tmap(jnp.add, acc, m)
    total = total + n
  if acc is None:
    return params
  stats = pooled_moments(acc, total)
  return {**params, 'batch_stats': tmap(lambda old, new: new.astype(old.dtype), params['batch_stats'], stats)}


def make_raw_moments_fn(model, preprocess=None):
  """(params, batch) -> ({layer: {'mean': n_b mean_b, 'sq': n_b (var_b + mean_b^2)}}, n_b valid examples).

  The layer inputs are those of the network normalized with each batch's own statistics (the usual
  AdaBN / precise-BN estimate); a layer's batch moments run over every valid pixel of the batch, and the
  per-layer pixel count is the same for every batch, so n_b (examples) weights them exactly.
  """

  def fn(params, batch):
    x = batch['x'] if preprocess is None else preprocess(batch['x'])
    mask = batch['mask'].astype(jnp.float32)
    _, moments = model.apply(params, x, train=False, mask=mask, batch_norm='batch', batch_moments=True)
    n = jnp.sum(mask)

    def one(layer):
      return {'mean': n * layer['mean'], 'sq': n * (layer['var'] + jnp.square(layer['mean']))}
    return jax.tree_util.tree_map(one, moments, is_leaf=_is_layer), n
  return fn


def trainable_view(model, params):
  """(model', trainable params) for the Hessian tools: the BatchNorm statistics become constants of apply
  (evaluation mode uses them; they are not parameters), so eigenvalues, traces and landscapes live in the
  space of the trainable parameters only. Models without statistics are returned unchanged."""
  if not getattr(model, 'batch_stats', False):
    return model, params
  import dataclasses
  stats = params['batch_stats']

  def apply(p, x, **kw):
    return model.apply({'params': p, 'batch_stats': stats}, x, **kw)
  return dataclasses.replace(model, apply=apply, batch_stats=False), params['params']


# config.bn: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('bn', (
    Field('test_policy', Choice('auto', TEST_POLICIES, sort=True),
          "BatchNorm statistics of unseen test clients: 'auto' | 'running' | 'batch' | 'client'"),
    Field('test_batch_size', Int(8, lo=1), "'batch': the test batch whose statistics normalize it (FedDrive: 8)"),
), doc='BatchNorm models: test-time statistics (core/py)')
