"""The paper configs run end to end on files written in the official formats (CIFAR python tarball, FedJAX
SQLite, TFF CSV + GLDv2 JPEGs): dataset selected by name, loaded, split, batched, trained, evaluated,
written. Sizes are shrunk so each run takes seconds; the model is the small MLP where the paper's network
would only add compile time (the networks have their own tests)."""
import json
import os

import numpy as np
import pytest

from fedjax_flat.data.sources import landmarks
from fedjax_flat.training import run as run_lib
from tests.fixtures.data_files import make_cifar10, make_landmarks
from tests.fixtures.paths import REPO



def _config(spec):
  from fedjax_flat.config import families as config_strings
  c = config_strings.load_config(os.path.join(REPO, 'configs', spec))
  c.rounds = 3
  c.eval_every = 1
  c.eval_every_last = 0
  c.summary_last_k = 2
  c.progress_every_s = 1e9
  c.eval_batch_size = 16
  return c


def _run(c, tmp_path, dataset, *, clients_per_round, batch_size):
  """Runs 3 rounds; checks the summary, and one finite evaluation per round in metrics.jsonl."""
  c.clients_per_round = clients_per_round
  c.client.batch_size = batch_size
  wd = str(tmp_path / 'run')
  s = run_lib.run(c, wd)
  assert s['dataset'] == dataset and s['rounds_completed'] == 3
  recs = [json.loads(line) for line in open(os.path.join(wd, 'metrics.jsonl'))]
  assert [r['round'] for r in recs] == [1, 2, 3]
  assert all(np.isfinite(r['test_loss']) for r in recs)
  assert os.path.exists(os.path.join(wd, 'summary.json'))


@pytest.mark.slow   # ~25 s; the tarball reader runs in the default suite through the FedSeq family's cell below
def test_cifar10_fedsam_config_on_official_tarball(tmp_path):
  make_cifar10(str(tmp_path / 'data'), per_batch=20, n_test=20)     # 100 train images, 20 test
  c = _config('fedsam_cifar.py:cifar10,fedsam')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.num_clients, c.data.examples_per_client, c.data.alpha = 5, 20, 0.05
  c.data.check_official_sizes = False
  _run(c, tmp_path, 'cifar10', clients_per_round=2, batch_size=8)
  assert os.path.exists(tmp_path / 'data' / 'splits' / 'cifar10_alpha0.05_clients5_epc20_seed0.npz')


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_pam_config_on_fedjax_sqlite(tmp_path):
  from tests.fixtures.data_files import write_pam
  os.makedirs(tmp_path / 'data')
  write_pam(str(tmp_path / 'data'), n_train=6, n_test=3, per=5)
  c = _config('fedsam_pam.py:fedavg')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.check_official_sizes = False
  c.model = 'mlp'
  _run(c, tmp_path, 'cifar100_pam', clients_per_round=3, batch_size=4)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_landmarks_config_on_tff_csv_and_gldv2_jpegs(tmp_path):
  root = str(tmp_path / 'data')
  make_landmarks(root, 'gld23k', num_users=4, per_user=(3, 5, 2, 4), num_test=5, num_classes=7)
  landmarks.prepare('gld23k', root, short_side=40, num_workers=1)
  c = _config('fedsam_landmarks.py:fedavg')
  c.dataset = 'gld23k'
  c.data.data_dir = root
  c.data.image_size = 32
  c.data.short_side = 40
  c.model = 'mlp'
  _run(c, tmp_path, 'gld23k', clients_per_round=2, batch_size=2)


@pytest.mark.slow   # ~14 s (CI time budget); fast: tests/data/sources/test_leaf.py, the femnist CNN's model tests
def test_femnist_quickstart_on_leaf_json(tmp_path):
  from tests.fixtures.data_files import make_femnist_leaf
  make_femnist_leaf(str(tmp_path / 'data'), ((6, 9, 5), (7, 8)))
  c = _config('quickstart_femnist.py')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.fraction = 1.0
  _run(c, tmp_path, 'femnist', clients_per_round=2, batch_size=4)    # the paper CNN: dropout keyed per step
  s = json.load(open(tmp_path / 'run' / 'summary.json'))
  assert s['num_params'] == 1_206_590 and s['centralized_accuracy'] == 0.8752
  assert 'rounds_to_70pct_centralized' in s


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_shakespeare_quickstart_on_leaf_json(tmp_path):
  from tests.fixtures.data_files import make_shakespeare_leaf
  text = 'Full fathom five thy father lies; of his bones are coral made; those are pearls that were his eyes. '
  make_shakespeare_leaf(str(tmp_path / 'data'), [('P1', text), ('P2', text[::-1] * 2), ('P3', text.upper())])
  c = _config('quickstart_shakespeare.py')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.fraction, c.data.min_samples = 1.0, 0
  c.model_kwargs.hidden = 16
  _run(c, tmp_path, 'shakespeare', clients_per_round=2, batch_size=8)
  rec = json.loads(open(tmp_path / 'run' / 'metrics.jsonl').readlines()[-1])
  assert {'test_accuracy_no_pad', 'test_accuracy_in_vocab', 'test_oov_rate', 'test_tokens'} <= set(rec)
  assert rec['test_tokens'] > 0 and rec['test_accuracy'] == rec['test_accuracy_no_pad']   # pad-only exclusion


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_stackoverflow_quickstart_on_tff_sqlite(tmp_path):
  from tests.fixtures.data_files import make_stackoverflow_tff, write_word_counts
  from fedjax_flat.data.sources import stackoverflow as so
  os.makedirs(tmp_path / 'data')
  words = ['the', 'a', 'is', 'to', '.', 'python']
  rng = np.random.default_rng(0)
  sent = lambda: ' '.join(rng.choice(words + ['zzz'], rng.integers(2, 9)))   # noqa: E731
  make_stackoverflow_tff(str(tmp_path / 'data' / so.TFF_FILE),
                         {'train': {str(k): [sent() for _ in range(5 + k)] for k in range(4)},
                          'test': {'t': [sent() for _ in range(12)]}})
  write_word_counts(str(tmp_path / 'data' / so.WORD_COUNT_FILE), [(w, 10 - i) for i, w in enumerate(words)])
  c = _config('quickstart_stackoverflow.py')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.num_clients, c.data.vocab_size, c.data.test_examples = 0, 5, 10
  c.model_kwargs.hidden, c.model_kwargs.embed = 16, 8
  _run(c, tmp_path, 'stackoverflow', clients_per_round=2, batch_size=4)
@pytest.mark.parametrize('cell', ['cifar10,fedcyclic', 'cifar10,fedavg,attack=0-2,gamma=fixed,ls=0.5,l=0.5'])
def test_fedseq_family_cells_on_official_tarball(tmp_path, cell):
  """configs/fedseq.py cells that need no grouping: FedCyclic (one chain) and an attacked FedAvg (Table 5.5)."""
  make_cifar10(str(tmp_path / 'data'), per_batch=20, n_test=20)
  c = _config(f'fedseq.py:{cell}')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.num_clients, c.data.examples_per_client, c.data.alpha = 5, 20, 100.0   # the fixture's 100 images
  c.data.check_official_sizes = False
  c.model = 'mlp'
  if c.algorithm == 'fedcyclic':
    c.algo.fraction = 0.6                     # 3 of 5 clients in the chain
  _run(c, tmp_path, 'cifar10', clients_per_round=2, batch_size=8)
  s = json.load(open(tmp_path / 'run' / 'summary.json'))
  if c.algorithm == 'fedcyclic':
    assert s['fedseq']['mean_clients_per_round'] == 3 and s['fedseq']['comm_messages_per_round']['c2c'] == 2
  else:
    assert s['attack']['num_attackers'] >= 1 and os.path.exists(tmp_path / 'run' / 'attack.json')


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_fedseq_shakespeare_cell_on_leaf_json(tmp_path):
  """configs/fedseq.py's Shakespeare FedSeq cell on LEAF JSON: superclients from the grouping toolkit, chains
  of the next_token task, summary.json's fedseq section. The cell's psi_clf + greedy grouping is replaced by
  random grouping here (5 s less; the pre-training pass on next_token data: tests/grouping/test_pretrain.py)."""
  from tests.fixtures.data_files import make_shakespeare_leaf
  text = 'Full fathom five thy father lies; of his bones are coral made; those are pearls that were his eyes. '
  make_shakespeare_leaf(str(tmp_path / 'data'), [(f'R{i}', text[i:] + text[:i]) for i in range(0, 60, 10)])
  c = _config('fedseq.py:shakespeare,fedseq')
  assert (c.algorithm, c.grouping.estimator, c.grouping.method) == ('fedseq', 'clf', 'greedy')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.min_samples, c.data.max_samples = 0, 20   # the cell's fixed-size subset, scaled to the fixture
  c.data.num_clients = 6
  c.model_kwargs.hidden, c.model_kwargs.num_layers = 8, 1       # compile time
  c.grouping.min_examples, c.grouping.max_clients, c.grouping.method = 40, 3, 'random'
  c.algo.fraction = 1.0                       # both superclients every round
  _run(c, tmp_path, 'shakespeare', clients_per_round=2, batch_size=16)
  s = json.load(open(tmp_path / 'run' / 'summary.json'))
  f = s['fedseq']
  assert f['variant'] == 'fedseq' and f['num_superclients_initial'] == 2 and f['mean_chains_per_round'] == 2
  assert f['comm_messages_per_round'] == {'s2c': 2, 'c2s': 2, 'c2c': 4}      # 6 clients in 2 chains
  assert s['centralized_accuracy'] == 0.52 and 'rounds_to_70pct_centralized' in s
  grouping = json.load(open(tmp_path / 'run' / 'superclients.json'))['groupings'][0]
  assert sorted(i for g in grouping['groups'] for i in g) == list(range(6))
  assert sum(grouping['examples']) == 6 * 18                  # 21 windows per role -> first 20 -> 18 train
  rec = json.loads(open(tmp_path / 'run' / 'metrics.jsonl').readlines()[-1])
  assert rec['test_tokens'] > 0 and 'test_accuracy_no_pad' in rec      # the NextToken task's metrics


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
@pytest.mark.parametrize('cell', ['celeba,fedcg', 'celeba,table=5.9,residual,H', 'celeba,fedavg',
                                  'celeba,table=5.10,all,eye,kmeans,D=2,soft=0'])
def test_fedcg_celeba_cells_on_leaf_layout(tmp_path, cell):
  """configs/fedcg.py on CelebA in LEAF's layout (JSON + official JPEGs and attribute file): discovered domains,
  the 32 oracle attribute domains with the Hamming adjacency, the FedAvg baseline, and k-means client domains
  (the trainer's pre-training pass, one epoch here); images shrunk to 16."""
  from tests.fixtures.data_files import make_celeba_leaf
  make_celeba_leaf(str(tmp_path / 'data' / 'celeba' / 'data'), celebs=(6, 5, 7, 8))
  c = _config(f'fedcg.py:{cell}')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.image_size = 16
  c.model_kwargs.channels = (4, 4)
  c.model_kwargs.gcn_bottleneck = 4
  c.grouping.pretrain_epochs = 1
  _run(c, tmp_path, 'celeba', clients_per_round=2, batch_size=4)
