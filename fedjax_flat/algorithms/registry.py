"""Algorithm registry and the builder that composes an algorithm from config.

build_algorithm(config, model):
  loss    = the task's loss (+ MAN when config.man.zeta > 0)                algorithms/local.py, tasks/base.py
  client  = SGD | SAM | ASAM optimizer chain, hparams broadcast by server   optimizers/client.py
  server  = optax transform on the pseudo-gradient                         optimizers/server.py
  base    = ALGORITHMS[config.algorithm](ctx)                              one module per algorithm
  then the server-side wrappers: SWA (config.swa), WiMA (config.wima)      algorithms/wrappers/swa.py, algorithms/wrappers/wima.py

A new algorithm is one module with a builder `fn(ctx) -> FederatedAlgorithm`, registered here with
`@register('name', hparams={...defaults...})`; its hyperparameters live in `config.algo`.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.optimizers.server import make_server_tx


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """What an algorithm builder gets: the model, the loss, the optimizers and the whole config."""
  model: Any
  loss_fn: Callable
  client_cfg: Any
  server_tx: Any
  make_client_tx: Callable
  config: Any
  population: int = 0        # N, the dataset's number of clients (0 = unknown: config.data.num_clients)
  task: Any = None           # the dataset's task (fedjax_flat/tasks/base.py); None = classification
  chain: Any = None          # chain algorithms (algorithms/fedseq.py): their plan from the chain trainer

  @property
  def algo(self):
    return self.config.algo


_ALGORITHMS: Dict[str, Callable[[BuildContext], FederatedAlgorithm]] = {}
_HPARAMS: Dict[str, dict] = {}

# Modules that register algorithms on import (each one file).
_MODULES = ('fedavg', 'fedprox', 'scaffold', 'feddyn', 'adabest', 'mime', 'fedcm', 'fedacg',
            'fedspeed', 'fedsmoo', 'fedgamma', 'fedgloss', 'fedsoup', 'fedseq', 'silobn')


def register(name: str, hparams: dict = None):
  def deco(fn):
    _ALGORITHMS[name] = fn
    _HPARAMS[name] = dict(hparams or {})
    return fn
  return deco


def _load():
  for m in _MODULES:
    mod = f'fedjax_flat.algorithms.{m}'
    try:
      importlib.import_module(mod)
    except ModuleNotFoundError as e:
      if e.name != mod:
        raise


def names():
  _load()
  return sorted(_ALGORITHMS)


def default_hparams(name: str) -> dict:
  _load()
  return dict(_HPARAMS.get(name, {}))


def build_algorithm(config, model, population: int = 0, task=None, chain=None) -> FederatedAlgorithm:
  _load()
  name = config.algorithm
  if name not in _ALGORITHMS:
    raise ValueError(f'algorithm={name!r} is unknown; allowed: {sorted(_ALGORITHMS)}')
  loss_fn = local_lib.make_loss(model, man_zeta=float(config.man.zeta), task=task,
                                microbatches=int(config.client.get('microbatches', 1)))
  server_tx = make_server_tx(config.server)
  if getattr(model, 'batch_stats', False):   # BatchNorm statistics: averaged, not optimized (core/batch_stats.py)
    from fedjax_flat.core.batch_stats import average_batch_stats
    server_tx = average_batch_stats(server_tx)
  ctx = BuildContext(model=model, loss_fn=loss_fn, client_cfg=config.client,
                     server_tx=server_tx, make_client_tx=make_client_tx, config=config,
                     population=int(population), task=task, chain=chain)
  alg = _ALGORITHMS[name](ctx)
  if config.swa.enabled:
    from fedjax_flat.algorithms.wrappers import swa
    alg = swa.with_swa(alg, config)
  if config.wima.enabled:
    from fedjax_flat.algorithms.wrappers import wima
    alg = wima.with_wima(alg, config)
  return alg
