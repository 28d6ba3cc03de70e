r"""FedCG on the planted-domain digits (`digits_domains`: 4 domains = identity / inverted / rotated / rotated and
inverted digits, one domain per client): the machine-sized stand-in for thesis section 5.4, where the true domain
of every image is known, so that the discovered domains can be scored (purity). No published number applies
(config.published stays empty); the thesis' CelebA / FEMNIST tables are configs/fedcg.py.

  .venv/bin/python experiments/train.py --workdir=runs/fcg_fedavg --config=configs/fedcg_digits.py:fedavg
  .venv/bin/python experiments/train.py --workdir=runs/fcg_oracle --config=configs/fedcg_digits.py:fedcg,oracle
  .venv/bin/python experiments/train.py --workdir=runs/fcg_disc --config=configs/fedcg_digits.py:fedcg,discovered
  .venv/bin/python experiments/train.py --workdir=runs/fcg_kmeans --config=configs/fedcg_digits.py:fedcg,kmeans
  .venv/bin/python experiments/train.py --workdir=runs/fcg_wide --config=configs/fedcg_digits.py:fedavg,width=267
  .venv/bin/python -m benchmarks.studies.fedcg_digits        # 3 seeds, the ablations, purity -> runs/fedcg_digits/
  .venv/bin/python -m benchmarks.studies.fedcg_digits --table   # their table (README.fedcg.md)

Grammar (comma-separated; default fedcg,discovered):
  fedavg | fedcg;  oracle | discovered | kmeans (the domains FedCG trains with: the planted ones, the teacher /
  student's, or k-means on locally trained client models, Table 5.10's alternative);  last | all (domain-specific
  layers);
  eye | U | H | rand (A's initialisation);  fixed=0|1 (A kept at its init instead of eq. 5.14 every round);
  W=0|1 (the GCN projection);  relu=0|1;  residual=0|1 (0: no domain-agnostic part at those layers);
  soft=0|1 (test-time domain weights);  D=<int> (the model's number of domains; the data plant 4);
  width=<int> (the body's hidden width, default 64)
CELLS: FedAvg, FedAvg of FedCG's size, FedCG with oracle / discovered / k-means domains, one cell per ablation.

Setting: 20 clients (5 per planted domain, about 72 training digits each), 10 per round, 100 rounds; body = an
MLP 64 -> 64 -> 10 (`fedcg_net` with hidden=(64,); FedAvg runs the same body with domain_layers='none'); FedCG
makes the last layer domain-specific (D = 4, the thesis' final setting) with a bottleneck GCN projection
(gcn_bottleneck=8: q = 650), a student of one hidden layer of 32 units, teacher period T = 5; client SGD lr 0.05,
batch 16, 1 local epoch. k-means domains: every client trains the plain body for grouping.pretrain_epochs = 5
local epochs from w_0, classifier weights standardised + PCA (90% variance), k-means with k = D
(grouping/domains.py). Same-size FedAvg: FedCG's network has 20,040 parameters, FedAvg's 4,811 (4.2x); 'fedavg,
width=267' widens the hidden layer to 267 units: 20,036 parameters (64*267 + 267 + 267*10 + 10, + the unused
'soft' scalar), the capacity control of the comparison.
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/fedcg_digits.py'
FIELDS = {
    'method': ('fedcg', ('fedavg', 'fedcg')),
    'domains': ('discovered', ('discovered', 'oracle', 'kmeans')),
    'layers': ('last', ('last', 'all')),
    'A': ('eye', ('eye', 'U', 'H', 'rand')),
    'fixed': (False, bool),
    'W': (True, bool),
    'relu': (True, bool),
    'residual': (True, bool),
    'soft': (True, bool),
    'D': (4, int),
    'width': (64, int),
}
PLANTED = 4
WIDE = 267   # FedAvg's hidden width for FedCG's parameter count (see the docstring)
CELLS = ['fedavg', f'fedavg,width={WIDE}', 'fedcg,oracle', 'fedcg,discovered', 'fedcg,kmeans',
         'fedcg,discovered,soft=0', 'fedcg,discovered,all',
         'fedcg,discovered,D=2', 'fedcg,discovered,D=8', 'fedcg,oracle,W=0', 'fedcg,oracle,relu=0',
         'fedcg,oracle,residual=0', 'fedcg,oracle,U,fixed', 'fedcg,oracle,H,fixed', 'fedcg,discovered,rand']


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  if o['D'] < 1:
    raise config_strings.ConfigStringError(FAMILY, f'D={o["D"]}', 'D must be >= 1')
  if o['width'] < 1:
    raise config_strings.ConfigStringError(FAMILY, f'width={o["width"]}', 'width must be >= 1')
  if o['domains'] == 'oracle' and o['D'] < PLANTED:
    raise config_strings.ConfigStringError(FAMILY, f'D={o["D"]}', f'oracle domains need D >= {PLANTED} '
                                           '(the planted domains)')
  c = default_config()
  c.dataset = 'digits_domains'
  c.data = data_section(num_clients=20, num_domains=PLANTED, domains_per_client=1, test_fraction=0.2, seed=0)
  c.model = 'fedcg_net'
  c.algorithm = o['method']
  for k, v in registry.default_hparams(o['method']).items():
    c.algo[k] = v
  kw = dict(channels=(), hidden=(o['width'],), classifier_channels=(), classifier_hidden=32, gcn_bottleneck=8)
  if o['method'] == 'fedavg':
    kw.update(domain_layers='none', num_domains=1)
  else:
    kw.update(num_domains=o['D'], domain_layers=o['layers'], residual=o['residual'], gcn_w=o['W'],
              gcn_relu=o['relu'])
    c.algo.domains = o['domains']
    c.algo.adjacency_init = {'eye': 'identity', 'U': 'uniform', 'H': 'hamming', 'rand': 'random'}[o['A']]
    c.algo.adjacency_update = 'fixed' if o['fixed'] else 'distance'
    c.algo.soft = o['soft']
    c.algo.teacher_period = 5
    if o['domains'] == 'kmeans':
      c.grouping.pretrain_epochs = 5
  c.model_kwargs = {'conv_impl': 'auto', **kw}   # conv_impl: the field every config carries
  c.rounds = 100
  c.clients_per_round = 10
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 0.0
  c.eval_every = 10
  c.summary_last_k = 1
  return c
