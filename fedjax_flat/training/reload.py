"""A finished (or running) run, reloaded read-only: its trainer, the params of one of its models, the round.

What the analysis tools (experiments/hessian.py), `config.init.checkpoint` (training/init.py) and
`grouping.probe_checkpoint` start from. Nothing is written; a live run's checkpoints are only read.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Tuple

import jax
import ml_collections
import numpy as np

from fedjax_flat.errors import BadInputError, DataFormatError
from fedjax_flat.config.default_config import WHOLE_SECTIONS, data_section, default_config
from fedjax_flat.run_dir import run_dir_of
from fedjax_flat.training import checkpoint, trainers
from fedjax_flat.training.loop import DEVICES_KEY


def read_saved_config(workdir: str) -> Dict[str, Any]:
  """WORKDIR/config.json as written by the run (a dict); BadInputError when it is not a run directory,
  DataFormatError when the file is truncated or not a config."""
  cfg_path = os.path.join(workdir, 'config.json')
  if not os.path.isdir(workdir):
    raise BadInputError(f'{workdir} is not a directory: give a run directory written by experiments/train.py '
                        '(holding config.json and checkpoints/)')
  if not os.path.isfile(cfg_path):
    raise BadInputError(f'{workdir} is not a run directory: no config.json (expected a directory written by '
                        'experiments/train.py, holding config.json and checkpoints/)')
  try:
    with open(cfg_path, 'rb') as f:
      saved = json.loads(f.read())
  except (ValueError, RecursionError) as e:
    raise DataFormatError(f'{cfg_path} is not valid JSON ({type(e).__name__}: {e}): the run\'s config is '
                          'truncated or corrupted') from None
  if not isinstance(saved, dict) or not isinstance(saved.get('dataset'), str) or \
      not isinstance(saved.get('data'), dict):
    raise DataFormatError(f'{cfg_path} is not a run\'s config (a JSON object with dataset, data, model, ...)')
  return saved


def restore_config(saved: Dict[str, Any]) -> ml_collections.ConfigDict:
  """The run's ConfigDict from its config.json dict: every saved field as saved. Fields added to the code
  since the run was written keep their defaults, except in `WHOLE_SECTIONS` (config.data, model_kwargs, algo,
  ...), which a config replaces whole and which are therefore restored whole: merging a FEMNIST run's
  data section into the default one would add the digits' `num_clients=20`."""
  config = default_config()

  def merge(node, d, prefix):
    for k, v in d.items():
      path = prefix + k
      if path == DEVICES_KEY:
        continue            # the writing process's device record (training/loop.write_config)
      if path in WHOLE_SECTIONS and isinstance(v, dict):
        section = data_section(**v) if path == 'data' else ml_collections.ConfigDict(v)
        with node.ignore_type():
          node[k] = section
      elif isinstance(v, dict) and k in node and isinstance(node[k], ml_collections.ConfigDict):
        merge(node[k], v, path + '.')
      else:
        with node.ignore_type():
          node[k] = v
  merge(config, saved, '')
  return config


def _read_only_advice(e: Exception) -> str:
  """A checkpoint error's message without the advice of a training run (--fresh, --workdir): nothing here
  writes to the run."""
  text = ' '.join(str(e).split())
  text = re.sub(r'\s*(Pass|Use|Resume with)[^.]*--(fresh|workdir)[^.]*\.', '', text)
  return text.strip()


def load_run(workdir: str, which: str = 'global', step=None) -> Tuple[object, object, int]:
  """(trainer, params, round) from a run directory's config.json and its newest checkpoint (or checkpoint
  `step`); builds the run's data and model, writes nothing."""
  workdir = run_dir_of(workdir)
  config = restore_config(read_saved_config(workdir))
  if config.get('init') is not None:     # the source's own initialisation is in its checkpoint already
    config.init.checkpoint = ''
    config.init.pretrained = ''
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(ckpt_dir):
    raise BadInputError(f'{workdir} has no checkpoints/ folder: the run has not written a checkpoint yet '
                        '(runs write one at the end, and every config.checkpoint_every rounds)')
  ckpt = checkpoint.Checkpointer(ckpt_dir, read_only=True)   # the run may be live
  try:
    if step is not None and int(step) not in ckpt.steps():
      raise BadInputError(f'round {int(step)} was not kept by the run {workdir}: its checkpoints are rounds '
                          f'{ckpt.steps()} (a run keeps chosen rounds with config.keep_rounds, more with '
                          'config.checkpoint_every / keep_checkpoints)')
    trainer = trainers.make_trainer(config, None, write_files=False)
    try:
      step = ckpt.restore_latest(trainer) if step is None else ckpt.restore_step(trainer, int(step))
    except checkpoint.CheckpointMismatchError as e:
      fields = ', '.join(f'config.{f}: checkpoint {old!r}, config.json {new!r}' for f, old, new in e.diffs[:4])
      raise BadInputError(f'{workdir}: its checkpoint {e.step} was written by another config than its '
                          f'config.json ({fields}): config.json and checkpoints/ come from different runs') from None
    except checkpoint.CheckpointError as e:
      raise checkpoint.CheckpointError(_read_only_advice(e)) from None
  finally:
    ckpt.close()
  if step is None:
    raise BadInputError(f'no checkpoint in {workdir}/checkpoints (runs write one at the end)')
  models = trainer.algorithm.eval_models(trainer.server_state)
  if which not in models:
    raise BadInputError(f'model {which!r}: the run {workdir} has models {sorted(models)}; choose one of them')
  params, active = models[which]
  if not bool(active):
    raise BadInputError(f'model {which!r} of {workdir} is not active at round {step} (e.g. SWA had not started); '
                        "choose --model=global or a later round")
  return trainer, jax.device_get(params), step


def _leaves(params) -> Dict[str, Tuple[tuple, str]]:
  """{'/'-joined path: (shape, dtype)} of a params pytree."""
  return {'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): (np.shape(v), str(np.asarray(v).dtype))
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def check_same_model(workdir: str, config, params, other_workdir: str, other_config, other_params) -> None:
  """BadInputError unless two runs' models can be mixed (interpolated): the same config.model and the same
  parameters (paths, shapes, dtypes). Called before any work on either model, so a wrong pairing costs nothing."""
  flag = f'--interpolate_with={other_workdir}'
  if config.model != other_config.model:
    raise BadInputError(f"{flag}: its model is {other_config.model!r}, the model of {workdir} is {config.model!r}; "
                        'interpolation needs two runs of the same model: choose a run of the same config.model')
  a, b = _leaves(params), _leaves(other_params)
  diffs = [f'{k}: missing in {other_workdir}' for k in a if k not in b]
  diffs += [f'{k}: only in {other_workdir}' for k in b if k not in a]
  diffs += [f'{k}: {a[k][0]} {a[k][1]} vs {b[k][0]} {b[k][1]}' for k in a if k in b and a[k] != b[k]]
  if diffs:
    raise BadInputError(f'{flag}: its parameters do not fit the model of {workdir} ({len(diffs)} difference(s), '
                        f'e.g. {"; ".join(diffs[:2])}): choose a run of the same model and model_kwargs')
