r"""The FedJAX 0.0.17 peer: a round as a FedJAX user writes it, run in the side venv `.venv-fedjax`.

  bash benchmarks/speed/peers/make_fedjax_venv.sh                 creates .venv-fedjax (jax 0.4.23, FedJAX 0.0.17)
  .venv-fedjax/bin/python -m benchmarks.speed.peers.fedjax_peer --check
  .venv-fedjax/bin/python -m benchmarks.speed.peers.fedjax_peer --serve     (JSON lines: peers/protocol.py)
(from the repository root)

FedJAX's documented pattern: `fedjax.InMemoryFederatedData` of the clients' arrays, a haiku model through
`fedjax.create_model_from_haiku`, `fedjax.model_grad`, client optimizer `create_optimizer_from_optax`
(weight decay then SGD, like torch's SGD), server SGD lr 1 (plain FedAvg),
`fedjax.algorithms.fed_avg.federated_averaging` with `ShuffleRepeatBatchHParams(batch_size, num_epochs)`, and
each round `UniformGetClientSampler.sample()` -> `algorithm.apply(state, clients)`. `apply` runs its default
`for_each_client` backend: a Python loop over clients and batches, one jitted call per batch (a new
compilation per distinct batch shape: the warm-up visits every client so that every shape is compiled before
timing). FedJAX has no SAM: a FedJAX user writes it as a `grad_fn` (the gradient at w + rho g/||g||), which
is what the 'sam' spec does. The models are ours (models/cnn.py) written in haiku. Needs no fedjax_flat.
"""
from __future__ import annotations

import sys

from benchmarks.speed.peers import protocol


def _imports():
  global jax, jnp, hk, optax, fedjax, np
  import numpy as np
  import jax
  import jax.numpy as jnp
  import haiku as hk
  import optax
  import fedjax


def _forward(model, num_classes, hidden, dropout=True):
  """Our models in haiku (NHWC), logits out. Only pfl_cnn has dropout (as FedJAX's own EMNIST CNN writes it:
  `hk.dropout` with the rng `apply_for_train` gets, when is_train)."""
  pool = lambda v: hk.max_pool(v, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding='VALID')
  glorot = hk.initializers.VarianceScaling(1.0, 'fan_avg', 'uniform')

  def drop(rate, v, is_train):
    return hk.dropout(hk.next_rng_key(), rate, v) if (dropout and is_train) else v

  def fwd(batch, is_train=True):
    x = batch['x']
    if model == 'pfl_cnn':     # pfl-research's simple_cnn (models/cnn.py PflCNN)
      x = jax.nn.relu(hk.Conv2D(32, 3, padding='VALID', w_init=glorot)(x))
      x = pool(jax.nn.relu(hk.Conv2D(64, 3, padding='VALID', w_init=glorot)(x)))
      x = hk.Flatten()(drop(0.25, x, is_train))
      x = drop(0.5, jax.nn.relu(hk.Linear(128, w_init=glorot)(x)), is_train)
      return hk.Linear(num_classes, w_init=glorot)(x)
    if model == 'cifar_cnn':
      x = pool(jax.nn.relu(hk.Conv2D(64, 5, padding='VALID')(x)))
      x = pool(jax.nn.relu(hk.Conv2D(64, 5, padding='VALID')(x)))
      x = hk.Flatten()(x)
      x = jax.nn.relu(hk.Linear(384)(x))
      x = jax.nn.relu(hk.Linear(192)(x))
    elif model == 'digits_cnn':
      x = jax.nn.relu(hk.Conv2D(32, 3, padding='SAME')(x))
      x = pool(jax.nn.relu(hk.Conv2D(32, 3, padding='SAME')(x)))
      x = jax.nn.relu(hk.Linear(128)(hk.Flatten()(x)))
    elif model == 'mlp':
      x = hk.Flatten()(x)
      for h in hidden:
        x = jax.nn.relu(hk.Linear(h)(x))
    else:
      raise protocol.PeerError(f'fedjax peer: unknown model {model!r}')
    return hk.Linear(num_classes)(x)
  return hk.transform(fwd)


def _sam_grad(grad_fn, rho):
  """SAM as a FedJAX user writes it: the gradient at the ascent point w + rho g / ||g||."""
  def sam(params, batch, rng):
    g = grad_fn(params, batch, rng)
    scale = rho / (fedjax.tree_util.tree_l2_norm(g) + 1e-12)
    return grad_fn(jax.tree_util.tree_map(lambda p, d: p + scale * d, params, g), batch, rng)
  return sam


class FedAvgProblem:
  def __init__(self, spec):
    clients = protocol.read_problem(spec['data'])
    fd = fedjax.InMemoryFederatedData({f'{k}'.encode(): {'x': x, 'y': y} for k, (x, y) in enumerate(clients)})
    sample = {'x': clients[0][0][:1], 'y': clients[0][1][:1]}
    if spec.get('weighting', 'examples') == 'uniform' and len({len(y) for _, y in clients}) > 1:
      # fed_avg weights each client by its examples; with equal sizes that is the uniform mean.
      raise protocol.PeerError("fedjax peer: weighting='uniform' needs clients of equal sizes")
    model = fedjax.create_model_from_haiku(
        _forward(spec['model'], int(spec['num_classes']), tuple(spec.get('hidden', (32,))),
                 dropout=bool(spec.get('dropout', True))), sample,
        lambda batch, preds: fedjax.metrics.unreduced_cross_entropy_loss(batch['y'], preds),
        eval_metrics={'accuracy': fedjax.metrics.Accuracy(), 'loss': fedjax.metrics.CrossEntropyLoss()},
        train_kwargs={'is_train': True}, eval_kwargs={'is_train': False})
    self.model = model
    grad_fn = fedjax.model_grad(model)
    if spec['optimizer'] == 'asam':
      raise protocol.PeerError('fedjax peer: no ASAM (FedJAX has none; only the torch peer writes it)')
    if spec['optimizer'] == 'sam':
      grad_fn = _sam_grad(grad_fn, float(spec['rho']))
    client_opt = fedjax.optimizers.create_optimizer_from_optax(
        optax.chain(optax.add_decayed_weights(float(spec['weight_decay'])), optax.sgd(float(spec['lr']))))
    self.algorithm = fedjax.algorithms.fed_avg.federated_averaging(
        grad_fn, client_opt, fedjax.optimizers.sgd(1.0),
        fedjax.ShuffleRepeatBatchHParams(batch_size=int(spec['batch_size']), num_epochs=int(spec['epochs'])))
    self.state = self.algorithm.init(model.init(jax.random.PRNGKey(int(spec['seed']))))
    self.fd = fd
    # False where every client has the same size (one batch shape: the first round compiled it), e.g. the
    # pfl protocol's 1000 users x 50: visiting all of them would cost 20 rounds of set-up.
    self.warmup_all_clients = bool(spec.get('warmup_all_clients', True))
    self.sampler = fedjax.client_samplers.UniformGetClientSampler(
        fd, min(int(spec['clients_per_round']), fd.num_clients()), int(spec['seed']))

  def round(self):
    self.state, _ = self.algorithm.apply(self.state, self.sampler.sample())

  def warm_up(self):
    """One apply over all clients: compiles every batch shape the timed rounds can meet."""
    if not self.warmup_all_clients:
      return
    rng = jax.random.PRNGKey(0)
    everyone = [(cid, cds, rng) for cid, cds in self.fd.clients()]
    state, _ = self.algorithm.apply(self.state, everyone)
    jax.block_until_ready(state.params)

  def sync(self):
    jax.block_until_ready(self.state.params)

  def evaluate(self, x, y, batch_size: int):
    """(accuracy, loss) of the server model as a FedJAX user evaluates: `fedjax.evaluate_model` over the test
    set's `ClientDataset.batch`."""
    if getattr(self, '_test', None) is None or self._test[0] is not x:
      self._test = (x, fedjax.ClientDataset({'x': x, 'y': y}))
    m = fedjax.evaluate_model(self.model, self.state.params,
                              self._test[1].batch(fedjax.BatchHParams(batch_size=batch_size)))
    return float(m['accuracy']), float(m['loss'])

  def peak_mem(self):
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != 'cpu' else None
    return (stats or {}).get('peak_bytes_in_use', protocol.peak_rss_bytes())


def _info():
  import importlib.metadata as md
  return {'stack': 'fedjax', 'fedjax': md.version('fedjax'), 'jax': jax.__version__,
          'haiku': md.version('dm-haiku'), 'backend': jax.default_backend()}


if __name__ == '__main__':
  _imports()
  server = protocol.ProblemServer(FedAvgProblem, _info)
  if protocol.whole_run_arg(sys.argv):
    protocol.whole_run(FedAvgProblem, protocol.whole_run_arg(sys.argv))
  elif '--serve' in sys.argv:
    server.serve()
  elif '--check' in sys.argv:
    server.check(('cifar_cnn', 'digits_cnn', 'mlp', 'pfl_cnn'))
  else:
    print(__doc__)
