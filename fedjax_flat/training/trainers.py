"""`make_trainer(config)`: the trainer a config needs, chosen where it can be seen.

The FedSeq family (chain algorithms: the algorithm declares it needs chains) runs on `ChainTrainer`
(training/chain_loop.py); every other algorithm on `Trainer` (training/loop.py). Both take the same arguments.
"""
from __future__ import annotations

from fedjax_flat.training import chain_loop, loop


def trainer_class(config):
  return chain_loop.ChainTrainer if chain_loop.is_chain_config(config) else loop.Trainer


def make_trainer(config, workdir=None, *, init_params=None, **kwargs) -> loop.Trainer:
  """`init_params`: training/init.initial_params, which a chain trainer needs for its grouping's w_0 when
  config.init is set (the client trainer applies config.init after construction: training/run.py)."""
  cls = trainer_class(config)
  if cls is chain_loop.ChainTrainer:
    kwargs['init_params'] = init_params
  return cls(config, workdir, **kwargs)
