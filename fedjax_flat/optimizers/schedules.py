"""Every schedule of the client hyperparameters, in one place. All are jnp-traceable.

The client's lr and rho follow two clocks:
* per round (the server broadcasts them, `client_round_hparams`): rho's warm-up (`rho_warmup`), the lr's
  polynomial decay over rounds (client.lr_schedule='poly_round', `poly_lr`); server-side wrappers may replace
  the broadcast lr (SWA's cyclic lr, `swa_cyclic_lr`, algorithms/wrappers/swa.py);
* per local step (inside the client optimizer, `client_step_lr`): client.lr_schedule='poly_step' decays the
  broadcast lr over the round's local steps (optimizers/client.py).

* `rho_warmup`: FedGloSS's local rho warm-up (thesis App. A.2):
      rho(t) = rho0 + (rho - rho0) * t / T_s   for t <= T_s,   rho   for t > T_s.
* `server_rho_schedule`: FedGloSS's server radius rho_s(t) (`algo.rho_server_schedule`): 'constant',
  'linear' (the intended warm-up rho0 -> rho_s over T_s rounds) or 'release' (as the release code behaves).
* `swa_cyclic_lr`: the client learning rate during server-side SWA (FedSAM, Eq. 2.36-2.37), in the
  FedSAM code's 0-based form:
      gamma(i) = (1 - t) * gamma1 + t * gamma2,   t = ((i mod c) + 1) / c.
"""
from __future__ import annotations

from typing import Callable, Dict, Union

import jax
import jax.numpy as jnp

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import RESULT, VALUE, Field, Flag, Int, Num, Section

Scalar = Union[int, float, jax.Array]


def rho_warmup(rho0: float, rho: float, warmup_rounds: int) -> Callable[[Scalar], jax.Array]:
  """Linear warm-up of the local SAM radius from `rho0` (at t = 0) to `rho` (at t = warmup_rounds).

  Args:
    rho0: radius at round 0. The thesis uses 0.001.
    rho: final radius, reached at round `warmup_rounds` and kept afterwards.
    warmup_rounds: T_s, a Python int >= 0. With T_s = 0 the radius is `rho` at every round.

  Returns:
    `t -> rho(t)` (float32 scalar). `t` may be a traced integer. Rounds t < 0 give rho0.
  """
  if warmup_rounds < 0:
    raise ValueError(f'warmup_rounds must be >= 0, got {warmup_rounds}')

  def schedule(t):
    rho_final = jnp.asarray(rho, jnp.float32)
    if warmup_rounds == 0:
      return rho_final
    t = jnp.asarray(t, jnp.float32)
    frac = jnp.clip(t / warmup_rounds, 0.0, 1.0)
    ramp = jnp.asarray(rho0, jnp.float32) + (rho_final - rho0) * frac
    # Exactly `rho` from T_s on (the ramp can be 1 ulp off in float32).
    return jnp.where(t >= warmup_rounds, rho_final, ramp)

  return schedule


SERVER_RHO_SCHEDULES = ('constant', 'release', 'linear')


def server_rho_schedule(kind: str, rho0: float, rho_client: float, rho_server: float,
                        warmup_rounds: int) -> Callable[[Scalar], jax.Array]:
  """FedGloSS's server SAM radius as a function of the 0-based round t.

  The release code (pietrocagnasso/fedgloss, codebase/servers/fedgloss_server.py) builds, for T_s > 1,
      server_rhos = [rho0] + [rhos_l[-1] + (rho_s - rho0) / T_s] * T_s + [rho_s] * ...
  because each warm-up step starts from the *client* list's last value (rhos_l[-1] = rho_l, the client's
  final radius) instead of the server list's. So for 1 <= t <= T_s the server radius is
  rho_l + (rho_s - rho0) / T_s (~rho_l), and rho_s only after T_s: the published CIFAR-100 script
  (rho_l 0.2, rho_s 0.01, T_s 15000 of 20000 rounds) ran with server rho ~0.2 for 15000 rounds.
  One T_s drives both the client and the server lists there, hence `warmup_rounds` = client.rho_warmup_rounds.

  kind:
    'constant': rho_s at every round (T_s ignored).
    'release': as the release code behaves (above); T_s <= 1 gives rho_s at every round, as there.
    'linear': the intended warm-up, rho0 + (rho_s - rho0) t / T_s up to T_s, then rho_s (T_s = 0: constant).
  Round 0 has no server ascent in FedGloSS (no previous pseudo-gradient), so the t = 0 value (rho0) is only
  used by NaiveFedGloSS.
  """
  if kind not in SERVER_RHO_SCHEDULES:
    raise ValueError(f'rho_server_schedule={kind!r}; allowed: {SERVER_RHO_SCHEDULES}')
  if kind == 'linear':
    return rho_warmup(rho0, rho_server, warmup_rounds)
  if kind == 'constant' or warmup_rounds <= 1:
    return lambda t: jnp.asarray(rho_server, jnp.float32)
  # Python float64 first (as the release code), one cast to float32.
  plateau = float(rho_client) + (float(rho_server) - float(rho0)) / warmup_rounds

  def schedule(t):
    t = jnp.asarray(t, jnp.int32)
    return jnp.where(t <= 0, jnp.float32(rho0),
                     jnp.where(t <= warmup_rounds, jnp.float32(plateau), jnp.float32(rho_server)))

  return schedule


def swa_cyclic_lr(gamma1: float, gamma2: float, cycle: int) -> Callable[[Scalar], jax.Array]:
  """SWA cyclic client learning rate, as a function of the 0-based absolute round index i.

  gamma(i) = (1 - t) gamma1 + t gamma2, with t = ((i mod c) + 1) / c. Inside a cycle the learning
  rate falls linearly from (1 - 1/c) gamma1 + gamma2 / c to gamma2, which it reaches at rounds
  i = -1 (mod c).

  For c = 1 the formula would give gamma2 at every round. The thesis calls the c = 1 schedule
  "constant", and the FedSAM reference code leaves the client learning rate unchanged for c = 1
  (it stays eta_l = gamma1). So here c = 1 returns gamma1 at every round.

  Args:
    gamma1: upper learning rate. In the FedSAM code this is the client lr eta_l (0.01 on CIFAR).
    gamma2: lower learning rate, reached at the end of each cycle.
    cycle: c, a Python int >= 1.

  Returns:
    `i -> gamma(i)` (float32 scalar). `i` may be a traced integer.
  """
  if cycle < 1:
    raise ValueError(f'cycle must be >= 1, got {cycle}')

  def schedule(i):
    if cycle == 1:
      return jnp.asarray(gamma1, jnp.float32)
    i = jnp.asarray(i, jnp.int32)
    t = (jnp.mod(i, cycle) + 1).astype(jnp.float32) / cycle
    return (1.0 - t) * gamma1 + t * gamma2

  return schedule


def _swa_check(cfg) -> None:
  s = cfg.swa
  if s.enabled and not (s.average or s.cyclic_lr):
    raise ConfigError('swa.average', s.average, 'swa.average and swa.cyclic_lr cannot both be False '
                      'when swa.enabled (disable SWA instead)')


# config.swa: server-side SWA. Declared here, beside its cyclic lr (the lowest code that reads it, and the layer
# of the batched runs whose per-run values include lr1 / lr2); algorithms/wrappers/swa.py averages the models,
# training/centralized.py runs SWA over epochs.
SWA_SECTION = Section('swa', (
    Field('enabled', Flag(False), 'server-side SWA (algorithms/wrappers/swa.py)'),
    Field('start_fraction', Num(0.75, lo=0, hi=1, hi_open=True), 'SWA starts at round floor(start_fraction * rounds)'),
    Field('cycle', Int(10, lo=1), 'c: rounds of one cyclic-lr cycle and between two averages'),
    Field('lr1', Num(1e-2, lo=0, lo_open=True), 'the cyclic client lr at the start of a cycle', {VALUE}),
    Field('lr2', Num(1e-4, lo=0, lo_open=True), 'the cyclic client lr at the end of a cycle', {VALUE}),
    Field('average', Flag(True), 'False: the "cyclic learning rate only" ablation'),
    Field('cyclic_lr', Flag(True), 'False: the "weight averaging only" ablation'),
), check=_swa_check, tags={RESULT}, doc='server-side SWA (FedSAM): cyclic client lr and averaged server models')


LR_SCHEDULES = ('constant', 'poly_step', 'poly_round')


def poly_lr(base: Scalar, power: float, max_count: int) -> Callable[[Scalar], jax.Array]:
  """Polynomial decay (DeepLab's "poly", FedDrive's client scheduler): base * (1 - t / T) ** power.

  FedDrive (src/utils/scheduler.py, src/clients/client.py) builds a fresh `LambdaLR` for every client in
  every round with T = 10000 * E * len(loader), i.e. t counts the client's local steps from 0 each round
  ('poly_step': client.lr_schedule), so within a round the factor stays above (1 - 1e-4) ** 0.9. 'poly_round'
  decays over rounds instead (t = round, T = client.lr_poly_max). t >= T gives 0.

  Args:
    base: the learning rate at t = 0 (may be traced: the server's broadcast lr, e.g. SWA's cyclic lr).
    power: 0.9 in FedDrive and DeepLab.
    max_count: T, a Python int >= 1.
  """
  if max_count < 1:
    raise ValueError(f'max_count must be >= 1, got {max_count}')

  def schedule(t):
    frac = jnp.clip(1.0 - jnp.asarray(t, jnp.float32) / max_count, 0.0, 1.0)
    return jnp.asarray(base, jnp.float32) * frac ** jnp.float32(power)

  return schedule


def client_hparams(lr: Scalar, rho: Scalar) -> Dict[str, jax.Array]:
  """What one client step reads, {'lr', 'rho'} as float32 scalars: the round's broadcast (client_round_hparams)
  and one-off local training alike (personalized fine-tuning, centralized epochs, grouping's pretraining)."""
  return {'lr': jnp.asarray(lr, jnp.float32), 'rho': jnp.asarray(rho, jnp.float32)}


def client_round_hparams(client_cfg) -> Callable[[Scalar], Dict[str, jax.Array]]:
  """Round -> the client hyperparameters the server broadcasts, {'lr', 'rho'} (float32 scalars).

  rho follows the optional linear warm-up (client.rho0 -> client.rho over client.rho_warmup_rounds); lr the
  optional per-round polynomial decay (client.lr_schedule='poly_round': lr * (1 - r / lr_poly_max) ** lr_power).
  """
  rho_fn = rho_warmup(client_cfg.get('rho0', 0.0), client_cfg.rho, client_cfg.get('rho_warmup_rounds', 0))
  lr_fn = lambda r: client_cfg.lr  # noqa: E731
  if client_cfg.get('lr_schedule', 'constant') == 'poly_round':
    lr_fn = poly_lr(client_cfg.lr, client_cfg.lr_power, int(client_cfg.lr_poly_max))

  def hparams(round_idx):
    return client_hparams(lr_fn(round_idx), rho_fn(round_idx))
  return hparams


def client_step_lr(client_cfg) -> Callable[[Scalar], Union[Scalar, Callable[[Scalar], jax.Array]]]:
  """broadcast lr -> what the client's base optimizer gets as its learning rate: the lr itself, or with
  client.lr_schedule='poly_step' the schedule `local step t -> lr * (1 - t / lr_poly_max) ** lr_power`
  (FedDrive's client scheduler; t restarts at 0 every round with the client optimizer's state)."""
  if client_cfg.get('lr_schedule', 'constant') == 'poly_step':
    power, max_count = client_cfg.lr_power, int(client_cfg.lr_poly_max)
    return lambda lr: poly_lr(lr, power, max_count)
  return lambda lr: lr
