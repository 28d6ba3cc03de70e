"""The evaluation plug-in registry (like FedJAX's `periodic_eval_fn_map` and big_vision's `config.evals`).

A plug-in is an `Evaluation`: `applies(plan)` (declared by the config and the algorithm's eval models),
`periodic(trainer) -> metrics` added to every evaluation record, `final(trainer, summary, reported)` adding its
entries (and figures) to summary.json; `resumed(trainer, records) -> bool`: after a checkpoint is restored, may
correct the restored records in place (True when it did: metrics.jsonl is rewritten); `models`: the algorithm's
eval models it is about; `check(plan)`: its rules against the loaded data, run when the recorder is built, before
anything compiles. Each lives in its own
module of this package; `selected(plan)` lists those a run uses, in `order` (the order of their summary
entries). Which model is reported is the algorithm's declaration (`FederatedAlgorithm.reported_models`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

from fedjax_flat.registry import Registry

EVALUATIONS = Registry('evaluation', package='fedjax_flat.training.evals', skip=('registry',))


@dataclasses.dataclass(frozen=True)
class Evaluation:
  name: str
  order: int                                              # position among the selected plug-ins
  applies: Callable[[Any], bool]                          # (run plan) -> whether this run uses it
  periodic: Optional[Callable[[Any], dict]] = None        # (trainer) -> metrics of an evaluation round
  final: Optional[Callable[[Any, dict, str], None]] = None  # (trainer, summary, reported model) -> summary entries
  models: tuple = ()                                      # the algorithm's eval models it is about (documentation)
  resumed: Optional[Callable[[Any, list], bool]] = None   # (trainer, restored records) -> whether it corrected them
  check: Optional[Callable[[Any], None]] = None           # (run plan) -> None: refuses a run it cannot serve, one
                                                          # ConfigError line, when the run is built (before compiling)


def register(evaluation: Evaluation) -> Evaluation:
  EVALUATIONS.register(evaluation.name)(evaluation)
  return evaluation


def selected(plan) -> List[Evaluation]:
  """The plug-ins the run of this plan (training/plan.RunPlan) uses, in order."""
  evs = [EVALUATIONS.get(n) for n in EVALUATIONS.names()]
  return [e for e in sorted(evs, key=lambda e: (e.order, e.name)) if e.applies(plan)]


def reported_model(models, records) -> str:
  """The first of `models` (the algorithm's reported_models, preferred first) with test numbers, else 'global'."""
  return next((m for m in models if any(f'{m}/test_accuracy' in r for r in records)), 'global')
