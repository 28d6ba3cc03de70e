"""The streamed MSLS source (data/sources/msls_stream.py) on a small tree in the official layout: the same clients,
round batches (image for image, candidate draws included), client examples, test and validation sets as the
in-memory `msls` reader, decoded per client with a bounded LRU cache; a trainer runs it on the host path."""
import math

import numpy as np
import pytest

from configs import quickstart_vpr
from fedjax_flat.config.default_config import segmentation_data
from fedjax_flat.data import batching, registry
from fedjax_flat.errors import ConfigError
from fedjax_flat.training import trainers
from tests.data.sources.test_msls import write_city

KW = dict(split_radius=400.0, image_size=8, num_candidates=4, neg_pool=12)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('msls_stream')
  rng = np.random.default_rng(0)
  for c in ('boston', 'tokyo', 'amsterdam', 'sf', 'cph'):
    write_city(str(root / 'msls'), c, rng)
  return str(root)


def test_same_clients_batches_and_sets_as_the_in_memory_reader(data_dir):
  mem = registry.get_dataset('msls', data_dir=data_dir, **KW)
  src = registry.get_dataset('msls_stream', data_dir=data_dir, cache_clients=2, **KW)
  assert src.num_clients == mem.num_clients >= 2
  np.testing.assert_array_equal(src.client_sizes(), mem.client_sizes())
  assert src.input_shape == mem.input_shape and src.label_shape == mem.label_shape and src.draw == mem.draw
  np.testing.assert_array_equal(src.test_examples()[0], mem.test_x)
  held = [registry.get_dataset(n, data_dir=data_dir, **KW, val_clients=1) for n in ('msls_stream', 'msls')]
  assert len(held[0].val_x) and held[0].num_clients == held[1].num_clients
  np.testing.assert_array_equal(held[0].val_x, held[1].val_x)
  np.testing.assert_array_equal(held[0].val_y, held[1].val_y)
  np.testing.assert_array_equal(held[0].val_client, held[1].val_client)     # the trainer's validation groups
  for k in range(src.num_clients):
    for a, b in zip(src.client_examples(k), mem.client_examples(k)):
      np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(src.client_image_ids(k) >= 0, mem.tuple_index[mem.client_indices(k)] >= 0)
  ids = list(range(src.num_clients))
  s = batching.padded_num_steps(src.client_sizes(), 2)
  plan = batching.batch_plan(src.client_sizes(), batch_size=2, num_steps=s, draw=src.draw)
  for r in range(2):
    a = batching.make_round_batches(src, ids, round_idx=r, seed=3, batch_size=2, num_steps=s, plan=plan)
    b = batching.make_round_batches(mem, ids, round_idx=r, seed=3, batch_size=2, num_steps=s, plan=plan)
    for key in ('x', 'y', 'mask', 'num_examples'):
      np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    assert a.x.any()
  assert len(src._cache) == 2                       # the LRU cache keeps cache_clients decoded clients


def test_bad_cache_size_is_one_config_error(data_dir):
  with pytest.raises(ConfigError, match='cache_clients'):
    registry.get_dataset('msls_stream', data_dir=data_dir, **{**KW, 'cache_clients': -1})
  with pytest.raises(ConfigError, match='data.cluster_params'):     # msls's clustering-feature rules hold here too
    registry.get_dataset('msls_stream', data_dir=data_dir, **{**KW, 'split': 'clustering', 'cluster_features': 'model'})


@pytest.mark.slow   # a whole trainer (~80 s under load); the batches it trains on are checked by the first test
def test_trainer_runs_the_streamed_source_on_the_host_path_with_one_program(data_dir):
  c = quickstart_vpr.get_config()
  c.dataset = 'msls_stream'
  c.data = segmentation_data('msls_stream', data_dir=data_dir, **KW)
  c.model_kwargs = {'norm': 'gn', 'base_width': 4, 'gn_groups': 2, 'conv_impl': 'auto'}
  c.rounds, c.clients_per_round, c.eval_every, c.progress_every_s = 2, 2, 2, 1e9
  c.client.batch_size = 2
  c.retrieval.num_negatives = 2
  t = trainers.make_trainer(c)
  assert not t.plan.device_rounds
  t.train()
  assert math.isfinite(t.records[-1]['test_recall@1'])
  assert t.driver.round_fn._cache_size() == 1
