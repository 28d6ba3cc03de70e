"""`train(algorithm, config)`: run an algorithm *object* or a registered name, from a notebook or a binary.

    import fedjax_flat as ff

    @ff.register('clipped_fedavg', hparams={'clip': ff.Number(1.0, lo=0, lo_open=True)})
    def clipped_fedavg(ctx): ...                     # ctx: BuildContext -> FederatedAlgorithm

    result = ff.train(clipped_fedavg, ff.default_config(...))     # or ff.train('fedavg', config)
    result.summary['final_test_accuracy'], result.params

An algorithm is named once, where it is registered: `train` runs the builder under that name, so the run's
config.json, checkpoints, sweeps and reports name it as they name the built-in ones, and the same validation
refuses a bad config before anything is compiled. A builder that was never registered runs under its function
name with no declared hyperparameters, for the run only: the global registry is the same after the run as before
(`running`; a name taken by another definition is refused, registry.DuplicateName). Without a workdir the run
writes no files and keeps its records in memory; with one it is `experiments/train.py`'s run: workdir lock,
resume from the newest checkpoint, metrics.jsonl, summary.json / .md, TensorBoard.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator, List, Optional, Union

from fedjax_flat import registry as registry_lib
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.training import run as run_lib
from fedjax_flat.training import tracking as tracking_lib
from fedjax_flat.training import trainers


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What a finished run leaves: its summary (summary.json's dict), the reported model's params, the final
  server state, every evaluation record, the built algorithm, the model (pure init / apply), the data and the
  trainer (everything else it built)."""
  summary: dict
  params: Any
  server_state: Any
  records: List[dict]
  algorithm: Any
  model: Any
  data: Any
  trainer: Any


@contextlib.contextmanager
def running(algorithm: Union[str, Callable]) -> Iterator[str]:
  """The registered name of `algorithm` for the span of the block: a name as is; a builder by its registration,
  or, never registered, under its function name until the block ends (registry.DuplicateName if another
  definition holds that name)."""
  if isinstance(algorithm, str):
    yield algorithm
    return
  if not callable(algorithm):
    raise TypeError(f'algorithm={algorithm!r}: a registered name or a builder fn(ctx) -> FederatedAlgorithm')
  name = alg_registry.name_of(algorithm)
  if name is not None:
    yield name
    return
  # Registered for this run only: a notebook that tries builders one after another leaves no names behind.
  with registry_lib.scoped(algorithm):
    alg_registry.register(algorithm.__name__)(algorithm)
    yield algorithm.__name__


def train(algorithm: Union[str, Callable], config, workdir: Optional[str] = None, *, fresh: bool = False,
          data=None, handle_signals: bool = False, tracking=None) -> TrainResult:
  """Trains `algorithm` (a registered name or a builder function) with `config` (config.algorithm is set to its
  name; config.algo holds its hyperparameters over the declared defaults). The config is validated before any
  data are loaded; errors are the binaries' (errors.ConfigError: one line naming the field). `workdir`: write
  and resume as experiments/train.py does (`fresh=True` starts over); None: in memory, no files. `data`: a
  FederatedDataset to use instead of config.dataset's. `handle_signals` (with a workdir; experiments/train.py):
  SIGTERM / SIGINT finish the round, checkpoint and return (training/run.py). `tracking` (with a workdir): a
  training/tracking.Spec, the run tracked to MLflow or W&B (docs/tracking.md)."""
  config = config.copy_and_resolve_references()
  with running(algorithm) as name:
    with config.unlocked():
      config.algorithm = name
    if workdir is None:
      if tracking is not None:
        raise tracking_lib.TrackingError('tracking a run needs its workdir (tracker.json keeps the tracked run '
                                         'id for a resume): give workdir=')
      trainer = trainers.make_trainer(config, None, data=data)
      summary = trainer.train()
    else:
      summary, trainer = run_lib.execute(config, workdir, fresh=fresh, data=data, handle_signals=handle_signals,
                                         tracking=tracking)
  models = trainer.algorithm.eval_models(trainer.server_state)
  reported = summary.get('reported_model', 'global')
  params = models.get(reported, models['global'])[0]
  return TrainResult(summary, params, trainer.server_state, list(trainer.records), trainer.algorithm, trainer.model,
                     trainer.data, trainer)
