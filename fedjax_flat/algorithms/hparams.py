"""Typed rules for an algorithm's hyperparameters (config.algo.<name>).

An algorithm declares each hyperparameter once, next to its code, as a rule that carries its default:

    @register('fedprox', hparams={'mu': Number(0.01, lo=0)})

    Number(default, lo=, hi=, lo_open=, hi_open=)   a real number in an interval; an end left None is open
                                                   (infinite). Message: 'must be a number in [lo, inf)', or
                                                   with bound=True 'must be a number >= lo' (finite=True:
                                                   'a finite number'); `note` is appended.
    Integer(default, lo=)                          an integer >= lo ('must be an integer >= lo' + note)
    Flag(default)                                  True or False
    Choice(default, allowed)                       one of `allowed` (listed in the message in the given order)
    Population()                                   algo.population, N: an integer >= 0, 0 = the dataset's
                                                   number of clients (also declare needs=('population',)
                                                   when the algorithm always scales by N)

`defaults(rules)` gives {name: default}, which is what `config.algo` is filled with
(`algorithms.registry.default_hparams`, `--config.algo.<k>=<v>` in config/algo_flags.py). `check(rules, hp)`
raises `ConfigError('algo.<name>', value, why)` for the first value its rule refuses. A rule never sees the
rest of the config: cross-field rules are the algorithm's `check(cfg, hp)` hook (algorithms/registry.py).
"""
from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from typing import Any, Dict, Mapping, Optional, Tuple

from fedjax_flat.errors import ConfigError


def is_number(v, integer: bool = False) -> bool:
  """A real (or integral) number that is not a bool."""
  return not isinstance(v, bool) and isinstance(v, numbers.Integral if integer else numbers.Number)


@dataclasses.dataclass(frozen=True)
class Rule(abc.ABC):
  default: Any

  @abc.abstractmethod
  def why_not(self, v) -> Optional[str]:
    """None when v is allowed, else the reason (the text after 'algo.<name>=<v>: ')."""


@dataclasses.dataclass(frozen=True)
class Number(Rule):
  lo: Optional[float] = None
  hi: Optional[float] = None
  lo_open: bool = False
  hi_open: bool = False
  bound: bool = False           # message 'must be a number >= lo' instead of the interval
  finite: bool = False          # refuse inf / nan (and say 'finite' in the message)
  note: str = ''

  def why_not(self, v):
    lo, hi = self.lo, self.hi
    ok = is_number(v) and (not self.finite or math.isfinite(v))
    ok = ok and not (lo is not None and (v <= lo if self.lo_open else v < lo))
    ok = ok and not (hi is not None and (v >= hi if self.hi_open else v > hi))
    if ok:
      return None
    if self.bound:
      return (f'must be a {"finite " if self.finite else ""}number {">" if self.lo_open else ">="} {lo}'
              + self.note)
    left = '-inf' if lo is None else lo
    rng = (f'{"(" if self.lo_open or lo is None else "["}{left}, {hi if hi is not None else "inf"}'
           f'{")" if self.hi_open or hi is None else "]"}')
    return f'must be a number in {rng}' + self.note


@dataclasses.dataclass(frozen=True)
class Integer(Rule):
  lo: int = 0
  note: str = ''

  def why_not(self, v):
    if is_number(v, integer=True) and v >= self.lo:
      return None
    return f'must be an integer >= {self.lo}' + self.note


@dataclasses.dataclass(frozen=True)
class Flag(Rule):
  def why_not(self, v):
    return None if isinstance(v, bool) else 'must be True or False'


@dataclasses.dataclass(frozen=True)
class Choice(Rule):
  allowed: Tuple[str, ...] = ()
  note: str = ''

  def why_not(self, v):
    return None if v in self.allowed else f'allowed values: {list(self.allowed)}' + self.note


def Population() -> Integer:  # noqa: N802  (reads as a rule type at the declaration)
  """algo.population: N for |C|/N and 1/N factors; 0 = the dataset's number of clients."""
  return Integer(0, lo=0, note=" (0 = the dataset's number of clients)")


def defaults(rules: Mapping[str, Rule]) -> Dict[str, Any]:
  return {k: r.default for k, r in rules.items()}


def check(rules: Mapping[str, Rule], hp: Mapping[str, Any]) -> None:
  """Every declared hyperparameter of `hp` (defaults filled in) against its rule, in declaration order."""
  for name, rule in rules.items():
    why = rule.why_not(hp[name])
    if why:
      raise ConfigError(f'algo.{name}', hp[name], why)
