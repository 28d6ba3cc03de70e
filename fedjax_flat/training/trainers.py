"""`make_trainer(config)`: the trainer a config needs, chosen where it can be seen.

The FedSeq family (chain algorithms: the algorithm declares it needs chains) runs on `ChainTrainer`
(training/chain_loop.py); every other algorithm on `Trainer` (training/loop.py). Both take the same arguments.
"""
from __future__ import annotations

from fedjax_flat.training import chain_loop, loop


def trainer_class(config):
  return chain_loop.ChainTrainer if chain_loop.is_chain_config(config) else loop.Trainer


def make_trainer(config, workdir=None, *, grouping_context=None, **kwargs) -> loop.Trainer:
  """`grouping_context`: training/init.grouping_context, which a chain trainer's grouping needs when config.init
  or grouping.probe_checkpoint names another run (training/run.py passes it; config.init itself is applied after
  construction there)."""
  cls = trainer_class(config)
  if cls is chain_loop.ChainTrainer:
    kwargs['grouping_context'] = grouping_context
  return cls(config, workdir, **kwargs)
