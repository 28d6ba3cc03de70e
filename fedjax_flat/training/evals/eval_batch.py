"""config.eval_batch_size='auto': summary.json 'evaluation' records the batch size the evaluator measured and chose
(evaluation/evaluator.choose_batch_size: images/s of each candidate), so a run says how it was evaluated; `choice`
says whether this run measured it or read an earlier run's measurement of the same model, test set and devices."""
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  ev = trainer.plan.evaluator
  choice = getattr(ev, 'batch_choice', None)
  summary['evaluation'] = {'batch_size': getattr(ev, 'batch_size', None), 'auto': choice is not None,
                           'devices': int(ev.mesh.devices.size) if hasattr(ev, 'mesh') else 1}
  if choice is not None:
    summary['evaluation'].update({'images_per_s': {str(b): float(r) for b, r in choice['images_per_s'].items()},
                                  'sample': int(choice['sample']), 'choice': choice.get('source', 'measured'),
                                  'images_per_s_by_devices': {str(d): {str(b): float(r) for b, r in rates.items()}
                                                              for d, rates in choice.get('by_devices', {}).items()}})


register(Evaluation('eval_batch', order=90, applies=lambda t: t.config.eval_batch_size == 'auto', final=_final))
