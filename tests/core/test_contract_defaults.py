"""The contract's FedAvg defaults (core/contract.py): eval_models (the global model, when none is given), the
server state and the broadcast of FedAvg, against their definitions, with an algorithm's own entries, and filled in
where an algorithm leaves them out (with_defaults)."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init, global_model


def test_fedavg_defaults():
  params = {'w': jnp.arange(3.0)}
  tx = optax.sgd(0.1, momentum=0.9)
  state = fedavg_server_init(tx)(params, None)
  assert set(state) == {'params', 'opt_state'} and state['params'] is params
  np.testing.assert_array_equal(state['opt_state'][0].trace['w'], np.zeros(3))   # optax's own init
  bcast = fedavg_broadcast(lambda r: {'lr': 0.5 / (r + 1), 'rho': 0.0})(state, 3, phase=0)
  assert bcast['params'] is params and bcast['hparams'] == {'lr': 0.125, 'rho': 0.0}
  alg = FederatedAlgorithm('x', fedavg_server_init(tx), fedavg_broadcast(lambda r: {}), None, None, None, None)
  assert alg.eval_models is global_model
  (p, active), = alg.eval_models(state).values()
  assert list(alg.eval_models(state)) == ['global'] and p is params and bool(active)
  own = lambda s: {'global': (s['params'], jnp.bool_(False))}   # noqa: E731
  assert alg.replace(eval_models=own).eval_models is own


def test_extra_server_entries_and_shared_broadcast_entries():
  params = {'w': jnp.arange(3.0)}
  tx = optax.sgd(0.1)
  init = fedavg_server_init(tx, lambda p: {'c': p['w'] * 0.0 + 2.0})
  state = init(params, None)
  assert set(state) == {'params', 'opt_state', 'c'}
  np.testing.assert_array_equal(state['c'], [2.0, 2.0, 2.0])
  bcast = fedavg_broadcast(lambda r: {'lr': float(r)}, shared=('c',))(state, 4)
  assert set(bcast) == {'params', 'hparams', 'c'} and bcast['c'] is state['c'] and bcast['hparams'] == {'lr': 4.0}


def test_server_init_and_broadcast_left_out_are_filled_with_fedavgs():
  f = lambda *a, **k: None   # noqa: E731
  alg = FederatedAlgorithm('x', client_init=f, client_step=f, client_final=f, server_update=f)
  assert alg.server_init is None and alg.broadcast is None
  params = {'w': jnp.arange(3.0)}
  tx = optax.sgd(0.1, momentum=0.9)
  full = alg.with_defaults(tx, lambda r: {'lr': 0.5})
  state = full.server_init(params, None)
  assert set(state) == {'params', 'opt_state'} and state['params'] is params
  np.testing.assert_array_equal(state['opt_state'][0].trace['w'], np.zeros(3))
  assert full.broadcast(state, 1) == {'params': params, 'hparams': {'lr': 0.5}}
  own = fedavg_broadcast(lambda r: {}, shared=('c',))
  kept = alg.replace(broadcast=own).with_defaults(tx, lambda r: {})
  assert kept.broadcast is own and kept.server_init is not None
  assert full.with_defaults(None, None) is full         # nothing left to fill


def test_a_missing_client_function_is_refused_in_one_line():
  f = lambda *a, **k: None   # noqa: E731
  with pytest.raises(TypeError, match="'x': missing client_step, server_update"):
    FederatedAlgorithm('x', client_init=f, client_final=f)
