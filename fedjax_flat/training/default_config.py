"""Every config field with its default. Config files start from `default_config()` and override.

Fields (validated by `training/validate.py` before anything is compiled):
  seed                 run seed (init, sampling, batch order, augmentation all derive from it)
  dataset, data        dataset name (data/registry.py) and its builder kwargs
  model, model_kwargs  model name (models/registry.py) and builder kwargs (e.g. conv_impl)
  augment              on-device augmentation preset: 'none' | 'cifar' | 'cifar_cutout' | 'landmarks'
  normalize            normalization preset for train and eval ('none', 'cifar10', 'cifar100', 'imagenet')
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
                       device_data_max_mb
  eval_every, eval_every_last, eval_batch_size, eval_clients, summary_last_k
  checkpoint_every, keep_checkpoints   orbax checkpoints in WORKDIR/checkpoints every N rounds (0 = only at
                       the end or on SIGTERM/SIGINT), keeping the last K; resume is automatic (docs/scaling.md)
  client_state_store, client_state_device_max_mb   per-client state store (SCAFFOLD, FedDyn, ...)
  personalized         end-of-training personalized / OOD evaluation (core/personalized.py): enabled,
                       finetune_epochs, finetune_lr, finetune_batch_size, auc_scores, per_client
  segmentation         loss (OHEM, booster-head weight) and evaluation (resolution, per test client, PNG)
                       of the 'segmentation' task (tasks.py)
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


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.dataset = 'digits'
  # data.shuffle: reshuffle each client's examples every epoch (keyed by seed, round, client); False = stored
  # order every epoch (batch-by-batch comparison with reference code). Configs that replace c.data: True.
  c.data = ml_collections.ConfigDict({'num_clients': 20, 'alpha': 0.0, 'shuffle': True})
  c.model = 'digits_cnn'
  c.model_kwargs = ml_collections.ConfigDict({'conv_impl': 'auto'})
  c.augment = 'none'
  c.normalize = 'none'

  c.algorithm = 'fedavg'
  c.algo = ml_collections.ConfigDict()   # algorithm-specific hyperparameters (see algorithms/registry.py)

  c.rounds = 100
  c.clients_per_round = 5

  c.client = ml_collections.ConfigDict()
  c.client.optimizer = 'sgd'           # 'sgd' | 'sam' | 'asam': the gradient (plain or sharpness-aware)
  c.client.base_optimizer = 'sgd'      # 'sgd' (lr, momentum) | 'adam' (lr, adam_b1, adam_b2, adam_eps)
  c.client.adam_b1 = 0.9
  c.client.adam_b2 = 0.999             # torch default; FedSoup's paper says 0.99
  c.client.adam_eps = 1e-8
  c.client.lr = 0.01
  c.client.momentum = 0.0
  c.client.weight_decay = 4e-4
  c.client.batch_size = 64
  c.client.local_epochs = 1
  c.client.local_steps = 0            # > 0: a fixed number of local steps instead of epochs
  c.client.rho = 0.05                 # SAM/ASAM radius
  c.client.rho0 = 0.0                 # rho warm-up start (FedGloSS: 0.001)
  c.client.rho_warmup_rounds = 0      # T_s; 0 = no warm-up
  c.client.asam_eta = 0.0
  c.client.grad_clip = 0.0            # clip_by_global_norm (FedDyn: 30); 0 = off
  c.client.lr_schedule = 'constant'   # 'constant' | 'poly_step' (over each round's local steps, FedDrive) |
  c.client.lr_power = 0.9             #   'poly_round' (over rounds): lr * (1 - t / lr_poly_max) ** lr_power
  c.client.lr_poly_max = 0            # T: local steps (poly_step) or rounds (poly_round); > 0 for poly_*
  c.client.microbatches = 1           # k > 1: each batch as k micro-batches (gradient accumulation; memory / k)

  c.server = ml_collections.ConfigDict()
  c.server.optimizer = 'sgd'
  c.server.lr = 1.0
  c.server.momentum = 0.0
  c.server.b1 = 0.9
  c.server.b2 = 0.99
  c.server.eps = 1e-3
  c.server.adaptive_form = 'reddi'    # adam/adagrad/yogi: 'reddi' (Alg. 2) | 'torch' (release code); server/optimizers.py

  c.swa = ml_collections.ConfigDict()
  c.swa.enabled = False
  c.swa.start_fraction = 0.75
  c.swa.cycle = 10
  c.swa.lr1 = 1e-2
  c.swa.lr2 = 1e-4
  c.swa.average = True                # False: "cyclic learning rate only" ablation
  c.swa.cyclic_lr = True              # False: "weight averaging only" ablation

  c.wima = ml_collections.ConfigDict()
  c.wima.enabled = False
  c.wima.window = 100
  c.wima.subset = 'all'               # 'all' | 'classifier' | 'features'
  c.wima.classifier = ''              # top-level module of the classifier for wima.subset; '' = auto

  c.man = ml_collections.ConfigDict()
  c.man.zeta = 0.0

  c.engine = ml_collections.ConfigDict()
  c.engine.strategy = 'auto'
  c.engine.clients_per_chunk = 0
  c.engine.unroll = 1
  c.engine.step_bucketing = 'exact'
  # Shard the round's clients over every device of every host: 'auto' (if > 1 device) | True | False.
  c.engine.shard_clients = ml_collections.FieldReference('auto', field_type=object)
  c.engine.stream_batches = False     # build/copy the round's batches one chunk at a time (core/streaming.py)
  # Rounds per compiled call (core/rounds.py): 'auto' (blocks of up to 32 rounds, about 2 s each, cut at every
  # evaluation / checkpoint round) or an int >= 1. R > 1 needs the training data on the device (device_data):
  # in-memory data, one device, no streaming, no FedSoup validation steps, no host client-state store.
  c.engine.rounds_per_call = ml_collections.FieldReference('auto', field_type=object)
  # Keep the training data on the device and sample / batch inside the program: 'auto' (when possible and the
  # data take <= device_data_max_mb) | True | False (host batches, one round per call).
  c.engine.device_data = ml_collections.FieldReference('auto', field_type=object)
  c.engine.device_data_max_mb = 1024

  # Initial params (training/init.py; applied before round 0, never on resume): another run's checkpoint or
  # a params file (models/pretrained.py formats). One of the two at most.
  c.init = ml_collections.ConfigDict()
  c.init.checkpoint = ''               # a fedjax_flat run directory (or its checkpoints/)
  c.init.model = 'global'              # which of that run's models: 'global' | 'swa' | 'wima'
  c.init.pretrained = ''               # a .npz / msgpack params file
  c.init.reinit_classifier = 'auto'    # 'auto' (re-init when the class count differs) | 'always' | 'never'
  c.init.classifier_key = ''           # '' = models/pretrained.find_classifier_key
  c.corruption_eval = ml_collections.ConfigDict()   # CIFAR-10-C / 100-C at the end of training
  c.corruption_eval.name = ''          # '' = off; 'cifar10_c' | 'cifar100_c'
  c.corruption_eval.data_dir = ''
  c.corruption_eval.corruptions = 'all'   # 'all' present, or a comma-separated list
  c.corruption_eval.severities = (1, 2, 3, 4, 5)
  c.corruption_eval.check_official_sizes = True

  c.eval_every = 10
  c.eval_every_last = 0               # also evaluate every round of the last N rounds (papers: 100)
  c.eval_batch_size = 256
  c.eval_clients = False              # also evaluate on each sampled client's training data
  c.summary_last_k = 10               # summary.json averages the last K evaluations (papers: last 100 rounds)
  c.checkpoint_every = 0              # 0 = only at the end
  c.keep_checkpoints = 2
  c.progress_every_s = 10.0
  c.client_state_store = 'auto'       # stateful algorithms: 'host' | 'device' | 'auto' (core/client_state.py)
  c.client_state_device_max_mb = 256  # auto: device store if population * state bytes <= this

  c.personalized = ml_collections.ConfigDict()
  c.personalized.enabled = False        # evaluate personalized models at the end -> summary.json 'personalized'
  c.personalized.finetune_epochs = 0    # K extra local epochs per client, protocols after each
  c.personalized.finetune_lr = 0.0      # 0 = client.lr
  c.personalized.finetune_batch_size = 0  # 0 = client.batch_size
  c.personalized.auc_scores = 'softmax'   # 'softmax' | 'logits' (the FedSoup reference code)
  c.personalized.per_client = True      # per-client rows in the summary

  # Semantic segmentation (tasks.Segmentation; used when the dataset's task is 'segmentation').
  c.segmentation = ml_collections.ConfigDict()
  c.segmentation.ohem = 'topk'          # 'topk' (FedDrive: per image, the hardest ohem_fraction of pixels) |
  c.segmentation.ohem_fraction = 0.25   #   'thresh' (CoinCheung OhemCELoss: CE > -log(ohem_thresh), at least
  c.segmentation.ohem_thresh = 0.7      #   1/16 of the valid pixels) | 'none' (mean CE over valid pixels)
  c.segmentation.aux_weight = 1.0       # weight of each booster head's loss (the reference adds them: 1)
  c.segmentation.eval_mode = 'full'     # 'full' | 'downscale' (input x eval_scale, logits upsampled to the
  c.segmentation.eval_scale = 0.5       #   labels: FedDrive's IDDA use_test_resize) | 'tiles' (windows of
  c.segmentation.eval_tile = (0, 0)     #   eval_tile (0, 0 = the model's input size), overlapping by
  c.segmentation.eval_overlap = 1 / 3   #   eval_overlap, logits averaged)
  c.segmentation.by_test_client = True  # metrics per held-out test client group ('seen' / 'unseen') as well
  c.segmentation.predictions = 4        # predictions.png: this many test images with true / predicted masks

  # BatchNorm models (core/batch_stats.py): statistics of unseen test clients.
  c.bn = ml_collections.ConfigDict()
  c.bn.test_policy = 'auto'             # 'auto' | 'running' | 'batch' | 'client'
  c.bn.test_batch_size = 8              # 'batch': the test batch whose statistics normalize it (FedDrive: 8)

  # Published result of the paper cell this config reproduces (experiments/report.py puts it beside ours).
  c.published = ml_collections.ConfigDict()
  return c
