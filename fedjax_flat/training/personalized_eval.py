"""The Trainer's end-of-training personalized evaluation (config.personalized): every protocol of
evaluation/personalized.py on the clients' personal models (algorithms/personalization.py), + fine-tuning."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.personalization import global_params, personal_params, personalizer_name
from fedjax_flat.evaluation.evaluator import fixed_batch_size
from fedjax_flat.evaluation.personalized import (eval_sets_from_data, evaluate_protocols, finetune_and_evaluate,
                                                 make_predict_fn)

tmap = jax.tree_util.tree_map


def client_states_of(store) -> dict:
  """{client id: that client's state (numpy pytree)} for the clients seen (host or device store)."""
  if store is None:
    return {}
  d = store.state_dict()
  if d['states'] is None:
    return {}
  return {int(k): tmap(lambda a, i=i: np.asarray(a[i]), d['states']) for i, k in enumerate(d['ids'])}


def evaluate_trainer(trainer) -> dict:
  """config.personalized.enabled: every protocol on the clients' personalized models (+ fine-tuning)."""
  c = trainer.config
  pc = c.personalized
  data = trainer.data
  store_states = client_states_of(trainer.store)
  alg = trainer.algorithm
  client_params = [personal_params(alg, trainer.server_state, store_states.get(k))
                   for k in range(data.num_clients)]
  client_params = [tmap(jnp.asarray, p) for p in client_params]
  server_params = global_params(alg, trainer.server_state)
  predict = make_predict_fn(trainer.model, trainer.plan.eval_transform, fixed_batch_size(c.eval_batch_size))
  sets = eval_sets_from_data(data)
  res = evaluate_protocols(predict, client_params, server_params, sets, auc_scores=pc.auc_scores,
                           per_client=bool(pc.per_client))
  res['personal_model'] = personalizer_name(alg) or 'global'
  res['clients_with_state'] = len(store_states)
  if pc.finetune_epochs > 0:
    train_sets = [data.client_examples(k) for k in range(data.num_clients)]
    curve, _ = finetune_and_evaluate(
        predict, trainer.model, client_params, server_params, sets, train_sets, epochs=int(pc.finetune_epochs),
        client_cfg=c.client, lr=float(pc.finetune_lr or c.client.lr),
        batch_size=int(pc.finetune_batch_size or c.client.batch_size), seed=c.seed,
        man_zeta=local_lib.man_coefficient(c.man.zeta, c.man.get('convention', 'paper')),
        augment_fn=trainer.plan.train_transform, auc_scores=pc.auc_scores)
    res['finetune'] = curve
  return res
