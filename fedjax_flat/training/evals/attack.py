"""config.attack: the label-flipping attack's report and accuracy drop (data/attacks.summarize) -> summary.json
`attack`."""
from fedjax_flat.data import attacks
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  del reported
  attacks.summarize(trainer.config, summary, trainer.plan.attack_report)


register(Evaluation('attack', order=80, applies=lambda p: attacks.enabled(p.config), final=_final))
