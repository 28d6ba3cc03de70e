"""FedRep (Collins et al., ICML 2021): a shared body (representation) and a local head per client.

  server sends the body phi^t
  client k (its own head h_k; the global initial head on its first visit):
    head passes: h_k <- head_epochs passes of the client optimizer over its round batches, phi^t frozen
    body pass:   phi_k <- one pass of the client optimizer from phi^t, h_k frozen
  phi^{t+1} = ServerOpt(phi^t, sum_k (N_k / N) (phi^t - phi_k))      (the heads are never aggregated)

A pass is one run over the round's local batches (client.local_epochs epochs; FedSoup's setting has
local_epochs = 1, so a pass is an epoch, as the release's FedRep (PFLlib `clientrep.py`: plocal_epochs head
epochs, then local_epochs body epochs)). Each head pass is one phase of the round (num_phases =
head_epochs + 1) with the same clients: nothing crosses the network in a head phase (the server state is left
alone), so the communication is one body down and one body up per round (comm_down / comm_up are per phase).
The head lives in the client state (algorithms/wrappers/local_norm.with_local_norm with the model's declared
head, models/partition.py), and the personal model of client k is phi^t with h_k.

head_epochs = 0 is FedAvg on the body with every client keeping its (untrained) head.
"""
from __future__ import annotations

import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import check_head, tmap, tree_sub
from fedjax_flat.algorithms.hparams import Integer
from fedjax_flat.algorithms.registry import register
from fedjax_flat.algorithms.wrappers import local_norm
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.models import partition

HPARAMS = {'head_epochs': Integer(1, lo=0, note=' (head passes before the body pass, each a phase)')}


def fedrep(model, loss_fn, client_tx: optax.GradientTransformation, hparams_fn,
           server_tx: optax.GradientTransformation, *, head_epochs: int, name: str) -> FederatedAlgorithm:
  """name: the algorithm's (its personal model is reported under it)."""
  tx = client_tx
  num_phases = int(head_epochs) + 1
  mask_of = lambda p: partition.head_mask(model, p)  # noqa: E731   (True = head)

  def is_head_phase(phase):
    return phase < head_epochs

  server_init = fedavg_server_init(server_tx)
  broadcast = fedavg_broadcast(hparams_fn)

  def client_init(bcast, client_state, rng, phase=0):
    del client_state, rng, phase
    return local_lib.LocalState(bcast['params'], tx.init(bcast['params']), bcast['params'])

  def client_step(bcast, local, batch, rng, phase=0):
    head = mask_of(local.params)
    trainable = head if is_head_phase(phase) else tmap(lambda m: not m, head)
    return local_lib.masked_step(local, batch, rng, loss_fn=loss_fn, tx=tx, trainable=trainable,
                                 hparams=bcast['hparams'])

  def client_final(bcast, local, client_state, phase=0):
    del bcast, phase
    # The wrapper zeroes the head leaves of this upload and keeps the client's head (init - delta).
    return {'weighted': {'delta': tree_sub(local.init_params, local.params)}, 'uniform': {}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx
    if is_head_phase(phase):      # a head phase is local: the server learns nothing from it
      return state
    updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}

  inner = FederatedAlgorithm(name + '.inner', server_init, broadcast, client_init, client_step, client_final,
                             server_update, num_phases=num_phases,
                             comm_down=1.0 / num_phases, comm_up=1.0 / num_phases)
  return local_norm.with_local_norm(inner, name=name, select=partition.is_head_path(partition.require_head(model)))


@register('fedrep', hparams=HPARAMS, needs=('client_state',), check=check_head)
def _fedrep_builder(ctx) -> FederatedAlgorithm:
  """FedRep: local heads trained head_epochs passes first, then the shared body (aggregated)."""
  return fedrep(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx,
                head_epochs=int(ctx.hp['head_epochs']), name=ctx.name)
