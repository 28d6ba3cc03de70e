"""Client domains from k-means on locally trained client models: the "K-means" alternative of FedCG's domain
discovery (thesis Table 5.10; algorithms/fedcg.py).

  kmeans_domains(config, model, data, num_domains, classifier_key, workdir=None) -> (data', labels [K], info)

Every client trains the common initial model on its own data (grouping's pre-training pass: config.grouping
.pretrain_epochs local epochs of the client optimizer without SAM, cached in WORKDIR/grouping/ like FedSeq's),
its classifier weights are the client's representation (psi_clf, standardised + PCA as config.grouping says),
and Euclidean k-means (k-means++, 10 restarts, seeded by grouping.seed / config.seed) splits the clients into
`num_domains` clusters. One domain per client: every training image of client k gets domain c_k, written into
the domain column of the labels ([class, domain], tasks/domains.py) of a copy of the data; the test labels keep
their column (the planted or oracle domains, against which purity is measured). FedCG then trains on these
domains as on given ones (algo.domains='oracle'); at test time its student predicts them.

`model` is the network the clients train for the representation (the thesis: "models trained independently on
each client"; configs use the plain body, fedcg_net with domain_layers='none'); `classifier_key` its output
layer's path ('net/layer_<n>' for fedcg_net).

The config value: algo.domains='kmeans' of an algorithm declaring the need 'client_domains' (FedCG).
`requested(declared)` says so (declared: the algorithm's static declarations, algorithms/registry.declared);
`kmeans_from_config(config, data, workdir)` runs the pass for that config (the
representation model = config.model with model_kwargs.domain_layers='none', k = model_kwargs.num_domains);
training/trainers.make_trainer calls it before building the trainer, so experiments/train.py, sweeps and batched
runs get k-means domains from the config alone (the pass is cached in WORKDIR/grouping/ and resumes with it).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import ml_collections
import numpy as np

from fedjax_flat.data import registry as data_registry
from fedjax_flat.grouping import groupers
from fedjax_flat.grouping.superclients import GroupingContext, fresh_params, grouping_seed, representations
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.pretrained import find_classifier_key


def client_domain_labels(data, labels: np.ndarray):
  """A copy of `data` whose training examples of client k carry domain labels[k] in y[:, 1]."""
  y = np.array(data.y, copy=True)
  if y.ndim != 2 or y.shape[1] < 2:
    raise ValueError('client domains need labels [class, domain] (task domain_labelled)')
  for k in range(data.num_clients):
    y[data.client_indices(k), 1] = int(labels[k])
  return dataclasses.replace(data, y=y)


def kmeans_domains(config, model, data, num_domains: int, classifier_key: str,
                   workdir: Optional[str] = None) -> Tuple[object, np.ndarray, Dict]:
  cfg = ml_collections.ConfigDict(config.to_dict())
  cfg.grouping.estimator = 'clf'
  cfg.init.classifier_key = classifier_key
  # the local models learn the classes: the pass sees plain class labels (the domain column is what we look for)
  plain = dataclasses.replace(data, y=np.asarray(data.y)[:, 0], test_y=np.asarray(data.test_y)[:, 0], task=None)
  ctx = GroupingContext(model, plain, cfg, params0=fresh_params(cfg, model, plain))
  reps, info = representations(cfg, ctx, workdir, 'clf')
  labels = groupers.kmeans_labels(reps, int(num_domains), np.random.default_rng(grouping_seed(cfg)))
  # Each client's majority planted domain, before its column is overwritten: what the clusters are scored against.
  y = np.asarray(data.y)
  info = {**info, 'planted_of': [int(np.bincount(y[data.client_indices(k), 1]).argmax()) if
                                 len(data.client_indices(k)) else -1 for k in range(data.num_clients)]}
  return client_domain_labels(data, labels), labels, info


def requested(declared) -> bool:
  """True when the configured algorithm (its declarations: algorithms/registry.declared(config); None for no
  algorithm) asks for k-means client domains (need 'client_domains' and algo.domains='kmeans')."""
  return declared is not None and 'client_domains' in declared.needs and declared.hp.get('domains') == 'kmeans'


def kmeans_from_config(config, data=None, workdir: Optional[str] = None):
  """kmeans_domains for a config: (data', labels [K], info) with data' = `data` (loaded from config.data when
  None) whose training examples carry their client's k-means domain. The clients train the config's network
  without domain-specific layers (model_kwargs.domain_layers='none'); its output layer is the representation."""
  if data is None:
    data = data_registry.get_dataset(config.dataset, **config.data.to_dict())
  kw = {**config.model_kwargs.to_dict(), 'domain_layers': 'none'}
  plain = model_registry.get_model(config.model, data.num_classes, data.input_shape,
                                   compute_dtype=model_registry.compute_dtype(config), **kw)
  params0 = fresh_params(config, plain, data)
  key = 'net/' + find_classifier_key(params0['net'], data.num_classes)
  return kmeans_domains(config, plain, data, int(kw.get('num_domains', 4)), key, workdir)
