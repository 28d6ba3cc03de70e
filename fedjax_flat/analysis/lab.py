"""The landscape lab (config.lab): drift, update sparsity, Hessian alignment, feature rank and the loss profile of
a run's round, measured from the run's state (in a run every `lab.every` rounds: training/evals/lab.py; on a
checkpoint: experiments/hessian.py --lab).

At a state after r rounds, the clients of round r (the next round's cohort, from the seed) are trained from the
current global model exactly as that round trains them (analysis/local_models.local_updates: the same batches,
keys, client states; one client at a time, so equal to the round's own local models up to float reduction
order). Nothing in the training program changes: with lab.every=0 (the default) a run is bit-identical, and with
it on the run's own numbers are too (the lab only reads the state). The measures:

  drift      ||Delta_k|| and cos(Delta_k, Delta) of each client, Delta their N_k-weighted mean (drift.py):
             drift_norm_mean / _max, drift_cos_mean / _min, drift_aggregate_norm
  sparsity   fraction of |Delta_k| entries <= lab.sparsity_threshold * max |Delta_k| (drift.py):
             update_sparsity_mean / _max
  alignment  fraction of ||Delta||^2 in the span of the Hessian's top lab.top_k eigenvectors at the global model
             (Lanczos on the lab's examples, alignment.py): align_topk_client_mean (over the clients),
             align_topk_global (the aggregate), align_lambda_max
  rank       effective rank of each marked layer's features of the lab's examples (feature_rank.py):
             feature_rank/act<i>
  profile    per-example loss vs gradient norm of the global model on the lab's examples (loss_profile.py):
             profile_loss_gradnorm_corr (Pearson), profile_loss_gradnorm_spearman, the binned profile in lab.jsonl
  barrier    the loss barrier on the lab's examples along the linear path from the global model to each client's
             model (connectivity.loss_barrier at lab.barrier_points points, Frankle et al. 2020): barrier_mean /
             _max over the clients, barrier_max_loss_mean (the raw height); between every pair of the clients'
             models: barrier_pair_mean / _max; each path's in lab.jsonl. Not among
             the default measures (`DEFAULT_MEASURES`): ask for it (--config.lab.measures=drift,barrier); a sweep's
             report shows the last values as columns (sweeps/report.py LANDSCAPE)

The lab's examples: lab.examples training examples of all clients, drawn once from the seed
(local_models.global_train_subset), evaluation preprocessing. Every model is analysed in float32 over its
trainable parameters (BatchNorm statistics held fixed, core/batch_stats.trainable_view).
"""
from __future__ import annotations

import time
from typing import Dict, Tuple

import jax
import numpy as np

from fedjax_flat.analysis.alignment import subspace_fraction, top_subspace
from fedjax_flat.analysis.connectivity import loss_barrier
from fedjax_flat.analysis.data import make_fixed_batches
from fedjax_flat.analysis.drift import flat_updates, update_drift, update_sparsity
from fedjax_flat.analysis.feature_rank import layer_feature_ranks
from fedjax_flat.analysis.hvp import make_eval_fn, make_hvp, param_dim
from fedjax_flat.analysis.local_models import global_train_subset, local_updates, make_runner
from fedjax_flat.analysis.loss_profile import loss_gradnorm_profile, per_example_loss_gradnorm
from fedjax_flat.core.batch_stats import trainable_view
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.base import float32_model
from fedjax_flat.schema import LOG, Field, Int, Num, Section, Test

MEASURES = ('drift', 'sparsity', 'alignment', 'rank', 'profile', 'barrier')
DEFAULT_MEASURES = MEASURES[:5]     # the barrier evaluates a path per client: asked for by name
NEEDS_CLIENTS = ('drift', 'sparsity', 'alignment', 'barrier')     # the measures that train the next round's clients


def parse_measures(spec) -> Tuple[str, ...]:
  """'drift,rank' (or a tuple of names) -> ('drift', 'rank'); ValueError naming an unknown one."""
  names = tuple(s.strip() for s in (spec.split(',') if isinstance(spec, str) else spec) if str(s).strip())
  bad = [n for n in names if n not in MEASURES]
  if bad or not names:
    raise ValueError(f'unknown measure(s) {bad}' if bad else 'no measure named')
  return names


def _measures_why(v):
  try:
    parse_measures(v)
  except (ValueError, TypeError, AttributeError):
    return f'must name measures among {",".join(MEASURES)}, comma-separated (e.g. --config.lab.measures=drift,rank)'
  return None


def enabled(cfg) -> bool:
  lab = cfg.get('lab')
  return lab is not None and int(lab.every) > 0


def _every_on_evaluations(cfg) -> None:
  every, ev = int(cfg.lab.every), int(cfg.get('eval_every', 1))
  if every > 0 and every % ev:
    raise ConfigError('lab.every', every, f'the lab runs at evaluation rounds: use a multiple of eval_every={ev} '
                      f'(e.g. --config.lab.every={ev * max(1, round(every / ev))}), or 0 (off)')


# config.lab: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('lab', (
    Field('every', Int(0, lo=0), 'landscape-lab measures every N rounds (a multiple of eval_every; 0 = off): '
          'analysis/lab.py', after=_every_on_evaluations),
    Field('measures', Test(','.join(DEFAULT_MEASURES), why=_measures_why, what='comma-separated names'),
          f'which: {",".join(MEASURES)}', when=enabled, needs='lab.every'),
    Field('top_k', Int(5, lo=1), 'Hessian eigenvectors of the alignment measure', when=enabled, needs='lab.every'),
    Field('examples', Int(500, lo=2), 'training examples (drawn from the seed) of alignment, rank and profile',
          when=enabled, needs='lab.every'),
    Field('sparsity_threshold', Num(1e-3, lo=0, hi=1, lo_open=True, hi_open=True),
          'an entry counts as zero when |x| <= this * the update\'s max |x|', when=enabled, needs='lab.every'),
    Field('bins', Int(10, lo=2), 'loss-quantile bins of the profile', when=enabled, needs='lab.every'),
    Field('barrier_points', Int(11, lo=2), 'points of [0, 1] on each global-to-client path of the barrier',
          when=enabled, needs='lab.every'),
), doc='the landscape lab: drift, sparsity, Hessian alignment, feature rank, loss profile (analysis/lab.py)',
   optional=True, tags={LOG})
# LOG (runs-axis: left out of the compatibility key): the lab reads a run's model on the host at its evaluation
# rounds (lab.every is a multiple of eval_every) with its own programs, so neither the round program nor the
# block schedule depends on it; runs of a batched program may differ in it (tests/training/test_batched.py).


def check(algorithm, measures) -> None:
  """One ConfigError line when the lab cannot measure this algorithm (before anything compiles)."""
  if any(m in NEEDS_CLIENTS for m in measures):
    why = ('trains its clients in chains (no per-client model from the broadcast)' if algorithm.chain is not None
           else f'has {algorithm.num_phases} phases per round' if algorithm.num_phases != 1 else '')
    if why:
      raise ConfigError('lab.measures', ','.join(measures), f'{algorithm.label} {why}: drift, sparsity, '
                        'alignment and barrier need one local model per client; keep rank,profile')


class Lab:
  """The lab of one run: its examples (fixed once) and its compiled local-training program, kept across calls."""

  def __init__(self, trainer, *, measures=DEFAULT_MEASURES, top_k: int = 5, examples: int = 500,
               sparsity_threshold: float = 1e-3, bins: int = 10, batch_size: int = 100, lanczos_steps: int = 40,
               barrier_points: int = 11):
    self.measures = parse_measures(measures)
    self.top_k, self.threshold, self.bins = int(top_k), float(sparsity_threshold), int(bins)
    self.barrier_points = int(barrier_points)
    data, tf = trainer.data, trainer.plan.eval_transform
    x, y = data.take(global_train_subset(data, int(examples), int(trainer.config.seed)))
    self.x = np.asarray(tf(np.asarray(x)))
    self.batches = make_fixed_batches(self.x, np.asarray(y), min(int(batch_size), len(y)))
    self.runner = None
    self.lanczos_steps = int(lanczos_steps)
    self.seed = int(trainer.config.seed)

  @classmethod
  def from_config(cls, trainer, lab_cfg) -> 'Lab':
    return cls(trainer, measures=lab_cfg.measures, top_k=lab_cfg.top_k, examples=lab_cfg.examples,
               sparsity_threshold=lab_cfg.sparsity_threshold, bins=lab_cfg.bins,
               barrier_points=lab_cfg.get('barrier_points', 11))

  def __call__(self, trainer, global_params) -> Tuple[Dict[str, float], Dict]:
    """(record fields, details) at the trainer's state: `global_params` its global model."""
    ms, rec, det = self.measures, {}, {'round': int(trainer.round), 'measures': list(self.measures)}
    t0 = time.perf_counter()
    model, gp = trainable_view(float32_model(trainer.model), global_params)
    if any(m in NEEDS_CLIENTS for m in ms):
      if self.runner is None:
        self.runner = make_runner(trainer.algorithm, trainer.plan.train_transform)
      t = time.perf_counter()
      u = local_updates(trainer, trainer.round, runner=self.runner)
      det['seconds_clients'] = time.perf_counter() - t
      start = trainable_view(trainer.model, u['start'])[1]
      clients = [trainable_view(trainer.model, p)[1] for p in u['params']]
      deltas = flat_updates(start, clients)
      d = update_drift(deltas, u['num_examples'])
      det.update({'clients': u['ids'], 'num_examples': u['num_examples'].tolist()})
      if 'drift' in ms:
        rec.update({'drift_norm_mean': d['norm_mean'], 'drift_norm_max': d['norm_max'],
                    'drift_cos_mean': d['cos_mean'], 'drift_cos_min': d['cos_min'],
                    'drift_aggregate_norm': d['aggregate_norm']})
        det.update({'drift_norms': np.asarray(d['norms']).tolist(), 'drift_cosines': np.asarray(d['cosines']).tolist()})
      if 'sparsity' in ms:
        sp = update_sparsity(deltas, self.threshold)
        rec.update({'update_sparsity_mean': np.mean(sp), 'update_sparsity_max': np.max(sp)})
        det['update_sparsity'] = np.asarray(sp).tolist()
      if 'alignment' in ms:
        t = time.perf_counter()
        hvp = make_hvp(model, gp, self.batches, task=trainer.task)
        pairs = top_subspace(hvp, param_dim(gp), min(self.top_k, param_dim(gp)), rng=jax.random.key(self.seed),
                             num_steps=self.lanczos_steps)
        det['seconds_alignment'] = time.perf_counter() - t
        client_frac = subspace_fraction(deltas, pairs.eigenvectors)
        rec.update({'align_topk_client_mean': np.mean(client_frac),
                    'align_topk_global': subspace_fraction(d['aggregate'], pairs.eigenvectors),
                    'align_lambda_max': float(pairs.eigenvalues[0])})
        det.update({'align_topk_clients': np.asarray(client_frac).tolist(),
                    'eigenvalues': np.asarray(pairs.eigenvalues).tolist(),
                    'eigen_converged': np.asarray(pairs.converged).tolist(), 'random_expectation':
                    min(self.top_k, param_dim(gp)) / param_dim(gp)})
      if 'barrier' in ms:
        t = time.perf_counter()
        eval_fn = make_eval_fn(model, self.batches, task=trainer.task)
        paths = [loss_barrier(eval_fn, gp, c, self.barrier_points) for c in clients]
        pairs = [(i, j) for i in range(len(clients)) for j in range(i + 1, len(clients))]
        between = [loss_barrier(eval_fn, clients[i], clients[j], self.barrier_points)['barrier'] for i, j in pairs]
        rec.update({'barrier_mean': np.mean([p['barrier'] for p in paths]),
                    'barrier_max': np.max([p['barrier'] for p in paths]),
                    'barrier_max_loss_mean': np.mean([p['max_loss'] for p in paths])})
        if between:       # a cohort of one client has no pair
          rec.update({'barrier_pair_mean': np.mean(between), 'barrier_pair_max': np.max(between)})
        det.update({'barriers': [p['barrier'] for p in paths], 'barrier_t': [p['t_barrier'] for p in paths],
                    'barrier_max_loss': [p['max_loss'] for p in paths], 'barrier_pairs': [list(p) for p in pairs],
                    'barrier_pair': between})
        det['seconds_barrier'] = time.perf_counter() - t
    if 'rank' in ms:
      t = time.perf_counter()
      ranks = layer_feature_ranks(model, gp, self.x)
      det['seconds_rank'] = time.perf_counter() - t
      rec.update({f'feature_rank/{k}': v for k, v in ranks.items()})
    if 'profile' in ms:
      t = time.perf_counter()
      losses, norms = per_example_loss_gradnorm(model, gp, self.batches, task=trainer.task)
      prof = loss_gradnorm_profile(losses, norms, self.bins)
      rec.update({'profile_loss_gradnorm_corr': prof['pearson'], 'profile_loss_gradnorm_spearman': prof['spearman']})
      det['profile_bins'] = prof['bins']
      det['seconds_profile'] = time.perf_counter() - t
    det['seconds'] = time.perf_counter() - t0
    return {k: float(v) for k, v in rec.items()}, det
