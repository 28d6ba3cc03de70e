r"""Cross-device protocol: populations of 10^4 to 10^6 clients where a client takes part about once or twice,
stateful methods (SCAFFOLD, FedDyn, FedSMOO, FedGloSS, FedGamma) against stateless global flatness (FedLESAM,
FedNSAM, FedGF, FedSWA) and FedSAM / FedAvg (issue 50 item 4).

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/xdev_1e5_scaffold --config=configs/cross_device.py:1e5,scaffold

Grammar (defaults digits,fedavg):
  digits | 1e4 | 1e5 | 1e6 (the population);
  fedavg | fedsam | scaffold | feddyn | fedsmoo | fedgloss | fedgamma | fedlesam | fednsam | fedgf | fedswa.
CELLS lists every (population, algorithm). No published numbers: a protocol, not a paper table (config.published
stays empty).

Data. 1e4 / 1e5 / 1e6: a FEMNIST-shaped stand-in (the `synthetic` source: 28x28x1 images, 62 classes, class means +
noise) split IID into that many clients of 2 images each (LEAF's FEMNIST has 3,550 writers; CIFAR-100 split 10^6
ways has 0.05 images a client, so a population this size needs a generated stand-in). Host memory for the data:
6.3 KB a client (6.3 GB at 10^6). `digits`: the embedded handwritten digits (1,437 training images) split into 400
clients of 3-4 images (Dirichlet alpha 0.5): the same protocol small enough for the test suite.
Model: an MLP 784-32-62 (27,166 parameters; `digits`: the digits CNN), batch 2 (digits 4), 2 local steps
(client.local_steps: every client, whatever its size, takes the same steps), lr 0.05.

Participation. Cohort C = 100 clients a round (digits: 10) and rounds R = 1.5 K / C, so that R C / K = 1.5: a
client takes part about once or twice (1.5 times on average; the chance that a given client is never drawn is
about e^-1.5 = 22%): 1e4 -> 150 rounds, 1e5 -> 1,500, 1e6 -> 15,000, digits -> 60 (400 clients x 1.5 / 10).

Where the cost lives (docs/scaling.md, "Populations of 10^5-10^6 clients"):
  * sampler='floyd': the cohort is drawn in O(C^2) work, nothing of size K, so a round costs what it costs at 10^3
    ('sort' draws K keys a round: 21 ms at 10^6 on a 2-core EPYC, README.population.md; the default 'auto' is
    'floyd' above 10^4 clients, so it is named here only to keep the digits cell on the same procedure).
  * client_state_store='auto' (core/client_state.py): a stateful method's per-client state (SCAFFOLD: c_k, one
    copy of the parameters, 106 KB a client for this MLP; FedDyn, FedSMOO, FedGloSS, FedGamma likewise hold
    model-sized states) lives on the device when K x state <= client_state_device_max_mb (256 MB), else in a host
    dict of the clients written when <= client_state_host_max_mb (4096 MB), else in numpy memmaps [K, ...] in
    WORKDIR/client_states/ (sparse files: the rows written). For this MLP: 1e4 -> 1.0 GB: host; 1e5 -> 10 GB and
    1e6 -> 104 GB: disk (at R C / K = 1.5, 78% of the clients are written, 81 GB at 10^6). The stateless methods
    keep nothing per client. FedLESAM runs its release's estimate (direction='server': the server's last update,
    the same for every client), stateless; the paper's per-client direction keeps the model each client last
    received, a state that a client seen once never uses (its estimate is 0 at its first round).
  * a round's cost follows the cohort: benchmarks/speed/cross_device.py measures s/round, peak RSS and the store
    (kind, bytes) at 10^4 / 10^5 / 10^6 (README.cross_device.md).
Method hyperparameters: the registered defaults (config.algo holds them all); SAM-type clients (FedSAM, FedSMOO,
FedGamma, FedGF; FedGloSS's client) rho 0.05; FedLESAM rho 0.05; FedSWA's cycle = the 2 local steps.
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.schema import data_section

FAMILY = 'configs/cross_device.py'
STATEFUL = ('scaffold', 'feddyn', 'fedsmoo', 'fedgloss', 'fedgamma')
STATELESS = ('fedlesam', 'fednsam', 'fedgf', 'fedswa')
ALGOS = ('fedavg', 'fedsam') + STATEFUL + STATELESS
POPULATIONS = {'digits': 400, '1e4': 10_000, '1e5': 100_000, '1e6': 1_000_000}
FIELDS = {'population': ('digits', tuple(POPULATIONS)), 'algo': ('fedavg', ALGOS)}
PARTICIPATION = 1.5            # rounds x cohort / population
COHORT = {'digits': 10}        # else 100
SAM_CLIENT = ('fedsam', 'fedsmoo', 'fedgamma', 'fedgf', 'fedgloss')
RHO = 0.05
LOCAL_STEPS = 2

CELLS = [f'{p},{a}' for p in POPULATIONS for a in ALGOS]


def rounds_for(population: int, cohort: int) -> int:
  """R such that R x cohort / population = PARTICIPATION."""
  return int(round(PARTICIPATION * population / cohort))


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  pop, algo = o['population'], o['algo']
  k, cohort = POPULATIONS[pop], COHORT.get(pop, 100)
  c = default_config()
  if pop == 'digits':
    c.dataset, c.model = 'digits', 'digits_cnn'
    c.data.num_clients, c.data.alpha = k, 0.5
    c.client.batch_size = 4
  else:
    c.dataset, c.model = 'synthetic', 'mlp'
    c.data = data_section(num_clients=k, examples_per_client=2, input_shape=(28, 28, 1), num_classes=62,
                          test_size=2000, seed=0)
    c.model_kwargs.hidden = (32,)
    c.client.batch_size = 2
  c.clients_per_round = cohort
  c.rounds = rounds_for(k, cohort)
  c.client.lr, c.client.local_steps, c.client.weight_decay = 0.05, LOCAL_STEPS, 0.0
  c.sampler = 'floyd'
  c.client_state_store = 'auto'
  c.eval_every = max(1, c.rounds // 10)
  c.summary_last_k = 1
  c.algorithm = 'fedavg' if algo == 'fedsam' else algo
  if c.algorithm != 'fedavg':
    c.algo.update(registry.default_hparams(c.algorithm))
  if algo in SAM_CLIENT:
    c.client.optimizer, c.client.rho = 'sam', RHO
  if algo == 'fedlesam':
    c.algo.direction = 'server'        # stateless: the server's last update, not each client's own
    c.client.rho = RHO
  return c
