"""The centralized upper bound (training/centralized.py) and summary.json's rounds to 70% / 90% of it."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_flat.models.registry import get_model
from fedjax_flat.training import centralized
from tests.fixtures.configs import small_config

from fedjax_flat.config import validate
from fedjax_flat.training import run as run_lib
from fedjax_flat.config.default_config import default_config
from tests.fixtures.paths import REPO


def _config():
  c = default_config()
  c.data.num_clients, c.data.alpha = 10, 0.0
  c.client.lr, c.client.batch_size = 0.05, 32
  c.clients_per_round = 5
  c.eval_every = 1
  c.progress_every_s = 1e9
  c.summary_last_k = 1
  return c


def test_rounds_to_with_window():
  recs = [{'round': r, 'test_accuracy': a} for r, a in ((2, 0.5), (4, 0.8), (6, 0.7), (8, 0.95), (10, 0.9))]
  assert centralized.rounds_to(recs, 'test_accuracy', 0.7) == 4
  assert centralized.rounds_to(recs, 'test_accuracy', 0.75, window=2) == 6    # (0.8 + 0.7) / 2 = 0.75
  assert centralized.rounds_to(recs, 'test_accuracy', 0.9, window=3) is None   # best 3-mean: 0.85
  assert centralized.rounds_to(recs, 'swa/test_accuracy', 0.1) is None
  assert centralized.fraction_key(0.7) == 'rounds_to_70pct_centralized'


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_centralized_beats_one_federated_round_and_feeds_rounds_to(tmp_path):
  c = _config()
  c.centralized.epochs = 4
  res = centralized.train(c, str(tmp_path / 'central'))
  saved = json.loads((tmp_path / 'central' / 'centralized.json').read_text())
  assert saved['final_test_accuracy'] == res['final_test_accuracy']
  from fedjax_flat.data import registry
  data = registry.get_dataset(c.dataset, **c.data.to_dict())
  assert saved['num_train_examples'] == int(data.client_sizes().sum()) and len(saved['epochs']) == 4
  assert saved['hparams'] == {'epochs': 4, 'lr': 0.05, 'momentum': 0.9, 'weight_decay': 4e-4, 'batch_size': 32,
                              'schedule': 'cosine', 'optimizer': 'sgd'}
  f = _config()
  f.rounds = 5
  f.centralized.path = str(tmp_path / 'central')        # the workdir (its centralized.json is read)
  f.centralized.fractions = (0.3, 0.7, 0.9)
  s = run_lib.run(f, str(tmp_path / 'fed'))
  assert s['centralized_accuracy'] == res['final_test_accuracy']
  assert s['centralized_source'] == str(tmp_path / 'central' / 'centralized.json')
  recs = [json.loads(line) for line in open(tmp_path / 'fed' / 'metrics.jsonl')]
  # round 1 of this run is a 1-round federated run (same seed: same clients and batches)
  assert recs[0]['round'] == 1 and res['final_test_accuracy'] > 0.9 > recs[0]['test_accuracy']
  for frac in (0.3, 0.7, 0.9):
    want = next((r['round'] for r in recs if r['test_accuracy'] >= frac * res['final_test_accuracy']), None)
    assert s[centralized.fraction_key(frac)] == want
  assert s['rounds_to_30pct_centralized'] is not None
  disk = json.loads((tmp_path / 'fed' / 'summary.json').read_text())
  assert disk['rounds_to_70pct_centralized'] == s['rounds_to_70pct_centralized']


@pytest.mark.parametrize('field,value,msg', [
    ('accuracy', 1.5, 'fraction'), ('accuracy', float('nan'), 'finite'), ('epochs', 0, '>= 1'),
    ('momentum', 1.0, '[0, 1)'), ('weight_decay', -0.5, '-1'), ('schedule', 'step', 'allowed'),
    ('window', 0, '>= 1'), ('fractions', (0.7, 1.2), 'in (0, 1]'), ('fractions', (), 'in (0, 1]'),
    ('lr', float('inf'), 'finite'), ('lr', -0.1, '>= 0'), ('path', '/nonexistent/centralized.json', 'cannot read')])
def test_validation(field, value, msg):
  c = default_config()
  with c.centralized.ignore_type():
    c.centralized[field] = value
  with pytest.raises(validate.ConfigError, match=f'centralized.{field}') as e:
    validate.validate_config(c)
  assert msg in str(e.value)


def test_path_must_hold_a_centralized_result(tmp_path):
  p = tmp_path / 'x.json'
  p.write_text(json.dumps({'final_test_accuracy': 87.5}))       # percent, not a fraction
  c = default_config()
  c.centralized.path = str(p)
  with pytest.raises(validate.ConfigError, match=r'\(0, 1\]'):
    validate.validate_config(c)
  p.write_text(json.dumps({'final_test_accuracy': 0.875}))
  validate.validate_config(c)
  c.centralized.accuracy = 0.8
  with pytest.raises(validate.ConfigError, match='one of the two'):
    validate.validate_config(c)


def test_binary_exits_2_on_a_bad_field(tmp_path):
  import subprocess
  import sys
  repo = REPO
  res = subprocess.run([sys.executable, os.path.join(repo, 'experiments', 'centralized.py'),
                        f'--config={os.path.join(repo, "configs", "quickstart.py")}', f'--workdir={tmp_path}',
                        '--config.centralized.momentum=1.5'], capture_output=True, text=True, timeout=120)
  assert res.returncode == 2 and 'error: config.centralized.momentum' in res.stderr and 'Traceback' not in res.stderr


# ----------------------------------------------------------------------------------------------------
# The client optimizer chain (SAM / ASAM) and SWA in the centralized run (thesis Table 4.5), on a tiny MLP.

class _TinyData:
  """Two clients of 8-feature examples, 3 classes (the surface train() reads)."""
  num_clients, num_classes, input_shape = 2, 3, (8,)

  def __init__(self, n=24, seed=0):
    rng = np.random.RandomState(seed)
    self._x = rng.randn(n, 8).astype(np.float32)
    self._y = rng.randint(0, 3, n).astype(np.int32)

  def client_examples(self, k):
    h = len(self._y) // 2
    return self._x[k * h:(k + 1) * h], self._y[k * h:(k + 1) * h]

  def test_examples(self):
    return self._x, self._y


def _tiny_config(optimizer='sgd', epochs=1, batch_size=24):
  c = default_config()
  c.model = 'mlp'
  c.model_kwargs = ml_collections.ConfigDict({'hidden': (6,)})
  c.client.optimizer, c.client.rho, c.client.lr = optimizer, 0.05, 0.1
  c.centralized.epochs, c.centralized.batch_size, c.centralized.schedule = epochs, batch_size, 'constant'
  c.centralized.momentum, c.centralized.weight_decay = 0.9, 0.01
  return c


def _recorded(c, data):
  seen = []
  res = centralized.train(c, data=data, on_epoch=lambda e, p, swa: seen.append((e, p, swa)))
  return res, seen


def test_one_centralized_sam_step_is_the_sam_formula():
  data = _TinyData()
  c = _tiny_config('sam')
  res, seen = _recorded(c, data)
  model = get_model('mlp', 3, (8,), hidden=(6,))
  w0 = model.init(jax.random.fold_in(jax.random.key(c.seed), 0), jnp.zeros((1, 8), jnp.float32))
  x, y = data.test_examples()        # one step over all 24 examples (the batch order does not change the mean)

  def loss(p):
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x, train=True), y))
  g = jax.grad(loss)(w0)
  norm = jnp.sqrt(sum(jnp.sum(v ** 2) for v in jax.tree_util.tree_leaves(g)))
  g2 = jax.grad(loss)(jax.tree_util.tree_map(lambda w, gi: w + 0.05 * gi / norm, w0, g))
  # w1 = w0 - lr (g(w0 + e) + wd w0): SAM's gradient, coupled weight decay at w0, momentum's first step = 1x.
  want = jax.tree_util.tree_map(lambda w, gi: w - 0.1 * (gi + 0.01 * w), w0, g2)
  got = seen[0][1]
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  plain = jax.tree_util.tree_map(lambda w, gi: w - 0.1 * (gi + 0.01 * w), w0, g)
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(plain))) > 1e-4   # SAM != SGD here
  assert res['hparams']['optimizer'] == 'sam' and res['hparams']['rho'] == 0.05


def test_centralized_asam_trains_with_its_own_step():
  data = _TinyData()
  sam = _recorded(_tiny_config('sam'), data)[1][0][1]
  res, seen = _recorded(_tiny_config('asam'), data)
  assert res['hparams']['optimizer'] == 'asam' and 'asam_eta' in res['hparams']
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree_util.tree_leaves(seen[0][1]), jax.tree_util.tree_leaves(sam)))
  assert diff > 1e-6 and np.isfinite(res['final_test_accuracy'])


def test_centralized_swa_lr_and_average_of_the_recorded_iterates():
  data = _TinyData()
  c = _tiny_config('sgd', epochs=6, batch_size=8)
  c.swa.enabled, c.swa.start_fraction, c.swa.cycle, c.swa.lr1, c.swa.lr2 = True, 1 / 3, 2, 0.05, 0.01
  hp = centralized.hparams(c)
  # s = 2; cycles are epochs (2, 3), (4, 5); their last epochs (lr = lr2) are averaged.
  assert hp['swa']['start_epoch'] == 2 and centralized.swa_averaged_epochs(hp) == [3, 5]
  np.testing.assert_allclose(centralized.epoch_lrs(hp, 1, 3), [0.1] * 3)            # before s: the schedule
  np.testing.assert_allclose(centralized.epoch_lrs(hp, 2, 3), [0.03] * 3, rtol=1e-6)  # t = 1/2: (lr1 + lr2) / 2
  np.testing.assert_allclose(centralized.epoch_lrs(hp, 3, 3), [0.01] * 3, rtol=1e-6)  # t = 1: lr2
  res, seen = _recorded(c, data)
  assert [swa is None for _, _, swa in seen] == [True, True, True, False, False, False]
  want = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, seen[3][1], seen[5][1])      # epochs 4 and 6 (1-based)
  for a, b in zip(jax.tree_util.tree_leaves(seen[5][2]), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert res['swa_averages'] == 2 and res['reported_model'] == 'swa'
  assert res['final_test_accuracy'] == res['epochs'][-1]['swa/test_accuracy']
  assert res['final_test_accuracy_base'] == res['epochs'][-1]['test_accuracy']


def test_centralized_swa_that_never_averages_warns_and_reports_the_plain_model(caplog):
  c = _tiny_config('sgd', epochs=2)
  c.swa.enabled, c.swa.start_fraction, c.swa.cycle = True, 0.75, 5
  res = centralized.train(c, data=_TinyData())
  assert res['swa_averages'] == 0 and res['reported_model'] == 'base'
  assert res['final_test_accuracy'] == res['epochs'][-1]['test_accuracy']
  assert any('never averages' in r.getMessage() for r in caplog.records)


@pytest.mark.slow   # over 30 s; fast: test_centralized_store_candidates_are_drawn_afresh_every_epoch_from_the_pool
def test_centralized_retrieval_reports_recall_at_k():
  """Table 6.5's centralized row: the retrieval task trains on the pooled query tuples (triplet loss) and is
  evaluated by Recall@K on the server's test city and on the validation clients (left out of the union), as
  the federated runs are."""
  from configs import quickstart_vpr
  c = quickstart_vpr.get_config()
  c.data.update(num_cities=2, sequences_per_city=6, seq_len=4, queries_per_city=12, image_size=16,
                test_sequences=6, test_queries=12, val_clients=1)
  c.model_kwargs.base_width = 8
  c.centralized.epochs = 1
  res = centralized.train(c)
  rec = res['epochs'][-1]
  assert {'test_accuracy', 'test_loss', 'test_recall@5', 'test_recall@10'} <= set(rec), sorted(rec)
  assert 0.0 <= rec['test_accuracy'] <= rec['test_recall@5'] <= rec['test_recall@10'] <= 1.0
  assert res['final_test_accuracy'] == rec['test_accuracy'] and np.isfinite(rec['train_loss'])
  assert 0.0 <= rec['val_recall@1'] == rec['val_accuracy'] <= rec['val_recall@5'] <= rec['val_recall@10'] <= 1.0


# ----------------------------------------------------------------------------------------------------
# Data over an item store (FedVPR's tuples): fresh candidates every epoch through the rounds' draw definition.

def _store_data(seed=0):
  """12 query tuples of 2 clients over a store of 30 items (2 x 2 x 1): slot 0 the query, slot 1 its positive,
  then a pool of 5 negatives (rows 3 and 7: only 1 and 2 pool entries, the rest empty); draw = (2, 2). The
  server's test set: 4 database items, 2 queries (retrieval's (easting, northing, role) labels)."""
  from fedjax_flat.data import vpr_places
  from fedjax_flat.data.federated import FederatedDataset
  rng = np.random.RandomState(seed)
  store = rng.randn(30, 2, 2, 1).astype(np.float32)
  rows = np.stack([rng.choice(30, 7, replace=False) for _ in range(12)]).astype(np.int64)
  rows[3, 3:] = -1
  rows[7, 4:] = -1
  test_x = rng.randn(6, 2, 2, 1).astype(np.float32)
  test_y = np.array([[0, 0, 0], [50, 0, 0], [0, 50, 0], [50, 50, 0], [1, 1, 1], [49, 1, 1]], np.float32)
  return FederatedDataset.from_client_indices(
      rows.astype(np.int32), vpr_places.slot_kinds(1, rows), [np.arange(6), np.arange(6, 12)], test_x, test_y,
      num_classes=1, name='tiny_store', task='retrieval', store=store, draw=(2, 2))


def _store_config(seed=0, epochs=3):
  c = _tiny_config('sgd', epochs=epochs, batch_size=5)     # 12 examples: 3 steps of 5, the last one 2 valid
  c.model_kwargs = ml_collections.ConfigDict({'hidden': (4,)})
  c.retrieval.num_negatives = 1
  c.seed = seed
  return c


def _record_store_rows(monkeypatch):
  """Records (idx, mask, drawn rows) of every step of train()'s compiled epochs, and the epoch programs."""
  seen, fns = [], []
  inner, make = centralized.store_rows, centralized.make_epoch_fn

  def rows(arrays, idx, mask, keys, draw):
    out = inner(arrays, idx, mask, keys, draw)
    jax.debug.callback(lambda *a: seen.append(tuple(np.asarray(v) for v in a)), idx, mask, out[0], ordered=True)
    return out

  def make_fn(*a, **k):
    fns.append(make(*a, **k))
    return fns[-1]
  monkeypatch.setattr(centralized, 'store_rows', rows)
  monkeypatch.setattr(centralized, 'make_epoch_fn', make_fn)
  return seen, fns


def test_centralized_store_candidates_are_drawn_afresh_every_epoch_from_the_pool(monkeypatch):
  from fedjax_flat.data import batching
  data = _store_data()
  seen, fns = _record_store_rows(monkeypatch)
  res, params = _recorded(_store_config(), data)
  epochs, steps, b = 3, 3, 5
  assert len(seen) == epochs * steps and np.isfinite(res['final_test_accuracy'])
  rec = res['epochs'][-1]         # retrieval: Recall@K of the test queries against the test database
  assert 0.0 <= rec['test_accuracy'] <= rec['test_recall@5'] <= rec['test_recall@10'] <= 1.0
  assert res['final_test_accuracy'] == rec['test_accuracy'] and np.isfinite(rec['train_loss'])
  assert len(fns) == 1 and fns[0]._cache_size() == 1          # one program for every epoch
  x, y = np.asarray(data.x), np.asarray(data.y)
  drawn = {}                                                   # (epoch, example) -> its candidates
  for t, (idx, mask, rows) in enumerate(seen):
    e, s = divmod(t, steps)
    # the rounds' draw definition, keyed by (seed, epoch, step, slot): the union is client 0 of round e
    keys = batching.draw_keys(jax.random.key(0), e, jnp.zeros((1,), jnp.int32), steps, b)[0, s]
    want, _ = batching.draw_columns((2, 2), keys, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
    for j in range(b):
      if mask[j] == 0:
        assert (rows[j] == -1).all()                           # padding: empty, as in the round batches
        continue
      i = int(idx[j])
      np.testing.assert_array_equal(rows[j], np.asarray(want)[j])
      np.testing.assert_array_equal(rows[j, :2], x[i, :2])     # the query and its positive: always kept
      pool = set(x[i, 2:][x[i, 2:] >= 0].tolist())
      cand = [c for c in rows[j, 2:].tolist() if c >= 0]
      assert set(cand) <= pool and len(set(cand)) == len(cand) == min(2, len(pool))
      drawn[e, i] = frozenset(cand)
  assert sorted(i for _, i in drawn) == sorted(list(range(12)) * epochs)     # every example once an epoch
  for e in (1, 2):       # fresh draws: most examples with a pool of 5 get other candidates in the next epoch
    assert sum(drawn[e, i] != drawn[e - 1, i] for i in range(12) if i not in (3, 7)) >= 6
  assert drawn[0, 3] == drawn[1, 3] == frozenset(x[3, 2:3].tolist())       # a pool of 1: always all of it



def test_centralized_store_run_is_the_same_for_the_same_seed(monkeypatch):
  """The same seed: the same candidates and the same model (a rerun, or a resumed run, sees the same draws);
  another seed draws other candidates."""
  data = _store_data()
  seen, _ = _record_store_rows(monkeypatch)
  res, params = _recorded(_store_config(epochs=2), data)
  first = [r.copy() for _, _, r in seen]
  seen.clear()
  res2, params2 = _recorded(_store_config(epochs=2), data)
  assert len(first) == len(seen) == 6 and all((a == r).all() for a, (_, _, r) in zip(first, seen))
  assert [{**r, 'wall_s': 0} for r in res['epochs']] == [{**r, 'wall_s': 0} for r in res2['epochs']]
  for a, b in zip(jax.tree_util.tree_leaves(params[-1][1]), jax.tree_util.tree_leaves(params2[-1][1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  arrays = {'x': jnp.asarray(data.x), 'y': jnp.asarray(data.y)}
  idx, mask = jnp.arange(10).reshape(2, 5), jnp.ones((2, 5))
  other = [centralized.store_rows(arrays, idx[s], mask[s], centralized.epoch_draw_keys(1, 0, 2, 5)[s], (2, 2))[0]
           for s in range(2)]
  same = [centralized.store_rows(arrays, idx[s], mask[s], centralized.epoch_draw_keys(0, 0, 2, 5)[s], (2, 2))[0]
          for s in range(2)]
  assert any((np.asarray(a) != np.asarray(b)).any() for a, b in zip(same, other))


def test_store_batch_looks_up_the_drawn_rows():
  data = _store_data()
  arrays = {'x': jnp.asarray(data.x), 'y': jnp.asarray(data.y), 'store': jnp.asarray(data.store)}
  idx, mask = jnp.array([3, 0, 5, 0]), jnp.array([1.0, 1.0, 1.0, 0.0])
  keys = centralized.epoch_draw_keys(0, 2, 1, 4)[0]
  rows, kinds = centralized.store_rows(arrays, idx, mask, keys, (2, 2))
  batch = centralized.store_batch(arrays, idx, mask, keys, (2, 2))
  rows = np.asarray(rows)
  assert rows.shape == (4, 4) and rows[0, 3] == -1 and (rows[3] == -1).all()   # a pool of 1; padding
  want = np.where((rows >= 0)[..., None, None, None], data.store[np.maximum(rows, 0)], 0.0)
  np.testing.assert_array_equal(np.asarray(batch['x']), want)
  np.testing.assert_array_equal(np.asarray(batch['y'])[:3], np.asarray(kinds)[:3])
  assert (np.asarray(batch['y'])[3] == 0).all() and list(np.asarray(kinds)[0]) == [1, 2, 3, 0]


def test_union_indexed_of_per_client_stores_indexes_the_same_items():
  data = _store_data()

  class Source:      # the indexed-source protocol (data/sources/msls_stream.py): one store per client
    num_clients, draw = 2, (2, 2)

    def client_indexed(self, k):
      r = np.asarray(data.x[data.client_indices(k)])
      ids = np.unique(r[r >= 0])
      return (np.where(r >= 0, np.searchsorted(ids, np.maximum(r, 0)), -1).astype(np.int32),
              np.asarray(data.y)[data.client_indices(k)], data.store[ids])
  rows, y, store, draw = centralized.union_indexed(Source())
  rows0, y0, store0, draw0 = centralized.union_indexed(data)
  assert draw == draw0 == (2, 2) and rows.dtype == np.int32
  np.testing.assert_array_equal(rows < 0, rows0 < 0)
  np.testing.assert_array_equal(store[np.maximum(rows, 0)], store0[np.maximum(rows0, 0)])
  np.testing.assert_array_equal(y, y0)
  assert centralized.union_indexed(_TinyData()) is None


def test_centralized_run_without_a_store_is_the_plain_epoch_program():
  """Data without a store keep their path: the epoch program before store data existed (x[perm], y[perm] closed
  over; the reference below), bit for bit, SAM with a partial last batch over 3 epochs."""
  from fedjax_flat.algorithms import local as local_lib
  data = _TinyData(n=30)
  c = _tiny_config('sam', epochs=3, batch_size=7)
  res, seen = _recorded(c, data)
  hp = centralized.hparams(c)
  model = get_model('mlp', 3, (8,), hidden=(6,))
  tx = centralized.centralized_optimizer(c, hp)
  loss_fn = local_lib.make_loss(model, task=None)

  def epoch(params, opt_state, x, y, perm, valid, lrs, key):
    def body(carry, xs):
      params, opt_state = carry
      idx, mask, lr, step = xs
      rng = jax.random.fold_in(key, step)
      local, m = local_lib.local_step(local_lib.LocalState(params, opt_state, params),
                                      {'x': x[idx], 'y': y[idx], 'mask': mask}, rng, loss_fn=loss_fn, tx=tx,
                                      hparams={'lr': lr, 'rho': jnp.asarray(0.05, jnp.float32)})
      return (local.params, local.opt_state), (m['loss_sum'], m['count'])
    (params, opt_state), (s, n) = jax.lax.scan(body, (params, opt_state),
                                               (perm, valid, lrs, jnp.arange(perm.shape[0])))
    return params, opt_state, jnp.sum(s), jnp.sum(n)
  epoch = jax.jit(epoch, donate_argnums=(0, 1))
  key = jax.random.key(c.seed)
  params = model.init(jax.random.fold_in(key, 0), jnp.zeros((1, 8), jnp.float32))
  opt_state = tx.init(params)
  x, y = centralized.union(data)
  xd, yd = jax.device_put(x), jax.device_put(y)
  for e in range(3):
    order = np.random.default_rng([c.seed, e]).permutation(30)
    perm = np.concatenate([order, np.zeros(5, np.int64)]).reshape(5, 7).astype(np.int32)
    valid = np.concatenate([np.ones(30, np.float32), np.zeros(5, np.float32)]).reshape(5, 7)
    params, opt_state, s, n = epoch(params, opt_state, xd, yd, perm, valid, centralized.epoch_lrs(hp, e, 5),
                                    jax.random.fold_in(key, 1000 + e))
    assert res['epochs'][e]['train_loss'] == float(s) / float(n)
    for a, b in zip(jax.tree_util.tree_leaves(seen[e][1]), jax.tree_util.tree_leaves(params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

def test_centralized_starts_from_the_params_of_config_init(tmp_path):
  """config.init.pretrained (e.g. LADD's source model for the centralized FTDA): the run starts at exactly the
  file's params, classifier kept (init.reinit_classifier='never'); without it, at the model's init."""
  from fedjax_flat.models import pretrained
  c = _config()
  c.model, c.centralized.epochs = 'mlp', 1
  fresh = []
  centralized.train(c, on_init=fresh.append)
  shifted = jax.tree_util.tree_map(lambda a: np.asarray(a) + 0.5, fresh[0])
  path = str(tmp_path / 'source_model.npz')
  pretrained.save_params(path, shifted)
  c.init.pretrained, c.init.reinit_classifier = path, 'never'
  got, epochs = [], []
  res = centralized.train(c, on_init=got.append, on_epoch=lambda e, p, s: epochs.append(p))
  for u, v in zip(jax.tree_util.tree_leaves(shifted), jax.tree_util.tree_leaves(got[0])):
    np.testing.assert_array_equal(u, v)
  assert len(epochs) == 1 and np.isfinite(res['final_test_loss'])
  assert not np.allclose(jax.tree_util.tree_leaves(epochs[0])[0], jax.tree_util.tree_leaves(shifted)[0])


def test_centralized_poly_schedule_is_the_release_poly():
  hp = {'epochs': 2, 'lr': 0.1, 'schedule': 'poly'}
  lrs = np.concatenate([centralized.epoch_lrs(hp, e, 5) for e in range(2)])
  np.testing.assert_allclose(lrs, 0.1 * (1 - np.arange(10) / 10) ** 0.9, rtol=1e-6)


@pytest.mark.parametrize('opt', ['sam', 'asam', 'sam_every', 'looksam', 'ksam'])
def test_every_ascent_optimizer_gets_its_radius_in_a_centralized_run(opt):
  """The centralized step reads rho from hparams (client_hparams(lr, rho)): every optimizer with an ascent
  (optimizers/client.ASCENT_OPTIMIZERS) gets client.rho, SGD none."""
  assert centralized.hparams(small_config(**{'client.optimizer': opt, 'client.rho': 0.07}))['rho'] == 0.07
  assert 'rho' not in centralized.hparams(small_config())
