r"""Loss geometry of a trained model: top Hessian eigenvalues, lambda_max / lambda_5, trace, spectral density,
and loss landscapes, written as JSON + PNG plots.

  python experiments/hessian.py --workdir=runs/quickstart [--model=global|swa|wima] [--split=test]
      [--num_examples=2000] [--top_k=5] [--method=lanczos|power] [--lanczos_steps=80] [--num_iters=20]
      [--trace_probes=20]
      [--density_probes=3] [--surface_points=11] [--interpolate_with=runs/other]
  python experiments/hessian.py --workdir=runs/quickstart --per_client [--per_client_round=r] [--num_examples=500]
      [--per_client_estimate=full_data|both] [--per_client_global=test|train|both]
      (thesis Table 4.13: per sampled client, lambda_max of its local model on its own data vs the global
      model on the same data, and of the local model on the global data: the test set (default) or, as the
      thesis' "global" value, the whole training set of all clients (train), or both; local models recomputed
      from the checkpoint, analysis/local_models.py; --per_client_estimate=both adds FedSoup Fig. 2a's median
      over batches beside the full-data estimate)
  python experiments/hessian.py --workdir=runs/quickstart --connectivity [--connectivity_clients=4]
      [--connectivity_points=21] [--bezier_steps=200] [--num_examples=2000]
      (mode connectivity: the loss barrier along the linear paths between K client models of the round after the
      checkpoint, pairwise and each against the global model; optionally a trained Bezier curve between the first
      two: connectivity_<model>.json / .md / .png, analysis/connectivity.py)
  python experiments/hessian.py --workdir=runs/quickstart --lab [--lab_round=r] [--lab_measures=drift,rank]
      [--top_k=5] [--lab_examples=500] [--lab_bins=10] [--lab_sparsity_threshold=1e-3]
      (the landscape lab, analysis/lab.py, on checkpoint r: drift, cosine and sparsity of the updates of the
      clients round r trains from it, their alignment with the top-k Hessian eigenvectors, the effective rank of
      each layer's features, the loss-vs-gradient-norm profile; writes lab_<model>_round<r>.json and .md)

The model and data come from the run: WORKDIR/config.json rebuilds the dataset and model, and the newest
checkpoint in WORKDIR/checkpoints (written at the end of every run) gives the parameters. Outputs go to
WORKDIR/hessian/ (or --out_dir): hessian_<model>.json (eigenvalues, lambda_max, lambda_max/lambda_5, for every
eigenpair its Rayleigh quotient, residual ||Hu - lambda u|| and converged flag, trace and its standard error,
loss/accuracy, timings), eigenvalues_<model>.png, density_<model>.png,
surface_<model>.png (loss along two random filter-normalized directions, Li et al.; the same directions for
every model of a run via --direction_seed), interpolation.png (1D path to another run's model).
Eigenvalues: Lanczos by default (largest algebraic; the Krylov space grows until every pair's residual is
<= --residual_tol * max|lambda|); --method=power is the thesis protocol (20 deflated power steps, largest
|lambda|), whose pairs on a clustered spectrum are often no eigenpairs: every pair failing the residual test
is printed as a warning and marked converged=false in the JSON (all_converged=false).
The model is always the float32 one (a run trained with engine.compute_dtype='bfloat16' included: the same
float32 parameters, analysed without bfloat16 rounding; analysis/hvp.py).
On CPU, models use the im2col convolution (an HVP inside an XLA loop is ~40x slower with native convs).

Exit status (fedjax_flat/training/cli.py), each error one `error: ...` line without a traceback: 0 done; 1 the
checkpoint cannot be restored (corrupt); 2 bad input (a flag value, a directory that is not a run, a truncated
config.json, a checkpoint that does not match the run's config.json, a round the run did not keep, an
--interpolate_with run of another model or other parameter shapes: refused before any eigenvalue work).
hessian_<model>.json is written once the eigenvalues are computed, then again after each optional step
(surface, interpolation), so a failure there keeps the main results.
"""
from __future__ import annotations

import json
import os
import sys
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import flags, logging  # noqa: E402

from fedjax_flat.errors import BadInputError  # noqa: E402
from fedjax_flat.training import cli  # noqa: E402

MODELS = ('global', 'swa', 'wima')

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (config.json + checkpoints/).')
_MODEL = flags.DEFINE_string('model', 'global', "Which evaluated model: 'global', 'swa', 'wima'.")
_SPLIT = flags.DEFINE_enum('split', 'test', ['test', 'train'], 'Data the Hessian is averaged over.')
_N = flags.DEFINE_integer('num_examples', 2000, 'Fixed subset size (first N examples of the split).')
_BATCH = flags.DEFINE_integer('batch_size', 100, 'Batch size of the HVP accumulation.')
_TOPK = flags.DEFINE_integer('top_k', 5, 'Number of top eigenvalues.')
_METHOD = flags.DEFINE_enum('method', 'lanczos', ['lanczos', 'power'],
                            'Eigen-solver: lanczos (checked, grown until converged) or power (thesis protocol).')
_ITERS = flags.DEFINE_integer('num_iters', 20, 'Power iterations per eigenvalue (--method=power).')
_LANCZOS = flags.DEFINE_integer('lanczos_steps', 80, 'Initial Lanczos steps (doubled up to 4x while a pair has '
                                'not converged).')
_RES_TOL = flags.DEFINE_float('residual_tol', 1e-3, 'A pair is converged when ||Hu - lambda u|| <= this * '
                              'max|lambda|.')
_TRACE = flags.DEFINE_integer('trace_probes', 0, 'Hutchinson probes (0: skip).')
_DENSITY = flags.DEFINE_integer('density_probes', 0, 'SLQ probes for the spectral density (0: skip).')
_SURFACE = flags.DEFINE_integer('surface_points', 0, 'Grid points per axis of the random-direction surface.')
_DIR_SEED = flags.DEFINE_integer('direction_seed', 0, 'Seed of the random directions (same for all models).')
_OTHER = flags.DEFINE_string('interpolate_with', None, 'Another run dir: 1D interpolation to its model.')
_OUT = flags.DEFINE_string('out_dir', None, 'Output directory (default WORKDIR/hessian).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the eigen-solver start vectors and probes.')
flags.mark_flag_as_required('workdir')


# Per-client sharpness (thesis Table 4.13): analysis/local_models.py.
_PER_CLIENT = flags.DEFINE_bool(
    'per_client', False, 'Instead of the global analysis: lambda_max of each client sampled at round r '
    '(--per_client_round, default the newest checkpoint; r rounds done) for its local model on its own data, the '
    'global model on the same data, and the local model on the global data (--per_client_global). Local models '
    'are recomputed from the checkpointed server state with the same batches, rngs and client states as '
    'training (one client at a time instead of vmapped: equal up to float reduction order); no local models are '
    'stored. '
    'Writes per_client_<model>_round<r>.json.')
_PC_ROUND = flags.DEFINE_integer(
    'per_client_round', -1, 'With --per_client: the checkpoint round r to start from (-1: the newest); the run must '
    'have kept it (config.keep_rounds, or checkpoint_every / keep_checkpoints).')
_PC_EST = flags.DEFINE_enum(
    'per_client_estimate', 'full_data', ['full_data', 'both'],
    'With --per_client: full_data (lambda_max of the loss over the client\'s examples, Table 4.13 and the FedSoup '
    'release) or both: also FedSoup\'s paper estimate, the median over batches of --batch_size of each batch\'s '
    'lambda_max (lambda_<name>_batch_median, side by side).')
_PC_GLOBAL = flags.DEFINE_enum(
    'per_client_global', 'test', ['test', 'train', 'both'],
    'With --per_client: the global data the local model is also measured on: the test set (lambda_local_global), '
    'the whole training set of all clients (lambda_local_train, the thesis\' Table 4.13 "global" value; '
    '--num_examples of it drawn with --seed) or both side by side.')

# Mode connectivity between client models (analysis/connectivity.py).
_CONN = flags.DEFINE_bool(
    'connectivity', False, 'Instead of the global analysis: the loss barrier (Frankle et al. 2020) along the linear '
    'path between every pair of --connectivity_clients client models and between each and the global model, on '
    '--num_examples of --split. The client models are those of the round after the checkpoint (--per_client_round; '
    'the run\'s local epochs from that global model on each client\'s data, analysis/local_models.py). Writes '
    'connectivity_<model>.json, connectivity_<model>.md and connectivity_<model>.png (the loss along the paths).')
_CONN_K = flags.DEFINE_integer('connectivity_clients', 4, 'With --connectivity: client models compared (the first K '
                               'of the round\'s sampled clients).')
_CONN_N = flags.DEFINE_integer('connectivity_points', 21, 'With --connectivity: points of each path, t in [0, 1].')
_BEZIER = flags.DEFINE_integer('bezier_steps', 0, 'With --connectivity: also train a quadratic Bezier curve '
                               '(Garipov et al. 2018) between the first two clients for this many Adam steps '
                               '(0: skip).')


# The landscape lab on a checkpoint: analysis/lab.py (in a run: config.lab).
_LAB = flags.DEFINE_bool('lab', False, 'Instead of the global analysis: the landscape-lab measures (--lab_measures) '
                         'at checkpoint --lab_round; writes lab_<model>_round<r>.json and .md.')
_LAB_ROUND = flags.DEFINE_integer('lab_round', -1, 'With --lab: the checkpoint round r (-1: the newest); the clients '
                                  'measured are those round r trains from it.')
_LAB_MEASURES = flags.DEFINE_string('lab_measures', 'drift,sparsity,alignment,rank,profile',
                                    'With --lab: comma-separated measures among drift, sparsity, alignment, rank, '
                                    'profile, barrier.')
_LAB_EXAMPLES = flags.DEFINE_integer('lab_examples', 500, 'With --lab: training examples (drawn from the run\'s '
                                     'seed) of the alignment, rank and profile measures.')
_LAB_BINS = flags.DEFINE_integer('lab_bins', 10, 'With --lab: loss-quantile bins of the profile.')
_LAB_THRESHOLD = flags.DEFINE_float('lab_sparsity_threshold', 1e-3, 'With --lab: an update entry counts as zero '
                                    'when |x| <= this * the update\'s max |x|.')
_LAB_BARRIER = flags.DEFINE_integer('lab_barrier_points', 11, 'With --lab and the barrier measure: points of [0, 1] on '
                                    'each linear path (the global model to each client, and between clients).')


def check_flags(argv) -> None:
  """Every flag value before anything is loaded: BadInputError naming the flag and what is allowed."""
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; give the run as --workdir=DIR')
  if not (_WORKDIR.value or '').strip():
    raise BadInputError("--workdir='' is empty: give a run directory written by experiments/train.py")
  if _MODEL.value not in MODELS:
    raise BadInputError(f'--model={_MODEL.value!r}; allowed: {", ".join(MODELS)}')
  for flag, lo in ((_N, 1), (_BATCH, 1), (_TOPK, 1), (_ITERS, 1), (_LANCZOS, 1), (_TRACE, 0), (_DENSITY, 0),
                   (_SURFACE, 0), (_PC_ROUND, -1)):
    if flag.value < lo:
      raise BadInputError(f'--{flag.name}={flag.value} must be >= {lo}')
  if _SURFACE.value == 1:
    raise BadInputError('--surface_points=1 gives no surface: use 0 (skip) or >= 2 (e.g. 11)')
  if not (0 < _RES_TOL.value < 1):
    raise BadInputError(f'--residual_tol={_RES_TOL.value} must be in (0, 1), e.g. 1e-3')
  if _PC_EST.value != 'full_data' and not _PER_CLIENT.value:
    raise BadInputError(f'--per_client_estimate={_PC_EST.value} applies to --per_client only: add --per_client')
  if _PC_GLOBAL.value != 'test' and not _PER_CLIENT.value:
    raise BadInputError(f'--per_client_global={_PC_GLOBAL.value} applies to --per_client only: add --per_client')
  for flag, lo in ((_CONN_K, 2), (_CONN_N, 2), (_BEZIER, 0)):
    if flag.value < lo:
      raise BadInputError(f'--{flag.name}={flag.value} must be >= {lo}')
  if _CONN.value and _LAB.value:
    raise BadInputError('--connectivity and --lab are two modes: give one')
  if _CONN.value and _PER_CLIENT.value:
    raise BadInputError('--connectivity and --per_client are two modes: give one')
  if (_CONN_K.value != 4 or _CONN_N.value != 21 or _BEZIER.value) and not _CONN.value:
    raise BadInputError('--connectivity_clients, --connectivity_points and --bezier_steps apply to --connectivity '
                        'only: add --connectivity')
  if _LAB.value:
    from fedjax_flat.analysis.lab import MEASURES, parse_measures
    try:
      parse_measures(_LAB_MEASURES.value)
    except ValueError:
      raise BadInputError(f'--lab_measures={_LAB_MEASURES.value!r}; allowed: comma-separated names among '
                          f'{",".join(MEASURES)}') from None
    if _PER_CLIENT.value or _OTHER.value or _SURFACE.value or _DENSITY.value or _TRACE.value:
      raise BadInputError('--lab computes the landscape-lab measures only: leave out --per_client, '
                          '--interpolate_with, --surface_points, --density_probes and --trace_probes')
    if _LAB_EXAMPLES.value < 2 or _LAB_BINS.value < 2 or _LAB_BARRIER.value < 2 or _LAB_ROUND.value < -1:
      raise BadInputError(f'--lab_examples={_LAB_EXAMPLES.value}, --lab_bins={_LAB_BINS.value} and '
                          f'--lab_barrier_points={_LAB_BARRIER.value} must be >= 2, '
                          f'--lab_round={_LAB_ROUND.value} >= -1')
    if not 0 < _LAB_THRESHOLD.value < 1:
      raise BadInputError(f'--lab_sparsity_threshold={_LAB_THRESHOLD.value} must be in (0, 1), e.g. 1e-3')
  elif (_LAB_ROUND.value != -1 or _LAB_MEASURES.value != _LAB_MEASURES.default or _LAB_EXAMPLES.value != 500
        or _LAB_BINS.value != 10 or _LAB_THRESHOLD.value != 1e-3 or _LAB_BARRIER.value != 11):
    raise BadInputError('--lab_round, --lab_measures, --lab_examples, --lab_bins, --lab_sparsity_threshold and '
                        '--lab_barrier_points apply to --lab only: add --lab')
  if _PER_CLIENT.value and (_OTHER.value or _SURFACE.value or _DENSITY.value or _TRACE.value):
    raise BadInputError('--per_client computes per-client lambda_max only: leave out --interpolate_with, '
                        '--surface_points, --density_probes and --trace_probes')


def lab_markdown(rep: dict) -> str:
  """The lab report as Markdown: the scalar fields, then the per-client table and the loss profile."""
  lines = [f"# Landscape lab: {rep['workdir']}, {rep['model']} model, checkpoint round {rep['round']}", '',
           f"Measures: {', '.join(rep['measures'])}; {rep['examples']} training examples; {rep['seconds']:.1f} s.",
           '', '| field | value |', '|---|---|']
  lines += [f'| {k} | {v:.6g} |' for k, v in rep['fields'].items()]
  d = rep['details']
  if 'clients' in d:
    cols = [c for c in ('drift_norms', 'drift_cosines', 'update_sparsity', 'align_topk_clients', 'barriers')
            if c in d]
    lines += ['', '| client | N_k | ' + ' | '.join(cols) + ' |', '|---' * (len(cols) + 2) + '|']
    for i, k in enumerate(d['clients']):
      lines.append(f"| {k} | {d['num_examples'][i]:g} | " + ' | '.join(f'{d[c][i]:.4g}' for c in cols) + ' |')
  if 'profile_bins' in d:
    lines += ['', '| loss bin | count | mean loss | mean grad norm |', '|---|---|---|---|']
    lines += [f"| [{b['loss_lo']:.3g}, {b['loss_hi']:.3g}] | {b['count']} | {b['loss_mean']:.4g} | "
              f"{b['gradnorm_mean']:.4g} |" for b in d['profile_bins']]
  return '\n'.join(lines) + '\n'


def lab_report(wd, out, load_run) -> dict:
  """--lab: the landscape lab on a checkpoint -> OUT/lab_<model>_round<r>.json and .md."""
  from fedjax_flat.analysis.lab import Lab, check, parse_measures
  trainer, params, step = load_run(wd, _MODEL.value, None if _LAB_ROUND.value < 0 else _LAB_ROUND.value)
  measures = parse_measures(_LAB_MEASURES.value)
  check(trainer.algorithm, measures)        # before any work: an algorithm without per-client models
  os.makedirs(out, exist_ok=True)
  lab = Lab(trainer, measures=measures, top_k=_TOPK.value, examples=_LAB_EXAMPLES.value,
            sparsity_threshold=_LAB_THRESHOLD.value, bins=_LAB_BINS.value, batch_size=_BATCH.value,
            barrier_points=_LAB_BARRIER.value)
  fields, details = lab(trainer, params)
  rep = {'workdir': os.path.abspath(wd), 'model': _MODEL.value, 'round': int(step), 'measures': list(measures),
         'examples': int(len(lab.x)), 'top_k': _TOPK.value, 'seconds': details['seconds'], 'fields': fields,
         'details': details}
  base = os.path.join(out, f'lab_{_MODEL.value}_round{step}')
  with open(base + '.json', 'w') as f:
    json.dump(rep, f, indent=2)
  with open(base + '.md', 'w') as f:
    f.write(lab_markdown(rep))
  print(f'landscape lab at round {step}: ' + ', '.join(f'{k} {v:.4g}' for k, v in fields.items())
        + f'; report: {base}.json, {base}.md')
  return rep


def main(argv):
  import jax
  import numpy as np
  from fedjax_flat import analysis
  from fedjax_flat.analysis import plots
  from fedjax_flat.training.reload import load_run   # the run's trainer, params and round, read-only
  check_flags(argv)
  wd = _WORKDIR.value
  out = _OUT.value or os.path.join(wd, 'hessian')
  if _CONN.value:
    return connectivity(wd, out)
  if _PER_CLIENT.value:
    trainer, params, step = load_run(wd, _MODEL.value, None if _PC_ROUND.value < 0 else _PC_ROUND.value)
    os.makedirs(out, exist_ok=True)      # only once the run has loaded: a wrong --workdir gets no folder
    from fedjax_flat.analysis.local_models import per_client_sharpness
    t0 = time.time()
    rep = per_client_sharpness(trainer, params, step, num_examples=_N.value, batch_size=_BATCH.value,
                               num_iters=_ITERS.value, seed=_SEED.value, estimate=_PC_EST.value,
                               global_set=_PC_GLOBAL.value, warn=False)   # said once, below
    rep.update({'workdir': os.path.abspath(wd), 'model': _MODEL.value, 'seconds': time.time() - t0})
    path = os.path.join(out, f'per_client_{_MODEL.value}_round{step}.json')
    with open(path, 'w') as f:
      json.dump(rep, f, indent=2)
    for r in rep['clients']:
      print(f"client {r['client']:4d}: local/own {r['lambda_local_own']:.4f}  global/own {r['lambda_global_own']:.4f}"
            + (f"  local/test {r['lambda_local_global']:.4f}" if 'lambda_local_global' in r else '')
            + (f"  local/train {r['lambda_local_train']:.4f}" if 'lambda_local_train' in r else ''))
    if not rep['all_converged']:
      print('warning: some power iterations did not converge (residual_* / converged_* in the report); '
            'more steps: --num_iters', file=sys.stderr)
    print(f"round {step}: mean lambda_max local/own {rep.get('mean_lambda_local_own', float('nan')):.4f}, "
          f"global/own {rep.get('mean_lambda_global_own', float('nan')):.4f}"
          + (f", local/own batch median {rep['mean_lambda_local_own_batch_median']:.4f}"
             if 'mean_lambda_local_own_batch_median' in rep else '') + f'; report: {path}')
    return
  if _LAB.value:
    lab_report(wd, out, load_run)
    return
  trainer, params, step = load_run(wd, _MODEL.value)
  # BatchNorm models: the Hessian over the trainable params, the running statistics held fixed.
  from fedjax_flat.core.batch_stats import trainable_view
  from fedjax_flat.models.base import float32_model
  other = None
  if _OTHER.value:
    # The other run with its own config (training/reload), refused before any work when its model differs.
    from fedjax_flat.training.reload import check_same_model
    other_trainer, other, _ = load_run(_OTHER.value, _MODEL.value)
    check_same_model(wd, trainer.config, params, _OTHER.value, other_trainer.config, other)
    # its statistics are not interpolated: ours are used
    _, other = trainable_view(float32_model(other_trainer.model), other)
    del other_trainer
  os.makedirs(out, exist_ok=True)
  x, y = trainer.data.test_examples() if _SPLIT.value == 'test' else (trainer.data.x, trainer.data.y)
  x = np.asarray(trainer.plan.eval_transform(np.asarray(x[:_N.value])))
  y = np.asarray(y[:_N.value])
  model, params = trainable_view(float32_model(trainer.model), params)   # float32 whatever the config
  logging.info('run %s, round %d, model %r, %d %s examples', wd, step, _MODEL.value, len(y), _SPLIT.value)
  t0 = time.time()
  report = analysis.analyze(model, params, x, y, batch_size=_BATCH.value, top_k=_TOPK.value, method=_METHOD.value,
                            num_iters=_ITERS.value, lanczos_steps=_LANCZOS.value, residual_tol=_RES_TOL.value,
                            trace_probes=_TRACE.value, density_probes=_DENSITY.value,
                            rng=jax.random.key(_SEED.value), task=trainer.task, warn=False)   # said once, below
  logging.info('lambda_max %.4f  lambda_max/lambda_5 %s  (%.1f s)', report['lambda_max'],
               report.get('lambda_max_over_lambda_5'), time.time() - t0)
  name = _MODEL.value
  density = report.pop('density', None)
  report.update({'workdir': os.path.abspath(wd), 'round': step, 'model': name, 'split': _SPLIT.value,
                 'num_examples': int(len(y))})
  path = os.path.join(out, f'hessian_{name}.json')

  def save():
    # rewritten after each optional step: the eigenvalue results are on disk before any of them runs
    with open(path, 'w') as f:
      json.dump(report, f, indent=2, default=lambda o: np.asarray(o).tolist())
  save()
  plots.plot_eigenvalues(report['eigenvalues'], os.path.join(out, f'eigenvalues_{name}.png'),
                         title=f'Top Hessian eigenvalues ({name}, round {step})')
  if density is not None:
    plots.plot_density(density['grid'], density['density'], os.path.join(out, f'density_{name}.png'),
                       eigenvalues=report['eigenvalues'])
  batches = analysis.make_fixed_batches(x, y, _BATCH.value)
  eval_fn = analysis.make_eval_fn(model, batches, task=trainer.task)
  if _SURFACE.value:
    k1, k2 = jax.random.split(jax.random.key(_DIR_SEED.value))
    d1 = analysis.filter_normalized_direction(k1, params)
    d2 = analysis.filter_normalized_direction(k2, params)
    surf = analysis.surface_2d(eval_fn, params, d1, d2, np.linspace(-1, 1, _SURFACE.value))
    plots.plot_surface_3d(surf['xs'], surf['ys'], surf['loss'], os.path.join(out, f'surface_{name}.png'),
                          title=f'loss along filter-normalized directions ({name})')
    report['surface'] = {k: np.asarray(v).tolist() for k, v in surf.items()}
    save()
  if other is not None:
    alphas = np.linspace(-0.25, 1.25, 31)
    curve = analysis.interpolate_1d(eval_fn, params, other, alphas)
    plots.plot_interpolation(alphas, curve['loss'], os.path.join(out, 'interpolation.png'),
                             labels=['loss'])
    report['interpolation'] = {'with': os.path.abspath(_OTHER.value), 'alphas': alphas.tolist(),
                               **{k: np.asarray(v).tolist() for k, v in curve.items() if k != 'alphas'}}
    save()
  bad = [i + 1 for i, c in enumerate(report['converged']) if not c]
  if bad:
    more = '--num_iters' if _METHOD.value == 'power' else '--lanczos_steps'     # the flag that adds steps
    print(f'warning: eigenpairs {bad} did not converge (residual > {report["residual_tol"]:g} * '
          f'{report["residual_scale"]:.4g}; marked converged=false in the report); more steps: {more}',
          file=sys.stderr)
  print(f"lambda_max {report['lambda_max']:.4f}; report: {path}; plots in {out}")


def connectivity(wd: str, out: str) -> None:
  """--connectivity: barriers between client models and the global model, as JSON, Markdown and a plot."""
  import jax
  import numpy as np
  from fedjax_flat import analysis
  from fedjax_flat.analysis import plots
  from fedjax_flat.analysis.local_models import local_models
  from fedjax_flat.core.batch_stats import trainable_view
  from fedjax_flat.models.base import float32_model
  from fedjax_flat.training.reload import load_run
  trainer, params, step = load_run(wd, _MODEL.value, None if _PC_ROUND.value < 0 else _PC_ROUND.value)
  ids, locals_ = local_models(trainer, step)
  if len(ids) < _CONN_K.value:
    raise BadInputError(f'--connectivity_clients={_CONN_K.value}: the round samples {len(ids)} clients; at most '
                        f'{len(ids)}')
  os.makedirs(out, exist_ok=True)
  x, y = trainer.data.test_examples() if _SPLIT.value == 'test' else (trainer.data.x, trainer.data.y)
  x = np.asarray(trainer.plan.eval_transform(np.asarray(x[:_N.value])))
  y = np.asarray(y[:_N.value])
  model, params = trainable_view(float32_model(trainer.model), params)
  clients = {f'client {k}': trainable_view(float32_model(trainer.model), p)[1]
             for k, p in zip(ids[:_CONN_K.value], locals_[:_CONN_K.value])}
  batches = analysis.make_fixed_batches(x, y, _BATCH.value)
  eval_fn = analysis.make_eval_fn(model, batches, task=trainer.task)
  t0 = time.time()
  rows = analysis.barrier_table(eval_fn, clients, params, _CONN_N.value)
  name = _MODEL.value
  rep = {'workdir': os.path.abspath(wd), 'round': step, 'model': name, 'split': _SPLIT.value,
         'num_examples': int(len(y)), 'paths': rows,
         'mean_barrier_clients': float(np.mean([r['barrier'] for r in rows if r['b'] != 'global'])),
         'mean_barrier_client_global': float(np.mean([r['barrier'] for r in rows if r['b'] == 'global']))}
  if _BEZIER.value:
    (a, wa), (b, wb) = list(clients.items())[:2]
    train_batches = analysis.make_fixed_batches(np.asarray(trainer.plan.eval_transform(
        np.asarray(trainer.data.x[:_N.value]))), np.asarray(trainer.data.y[:_N.value]), _BATCH.value)
    train_fn = analysis.make_eval_fn(model, train_batches, task=trainer.task)
    curve = analysis.bezier_curve(lambda p, k: train_fn(p)[0], eval_fn, wa, wb, jax.random.key(_SEED.value),
                                  steps=_BEZIER.value, n=_CONN_N.value)
    rep['bezier'] = {'a': a, 'b': b, 'steps': _BEZIER.value, 'train_examples': int(min(_N.value, len(trainer.data.y))),
                     **{k: curve[k] for k in ('barrier', 'max_loss', 't_barrier', 'end_losses')},
                     'ts': curve['ts'].tolist(), 'loss': np.asarray(curve['loss']).tolist()}
  rep['seconds'] = time.time() - t0
  base = os.path.join(out, f'connectivity_{name}')
  with open(base + '.json', 'w') as f:
    json.dump(rep, f, indent=2, default=lambda o: np.asarray(o).tolist())
  md = (f'# Loss barriers, {name} model, round {step} ({wd})\n\nLinear paths, {_CONN_N.value} points, '
        f'{len(y)} {_SPLIT.value} examples (Frankle et al. 2020: max_t L(w(t)) - ((1 - t) L(w1) + t L(w2))).\n\n'
        + analysis.barrier_markdown(rows))
  if 'bezier' in rep:
    z = rep['bezier']
    md += (f"\nQuadratic Bezier curve {z['a']} - {z['b']} ({z['steps']} Adam steps on {z['train_examples']} "
           f"training examples): barrier {z['barrier']:.4f}, max loss {z['max_loss']:.4f}.\n")
  with open(base + '.md', 'w') as f:
    f.write(md)
  plots.plot_interpolation(np.asarray(rows[0]['ts']), [r['loss'] for r in rows], base + '.png',
                           labels=[f"{r['a']} - {r['b']}" for r in rows], endpoints=('a', 'b'),
                           title=f'loss along the linear paths ({name}, round {step})')
  print(md)
  print(f'report: {base}.json, .md, .png')


if __name__ == '__main__':
  cli.run_main(main)   # every error one line and its exit status (training/cli.py)
