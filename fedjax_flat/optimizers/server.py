"""Server optimizers (FedOpt, Reddi et al. 2021): optax transforms over the pseudo-gradient.

The pseudo-gradient Delta = sum_k (N_k/N)(w - w_k) has the sign of a gradient (Reddi et al. write
Delta_R = -Delta and x + eta m / (sqrt(v) + tau); the two are the same update). With server.optimizer:

  'sgd'      FedAvg (lr 1, momentum 0):  w <- w - lr Delta
             FedAvgM (Hsu et al. 2019; momentum beta): v <- beta v + Delta;  w <- w - lr v      (optax.sgd,
             = torch SGD with dampening 0, the FedSAM release code; server.nesterov for Nesterov)
  'adam'     FedAdam, 'adagrad' FedAdagrad, 'yogi' FedYogi: `fedopt_adaptive`, in one of two exact forms
             (server.adaptive_form):

  'reddi'  (default) Algorithm 2 of Reddi et al., no bias correction, v_{-1} = tau^2, tau = server.eps:
             m <- b1 m + (1 - b1) Delta              (FedAdagrad: b1 = server.momentum, default 0 as in
                                                      Reddi's experiments and the thesis, Section 1.5)
             v <- b2 v + (1 - b2) Delta^2            FedAdam
             v <- v + Delta^2                        FedAdagrad
             v <- v - (1 - b2) Delta^2 sign(v - Delta^2)   FedYogi
             w <- w - lr m / (sqrt(v) + tau)
  'torch'  the FedSAM/FedGloSS release code (torch.optim): Adam with bias correction, v_0 = 0,
             w <- w - lr m^ / (sqrt(v^) + eps)        (= optax.adam(lr, b1, b2, eps))
           Adagrad with initial_accumulator_value 0, no momentum, eps OUTSIDE the sqrt:
             v <- v + Delta^2;  w <- w - lr Delta / (sqrt(v) + eps)
           Yogi: as Adam with Yogi's v (v_0 = 0).

Why not optax.adagrad / optax.yogi: optax.adagrad puts eps INSIDE the sqrt (rsqrt(v + eps)) and starts the
accumulator at 0.1; optax.yogi starts both moments at 1e-6 and bias-corrects; optax.adam bias-corrects. None
is Reddi's Algorithm 2, and optax.adagrad is not torch's Adagrad either (tests/optimizers/test_server.py).

Digest conventions (reference code): Adam b1=0.9, b2=0.99, eps 0.1; Adagrad eps 0.01 (configs/baselines_*).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.aggregators import AGGREGATORS
from fedjax_flat.errors import ConfigError
from fedjax_flat.merging import PERMUTABLE_MODELS
from fedjax_flat.schema import RESULT, TRUTH, VALUE, Choice, Field, Flag, Int, Num, Section

SERVER_OPTIMIZERS = ('sgd', 'adam', 'adagrad', 'yogi')
ADAPTIVE_FORMS = ('reddi', 'torch')
# A client's weight in the mean of the updates (FederatedAlgorithm.client_weighting, core/engine.py).
WEIGHTINGS = ('examples', 'uniform', 'capped')


def _check(cfg) -> None:
  s = cfg.server
  cap = float(s.get('weight_cap', 0.0))
  if s.weighting == 'capped' and cap <= 0:
    raise ConfigError('server.weight_cap', s.get('weight_cap', 0.0), "must be > 0 with server.weighting='capped' "
                      '(the example count at which a client reaches full weight)')
  if s.get('aggregator', 'mean') == 'krum' or s.get('aggregator', 'mean') == 'multi_krum':
    n, f = int(cfg.clients_per_round), int(s.krum_f)
    if n <= 2 * f + 2:
      raise ConfigError('server.krum_f', f, f"{s.aggregator} needs clients_per_round > 2 krum_f + 2 (Blanchard et al. "
                        f'2017), got clients_per_round={n}: at most krum_f={max((n - 3) // 2, 0)}'
                        + ('' if n > 2 else ', and clients_per_round >= 3'))
    if s.aggregator == 'multi_krum' and int(s.krum_m) > n:
      raise ConfigError('server.krum_m', s.krum_m, f'must be <= clients_per_round={n} (0: n - krum_f)')
  if s.get('aggregator', 'mean') == 'bulyan':
    n, f = int(cfg.clients_per_round), int(s.krum_f)
    if n < 4 * f + 3:
      raise ConfigError('server.krum_f', f, f'bulyan needs clients_per_round >= 4 krum_f + 3 (El Mhamdi et al. 2018), '
                        f'got clients_per_round={n}: ' + (f'at most krum_f={(n - 3) // 4}' if n >= 3 else
                                                          'raise clients_per_round to at least 3'))
  if s.get('aggregator', 'mean') == 'rebasin':
    gn = int((cfg.get('model_kwargs', None) or {}).get('gn_groups', 0) or 0)
    if cfg.model not in PERMUTABLE_MODELS:
      raise ConfigError('model', cfg.model, "cannot be permuted by server.aggregator='rebasin' (it aligns chains of "
                        f'Conv / Dense layers without normalisation or residual paths: {", ".join(PERMUTABLE_MODELS)})'
                        ': use one of them or another server.aggregator')
    if gn:
      raise ConfigError('model_kwargs.gn_groups', gn, "server.aggregator='rebasin' does not permute GroupNorm "
                        'parameters: set model_kwargs.gn_groups=0 or use another server.aggregator')
  if s.weighting != 'capped' and cap:
    raise ConfigError('server.weight_cap', cap, f"is read with server.weighting='capped' only (it is "
                      f'{s.weighting!r}): set it to 0 or the weighting to capped')

# config.server: the server optimizer over the pseudo-gradient (make_server_tx) and the clients' weighting.
SECTION = Section('server', (
    Field('optimizer', Choice('sgd', SERVER_OPTIMIZERS, sort=True), "'sgd' (FedAvg, FedAvgM) | 'adam' | 'adagrad' | "
          "'yogi' (FedOpt)"),
    Field('lr', Num(1.0, lo=0, lo_open=True), 'server learning rate', {VALUE}),
    Field('weighting', Choice('examples', WEIGHTINGS, sort=True),
          "a client's weight in the mean of the updates: 'examples' (N_k) | 'uniform' | 'capped' (min(N_k, "
          'server.weight_cap): McMahan et al. 2018, the bounded weight client-level DP needs)'),
    Field('weight_cap', Num(0.0, lo=0), "w_hat: the example count at which a client's 'capped' weight stops "
          'growing (0 with the other weightings)'),
    Field('momentum', Num(0.0, lo=0, hi=1, hi_open=True), 'server momentum (FedAvgM; FedAdagrad b1)',
          {VALUE, TRUTH}),
    Field('nesterov', Flag(False), "Nesterov momentum of server.optimizer='sgd' (FedAvgM)"),
    Field('b1', Num(0.9, lo=0, hi=1, hi_open=True), 'adaptive optimizers: first-moment decay'),
    Field('b2', Num(0.99, lo=0, hi=1, hi_open=True), 'adaptive optimizers: second-moment decay'),
    Field('eps', Num(1e-3, lo=0, lo_open=True), 'adaptive optimizers: tau (reddi) / eps (torch)'),
    Field('adaptive_form', Choice('reddi', ADAPTIVE_FORMS, sort=True),
          "adam / adagrad / yogi: 'reddi' (Alg. 2) | 'torch' (the release code)"),
    Field('aggregator', Choice('mean', AGGREGATORS),
          "how the round's deltas are reduced (fedjax_flat/aggregators.py): 'mean' (the streaming weighted mean) | "
          "'median' | 'trimmed_mean' | 'krum' | 'multi_krum' | 'geometric_median' | 'bulyan' | 'centered_clipping' | "
          "'norm_bounding' | 'rebasin' (the uploads stacked [C, ...]: docs/aggregation.md)"),
    Field('trim_fraction', Num(0.1, lo=0, hi=0.5, hi_open=True),
          "aggregator='trimmed_mean': the fraction of each coordinate's smallest and largest values dropped"),
    Field('krum_f', Int(0, lo=0), "aggregator='krum' / 'multi_krum' / 'bulyan': f, the Byzantine clients tolerated "
          '(clients_per_round > 2 f + 2; bulyan: >= 4 f + 3)'),
    Field('krum_m', Int(0, lo=0), "aggregator='multi_krum': m, the best-scored uploads averaged (0: n - f)"),
    Field('gm_iters', Int(8, lo=1), "aggregator='geometric_median': the smoothed Weiszfeld iterations (RFA)"),
    Field('gm_eps', Num(1e-6, lo=0, lo_open=True), "aggregator='geometric_median': nu, the smoothing of the "
          'distances (b_k = w_k / max(nu, ||z - u_k||))'),
    Field('cc_tau', Num(1.0, lo=0, lo_open=True), "aggregator='centered_clipping': tau, the clipping radius around "
          "the previous round's aggregate (Karimireddy et al. 2021)"),
    Field('cc_iters', Int(1, lo=1), "aggregator='centered_clipping': the clipping iterations per round"),
    Field('norm_bound', Num(1.0, lo=0, lo_open=True), "aggregator='norm_bounding': M, the norm each client's delta "
          'is clipped to before the mean (Sun et al. 2019)'),
    Field('rebasin_iters', Int(3, lo=1), "aggregator='rebasin': the weight-matching sweeps over the layers aligning "
          'each client model to the global one (Ainsworth et al. 2023)'),
), check=_check, tags={RESULT},
    doc='the server optimizer over the pseudo-gradient (FedOpt) and the clients\' weighting')


class FedOptState(NamedTuple):
  count: jax.Array
  mu: optax.Params
  nu: optax.Params


def scale_by_fedopt(kind: str, *, b1: float, b2: float, tau: float, form: str = 'reddi'
                    ) -> optax.GradientTransformation:
  """The preconditioned direction m / (sqrt(v) + tau) of FedAdam / FedAdagrad / FedYogi (see module doc)."""
  if kind not in ('adam', 'adagrad', 'yogi'):
    raise ValueError(f'adaptive server optimizer {kind!r}; allowed: adam, adagrad, yogi')
  if form not in ADAPTIVE_FORMS:
    raise ValueError(f'server.adaptive_form={form!r}; allowed: {ADAPTIVE_FORMS}')
  reddi = form == 'reddi'
  if kind == 'adagrad' and not reddi:
    b1 = 0.0                                  # torch.optim.Adagrad has no momentum
  v0 = tau * tau if reddi else 0.0
  bias_correction = not reddi

  def init_fn(params):
    mu = jax.tree_util.tree_map(jnp.zeros_like, params)
    nu = jax.tree_util.tree_map(lambda p: jnp.full_like(p, v0), params)
    return FedOptState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda g, m: b1 * m + (1.0 - b1) * g, updates, state.mu)
    if kind == 'adam':
      nu = jax.tree_util.tree_map(lambda g, v: b2 * v + (1.0 - b2) * g * g, updates, state.nu)
    elif kind == 'adagrad':
      nu = jax.tree_util.tree_map(lambda g, v: v + g * g, updates, state.nu)
    else:
      nu = jax.tree_util.tree_map(lambda g, v: v - (1.0 - b2) * g * g * jnp.sign(v - g * g), updates, state.nu)
    count = optax.safe_increment(state.count)
    m_hat, v_hat = mu, nu
    if bias_correction:
      t = count.astype(jnp.float32)
      c1 = 1.0 - b1 ** t if b1 else 1.0
      m_hat = jax.tree_util.tree_map(lambda m: m / c1, mu)
      if kind != 'adagrad':
        c2 = 1.0 - b2 ** t
        v_hat = jax.tree_util.tree_map(lambda v: v / c2, nu)
    out = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + tau), m_hat, v_hat)
    return out, FedOptState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def fedopt_adaptive(kind: str, lr, *, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3,
                    form: str = 'reddi') -> optax.GradientTransformation:
  """FedAdam / FedAdagrad / FedYogi as an optax transform over the pseudo-gradient: w <- w - lr * dir."""
  return optax.chain(scale_by_fedopt(kind, b1=b1, b2=b2, tau=tau, form=form), optax.scale(-lr))


def make_server_tx(server_cfg) -> optax.GradientTransformation:
  name = server_cfg.optimizer
  lr = server_cfg.lr
  if name == 'sgd':
    return optax.sgd(lr, momentum=server_cfg.momentum or None, nesterov=bool(server_cfg.get('nesterov', False)))
  if name not in SERVER_OPTIMIZERS:
    raise ValueError(f'server.optimizer={name!r}; allowed: {SERVER_OPTIMIZERS}')
  form = server_cfg.get('adaptive_form', 'reddi')
  b1 = server_cfg.momentum if name == 'adagrad' else server_cfg.b1
  return fedopt_adaptive(name, lr, b1=b1, b2=server_cfg.b2, tau=server_cfg.eps, form=form)
