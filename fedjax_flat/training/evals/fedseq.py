"""The chain algorithms (FedSeq family: training/chain_loop.py): their message counts at every evaluation
(comm_s2c / comm_c2s / comm_c2c cumulative, num_superclients, mean_chains_per_round) and summary.json `fedseq`
(thesis Tables 5.2 and 5.4: messages, N_S, chains per round, local steps per round, the lanes)."""
from fedjax_flat.training.evals.registry import Evaluation, register


def _periodic(trainer) -> dict:
  tot = trainer.driver.totals(trainer.round)
  last = trainer.plan.chain_stats(max(trainer.round - 1, 0))
  return {'comm_s2c': tot['chains'], 'comm_c2s': tot['chains'], 'comm_c2c': tot['c2c'],
          'num_superclients': last['num_superclients'],
          'mean_chains_per_round': tot['chains'] / max(tot['rounds'], 1)}


def _final(trainer, summary, reported):
  del reported
  summary['fedseq'] = trainer.plan.summary_section(trainer.driver.totals(trainer.round), trainer.driver.device_gather)


register(Evaluation('fedseq', order=5, applies=lambda plan: plan.algorithm.chain is not None, periodic=_periodic,
                    final=_final))
