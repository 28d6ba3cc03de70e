"""Small helpers the algorithm modules share (one definition each).

  client_parts(client_cfg)    (client_tx, hparams_fn): the client optimizer and the round's schedule {'lr', 'rho'}
  population(ctx, hp)         N for |C|/N and 1/N factors
  server_step_to(tx, s, w*)   ServerOpt on the pseudo-gradient w - w* (server SGD lr 1: w' = w*)
  without_sharpness(cfg)      the client config with optimizer 'sgd' (methods with their own ascent step)
  global_norm, tree_sub, tmap pytree arithmetic
  check_head(cfg, hp)         a head/body algorithm needs a model that declares its head

The algorithm's hyperparameters (ctx.hp) and the round's client schedule (ctx.hparams_fn: round -> {'lr', 'rho'})
are resolved once, in registry.build_algorithm, and reach the builders on the BuildContext.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_flat.core.runs import RunValue
from fedjax_flat.errors import ConfigError
from fedjax_flat.models import registry as model_registry
from fedjax_flat.optimizers.client import client_optimizer
from fedjax_flat.optimizers.schedules import client_round_hparams as make_hparams_fn

tmap = jax.tree_util.tree_map


def run_value(x):
  """A config number as a builder keeps it: a Python float, or in a batched program (core/runs.py) the run's own
  traced value, kept traced: float() of it would freeze one run's value into the program every run shares (the
  contract's rule for per-run values, core/contract.py)."""
  return x if isinstance(x, RunValue) else float(x)


def client_parts(client_cfg):
  """(client_tx, hparams_fn) of a client config: the client optimizer (optimizers/client.py) and the round's
  schedule, round -> the broadcast {'lr', 'rho'} (optimizers/schedules.py). Built once per algorithm, by
  registry.build_algorithm (ctx.client_tx, ctx.hparams_fn); an inner builder called directly takes the pair."""
  return client_optimizer(client_cfg), make_hparams_fn(client_cfg)


def tree_sub(a, b):
  return tmap(lambda x, y: x - y, a, b)


def population(ctx, hp: dict) -> int:
  """N, the number of clients (SCAFFOLD's |S|/N, FedDyn's 1/m): algo.population, else the dataset's number of
  clients (BuildContext.population), else config.data.num_clients. The registry's 'population' need checks an
  explicit algo.population against the dataset before anything is built (registry.check_population)."""
  explicit, given = int(hp.get('population', 0) or 0), getattr(ctx, 'population', 0)
  if not explicit and isinstance(given, RunValue):
    return given      # a batched program whose runs have other populations: each lane's own N, traced
  n = explicit or int(given or 0) or int(ctx.config.data.get('num_clients', 0) or 0)
  if n <= 0:
    raise ValueError('this algorithm needs the population size N: set config.algo.population '
                     '(or config.data.num_clients)')
  return n


def server_step_to(server_tx, state, target):
  """ServerOpt on the pseudo-gradient w - target: with server SGD lr 1 (the papers' setting) w' = target."""
  w = state['params']
  pseudo = tmap(lambda a, b: a - b, w, target)
  updates, opt_state = server_tx.update(pseudo, state['opt_state'], w)
  return {**state, 'params': optax.apply_updates(w, updates), 'opt_state': opt_state}


def without_sharpness(client_cfg):
  """The client config with optimizer 'sgd': for methods that compute their own ascent step (FedSpeed,
  FedSMOO) and feed the resulting gradient to the rest of the client chain (correction, clip, wd, sgd)."""
  cfg = ml_collections.ConfigDict(client_cfg.to_dict())
  cfg.optimizer = 'sgd'
  return cfg


def global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree)))


def check_head(cfg, hp=None) -> None:
  """A head/body algorithm (FedRep, FedBABU, MOON) on a model that declares no classifier head: one ConfigError,
  before anything is built (models/partition.py; the head is declared where the model registers)."""
  del hp
  if cfg.model in model_registry.MODELS and not model_registry.declared_head(cfg.model, cfg.get('model_kwargs')):
    with_head = [n for n in model_registry.names() if model_registry.declared_head(n, {})]
    raise ConfigError('model', cfg.model, f'{cfg.algorithm} splits the model into body and head, and this model '
                      f'declares no head; models that do: {with_head}')


def check_sgd_one_lr(cfg, name: str, why: str) -> None:
  """Refuses, in one line, a client optimizer other than SGD or an lr that changes within a round: `name`'s rule
  (`why`) reads the lr as the one step size of SGD steps (FedNova's normalization, q-FFL's L = 1/lr)."""
  if cfg.client.get('base_optimizer', 'sgd') != 'sgd':
    raise ConfigError('client.base_optimizer', cfg.client.base_optimizer, f'{name} {why}: use sgd')
  if cfg.client.get('lr_schedule', 'constant') == 'poly_step':
    raise ConfigError('client.lr_schedule', 'poly_step', f"{name} {why}, one lr within a round: use 'constant' or "
                      "'poly_round'")
