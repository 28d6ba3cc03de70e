"""`make_trainer(config)`: the trainer a config needs, chosen where it can be seen.

The FedSeq family (chain algorithms: the algorithm declares it needs chains) runs on `ChainTrainer`
(training/chain_loop.py); every other algorithm on `Trainer` (training/loop.py). Both take the same arguments.
A config asking for k-means client domains (algo.domains='kmeans' of an algorithm declaring the need
'client_domains': FedCG) gets its training data from that pass first (grouping/domains.py; cached in
WORKDIR/grouping/); the clusters are `trainer.client_domains` ([K] ints), None otherwise.
"""
from __future__ import annotations

from absl import logging
import numpy as np

from fedjax_flat.config import validate
from fedjax_flat.grouping import domains as grouping_domains
from fedjax_flat.training import chain_loop, loop, plan as plan_lib


def trainer_class(config):
  return chain_loop.ChainTrainer if chain_loop.is_chain_config(config) else loop.Trainer


def make_trainer(config, workdir=None, *, grouping_context=None, **kwargs) -> loop.Trainer:
  """`grouping_context`: training/init.grouping_context, which a chain trainer's grouping needs when config.init
  or grouping.probe_checkpoint names another run (training/run.py passes it; config.init itself is applied after
  construction there)."""
  cls = trainer_class(config)
  if cls is chain_loop.ChainTrainer:
    kwargs['grouping_context'] = grouping_context
  client_domains, info = None, {}
  if grouping_domains.requested(plan_lib.declaration(config)):   # static declarations: before anything is built
    validate.validate_config(config)       # a bad config fails before the pre-training pass
    kwargs['data'], client_domains, info = grouping_domains.kmeans_from_config(config, kwargs.get('data'), workdir)
    logging.info('k-means client domains: %s clients per domain',
                 np.bincount(client_domains, minlength=int(config.model_kwargs.get('num_domains', 4))).tolist())
  trainer = cls(config, workdir, **kwargs)
  trainer.client_domains = client_domains
  trainer.client_planted_domains = info.get('planted_of')    # the clients' majority planted domains (or None)
  return trainer
