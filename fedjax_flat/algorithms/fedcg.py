"""FedCG: cluster-driven graph federated learning over multiple domains (Caldarola et al., CVPR-W 2021; thesis
section 5.4, eqs. 5.11-5.14). No official code exists: the thesis is the specification; every choice below names
its alternative, one config value away. The network is models/fedcg.py (`fedcg_net`).

Round t (one compiled program, like every algorithm here):
  server sends   the model w = {w_a, V (domain-specific nodes), W (GCN projections), lambda, student phi},
                 the adjacency A of every domain-specific layer, and the teacher (comm: see below)
  client k       for each image the domain d_hat:  'discovered' (default): argmax of the teacher g_teacher(x);
                 'oracle': the domain given by the data (labels y = [class, domain]: tasks/domains.py, e.g.
                 CelebA's 32 attribute domains, the planted domains of digits_domains)
                 w = one_hot(d_hat) in eq. 5.12; one optimizer step of the client optimizer (SGD / SAM / ASAM,
                 as every algorithm) on
                     task loss(f_w(x; w)) + domain_loss_weight * CE(g_student(x), d_hat)        (eq. 5.11)
                 i.e. the student is trained on the teacher's pseudo-labels in the same local steps as the
                 network (one optimizer over both: a choice; domain_loss_weight=0 leaves the student untrained)
  server         FedAvg (any server optimizer, config.server) over all trained parameters: w_a, V, W,
                 lambda, and the student (the thesis' phi = sum N_k phi_k / N)
                 A <- eq. 5.14 from the new nodes:  h_ij = 1 / ||V_i - V_j||_2,
                      A_ii = beta,  A_ij = (1 - beta) h_ij / sum_{d != i} h_id           (adjacency_update='distance')
                      or A kept at its initial value                                    (adjacency_update='fixed':
                                                                                         Table 5.9's U / H rows)
                 teacher <- student every `teacher_period` = T rounds (after rounds T, 2T, ...; T is not given
                 in the thesis: default 5)
  test time      w = the student's soft probabilities (soft=True, the thesis' final setting) or the one-hot of
                 its argmax (soft=False); the other one is evaluated too, as eval model 'hard' / 'soft'
                 (metrics 'hard/test_accuracy' ...). With oracle domains the student is trained on the oracle
                 labels and predicts the test images' domains (the model is never given a test domain).

Choices and their alternatives:
  adjacency_init   'identity' (default: the Table 5.11 setup; the thesis TEXT says a uniform init is used after
                   Table 5.10: the two disagree), 'uniform' (A_ii = beta, A_ij = (1 - beta)/(D - 1)), 'random'
                   (A_ii = beta, off-diagonal U(0, 1) rows normalised to 1 - beta; keyed by the run's seed),
                   'hamming' (Table 5.9's H: h_ij = 1/Hamming(code_i, code_j), the codes are the domain ids'
                   binary digits, as CelebA's attribute domains d = sum_b attr_b 2^b; normalised as eq. 5.14)
  adjacency_nodes  'raw' (default): the distances of eq. 5.14 between the nodes V ("the parameters' space");
                   'refined': between the GCN outputs V_hat = sigma(A V W)
  adjacency_scope  'layer' (default): one A per domain-specific layer from its own nodes (the graph G^l);
                   'model': one A from all layers' nodes concatenated, shared by every layer
  beta             0.5 (the thesis' value); D = 1 gives A = [[1]]
  soft             True (default) / False
  domains          'discovered' (default) / 'oracle' / 'kmeans' (Table 5.10's "K-means" rows: k-means on models
                   trained independently on each client, one domain per client). With 'kmeans' the trainer runs
                   the pass before training (training/trainers.make_trainer -> grouping/domains.py: pre-training
                   as config.grouping says, classifier weights + PCA, k-means with k = model_kwargs.num_domains)
                   and writes each client's cluster into the training labels' domain column; the rounds then
                   read that column exactly as with 'oracle' (the declared need 'client_domains')

Not supported (ConfigError): MAN's activation term (man.zeta > 0) and client.microbatches > 1 (FedCG's loss is
its own: the task's loss plus the student's).

Communication (core/contract.py comm_down/comm_up, in models of the full params, which hold A and the
student): down = 1 + |teacher| / |params| (the teacher is sent with the model), up = 1 - |A| / |params| (the
clients send back everything they train, not A).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.hparams import Choice, Flag, Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast
from fedjax_flat.errors import ConfigError
from fedjax_flat.tasks.base import cross_entropy, get_task
from fedjax_flat.tasks.domains import purity  # noqa: F401  (domain discovery's score; fedcg.purity for callers)

DOMAINS = ('discovered', 'oracle', 'kmeans')
GIVEN_DOMAINS = ('oracle', 'kmeans')   # the domain column of the labels: the data's own, or k-means clusters
ADJACENCY_INITS = ('identity', 'uniform', 'random', 'hamming')


# --- The adjacency (eq. 5.14) and its initialisations: pure functions of small matrices. ---

def normalise(h, beta):
  """A from similarities h [D, D] (diagonal ignored): A_ii = beta, A_ij = (1 - beta) h_ij / sum_{d != i} h_id."""
  d = h.shape[0]
  if d == 1:
    return jnp.ones((1, 1), jnp.float32)
  off = 1.0 - jnp.eye(d, dtype=jnp.float32)
  h = h.astype(jnp.float32) * off
  rows = jnp.sum(h, axis=1, keepdims=True)
  return beta * jnp.eye(d, dtype=jnp.float32) + (1.0 - beta) * h / jnp.maximum(rows, 1e-30)


def distance_adjacency(nodes, beta):
  """Eq. 5.14 on nodes V [D, q]: h_ij = 1 / ||V_i - V_j||_2."""
  v = nodes.astype(jnp.float32)
  sq = jnp.sum(jnp.square(v[:, None, :] - v[None, :, :]), axis=-1)
  dist = jnp.sqrt(jnp.maximum(sq, 0.0))
  return normalise(1.0 / jnp.maximum(dist, 1e-12), beta)


def uniform_adjacency(d, beta):
  return normalise(jnp.ones((d, d), jnp.float32), beta)


def hamming_distances(d):
  """Hamming distances between the binary codes of domain ids 0..d-1 (numpy, [d, d])."""
  bits = max(1, int(np.ceil(np.log2(max(d, 2)))))
  codes = (np.arange(d)[:, None] >> np.arange(bits)[None, :]) & 1
  return np.sum(codes[:, None, :] != codes[None, :, :], axis=-1)


def hamming_adjacency(d, beta):
  ham = hamming_distances(d).astype(np.float64)
  h = np.where(ham > 0, 1.0 / np.maximum(ham, 1.0), 0.0)
  return normalise(jnp.asarray(h, jnp.float32), beta)


def random_adjacency(key, d, beta):
  return normalise(jax.random.uniform(key, (d, d), jnp.float32), beta)


def initial_adjacency(kind, d, beta, key):
  if kind == 'identity':
    return jnp.eye(d, dtype=jnp.float32)
  if kind == 'uniform':
    return uniform_adjacency(d, beta)
  if kind == 'hamming':
    return hamming_adjacency(d, beta)
  if kind == 'random':
    return random_adjacency(key, d, beta)
  raise ValueError(f'adjacency_init={kind!r}; allowed: {list(ADJACENCY_INITS)}')


def adjacency_of(node_sets, beta, scope):
  """{layer: V [D, q]} -> {layer: A}: per layer, or one A from all layers' nodes (scope 'model')."""
  if scope == 'model':
    a = distance_adjacency(jnp.concatenate([node_sets[k] for k in sorted(node_sets)], axis=1), beta)
    return {k: a for k in node_sets}
  return {k: distance_adjacency(v, beta) for k, v in node_sets.items()}


def fedcg_algorithm(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  model = ctx.model
  d = int(model.num_domains)
  task = get_task(ctx.task)
  tx, server_tx = ctx.client_tx, ctx.server_tx
  oracle = hp['domains'] in GIVEN_DOMAINS       # read from the labels' domain column
  beta, period = float(hp['beta']), int(hp['teacher_period'])
  dom_w = float(hp['domain_loss_weight'])
  soft = bool(hp['soft'])
  sample_x = jnp.zeros((1,) + tuple(model.input_shape), jnp.float32)

  def node_sets(params):
    return model.refined(params) if hp['adjacency_nodes'] == 'refined' else model.nodes(params)

  def server_init(params, rng):
    k_teacher, k_adj = jax.random.split(jax.random.fold_in(rng, 0xFC6))
    a0 = initial_adjacency(hp['adjacency_init'], d, beta, k_adj)
    # one buffer per layer (a shared one would be donated twice by the round program)
    params = {**params, 'adjacency': {k: jnp.array(a0, copy=True) for k in model.layer_names},
              'soft': jnp.float32(soft)}
    teacher = model.init(k_teacher, sample_x)['net']['student']   # randomly initialised, independent of phi
    return {'params': params, 'opt_state': server_tx.init(params), 'teacher': teacher}

  broadcast = fedavg_broadcast(ctx.hparams_fn, shared=('teacher',))   # FedAvg's, plus the teacher

  def domains_of(bcast, batch):
    if oracle:
      return batch['y'][..., 1].astype(jnp.int32)
    return jnp.argmax(model.classifier_apply(bcast['teacher'], batch['x']), axis=-1)

  def client_init(bcast, client_state, rng):
    del client_state, rng
    net = bcast['params']['net']
    return local_lib.LocalState(net, tx.init(net), net)

  def client_step(bcast, local, batch, rng):
    d_hat = jax.lax.stop_gradient(domains_of(bcast, batch))
    w = jax.nn.one_hot(d_hat, d, dtype=jnp.float32)
    fixed = {k: v for k, v in bcast['params'].items() if k != 'net'}

    def loss_fn(net, b, r):
      logits, dl = model.apply_train({**fixed, 'net': net}, b['x'], w, rng=r)
      mask = b['mask'].astype(jnp.float32)
      loss_sum, count = task.loss_sums(logits, b['y'], mask)
      dom = jnp.sum(cross_entropy(dl, d_hat) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
      return loss_sum / jnp.maximum(count, 1.0) + dom_w * dom, (loss_sum, count)

    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, client_state):
    del bcast
    return {'weighted': {'delta': tmap(lambda a, b: a - b, local.init_params, local.params)},
            'uniform': {}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del phase
    params = state['params']
    pseudo = {**tmap(jnp.zeros_like, params), 'net': agg['weighted']['delta']}
    updates, opt_state = server_tx.update(pseudo, state['opt_state'], params)
    new = optax.apply_updates(params, updates)
    new = {**new, 'adjacency': params['adjacency'], 'soft': params['soft']}   # never optimized
    if hp['adjacency_update'] == 'distance':
      new['adjacency'] = adjacency_of(node_sets(new), beta, hp['adjacency_scope'])
    swap = (jnp.asarray(round_idx) + 1) % period == 0
    teacher = tmap(lambda s, t: jnp.where(swap, s, t), new['net']['student'], state['teacher'])
    return {**state, 'params': new, 'opt_state': opt_state, 'teacher': teacher}

  def eval_models(state):
    params = state['params']
    other = {**params, 'soft': 1.0 - params['soft']}
    return {'global': (params, jnp.bool_(True)), 'soft' if not soft else 'hard': (other, jnp.bool_(True))}

  sizes = jax.eval_shape(model.init, jax.random.key(0), sample_x)
  n_all = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(sizes))
  n_teacher = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(sizes['net']['student']))
  n_adj = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(sizes['adjacency']))
  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, eval_models, comm_down=1.0 + n_teacher / n_all,
                            comm_up=1.0 - (n_adj + 1) / n_all)


def _check(cfg, hp):
  if cfg.model != 'fedcg_net':
    raise ConfigError('model', cfg.model, "fedcg needs the FedCG network: set model='fedcg_net' "
                      '(models/fedcg.py: domain-specific layers, GCN, domain classifier)')
  if float(cfg.man.zeta) > 0:
    raise ConfigError('man.zeta', cfg.man.zeta, 'fedcg builds its own loss (task + domain classifier) without '
                      "MAN's activation term: set man.zeta=0")
  if int(cfg.client.get('microbatches', 1)) > 1:
    raise ConfigError('client.microbatches', cfg.client.microbatches, 'fedcg steps on whole batches: set 1')
  if cfg.model_kwargs.get('domain_layers', 'last') == 'none':
    raise ConfigError('model_kwargs.domain_layers', 'none', "fedcg needs domain-specific layers: 'last' or 'all' "
                      "('none' is the baselines' plain network)")
  if hp['domains'] in GIVEN_DOMAINS and cfg.dataset not in ('digits_domains', 'celeba'):
    raise ConfigError('algo.domains', hp['domains'], f'dataset {cfg.dataset!r} gives no domain labels: '
                      f"{hp['domains']} domains need labels [class, domain] (datasets 'digits_domains', 'celeba'); "
                      "use 'discovered'")


def _check_data(cfg, hp, data):
  d = int(cfg.model_kwargs.get('num_domains', 4))
  if hp['domains'] in GIVEN_DOMAINS:
    y = np.asarray(data.y)
    if y.ndim != 2 or y.shape[1] < 2:
      raise ConfigError('algo.domains', hp['domains'], 'the data carry no domain column (labels [class, domain])')
    top = int(y[:, 1].max()) + 1 if len(y) else 0
    # 'kmeans': the column is rewritten with clusters < num_domains before training (the raw data may hold more)
    if hp['domains'] == 'oracle' and top > d:
      raise ConfigError('model_kwargs.num_domains', d, f'the data have oracle domains up to {top - 1}: set '
                        f'model_kwargs.num_domains >= {top}')


@register('fedcg', hparams={
    'domains': Choice('discovered', allowed=DOMAINS),
    'teacher_period': Integer(5, lo=1, note=' (rounds between teacher <- student)'),
    'domain_loss_weight': Number(1.0, lo=0),
    'soft': Flag(True),
    'beta': Number(0.5, lo=0, hi=1),
    'adjacency_init': Choice('identity', allowed=ADJACENCY_INITS),
    'adjacency_update': Choice('distance', allowed=('distance', 'fixed')),
    'adjacency_nodes': Choice('raw', allowed=('raw', 'refined')),
    'adjacency_scope': Choice('layer', allowed=('layer', 'model')),
}, needs=('client_domains', 'domain_assignments'), check=_check, check_data=_check_data, upload='delta')
def fedcg(ctx) -> FederatedAlgorithm:
  """FedCG (thesis 5.4): domain-specific residual layers connected by a GCN, teacher/student domain discovery."""
  return fedcg_algorithm(ctx)


def domain_assignments(model, state, x, batch: int = 1024) -> dict:
  """The domains FedCG assigns to images x: 'student' (the server's domain classifier, what test-time weighting
  reads) and 'teacher' (what clients trained with in the last round), each the argmax, numpy [N]."""
  fn = jax.jit(lambda p, a: jnp.argmax(model.classifier_apply(p, a), axis=-1))
  nets = {'student': state['params']['net']['student'], 'teacher': state['teacher']}
  return {k: np.concatenate([np.asarray(fn(p, jnp.asarray(x[i:i + batch], jnp.float32)))
                             for i in range(0, len(x), batch)]) if len(x) else np.zeros((0,), np.int64)
          for k, p in nets.items()}
