"""FedCG (algorithms/fedcg.py): the adjacency and its initialisations equal their formulas on small matrices;
engine rounds equal rounds written by hand (teacher pseudo-labels or oracle domains -> one-hot w, student on the
pseudo-labels, FedAvg, eq. 5.14's A, teacher <- student every T rounds); communication; the config checks; and
the planted-domain problem on which the teacher/student procedure's purity is measured."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import fedcg, registry
from fedjax_flat.config import families as config_strings
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.data.sources.planted_domains import planted_domains
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.registry import get_model
from fedjax_flat.tasks.base import cross_entropy
from fedjax_flat.training import trainers
from fedjax_flat.training.evals import domains as evals_domains
from fedjax_flat.training.evals import registry as evals_registry
from tests.fixtures.paths import REPO

tmap = jax.tree_util.tree_map
D, B, LR, WD = 3, 4, 0.1, 1e-3


# --- The adjacency: formulas on small matrices. ---

def _by_hand(h, beta):
  d = len(h)
  a = np.zeros((d, d))
  for i in range(d):
    s = sum(h[i][j] for j in range(d) if j != i)
    for j in range(d):
      a[i, j] = beta if i == j else (1 - beta) * h[i][j] / s
  return a


def test_distance_adjacency_equals_eq_5_14():
  v = np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])
  dist = [[np.linalg.norm(v[i] - v[j]) for j in range(3)] for i in range(3)]
  h = [[1.0 / dist[i][j] if i != j else 0.0 for j in range(3)] for i in range(3)]
  for beta in (0.5, 0.2):
    np.testing.assert_allclose(fedcg.distance_adjacency(jnp.asarray(v), beta), _by_hand(h, beta), rtol=1e-6)
  # row 0: h = (-, 1/5, 1/1): A_01 = 0.5 * 0.2 / 1.2, A_02 = 0.5 * 1 / 1.2
  np.testing.assert_allclose(fedcg.distance_adjacency(jnp.asarray(v), 0.5)[0], [0.5, 0.1 / 1.2, 0.5 / 1.2],
                             rtol=1e-6)


def test_initialisations():
  np.testing.assert_allclose(fedcg.initial_adjacency('identity', 4, 0.5, None), np.eye(4))
  u = fedcg.initial_adjacency('uniform', 4, 0.5, None)
  np.testing.assert_allclose(u, 0.5 * np.eye(4) + (0.5 / 3) * (1 - np.eye(4)), rtol=1e-6)
  # Hamming distances of the codes 00, 01, 10, 11 (bit b = attribute b)
  ham = fedcg.hamming_distances(4)
  np.testing.assert_array_equal(ham, [[0, 1, 1, 2], [1, 0, 2, 1], [1, 2, 0, 1], [2, 1, 1, 0]])
  h = [[1.0 / ham[i][j] if i != j else 0.0 for j in range(4)] for i in range(4)]
  np.testing.assert_allclose(fedcg.initial_adjacency('hamming', 4, 0.5, None), _by_hand(h, 0.5), rtol=1e-6)
  assert fedcg.hamming_distances(32)[0, 31] == 5
  r = np.asarray(fedcg.initial_adjacency('random', 5, 0.3, jax.random.key(0)))
  np.testing.assert_allclose(np.diag(r), 0.3, rtol=1e-6)
  np.testing.assert_allclose(r.sum(1), 1.0, rtol=1e-6)
  assert (r >= 0).all() and len(np.unique(np.round(r[0, 1:], 6))) == 4
  np.testing.assert_allclose(fedcg.distance_adjacency(jnp.ones((1, 3)), 0.5), [[1.0]])
  scoped = fedcg.adjacency_of({'a': jnp.eye(3), 'b': 2 * jnp.eye(3)}, 0.5, 'model')
  np.testing.assert_allclose(scoped['a'], fedcg.distance_adjacency(jnp.concatenate([jnp.eye(3), 2 * jnp.eye(3)], 1),
                                                                   0.5))


def test_purity():
  assert fedcg.purity([0, 0, 1, 1], [1, 1, 0, 0], 2, 2) == 1.0
  assert fedcg.purity([0, 0, 0, 0], [0, 1, 2, 3], 4, 4) == 0.25
  assert fedcg.purity([0, 1, 0, 1], [0, 0, 1, 1], 2, 2) == 0.5


# --- Rounds through the engine vs rounds by hand. ---

def _config(dataset, num_clients, **algo):
  c = default_config()
  c.dataset, c.model, c.algorithm = dataset, 'fedcg_net', 'fedcg'
  c.model_kwargs = {'num_domains': D, 'hidden': (), 'channels': (), 'classifier_channels': (),
                    'classifier_hidden': 3}
  c.data.num_clients = num_clients
  if dataset == 'digits_domains':
    c.data.num_domains = D
  c.client.lr, c.client.weight_decay, c.client.batch_size, c.client.local_epochs = LR, WD, B, 1
  c.engine.strategy = 'vmap'
  for k, v in algo.items():
    c.algo[k] = v
  return c


def _setup(dataset):
  if dataset == 'synthetic':
    data = synthetic(3, [3, 7, 4], input_shape=(2, 2, 1), num_classes=3, seed=1)
  else:
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (40, 2, 2, 1)).astype(np.float32)
    data = planted_domains(images, rng.integers(0, 3, 40).astype(np.int32), num_clients=3, num_domains=D,
                           test_fraction=0.25, seed=0)
  model = get_model('fedcg_net', 3, data.input_shape, num_domains=D, hidden=(), channels=(),
                    classifier_channels=(), classifier_hidden=3)
  return data, model


def _hand_rounds(model, data, state0, schedule, steps, *, oracle, period, beta):
  """FedCG written out: per client SGD with coupled weight decay on CE(f(x; w)) + CE(g_s(x), d_hat)."""
  params, teacher = state0['params'], state0['teacher']

  # jitted (one program per count of valid examples): op by op, this loop was most of the test's time
  @jax.jit
  def grad(params, n, x, w, cls, d_hat):
    def loss(n):
      logits, dl = model.apply_train({**params, 'net': n}, x, w)
      return jnp.mean(cross_entropy(logits, cls)) + jnp.mean(cross_entropy(dl, d_hat))
    return jax.grad(loss)(n)

  for r, ids in enumerate(schedule):
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=0, batch_size=B, num_steps=steps, epochs=1,
                                     pad_clients_to=3)
    nets, sizes = [], []
    for i, k in enumerate(rb.client_ids):
      if k < 0:
        continue
      net = params['net']
      for s in range(steps):
        m = rb.mask[i, s] > 0
        if not m.any():
          continue
        x, y = jnp.asarray(rb.x[i, s][m]), jnp.asarray(rb.y[i, s][m])
        if oracle:
          d_hat = y[:, 1]
        else:
          d_hat = jnp.argmax(model.classifier_apply(teacher, x), -1)
        w = jax.nn.one_hot(d_hat, D)
        cls = y[:, 0] if y.ndim == 2 else y
        g = grad(params, net, x, w, cls, d_hat)
        net = tmap(lambda p, a: p - LR * (a + WD * p), net, g)
      nets.append(net)
      sizes.append(float(data.client_sizes()[k]))
    wts = np.asarray(sizes) / sum(sizes)
    new_net = tmap(lambda *xs: sum(wi * x for wi, x in zip(wts, xs)), *nets)
    adj = {}
    for layer in model.layer_names:
      v = np.asarray(new_net[layer]['nodes'], np.float64)
      h = [[1.0 / np.linalg.norm(v[i] - v[j]) if i != j else 0.0 for j in range(D)] for i in range(D)]
      adj[layer] = _by_hand(h, beta)
    params = {**params, 'net': new_net, 'adjacency': adj}
    if (r + 1) % period == 0:
      teacher = new_net['student']
  return params, teacher


@pytest.mark.parametrize('dataset,oracle', [pytest.param('synthetic', False, marks=pytest.mark.slow),   # ~15 s
                                            ('digits_domains', True), ('digits_domains', False)])
def test_rounds_match_hand_computed(dataset, oracle):
  data, model = _setup(dataset)
  cfg = _config(dataset, 3, domains='oracle' if oracle else 'discovered', teacher_period=2,
                adjacency_init='uniform')
  validate.validate_config(cfg)
  alg = registry.build_algorithm(cfg, model, population=3, task=data.task)
  steps = batching.padded_num_steps(data.client_sizes(), B, epochs=1)
  state = alg.server_init(model.init(jax.random.key(0), jnp.zeros((1,) + data.input_shape)), jax.random.key(1))
  np.testing.assert_allclose(state['params']['adjacency']['ds_0'], fedcg.uniform_adjacency(D, 0.5))
  assert not np.allclose(state['teacher']['Dense_0']['kernel'], state['params']['net']['student']['Dense_0']['kernel'])
  state0 = tmap(jnp.copy, state)
  fn = engine.make_round_fn(alg, chunk=3)
  schedule = [[0, 1, 2], [2, 0], [1, 2]]
  for r, ids in enumerate(schedule):
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=0, batch_size=B, num_steps=steps, epochs=1,
                                     pad_clients_to=3)
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
    state, _, _ = fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, r)
  want_params, want_teacher = _hand_rounds(model, data, state0, schedule, steps, oracle=oracle, period=2, beta=0.5)
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)  # noqa: E731
  tmap(close, state['params']['net'], want_params['net'])
  tmap(close, state['params']['adjacency'], want_params['adjacency'])
  tmap(close, state['teacher'], want_teacher)
  # the teacher was refreshed after round 2 (T = 2) and is not the round-3 student
  assert not np.allclose(state['teacher']['Dense_0']['kernel'], state['params']['net']['student']['Dense_0']['kernel'])


def test_fixed_adjacency_and_eval_models():
  data, model = _setup('synthetic')
  cfg = _config('synthetic', 3, adjacency_init='hamming', adjacency_update='fixed', soft=False)
  alg = registry.build_algorithm(cfg, model, population=3)
  state = alg.server_init(model.init(jax.random.key(0), jnp.zeros((1,) + data.input_shape)), jax.random.key(1))
  fn = engine.make_round_fn(alg, chunk=3)
  steps = batching.padded_num_steps(data.client_sizes(), B, epochs=1)
  rb = batching.make_round_batches(data, [0, 1, 2], round_idx=0, seed=0, batch_size=B, num_steps=steps, epochs=1,
                                   pad_clients_to=3)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
  state, _, _ = fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)
  np.testing.assert_allclose(state['params']['adjacency']['ds_0'], fedcg.hamming_adjacency(D, 0.5), rtol=1e-6)
  models = alg.eval_models(state)
  assert set(models) == {'global', 'soft'}
  assert float(models['global'][0]['soft']) == 0.0 and float(models['soft'][0]['soft']) == 1.0


def test_communication_counts_teacher_and_adjacency():
  data, model = _setup('synthetic')
  alg = registry.build_algorithm(_config('synthetic', 3), model, population=3)
  p = model.init(jax.random.key(0), jnp.zeros((1,) + data.input_shape))
  n = sum(int(a.size) for a in jax.tree_util.tree_leaves(p))
  n_student = sum(int(a.size) for a in jax.tree_util.tree_leaves(p['net']['student']))
  assert alg.comm_down == pytest.approx(1 + n_student / n)
  assert alg.comm_up == pytest.approx((n - D * D - 1) / n)


def test_config_checks():
  c = _config('digits', 3)
  c.model = 'mlp'
  with pytest.raises(ConfigError, match='fedcg_net'):
    validate.validate_config(c)
  c = _config('digits', 3, domains='oracle')
  with pytest.raises(ConfigError, match='algo.domains'):
    validate.validate_config(c)
  with pytest.raises(ConfigError, match='adjacency_init'):
    validate.validate_config(_config('digits_domains', 4, adjacency_init='ring'))
  data, _ = _setup('digits_domains')
  c = _config('digits_domains', 3, domains='oracle')
  c.model_kwargs.num_domains = 2
  with pytest.raises(ConfigError, match='num_domains'):
    registry.spec('fedcg').validate_data(c, data)
  with pytest.raises(ConfigError, match='algo.domains'):             # k-means domains need a domain column too
    validate.validate_config(_config('digits', 3, domains='kmeans'))
  c = _config('digits_domains', 3, domains='kmeans')
  c.model_kwargs.num_domains = 2                                      # k < the data's domains: the pass rewrites
  registry.spec('fedcg').validate_data(c, data)                       # the column with clusters < k
  assert 'client_domains' in registry.needs('fedcg')


@pytest.mark.slow
def test_teacher_student_discovers_two_planted_domains():
  """Identity vs inverted digits, one domain per client, D = 2, 30 rounds: the final student's clusters on the test
  images against the planted domains (purity 0.5 = no information, 1 = the planted split). Measured 0.777 (seed
  0; 259 / 99 test images per cluster): a partial discovery, asserted with a margin for float differences."""
  c = config_strings.load_config(os.path.join(REPO, 'configs', 'fedcg_digits.py:fedcg,discovered,D=2'))
  c.data.num_domains, c.data.num_clients, c.clients_per_round, c.rounds = 2, 8, 8, 30
  c.progress_every_s = 1e9
  t = trainers.make_trainer(c)
  t.train()
  tx, ty = t.data.test_examples()
  student = np.asarray(jnp.argmax(t.model.classifier_apply(t.server_state['params']['net']['student'],
                                                           jnp.asarray(tx)), -1))
  assert fedcg.purity(student, ty[:, 1], 2, 2) >= 0.7
  assert np.bincount(student, minlength=2).min() > 0           # both domains in use (no collapse)
  s = t.end_training()
  assert s['domains']['purity_student'] == fedcg.purity(student, ty[:, 1], 2, 2)
  assert s['domains']['domains_used'] == 2


def test_summary_records_the_domains_the_run_found():
  """summary.json `domains` (training/evals/domains.py, selected for FedCG runs): the student's test assignment and
  its purity, the teacher's, the reported model's accuracy per planted domain, each equal to its computation by
  hand (on the initial server state: the plug-in reads whatever state the run ends with; the slow test above
  checks it after training), and the summary.md fact saying what 'global' means."""
  data, _ = _setup('digits_domains')                 # 40 planted-domain images of 2x2 pixels, 3 clients
  c = _config('digits_domains', 3, domains='oracle')
  c.clients_per_round, c.progress_every_s = 3, 1e9
  t = trainers.make_trainer(c, data=data)
  assert 'domains' in [e.name for e in evals_registry.selected(t.plan)]
  s = {}
  evals_domains.EVALUATION.final(t, s, 'global')
  dom = s['domains']
  tx, ty = t.data.test_examples()
  state = t.server_state
  student = np.asarray(jnp.argmax(t.model.classifier_apply(state['params']['net']['student'], jnp.asarray(tx)), -1))
  teacher = np.asarray(jnp.argmax(t.model.classifier_apply(state['teacher'], jnp.asarray(tx)), -1))
  assert dom['num_domains'] == D and dom['planted_domains'] == D and dom['soft'] is True
  assert dom['student_counts'] == np.bincount(student, minlength=D).tolist()
  assert dom['purity_student'] == fedcg.purity(student, ty[:, 1], D, D)
  assert dom['purity_teacher'] == fedcg.purity(teacher, ty[:, 1], D, D)
  assert np.asarray(dom['student_vs_planted']).sum() == len(ty)
  params = t.algorithm.eval_models(state)[dom['per_domain_accuracy']['model']][0]
  pred = np.asarray(jnp.argmax(t.model.apply(params, jnp.asarray(tx)), -1))
  want = [float(np.mean((pred == ty[:, 0])[ty[:, 1] == d])) for d in range(D)]
  np.testing.assert_allclose(dom['per_domain_accuracy']['accuracy'], want)
  assert "'global' weighs the domain-specific layers by the student's soft probabilities" in s['facts']['domains']
