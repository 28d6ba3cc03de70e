"""config.eval_clients: at every evaluation, the global model on each client sampled in the last round, on that
client's own training data ('clients_<metric>': evaluation/evaluator.ClientEvaluator)."""
from fedjax_flat.evaluation.evaluator import ClientEvaluator, fixed_batch_size
from fedjax_flat.training.evals.registry import Evaluation, register


def _periodic(trainer) -> dict:
  rec, p = trainer.recorder, trainer.plan
  if rec.last_clients is None:
    return {}
  if 'clients' not in rec.plugin_state:        # built once per run
    rec.plugin_state['clients'] = ClientEvaluator(p.model, p.data, fixed_batch_size(p.config.eval_batch_size),
                                                  preprocess=p.eval_transform, task=p.task)
  params = p.algorithm.eval_models(trainer.server_state)['global'][0]
  res = rec.plugin_state['clients'](params, rec.last_clients)
  return {k: v for k, v in res.items() if k.startswith('clients_')}


register(Evaluation('clients', order=20, applies=lambda p: bool(p.config.eval_clients), periodic=_periodic,
                    models=('global',)))
