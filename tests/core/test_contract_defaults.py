"""The contract's FedAvg defaults (core/contract.py): eval_models (the global model, when none is given), the
server state and the broadcast of FedAvg, against their definitions."""
import jax.numpy as jnp
import numpy as np
import optax

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
