"""Cross-cutting features that wrap a built algorithm (compressed uploads, robust aggregation, client-level DP, SWA,
WiMA): each declares itself where it is defined, and the builder, the config validation and the run read the
declarations instead of importing each feature.

    FEATURE = features.register(features.Feature(
        'dp', order=30, switch='dp.mode', enabled=enabled, wrap=_wrap,
        upload='delta',          # acts on a model delta: runs only with algorithms declaring upload='delta'
        check=check))            # its rules across config sections: check(config, population)

Adding a feature is its module in algorithms/wrappers/ (registered on the first lookup) plus the module that
declares its config section; nothing central changes:
  order       the wrapping order (lower first): compression 10 sees the algorithm's own upload, the robust
              aggregator 20 reduces what was sent, DP 30 sees the aggregate as the algorithm's, SWA 40 / WiMA 50
              average the server models last
  switch      the config field that turns it on, named in the one-line refusals
  enabled     config -> bool
  wrap        (algorithm, config, WrapContext) -> the wrapped FederatedAlgorithm (its `wrappers` name appended)
  upload      the upload it needs (core/contract.UPLOADS), or None: any. An algorithm declaring another upload is
              refused in one line before anything is compiled, naming the switch and the declaration to make
  check       (config, population) -> None: its cross-section rules (population 0 before the data are loaded)
  divergence  (config, d params, population) -> what to change when the run diverges with it on (the likely
              cause then, not the client's step: training/driver.divergence_hint), or None
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

from fedjax_flat.core.contract import UPLOADS, FederatedAlgorithm
from fedjax_flat.errors import ConfigError
from fedjax_flat.registry import Registry

FEATURES = Registry('feature', package='fedjax_flat.algorithms.wrappers')


@dataclasses.dataclass(frozen=True)
class WrapContext:
  """What a feature may need beyond the config when it wraps the built algorithm."""
  population: Any = 0        # N, the dataset's clients (a RunValue in a batched program)
  data: Any = None           # the training data (None: not loaded, e.g. a traced harness)
  model: Any = None          # the model (pure init / apply)


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  order: int
  switch: str
  enabled: Callable[[Any], bool]
  wrap: Callable[[FederatedAlgorithm, Any, WrapContext], FederatedAlgorithm]
  upload: Optional[str] = None
  check: Optional[Callable[[Any, int], None]] = None
  divergence: Optional[Callable[[Any, int, int], Optional[str]]] = None

  def __post_init__(self):
    if self.upload is not None and self.upload not in UPLOADS:
      raise ValueError(f'feature {self.name!r}: upload={self.upload!r}, one of {UPLOADS} or None')

  def switch_value(self, config):
    node = config
    for part in self.switch.split('.'):
      node = node.get(part) if hasattr(node, 'get') else None
    return node


def register(feature: Feature) -> Feature:
  FEATURES.register(feature.name)(feature)
  return feature


def ordered() -> List[Feature]:
  """Every registered feature in wrapping order."""
  return sorted((FEATURES.get(n) for n in FEATURES.names()), key=lambda f: (f.order, f.name))


def on(config) -> List[Feature]:
  """The features this config turns on, in wrapping order."""
  return [f for f in ordered() if f.enabled(config)]


def check(config, upload: str, population: int = 0) -> None:
  """Every enabled feature's rules, one ConfigError each: the algorithm's declared upload against the one the
  feature acts on, then the feature's own cross-section rules (e.g. DP with compression)."""
  for f in on(config):
    if f.upload is not None and upload != f.upload:
      raise ConfigError(f.switch, f.switch_value(config), f'algorithm {config.algorithm!r} declares '
                        f"upload={upload!r}, and {f.name} acts on a model delta alone; an algorithm whose "
                        "client_final sends exactly {'weighted': {'delta'}, 'uniform': {}} declares "
                        f"upload='delta' where it is registered")
    if f.check is not None:
      f.check(config, population)


def wrap(alg: FederatedAlgorithm, config, ctx: WrapContext) -> FederatedAlgorithm:
  """The built algorithm wrapped by every enabled feature, in order."""
  for f in on(config):
    if f.upload is not None and alg.upload != f.upload:
      raise ConfigError(f.switch, f.switch_value(config), f'algorithm {alg.name!r} declares upload={alg.upload!r}, '
                        f"and {f.name} acts on a model delta alone: declare upload='delta' where it is registered "
                        'if its client_final sends exactly the delta')
    alg = f.wrap(alg, config, ctx)
  return alg


def divergence_hints(config, num_params: int, population: int = 0) -> List[str]:
  """What to change after a divergence, from every enabled feature that says, in order (training/driver.py)."""
  hints = [f.divergence(config, num_params, population) for f in on(config) if f.divergence is not None]
  return [h for h in hints if h]
