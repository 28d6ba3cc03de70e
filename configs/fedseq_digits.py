r"""FedSeq family on the embedded handwritten digits at alpha = 0 (one class per client): a CPU-sized stand-in for
configs/fedseq.py's CIFAR 500 x 100 setting (100 clients x 13-15 images, C = 0.2 as there).

  .venv/bin/python experiments/train.py --workdir=runs/digits_fedseq2par \
      --config=configs/fedseq_digits.py:fedseq2par
  .venv/bin/python experiments/train.py --workdir=runs/digits_fedseq_greedy \
      --config=configs/fedseq_digits.py:fedseq,grouping=greedy

  method = fedavg | fedseq | fedasyncseq | fedseq2par | fedcyclic;  grouping = random | greedy (FedSeq /
  FedAsyncSeq: psi_clf + greedy, cosine; FedSeq2Par always regroups with ICG on psi_clf); fair = 1 | 0
  (fair=0: FedAvg with FedSeq's parallelism, C N_S = 2 clients per round, instead of its number of updates).
Setting: digits CNN, SGD lr 0.05, batch 16, 1 local epoch, weight decay 4e-4, 200 rounds, evaluation every 5
rounds, reported = mean of the last 10 evaluations. Superclients: |D_S|_min 140, K_S,max 11 (about 10 clients of
about 10 classes, N_S = 10); FedSeq2Par: f_exp, alpha_gr 0.0152, beta_gr 5 = 1 / C (as CIFAR's 5 with C = 0.2: the
first round trains one chain of C K clients, and k chains of K / (5 k) later: C K clients every round), N_S 5 ->
100 = K at round 200;
FedAsyncSeq R = N_S; pre-training e = 10 epochs. Fairness: every method trains C K = 20 clients x 1 epoch per
round (FedAvg samples clients_per_round = 20; FedSeq 2 chains of about 10; FedCyclic one chain of 20).
The 3-seed comparison is benchmarks/studies/fedseq_digits.py (benchmarks/studies/README.fedseq.md).
No published numbers: the digits are a stand-in, not a paper setting (config.published stays empty).
"""

from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import default_config

FAMILY = 'configs/fedseq_digits.py'
METHODS = ('fedavg', 'fedseq', 'fedasyncseq', 'fedseq2par', 'fedcyclic')
FRACTION = 0.2
NUM_CLIENTS = 100
FIELDS = {'method': ('fedseq', METHODS), 'grouping': ('random', ('random', 'greedy')), 'fair': (True, bool)}
CELLS = [f'{m}' for m in METHODS] + ['fedseq,grouping=greedy', 'fedasyncseq,grouping=greedy', 'fedavg,fair=0']


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  m, grouping = o['method'], o['grouping']
  if not o['fair']:
    config_strings.check(FAMILY, 'method', m, ('fedavg',), context='with fair=0')
  if grouping != 'random':
    config_strings.check(FAMILY, 'method', m, ('fedseq', 'fedasyncseq'), context=f'with grouping={grouping}')
  c = default_config()
  c.dataset = 'digits'
  c.data.num_clients = NUM_CLIENTS
  c.data.alpha = 0.0
  c.model = 'digits_cnn'
  c.rounds = 200
  c.clients_per_round = round(FRACTION * NUM_CLIENTS) if o['fair'] else 2   # FedAvg: C K | C N_S; unused by chains
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 4e-4
  c.algorithm = m
  for k, v in registry.default_hparams(m).items():
    c.algo[k] = v
  if m != 'fedavg':
    c.algo.fraction = FRACTION
  if m == 'fedseq2par':
    c.algo.growth, c.algo.growth_alpha, c.algo.growth_beta = 'exp', 0.0152, 5
  c.grouping.method = 'icg' if m == 'fedseq2par' else grouping
  c.grouping.estimator = 'clf'
  c.grouping.distance = 'cosine' if grouping == 'greedy' else ('euclidean' if m == 'fedseq2par' else 'auto')
  c.grouping.min_examples = 140
  c.grouping.max_clients = 11
  c.grouping.pretrain_epochs = 10
  c.eval_every = 5
  c.summary_last_k = 10
  return c
