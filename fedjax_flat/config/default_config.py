"""Every config field with its default. Config files start from `default_config()` and override.

The fields, their rules, defaults, docs and kinds are declared by the sections (config/schema.py collects them;
configs/README.md's field reference lists them all). In short:

Fields (validated by `config/validate.py` before anything is compiled):
  seed                 run seed (init, sampling, batch order, augmentation all derive from it)
  dataset, data        dataset name (data/registry.py) and its builder kwargs; the segmentation datasets'
                       data fields (cityscapes, idda, seg_synthetic: reader, split, on-device augmentation,
                       style transfer) are declared by each dataset module (`fields=`; `segmentation_data(name)` below)
  model, model_kwargs  model name (models/registry.py) and builder kwargs (e.g. conv_impl)
  augment              on-device augmentation preset: 'none' | 'cifar' | 'cifar_cutout' | 'landmarks' |
                       'segmentation' (image + label map: style, scale + crop, flip, jitter; config.data.*)
  normalize            normalization preset for train and eval ('none', 'cifar10', 'cifar100', 'imagenet',
                       'feddrive' = mean 0.5 / std 0.5)
  algorithm, algo      algorithm name (algorithms/registry.py) and its hyperparameters
  rounds, clients_per_round
  client               local training: optimizer ('sgd'|'sam'|'asam'), lr, momentum, weight_decay,
                       batch_size, local_epochs or local_steps, rho (+ warm-up), asam_eta, grad_clip
  server               server optimizer over the pseudo-gradient ('sgd'|'adam'|'adagrad'|'yogi'), lr, ...
  swa, wima, man       flat-minima add-ons (server SWA, window averaging, activation-norm regularizer)
  engine               client strategy ('auto'|'vmap'|'chunked'|'sequential'), chunk size, unroll, bucketing,
                       shard_clients ('auto'|True|False: clients over every device of every host, docs/scaling.md),
                       stream_batches (host batches built one chunk at a time: memory O(chunk), not O(cohort)),
                       rounds_per_call ('auto'|R: rounds per compiled call), device_data ('auto'|True|False),
                       device_data_max_mb, compute_dtype ('float32'|'bfloat16': mixed precision, models/base.py;
                       it changes the result: a checkpoint must match it)
  eval_every, eval_every_last, eval_batch_size, eval_clients, summary_last_k
  checkpoint_every, keep_checkpoints   orbax checkpoints in WORKDIR/checkpoints every N rounds (0 = only at
                       the end or on SIGTERM/SIGINT), keeping the last K; resume is automatic (docs/scaling.md)
  keep_rounds          rounds r whose checkpoints are saved too and kept for good (e.g. for
                       `experiments/hessian.py --per_client --per_client_round=r`: round r's local models)
  client_state_store, client_state_device_max_mb, client_state_host_max_mb   per-client state store (SCAFFOLD,
                       FedDyn, ...): device, host, or memmaps on disk (WORKDIR/client_states)
  personalized         end-of-training personalized / OOD evaluation (evaluation/personalized.py): enabled,
                       finetune_epochs, finetune_lr, finetune_batch_size, auc_scores, per_client
  grouping             clients -> superclients (fedjax_flat/grouping/, FedSeq): method, estimator, distance,
                       min_examples, max_clients, pre-training, public set, PCA, k-means / ICG, Task2Vec probe
  centralized          the centralized upper bound (training/centralized.py): how experiments/centralized.py
                       trains it (epochs, lr, momentum, weight_decay, batch_size, schedule) and, for federated
                       runs, its accuracy (or the path of its centralized.json) for summary.json's
                       rounds_to_<70|90>pct_centralized (fractions, window)
  attack               label-flipping attack (data/attacks.py): kind, malicious_superclients (L_S), attackers
                       (L), classes, swap ('fixed' | 'random'), clean_workdir (report the accuracy drop)
  segmentation         loss (OHEM, booster-head weight) and evaluation (resolution, per test client, PNG)
                       of the 'segmentation' task (tasks/base.py)
  retrieval            triplet margin, hardest negatives per tuple and the Recall@K distance threshold of the
                       'retrieval' task (tasks/retrieval.py: FedVPR)
  fedvc                virtual_size > 0: FedVC's virtual clients of that many examples (data/virtual_clients.py)
  bn                   BatchNorm models: test-time statistics policy for unseen clients (core/batch_stats.py)
  client.lr_schedule   'constant' | 'poly_step' | 'poly_round' (lr_power, lr_poly_max): optimizers/schedules.py
  client.microbatches  k: each local batch as k micro-batches (gradient accumulation, algorithms/local.py)
  published            the paper's number for this setting, as data (documentation only: never changes
                       training, ignored by the resume check): source (str: paper, table, cell),
                       accuracy (percent, same protocol as summary.json's reported last-K mean),
                       optionally accuracy_std and other summary metrics by name
"""
from __future__ import annotations

import ml_collections

from fedjax_flat.config import schema
from fedjax_flat.config.schema import data_section  # noqa: F401  (configs build config.data with it)
from fedjax_flat.data import registry as data_registry
from fedjax_flat.schema import WHOLE, tagged


# Sections whose fields belong to the dataset, the model or the algorithm: a config replaces them whole
# (`c.data = data_section(...)`, `c.model_kwargs = ConfigDict({...})`), so a run's saved section is the whole
# section; training/reload.py restores these as saved, never merged into the defaults below.
WHOLE_SECTIONS = tagged(schema.SCHEMA, WHOLE)


def default_config() -> ml_collections.ConfigDict:
  """Every field of a run with its default: FedAvg on the embedded digits (configs/*.py start from it), built
  from the sections' declarations (config/schema.py)."""
  return schema.build()


def segmentation_data(dataset: str, **overrides) -> ml_collections.ConfigDict:
  """config.data for a segmentation dataset: its declared fields with their defaults (its module's
  `fields=`, data/registry.py), then overrides."""
  declared = data_registry.declared_fields(dataset)
  if declared is None:
    raise ValueError(f'{dataset!r} is not a segmentation dataset; allowed: {data_registry.declaring_datasets()}')
  unknown = sorted(set(overrides) - set(declared))
  if unknown:
    raise ValueError(f'unknown config.data fields {unknown} for dataset {dataset!r}')
  return data_section(**{**declared, **overrides})
