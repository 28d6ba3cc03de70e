"""FedVC's virtual clients (data/virtual_clients.py): every virtual client holds exactly V of its real client's
examples, every example is used, and uniform sampling over virtual clients picks real clients with frequencies
proportional to ceil(N_k / V) (= N_k / V for sizes that are multiples of V)."""
import numpy as np

from fedjax_flat.data import sampling, virtual_clients as vc
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config


def test_virtual_clients_hold_v_examples_of_their_own_client():
  data = synthetic(5, [3, 10, 25, 7, 40], input_shape=(2,), num_classes=3, seed=0)
  v = vc.virtual_clients(data, 8, seed=1)
  assert v.num_clients == 1 + 2 + 4 + 1 + 5
  assert v.virtual_of.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4, 4]
  assert set(v.client_sizes().tolist()) == {8}
  for j in range(v.num_clients):
    own = set(data.client_indices(int(v.virtual_of[j])).tolist())
    assert set(v.client_indices(j).tolist()) <= own
  for k in range(data.num_clients):            # every example of every client is used
    used = np.concatenate([v.client_indices(j) for j in np.flatnonzero(v.virtual_of == k)])
    assert set(used.tolist()) == set(data.client_indices(k).tolist())
  # a client with 25 = 3 * 8 + 1: the first three chunks are disjoint, the last one refills from the client
  chunks = [v.client_indices(j) for j in np.flatnonzero(v.virtual_of == 2)]
  assert len(set(np.concatenate(chunks[:3]).tolist())) == 24
  assert len(set(chunks[3].tolist())) == 8
  np.testing.assert_array_equal(v.x, data.x)   # no example copied: index sets over the same arrays


def test_sampling_frequencies_are_proportional_to_size():
  sizes = [8, 16, 32, 64, 8, 32]
  data = synthetic(6, sizes, input_shape=(2,), num_classes=2, seed=0)
  v = vc.virtual_clients(data, 8, seed=0)
  counts = np.zeros(6)
  rounds, per_round = 1500, 5
  for r in range(rounds):
    ids = sampling.sample_clients(v.num_clients, per_round, seed=0, round_idx=r)
    np.add.at(counts, v.virtual_of[ids], 1)
  freq = counts / counts.sum()
  expected = np.array(sizes) / np.sum(sizes)
  # binomial standard error of each frequency over 7,500 draws is < 0.006
  np.testing.assert_allclose(freq, expected, atol=0.02)
  assert freq[3] > 6 * freq[0]


def test_trainer_uses_virtual_clients_when_configured():
  data = synthetic(4, [4, 8, 16, 4], input_shape=(4, 4, 1), num_classes=4, seed=3)
  t = trainers.make_trainer(small_config(**{'fedvc.virtual_size': 4, 'client.local_steps': 2, 'rounds': 1}),
                            data=data)
  assert t.data.num_clients == 1 + 2 + 4 + 1 and set(t.data.client_sizes().tolist()) == {4}
  t.train()
