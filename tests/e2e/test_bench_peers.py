"""The benchmark peers' plumbing (benchmarks/speed/peers/protocol.py) and the torch reference round against ours.

The peers are optional: the torch case runs where torch is installed (the `peers` extra); nothing here needs
the FedJAX side venv.
"""
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.speed.peers import protocol


def test_problem_file_round_trip_and_rejects_bad_files(tmp_path):
  rng = np.random.default_rng(0)
  clients = [(rng.normal(size=(n, 4, 4, 1)), rng.integers(0, 3, n)) for n in (3, 1, 5)]
  path = str(tmp_path / 'p.npz')
  protocol.write_problem(path, clients)
  back = protocol.read_problem(path)
  assert len(back) == 3
  for (x, y), (bx, by) in zip(clients, back):
    np.testing.assert_array_equal(bx, x.astype(np.float32))
    np.testing.assert_array_equal(by, y)
  np.savez(tmp_path / 'bad.npz', x=np.zeros((4, 2), np.float32), y=np.zeros(4, np.int32),
           offsets=np.array([0, 3, 2, 4]))
  with pytest.raises(protocol.PeerError, match='not a peer problem file'):
    protocol.read_problem(str(tmp_path / 'bad.npz'))
  np.savez(tmp_path / 'obj.npz', x=np.array([object()]), y=np.zeros(1, np.int32), offsets=np.array([0, 1]))
  with pytest.raises(ValueError):   # pickled objects are refused (allow_pickle=False)
    protocol.read_problem(str(tmp_path / 'obj.npz'))


def test_peer_subprocess_protocol(tmp_path):
  # A peer module of its own, found in its working directory; benchmarks/ through PYTHONPATH (tests/conftest.py).
  (tmp_path / 'fake_peer.py').write_text(textwrap.dedent('''
      from benchmarks.speed.peers import protocol
      seen = {}
      def setup(name, spec):
        print('library chatter on stdout must not break the protocol')
        seen[name] = spec['lr']
        return {'first_round_s': 0.5, 'warmup_s': 0.25}
      def run(name, rounds):
        if name not in seen:
          raise KeyError(name)
        return {'s': seen[name] * rounds}
      protocol.serve(setup, run, lambda: {'stack': 'fake'})
  '''))
  spec = dict(model='mlp', num_classes=3, data='x.npz', clients_per_round=2, batch_size=4, epochs=1, lr=0.25,
              weight_decay=0.0, optimizer='sgd', rho=0.05, seed=0)
  with protocol.Peer(sys.executable, 'fake_peer', cwd=str(tmp_path)) as peer:
    assert peer.call(cmd='info')['stack'] == 'fake'
    assert peer.setup('a', spec)['first_round_s'] == 0.5
    assert peer.run('a', 4)['s'] == 1.0
    with pytest.raises(protocol.PeerError, match='KeyError'):
      peer.run('missing', 1)
    assert peer.run('a', 2)['s'] == 0.5          # still alive after an error
    with pytest.raises(protocol.PeerError, match='optimizer'):
      peer.setup('b', {**spec, 'optimizer': 'adam'})
  assert peer.proc.poll() == 0


@pytest.mark.parametrize('opt', ['sgd', 'sam'])
def test_torch_reference_round_equals_ours(tmp_path, opt):
  """Full-batch local training (order-free): the torch peer's FedAvg round == the engine's, same weights."""
  torch = pytest.importorskip('torch')
  from benchmarks.speed.peers import torch_peer
  from fedjax_flat.algorithms import registry
  from fedjax_flat.core import engine
  from fedjax_flat.data import batching
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.models.registry import get_model
  from fedjax_flat.config.default_config import default_config

  sizes, shape, b = [6, 9], (3, 2, 1), 9          # one channel: NHWC and NCHW flatten alike
  data = synthetic(2, sizes, input_shape=shape, num_classes=3, seed=3)
  c = default_config()
  c.model, c.client.lr, c.client.weight_decay, c.client.batch_size = 'mlp', 0.3, 1e-2, b
  c.client.local_epochs, c.client.optimizer, c.client.rho = 2, opt, 0.5
  model = get_model('mlp', 3, shape, hidden=(5,))
  params = model.init(jax.random.key(0), jnp.zeros((1,) + shape))
  alg = registry.build_algorithm(c, model)
  s = batching.padded_num_steps(data.client_sizes(), b, epochs=2)
  rb = batching.make_round_batches(data, [0, 1], round_idx=0, seed=0, batch_size=b, num_steps=s, epochs=2)
  fn = engine.make_round_fn(alg, chunk=1, donate=False)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(1), k))(jnp.arange(2))
  ours = fn(alg.server_init(params, None), rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)[0]

  path = str(tmp_path / 'p.npz')
  protocol.write_problem(path, [(data.x[data.client_indices(k)], data.y[data.client_indices(k)]) for k in (0, 1)])
  spec = dict(model='mlp', num_classes=3, hidden=[5], data=path, clients_per_round=2, batch_size=b, epochs=2,
              lr=0.3, weight_decay=1e-2, optimizer=opt, rho=0.5, seed=0)
  peer = torch_peer.FedAvgRound(spec)
  p = params
  layers = [p['Dense_0'], p['Dense_1']]
  sd = {}
  for name, layer in zip(['hidden.0', 'out'], layers):
    sd[f'{name}.weight'] = torch.from_numpy(np.asarray(layer['kernel']).T.copy())
    sd[f'{name}.bias'] = torch.from_numpy(np.asarray(layer['bias']).copy())
  peer.server = sd
  peer.round()
  got = ours['params']
  for name, key in zip(['hidden.0', 'out'], ['Dense_0', 'Dense_1']):
    np.testing.assert_allclose(peer.server[f'{name}.weight'].numpy().T, got[key]['kernel'], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(peer.server[f'{name}.bias'].numpy(), got[key]['bias'], rtol=2e-5, atol=2e-6)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_torch_pfl_cnn_round_equals_ours(tmp_path):
  """pfl-research's protocol on both stacks: the pfl CNN (dropout off: the one random draw the two stacks
  cannot share), unweighted averaging over clients of unequal sizes, full-batch steps (order-free), 2 epochs.
  The torch peer's round (CHW flatten, its own layout) == the engine's, from the same weights."""
  torch = pytest.importorskip('torch')
  from benchmarks.speed.peers import torch_peer
  from fedjax_flat.algorithms import registry
  from fedjax_flat.core import engine
  from fedjax_flat.data import batching
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.models.registry import get_model
  from fedjax_flat.config.default_config import default_config

  sizes, shape, b = [6, 9], (8, 8, 3), 9          # 8 -> 6 -> 4 -> pool 2: fc128 sees 2*2*64
  data = synthetic(2, sizes, input_shape=shape, num_classes=10, seed=3)
  c = default_config()
  c.model, c.client.lr, c.client.weight_decay, c.client.batch_size = 'pfl_cnn', 0.1, 0.0, b
  c.client.local_epochs, c.server.weighting = 2, 'uniform'
  model = get_model('pfl_cnn', 10, shape, dropout=False)
  params = model.init(jax.random.key(0), jnp.zeros((1,) + shape))
  params = jax.tree_util.tree_map(   # non-zero biases, so that their layout is checked too
      lambda a: a + 0.05 * jax.random.normal(jax.random.key(4), a.shape), params)
  alg = registry.build_algorithm(c, model)
  s = batching.padded_num_steps(data.client_sizes(), b, epochs=2)
  rb = batching.make_round_batches(data, [0, 1], round_idx=0, seed=0, batch_size=b, num_steps=s, epochs=2)
  fn = engine.make_round_fn(alg, chunk=1, donate=False)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(1), k))(jnp.arange(2))
  ours = fn(alg.server_init(params, None), rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)[0]

  path = str(tmp_path / 'p.npz')
  protocol.write_problem(path, [(data.x[data.client_indices(k)], data.y[data.client_indices(k)]) for k in (0, 1)])
  spec = dict(model='pfl_cnn', num_classes=10, data=path, clients_per_round=2, batch_size=b, epochs=2, lr=0.1,
              weight_decay=0.0, optimizer='sgd', rho=0.0, seed=0, weighting='uniform', dropout=False)
  peer = torch_peer.FedAvgRound(spec)
  hw, ch = (2, 2), 64

  def to_torch(p):
    t = lambda a: torch.from_numpy(np.array(a, dtype=np.float32, copy=True))  # noqa: E731
    k = lambda name: np.asarray(p[name]['kernel'])  # noqa: E731
    fc1 = k('Dense_0').reshape(hw + (ch, 128)).transpose(3, 2, 0, 1).reshape(128, -1)   # HWC rows -> CHW
    return {'conv1.weight': t(k('Conv_0').transpose(3, 2, 0, 1)), 'conv2.weight': t(k('Conv_1').transpose(3, 2, 0, 1)),
            'fc1.weight': t(fc1), 'fc2.weight': t(k('Dense_1').T),
            **{f'{tn}.bias': t(np.asarray(p[fn]['bias'])) for tn, fn in
               (('conv1', 'Conv_0'), ('conv2', 'Conv_1'), ('fc1', 'Dense_0'), ('fc2', 'Dense_1'))}}

  assert set(to_torch(params)) == set(peer.net.state_dict())
  peer.server = to_torch(params)
  peer.round()
  want = to_torch(ours['params'])
  for name, v in peer.server.items():
    np.testing.assert_allclose(v.numpy(), want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
  # Unweighted: the examples-weighted round of the same clients is a different model.
  peer.server, peer.spec = to_torch(params), {**spec, 'weighting': 'examples'}
  peer.round()
  assert not np.allclose(peer.server['fc2.weight'].numpy(), want['fc2.weight'].numpy(), atol=1e-5)
