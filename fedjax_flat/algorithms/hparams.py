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

The rule types live in fedjax_flat/schema.py (layer 0: every config section is declared with them); this module
re-exports them so an algorithm module keeps importing its rules from here.
"""

from __future__ import annotations

from fedjax_flat.schema import (  # noqa: F401  (re-exported: the algorithm modules' rule types)
    Choice, Flag, Integer, Number, Population, Rule, check, defaults, is_number)
