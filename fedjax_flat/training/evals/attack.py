"""config.attack: the attack's report and accuracy drop (data/attacks.summarize) -> summary.json `attack`; a
backdoor (data/attacks.py) also puts 'attack_success_rate' in every evaluation record beside the test accuracy:
the accuracy toward attack.target_label of the global model on the triggered test images whose label is not
the target (Bagdasaryan et al. 2020's backdoor accuracy), and its last value in summary.json
`attack.success_rate`."""
from fedjax_flat.data import attacks
from fedjax_flat.evaluation.evaluator import Evaluator, fixed_batch_size
from fedjax_flat.training.evals.registry import Evaluation, register

ASR = 'attack_success_rate'


def _periodic(trainer) -> dict:
  c, p = trainer.config, trainer.plan
  if c.attack.kind != 'backdoor':
    return {}
  state = trainer.recorder.plugin_state
  if ASR not in state:           # the triggered test set, placed once per run
    tx, ty = p.data.test_examples()
    x, y = attacks.triggered_test(tx, ty, c.attack, attacks.trigger_value(p.data.x))
    state[ASR] = Evaluator(p.model, x, y, fixed_batch_size(c.eval_batch_size), preprocess=p.eval_transform,
                           task=p.task)
  view = (lambda t: t) if p.placement is None else p.placement.local_view
  params = view(p.algorithm.eval_models(trainer.server_state)['global'][0])
  return {ASR: float(state[ASR](params)['accuracy'])}


def _final(trainer, summary, reported):
  del reported
  attacks.summarize(trainer.config, summary, trainer.plan.attack_report)
  rates = [r[ASR] for r in trainer.records if ASR in r]
  if rates and 'attack' in summary:
    summary['attack']['success_rate'] = rates[-1]


register(Evaluation('attack', order=80, applies=lambda p: attacks.enabled(p.config), periodic=_periodic,
                    final=_final, models=('global',)))
