"""Every config field with its default. Config files start from `default_config()` and override.

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
  client_state_store, client_state_device_max_mb   per-client state store (SCAFFOLD, FedDyn, ...)
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

from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.registry import OPTIONAL_FIELDS


# Sections whose fields belong to the dataset, the model or the algorithm: a config replaces them whole
# (`c.data = data_section(...)`, `c.model_kwargs = ConfigDict({...})`), so a run's saved section is the whole
# section; training/reload.py restores these as saved, never merged into the defaults below.
WHOLE_SECTIONS = ('data', 'model_kwargs', 'algo', 'published', 'grouping.probe_model_kwargs')


def default_config() -> ml_collections.ConfigDict:
  """Every field of a run with its default: FedAvg on the embedded digits (configs/*.py start from it)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.dataset = 'digits'
  # data.shuffle: reshuffle each client's examples every epoch (keyed by seed, round, client); False = stored
  # order every epoch (batch-by-batch comparison with reference code). Configs that replace c.data: True.
  # data_section: also declares the optional fields (split_json, seed, ...; None = dataset default).
  c.data = data_section(num_clients=20, alpha=0.0, shuffle=True)
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
  c.client.full_batches = False       # epochs of floor(N_k / B) full batches (the remainder unused), not ceil
  c.client.max_local_steps = 0        # > 0: at most this many local steps a round in the epochs mode (FedVPR's
                                      # min(floor(N_k / B), 2500): full_batches=True, max_local_steps=2500)
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
  c.server.weighting = 'examples'     # a client's weight in the mean of the updates: 'examples' (N_k) | 'uniform'
  c.server.momentum = 0.0
  c.server.b1 = 0.9
  c.server.b2 = 0.99
  c.server.eps = 1e-3
  # adam/adagrad/yogi: 'reddi' (Alg. 2) | 'torch' (release code); optimizers/server.py
  c.server.adaptive_form = 'reddi'

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
  # 'paper': zeta is Eq. 15's coefficient (loss = CE + zeta * sum_l mean(a_l^2)); 'code': zeta is the MAN
  # release's mu_mean, applied as mu_mean / 2 (algorithms/local.man_coefficient)
  c.man.convention = 'paper'

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
  # in-memory data, one process, no streaming, no FedSoup validation steps, no host client-state store.
  c.engine.rounds_per_call = ml_collections.FieldReference('auto', field_type=object)
  # Keep the training data on the device and sample / batch inside the program: 'auto' (when possible and the
  # data take <= device_data_max_mb) | True | False (host batches, one round per call).
  c.engine.device_data = ml_collections.FieldReference('auto', field_type=object)
  c.engine.device_data_max_mb = 1024
  # 'bfloat16': mixed precision (models/base.with_compute_dtype): params, optimizer state and aggregation in
  # float32, activations and matmuls in bfloat16, losses and metrics reduced in float32. Changes the result:
  # a checkpoint must match it (training/checkpoint.COMPUTATION_FIELDS), sweeps never pool the two.
  c.engine.compute_dtype = 'float32'

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
  c.keep_rounds = ()                  # rounds whose checkpoints are also saved and never deleted (analyses)
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

  # Grouping clients into superclients (fedjax_flat/grouping/, thesis 5.2.2: estimator psi, distance tau,
  # method phi). Pre-training and estimator outputs are cached in WORKDIR/grouping/.
  c.grouping = ml_collections.ConfigDict()
  c.grouping.method = 'random'           # 'random' | 'kmeans' | 'greedy' | 'icg'
  c.grouping.estimator = 'clf'           # 'clf' (classifier weights + PCA) | 'conf' (confidence, eq. 5.1) | 't2v'
  # 'auto': euclidean for kmeans / icg; greedy: cosine (clf), kl (conf), normalized_cosine (t2v), as Table 5.3.
  c.grouping.distance = 'auto'           # | 'euclidean' | 'cosine' | 'normalized_cosine' | 'kl' | 'gini'
  c.grouping.min_examples = 1000         # |D_S|_min (thesis CIFAR: 1000)
  c.grouping.max_clients = 11            # K_S,max (thesis CIFAR: 11); 0 = no cap
  c.grouping.pretrain_epochs = 10        # e: local epochs of the pre-training (t2v: of the head fine-tuning)
  c.grouping.pretrain_lr = 0.0           # 0 = client.lr (the passes use the client optimizer without SAM/ASAM)
  c.grouping.public_per_class = 10       # J: test examples per class in the public set of 'conf'
  c.grouping.pca_variance = 0.9          # 'clf': explained variance kept by PCA (0 or 1 = no reduction)
  c.grouping.pca_standardize = True      # 'clf': unit-variance columns before PCA (the reference code)
  c.grouping.num_clusters = 0            # kmeans: clusters (0 = the number of classes)
  c.grouping.icg_iterations = 10         # icg: equal-size k-means iterations
  c.grouping.fisher = 'montecarlo'       # t2v: 'montecarlo' (one y ~ p(y|x) per example) | 'exact' (sum over y)
  c.grouping.probe_model = ''            # t2v: probe architecture ('' = config.model with config.model_kwargs)
  c.grouping.probe_model_kwargs = ml_collections.ConfigDict()
  c.grouping.probe_lr = 4e-4             # t2v: Adam lr of the probe head's fine-tuning (Task2Vec's; wd 1e-4)
  c.grouping.probe_pretrained = ''       # t2v: probe params file (models/pretrained.py formats)
  c.grouping.probe_checkpoint = ''       # t2v: or a run directory; neither (and no config.init): random probe
  c.grouping.seed = -1                   # grouper / pre-training randomness; -1 = config.seed

  # The centralized upper bound (training/centralized.py; experiments/centralized.py trains it).
  c.centralized = ml_collections.ConfigDict()
  c.centralized.epochs = 10
  c.centralized.lr = 0.0                # 0 = client.lr; cosine-annealed over all steps (schedule)
  c.centralized.momentum = 0.9
  c.centralized.weight_decay = -1.0     # -1 = client.weight_decay
  c.centralized.batch_size = 0          # 0 = client.batch_size
  c.centralized.schedule = 'cosine'     # 'cosine' | 'constant' | 'poly' (power 0.9)
  # Federated runs: the centralized accuracy (a fraction) or a centralized run's centralized.json / workdir;
  # summary.json then holds rounds_to_<100 f>pct_centralized for f in fractions (mean of the last `window` evals).
  c.centralized.accuracy = 0.0          # 0 = none
  c.centralized.path = ''
  c.centralized.fractions = (0.7, 0.9)
  c.centralized.window = 1              # the FedSeq release averages 5 evaluations
  # Label-flipping attack (data/attacks.py; thesis Table 5.5). Chain algorithms (FedSeq family): L_S of the
  # superclients are malicious and L of their clients attack; other algorithms: L_S * L of the clients.
  c.attack = ml_collections.ConfigDict()
  c.attack.kind = 'none'               # 'none' | 'label_flip'
  c.attack.malicious_superclients = 0.1   # L_S
  c.attack.attackers = 0.1             # L
  c.attack.classes = '0,2'             # swapped classes: ids '0,2' | '3,5' | '0,2,3,5' ... | 'intra_sc' | 'extra_sc'
  c.attack.swap = 'fixed'              # 'fixed' (one pairing for every attacker) | 'random' (one per attacker)
  c.attack.clean_workdir = ''          # the clean run's workdir: summary.json reports the accuracy drop
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

  # Visual place recognition (tasks.Retrieval; used when the dataset's task is 'retrieval': FedVPR).
  c.retrieval = ml_collections.ConfigDict()
  c.retrieval.margin = 0.1              # triplet margin (the reference's TripletMarginLoss(margin=0.1, p=2))
  c.retrieval.num_negatives = 5         # hardest negative candidates per query tuple used in the loss
  c.retrieval.threshold = 25.0          # metres: a retrieved database image within it is a match (Recall@K)
  c.retrieval.cache_pass = True         # mine from a gradient-free pass, train on the mined slots only

  # FedVC (data/virtual_clients.py): > 0 cuts every client into virtual clients of this many examples
  # (large clients split, small ones replicated); uniform sampling over them is sampling proportional to size.
  c.fedvc = ml_collections.ConfigDict()
  c.fedvc.virtual_size = 0

  # BatchNorm models (core/batch_stats.py): statistics of unseen test clients.
  c.bn = ml_collections.ConfigDict()
  c.bn.test_policy = 'auto'             # 'auto' | 'running' | 'batch' | 'client'
  c.bn.test_batch_size = 8              # 'batch': the test batch whose statistics normalize it (FedDrive: 8)

  # Published result of the paper cell this config reproduces (experiments/report.py puts it beside ours).
  c.published = ml_collections.ConfigDict()
  return c


def data_section(**values) -> ml_collections.ConfigDict:
  """A `config.data` with the OPTIONAL fields (data/registry.OPTIONAL_FIELDS) declared (None) and `values` set."""
  d = ml_collections.ConfigDict()
  for name, typ in OPTIONAL_FIELDS.items():
    d[name] = ml_collections.FieldReference(None, field_type=typ)
  for k, v in values.items():
    d[k] = v
  return d


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
