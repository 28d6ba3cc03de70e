r"""FedVPR (thesis 6.3, Tables 6.5-6.7; Dutto et al., CVPRW 2024): federated visual place recognition on MSLS.

Command (MSLS needs a manual download with a licence: experiments/download.py --dataset=msls prints the steps):
  .venv/bin/python experiments/train.py --config=configs/fedvpr.py:proximity,radius=2000 --workdir=runs/fedvpr
  .venv/bin/python experiments/prepare.py --dataset=msls --data_dir=<data_dir>      # Table 6.5's statistics

Grammar (comma-separated tokens; defaults in brackets):
  split     proximity | random | clustering                 [proximity]  (Table 6.5; clustering: per-city
            k-means on the images' 4 x 4-grid mean colours [U], k = the city's proximity clients at 2000 m;
            on a model's descriptors instead: --config.data.cluster_features=model
            --config.data.cluster_params=<params file of vpr_resnet18> (data/sources/msls.py))
  radius    1000 | 2000 | 4000 metres, proximity only        [2000]
  server    sgd | sgdm | adam | adagrad                       [sgd]        (Table 6.6)
  T=, C=    rounds and clients per round: T=75,C=20 | T=15,C=105 (Table 6.6's matched FedAvg budgets) [300, 5]
  iters=    fixed local iterations per client and round: 125 | 250 | 500 | 1000 | 2000 | 4000 (Table 6.7;
            the rounds follow I_tot = iters x T x 5 = 2,000,000); 0 = the thesis' baseline rule
            min(floor(|D_k| / B), 2500) (client.full_batches, client.max_local_steps = 2500)          [0]
  fedvc     FedVC's virtual clients (Table 6.7): virtual size = iters x B, sampling proportional to size
  hfl=      city | continent: H-FL (Table 6.6) with city (C: 21 clusters) or continent (CC: 4) mid-tier
            servers, 5 clients of every cluster a round (clients_per_round = 5 x clusters: 105 / 20, the
            thesis' counts; the trainer checks it against the data's clusters), T_c = algo.sync_every, and
            T = 75 / 15 rounds [U: the rounds of the FedAvg budgets the thesis matches to H-FL: 5 x 300 client
            updates]                                                                                 ['']

Setting: ResNet18 truncated after its third stage + GeM + L2 (`vpr_resnet18`, GroupNorm [U: the thesis does not
name the normalisation]), FedAvg, 5 clients a round, min(floor(|D_k| / B), 2500) local iterations, T = 300
(thesis 6.3). Client training:
triplet loss margin 0.1 with the 5 hardest negatives and the nearest of 2 positive candidates (tasks/retrieval.py),
"partial" mining restricted to the client's own database: each query keeps a pool of up to 1000 negatives beyond
25 m (data.neg_pool: the reference's neg_samples_num), 10 candidates of it (data.num_candidates) are drawn afresh
every time the round's batches are built (the mining cache refreshed every client round; data/vpr_places.py
compares it with the reference's refresh every 1000 queries), their descriptors come from a gradient-free pass
with the current model at every step, and only the mined query, positive and negatives go through the loss's
backward pass (retrieval.cache_pass); Adam lr 1e-5, batch 4 query tuples, 224 x 224 images
[U: taken from the deep-visual-geo-localization benchmark's defaults; the thesis does not state them]. The
server keeps San Francisco and Copenhagen as the test cities; Recall@1/5/10 within 25 m, R@1 reported as
test_accuracy (percent in config.published).

Published R@1 (%, mean +- std over runs):
  Table 6.5  Centralized 66.0 +- 0.4 (not a cell: experiments/centralized.py, on the union of the clients'
             tuples, the candidates drawn afresh at every visit as in the rounds), Random 40.2 +- 0.0,
             Clustering 57.3 +- 1.2 [U: the thesis' visual features are not named; an image statistic here],
             Proximity 1000 m 51.7 +- 1.7, 2000 m 61.0 +- 0.6, 4000 m 66.1 +- 0.3
  Table 6.6  FedAvg SGD 61.0 +- 0.6 (= proximity 2000), SGDm 61.2 +- 1.4, Adam 61.1 +- 1.2, AdaGrad 61.6 +- 0.3,
             FedAvg T=75, C=20: 55.6 +- 0.8, FedAvg T=15, C=105: 44.2 +- 0.4;
             H-FL (CC, 4 continents) 46.9 +- 1.3 (hfl=continent), H-FL (C, 21 cities) 33.3 +- 0.1 (hfl=city);
             [U] T_c is not given by the thesis: algo.sync_every = 10 here (clusters drift between
             syncs, the effect the thesis describes); the continents' grouping is
             data/sources/msls.CONTINENT_OF's (the thesis does not list it)
  Table 6.7  iters  rounds  FedAvg        FedVC
             125    3200    66.6 +- 0.8   62.3 +- 1.1
             250    1600    66.0 +- 1.7   65.9 +- 1.0
             500    800     66.4 +- 1.6   67.7 +- 0.4
             1000   400     61.7 +- 2.4   66.8 +- 0.5
             2000   200     58.8 +- 1.8   65.2 +- 0.9
             4000   100     57.3 +- 2.5   60.6 +- 1.0
12 random clients are held out for validation (data.val_clients; data.val_x / val_y / val_client): the server
model is evaluated on each one's queries against its own database at every evaluation (val_recall@1/5/10 in
metrics.jsonl / csv and TensorBoard), and summary.json's `validation` gives the first round with the best
validation R@5 [U: the deep-visual-geo-localization benchmark's rule; the thesis does not say] and that round's
test Recall@K (model selection). The in-memory MSLS reader holds every image of the split (bounded by
data.max_queries_per_city, see data/sources/msls.py); the whole of MSLS: `--config.dataset=msls_stream` (the same
split and batches, each client's images decoded when its batches are built: data/sources/msls_stream.py).
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import default_config, segmentation_data

FAMILY = 'configs/fedvpr.py'
SERVERS = ('sgd', 'sgdm', 'adam', 'adagrad')
FIELDS = {
    'split': ('proximity', ('proximity', 'random', 'clustering')),
    'radius': (2000, int),
    'server': ('sgd', SERVERS),
    'T': (300, int),
    'C': (5, int),
    'iters': (0, int),
    'fedvc': (False, bool),
    'hfl': ('', ('', 'city', 'continent')),
}
T65 = {('proximity', 1000): (51.7, 1.7), ('proximity', 2000): (61.0, 0.6), ('proximity', 4000): (66.1, 0.3),
       ('random', 2000): (40.2, 0.0), ('clustering', 2000): (57.3, 1.2)}
T66 = {'sgdm': (61.2, 1.4), 'adam': (61.1, 1.2), 'adagrad': (61.6, 0.3)}
T66_BUDGETS = {(75, 20): (55.6, 0.8), (15, 105): (44.2, 0.4)}
T66_HFL = {'continent': (4, 75, (46.9, 1.3)), 'city': (21, 15, (33.3, 0.1))}    # clusters, rounds, R@1
HFL_PER_CLUSTER = 5
HFL_SYNC_EVERY = 10      # [U] T_c: the thesis does not give it
T67 = {125: (3200, (66.6, 0.8), (62.3, 1.1)), 250: (1600, (66.0, 1.7), (65.9, 1.0)),
       500: (800, (66.4, 1.6), (67.7, 0.4)), 1000: (400, (61.7, 2.4), (66.8, 0.5)),
       2000: (200, (58.8, 1.8), (65.2, 0.9)), 4000: (100, (57.3, 2.5), (60.6, 1.0))}
BATCH = 4
MAX_LOCAL_ITERS = 2500
VAL_CLIENTS = 12          # random clients held out for validation (thesis 6.3)

CELLS = (['proximity,radius=1000', 'proximity,radius=2000', 'proximity,radius=4000', 'random', 'clustering']
         + [f'server={s}' for s in T66] + [f'T={t},C={c}' for t, c in T66_BUDGETS]
         + [f'iters={i}' for i in T67] + [f'iters={i},fedvc' for i in T67] + [f'hfl={h}' for h in T66_HFL])


def _published(o):
  """(source, (R@1, std)) of a parsed cell; a setting the tables do not have is a ConfigStringError."""
  split, radius, server, t, c, iters, fedvc = (o['split'], o['radius'], o['server'], o['T'], o['C'], o['iters'],
                                               o['fedvc'])
  if o['hfl']:
    groups, rounds, published = T66_HFL[o['hfl']]
    for name, v, ok in (('split', split, ('proximity',)), ('radius', radius, (2000,)), ('server', server, ('sgd',)),
                        ('T', t, (300, rounds)), ('C', c, (5,)), ('iters', iters, (0,)), ('fedvc', fedvc, (False,))):
      config_strings.check(FAMILY, name, v, ok, context=f'with hfl={o["hfl"]} (Table 6.6)')
    return f"thesis Table 6.6, H-FL ({'CC' if o['hfl'] == 'continent' else 'C'})", published
  if iters or fedvc:
    config_strings.check(FAMILY, 'iters', iters, tuple(T67), context='in Table 6.7')
    config_strings.check(FAMILY, 'server', server, ('sgd',), context='in Table 6.7')
    rounds, avg, vc = T67[iters]
    config_strings.check(FAMILY, 'T', t, (300, rounds), context=f'with iters={iters} (Table 6.7: T = {rounds})')
    return f"thesis Table 6.7, {'FedVC' if fedvc else 'FedAvg'} {iters} local iterations", vc if fedvc else avg
  if (t, c) != (300, 5):
    config_strings.check(FAMILY, 'T,C', (t, c), tuple(T66_BUDGETS), context='in Table 6.6')
    return f'thesis Table 6.6, FedAvg T={t}, C={c}', T66_BUDGETS[(t, c)]
  if server != 'sgd':
    config_strings.check(FAMILY, 'split', split, ('proximity',), context='in Table 6.6')
    config_strings.check(FAMILY, 'radius', radius, (2000,), context='in Table 6.6')
    return f'thesis Table 6.6, FedAvg {server}', T66[server]
  if split == 'proximity':
    config_strings.check(FAMILY, 'radius', radius, (1000, 2000, 4000), context='in Table 6.5')
  if split == 'clustering':        # k per city from the 2000 m proximity split
    config_strings.check(FAMILY, 'radius', radius, (2000,), context='with split=clustering (Table 6.5)')
  key = (split, radius if split == 'proximity' else 2000)
  if key not in T65:
    raise config_strings.ConfigStringError(FAMILY, f'{split},radius={radius}', 'the random split has no radius')
  return f"thesis Table 6.5, {split}{f' {radius} m' if split == 'proximity' else ''}", T65[key]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  source, (acc, std) = _published(o)
  c = default_config()
  c.dataset = 'msls'
  c.data = segmentation_data('msls', split=o['split'], split_radius=float(o['radius']), image_size=224,
                             num_positives=2, num_candidates=10, neg_pool=1000, seed=0, val_clients=VAL_CLIENTS)
  c.augment, c.normalize = 'none', 'imagenet'
  c.model = 'vpr_resnet18'
  c.model_kwargs = {'norm': 'gn', 'base_width': 64, 'gn_groups': 2, 'conv_impl': 'auto'}
  c.algorithm = 'fedavg'
  c.rounds, c.clients_per_round = int(o['T']), int(o['C'])
  c.client.base_optimizer, c.client.lr, c.client.momentum, c.client.weight_decay = 'adam', 1e-5, 0.0, 0.0
  c.client.batch_size, c.client.local_epochs = BATCH, 1
  # The baseline's local iterations min(floor(|D_k| / B), 2500): full batches of one epoch, capped (masked
  # steps inside the run's fixed step count, data/batching.py).
  c.client.full_batches, c.client.max_local_steps = True, MAX_LOCAL_ITERS
  if o['iters']:
    c.client.full_batches, c.client.max_local_steps = False, 0
    c.rounds = T67[o['iters']][0]
    c.client.local_steps = int(o['iters'])
    if o['fedvc']:
      c.fedvc.virtual_size = int(o['iters']) * BATCH
  server = o['server']
  c.server.optimizer = {'sgd': 'sgd', 'sgdm': 'sgd', 'adam': 'adam', 'adagrad': 'adagrad'}[server]
  c.server.lr = {'sgd': 1.0, 'sgdm': 1.0, 'adam': 1e-3, 'adagrad': 1e-2}[server]    # [U] server lrs
  c.server.momentum = 0.9 if server == 'sgdm' else 0.0
  if o['hfl']:
    c.algorithm = 'hfl'
    c.algo = {'group_by': o['hfl'], 'clients_per_group': HFL_PER_CLUSTER, 'sync_every': HFL_SYNC_EVERY}
    c.clients_per_round = HFL_PER_CLUSTER * T66_HFL[o['hfl']][0]
    c.rounds = T66_HFL[o['hfl']][1]
  c.retrieval.margin, c.retrieval.num_negatives, c.retrieval.threshold = 0.1, 5, 25.0
  c.eval_batch_size = 64
  c.eval_every, c.summary_last_k = max(1, c.rounds // 10), 1
  config_strings.set_published(c, source, acc, std)
  return c
