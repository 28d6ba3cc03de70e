"""config.eval_clients: at every evaluation, the global model on each client sampled in the last round, on that
client's own training data ('clients_<metric>': evaluation/evaluator.ClientEvaluator)."""
from fedjax_flat.evaluation.evaluator import ClientEvaluator, fixed_batch_size
from fedjax_flat.training.evals.registry import Evaluation, register


def _periodic(trainer) -> dict:
  if getattr(trainer, 'last_clients', None) is None:
    return {}
  if getattr(trainer, 'client_evaluator', None) is None:
    batch = fixed_batch_size(trainer.config.eval_batch_size)
    trainer.client_evaluator = ClientEvaluator(trainer.model, trainer.data, batch,
                                               preprocess=trainer.eval_transform, task=trainer.task)
  params = trainer.algorithm.eval_models(trainer.server_state)['global'][0]
  res = trainer.client_evaluator(params, trainer.last_clients)
  return {k: v for k, v in res.items() if k.startswith('clients_')}


register(Evaluation('clients', order=20, applies=lambda t: bool(t.config.eval_clients), periodic=_periodic,
                    models=('global',)))
