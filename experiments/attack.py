r"""Privacy attacks on a finished run, as measurements: gradient inversion of one client's upload and membership
inference (loss threshold; LiRA with shadow models), the latter's empirical epsilon lower bound beside the
accountant's epsilon for a DP run.

  python experiments/attack.py --workdir=runs/quickstart [--attack=all|inversion|membership] [--model=global]
      [--client=0] [--num_images=2] [--upload=delta|gradient|local] [--local_steps=1] [--local_batch=0]
      [--dp_noise=release|upload|none] [--labels=known|inferred] [--steps=2000] [--step_size=0.1] [--tv_weight=0.01]
      [--num_examples=0] [--delta=-1] [--alpha=0.05] [--lira_shadows=0] [--shadow_epochs=30]
      [--shadow_trainer=central|federated]

Inversion (analysis/inversion.py, Geiping et al. 2020): the first --num_images examples of client --client,
their upload computed at the run's model as ONE local SGD step (--upload=delta: -lr (g + wd w) with the run's
client lr and weight decay, which the attacker is taken to know), as the gradient itself, or (--upload=local)
as the delta of --local_steps steps of the run's own client optimizer (SAM / ASAM with the run's rho, momentum,
weight decay; the algorithm's correction terms, e.g. SCAFFOLD's, are not modelled) over the images in minibatches
of --local_batch (0: all of them each step), which the attacker unrolls; the attacker optimises dummy images on the
per-layer cosine + TV with Adam and scores them by PSNR / SSIM against the true images, beside a random image's.
The one-step upload is the attack's easiest case and bounds what a server could see from a client that sends
gradients (FedSGD); --upload=local is what a FedSAM client sends. For a DP run the upload is observed as DP
leaves it (--dp_noise): 'release' (default) its clipped upload plus the noise the DP adversary sees on it, who
knows every other client's contribution (central and distributed: the sum's noise, std z C m / M; local: the
upload's own, z C); 'upload' what the server receives from the client (central: clipped, no noise; local: z C;
distributed: z C sqrt(m) / M); 'none' the raw upload. Adaptive clipping and capped weighting are refused there
(the round's clip and the client's weight are not in the config).
Membership (analysis/membership.py): members are training examples of the run's clients, non-members the test
set, --num_examples of each (0: as many as the smaller set has), drawn with --seed. The loss-threshold attack
(Yeom et al. 2018) always; LiRA (Carlini et al. 2022, online, fixed variance below 64 shadows) with
--lira_shadows > 0 shadows of the run's model on random halves of the candidates: trained centrally, vmapped in
one program (--shadow_trainer=central, cheaper), or as federated runs of the run's own config, each on its half
at the candidates' clients, lanes of one runs program (--shadow_trainer=federated: training/shadows.py; their
workdirs in OUT/shadows; --shadow_epochs / _batch_size / _lr are the central trainer's). Each attack's AUC,
TPR at low FPR and its epsilon lower bound at --delta (-1: the run's dp.delta, 1e-5 for a run without DP) with
1 - --alpha confidence (Clopper-Pearson; the threshold chosen on one half of the examples, the bound computed on
the other).

Outputs in WORKDIR/privacy_attacks/ (or --out_dir): inversion.json, inversion.png (true images above their
reconstructions), membership.json, and privacy_attacks.md, a table of the numbers. Exit status
(training/cli.py): 0 done; 2 bad input (a flag value, refused before the run is loaded; a directory that is not
a run, a client or image count the run does not have, a task other than classification).
"""
from __future__ import annotations

import json
import math
import os
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import flags  # noqa: E402

from fedjax_flat.errors import BadInputError  # noqa: E402
from fedjax_flat.training import cli  # noqa: E402

ATTACKS = ('all', 'inversion', 'membership')
MODELS = ('global', 'swa', 'wima')

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (config.json + checkpoints/).')
_ATTACK = flags.DEFINE_string('attack', 'all', "Which attacks: 'all', 'inversion', 'membership'.")
_MODEL = flags.DEFINE_string('model', 'global', "Which evaluated model: 'global', 'swa', 'wima'.")
_OUT = flags.DEFINE_string('out_dir', None, 'Output directory (default WORKDIR/privacy_attacks).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the dummy images, the example draws and the shadows.')
_CLIENT = flags.DEFINE_integer('client', 0, 'Inversion: the client whose upload is inverted.')
_NUM_IMAGES = flags.DEFINE_integer('num_images', 2, 'Inversion: the size of the client batch behind the upload.')
_UPLOAD = flags.DEFINE_string('upload', 'delta', "Inversion: 'delta' (one local SGD step) or 'gradient'.")
_LOCAL_STEPS = flags.DEFINE_integer('local_steps', 1, "Inversion, --upload=local: the client optimizer's steps.")
_LOCAL_BATCH = flags.DEFINE_integer('local_batch', 0, 'Inversion, --upload=local: the images per local step, '
                                    'cycled in order (0: all --num_images every step; must divide them).')
DP_NOISE = ('release', 'upload', 'none')
_DP_NOISE = flags.DEFINE_string('dp_noise', 'release', "Inversion of a DP run's upload: 'release' (clipped, plus the "
                                "noise the DP adversary sees), 'upload' (what the server receives), 'none' (raw).")
_LABELS = flags.DEFINE_string('labels', 'known', "Inversion: 'known' or 'inferred' (iDLG, from the last bias "
                              'gradient).')
_STEPS = flags.DEFINE_integer('steps', 2000, 'Inversion: Adam steps on the dummy images.')
_STEP_SIZE = flags.DEFINE_float('step_size', 0.1, 'Inversion: Adam step size (10x smaller at 3/8, 5/8, 7/8).')
_TV = flags.DEFINE_float('tv_weight', 1e-2, 'Inversion: weight of the total-variation prior.')
_N = flags.DEFINE_integer('num_examples', 0, 'Membership: members and non-members each (0: the smaller set).')
_DELTA = flags.DEFINE_float('delta', -1.0, "Membership: delta of the epsilon bound (-1: the run's dp.delta, else "
                            '1e-5).')
_ALPHA = flags.DEFINE_float('alpha', 0.05, 'Membership: the bound holds with confidence 1 - alpha.')
_SHADOWS = flags.DEFINE_integer('lira_shadows', 0, 'Membership: LiRA shadow models (0: no LiRA; even, >= 2).')
_SH_EPOCHS = flags.DEFINE_integer('shadow_epochs', 30, 'LiRA: epochs of each shadow over its half.')
_SH_BATCH = flags.DEFINE_integer('shadow_batch_size', 32, 'LiRA: batch size of the shadow trainer.')
_SH_LR = flags.DEFINE_float('shadow_lr', -1.0, "LiRA: SGD step size of the shadows (-1: the run's client.lr).")
SHADOW_TRAINERS = ('central', 'federated')
_SH_TRAINER = flags.DEFINE_string('shadow_trainer', 'central', "LiRA: 'central' (the shadows trained centrally, "
                                  "vmapped: cheaper) or 'federated' (each shadow a run of the target's config on "
                                  'its half, the shadows lanes of one runs program: training/shadows.py).')
flags.mark_flag_as_required('workdir')


def check_flags(argv) -> None:
  """Every flag value before anything is loaded: BadInputError naming the flag and what is allowed."""
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; give the run as --workdir=DIR')
  if not (_WORKDIR.value or '').strip():
    raise BadInputError("--workdir='' is empty: give a run directory written by experiments/train.py")
  for flag, allowed in ((_ATTACK, ATTACKS), (_MODEL, MODELS), (_UPLOAD, ('delta', 'gradient', 'local')),
                        (_DP_NOISE, DP_NOISE),
                        (_LABELS, ('known', 'inferred')), (_SH_TRAINER, SHADOW_TRAINERS)):
    if flag.value not in allowed:
      raise BadInputError(f'--{flag.name}={flag.value!r}; allowed: {", ".join(allowed)}')
  for flag, lo in ((_CLIENT, 0), (_NUM_IMAGES, 1), (_STEPS, 1), (_N, 0), (_SHADOWS, 0), (_SH_EPOCHS, 1),
                   (_SH_BATCH, 1), (_LOCAL_STEPS, 1), (_LOCAL_BATCH, 0)):
    if flag.value < lo:
      raise BadInputError(f'--{flag.name}={flag.value} must be >= {lo}')
  if _LOCAL_BATCH.value and _NUM_IMAGES.value % _LOCAL_BATCH.value:
    raise BadInputError(f'--local_batch={_LOCAL_BATCH.value} must divide --num_images={_NUM_IMAGES.value} '
                        '(0: all of them every step)')
  if _UPLOAD.value != 'local' and (_LOCAL_STEPS.value != 1 or _LOCAL_BATCH.value):
    raise BadInputError(f'--local_steps / --local_batch describe --upload=local, not --upload={_UPLOAD.value}')
  if not _STEP_SIZE.value > 0:
    raise BadInputError(f'--step_size={_STEP_SIZE.value} must be > 0, e.g. 0.1')
  if not _TV.value >= 0:
    raise BadInputError(f'--tv_weight={_TV.value} must be >= 0, e.g. 0.01')
  if not (_DELTA.value == -1 or 0 <= _DELTA.value < 1):
    raise BadInputError(f'--delta={_DELTA.value} must be in [0, 1), or -1 for the run\'s dp.delta')
  if not 0 < _ALPHA.value < 1:
    raise BadInputError(f'--alpha={_ALPHA.value} must be in (0, 1), e.g. 0.05 for 95% confidence')
  if _SHADOWS.value == 1 or _SHADOWS.value % 2:
    raise BadInputError(f'--lira_shadows={_SHADOWS.value} must be 0 (no LiRA) or an even number >= 2 '
                        '(each example in half of them), e.g. 16')
  if not (_SH_LR.value == -1 or _SH_LR.value > 0):
    raise BadInputError(f'--shadow_lr={_SH_LR.value} must be > 0, or -1 for the run\'s client.lr')


def _dp_view(trainer, params):
  """(noise std, clip) of the DP view --dp_noise asks for; (0.0, None) for a run without DP or --dp_noise=none."""
  from fedjax_flat.algorithms.wrappers import dp as dp_lib
  from fedjax_flat.privacy import mechanism as mech
  cfg = trainer.config
  if not dp_lib.enabled(cfg) or _DP_NOISE.value == 'none':
    return 0.0, None
  d = cfg.dp
  if d.adaptive:
    raise BadInputError(f"--dp_noise={_DP_NOISE.value}: the run clips adaptively, so the round's clip is in its "
                        'server state, not its config; use --dp_noise=none')
  if cfg.server.get('weighting', 'examples') == 'capped':
    raise BadInputError(f"--dp_noise={_DP_NOISE.value}: the run weights clients by capped sizes, so one client's "
                        "share of the noise depends on its weight; use --dp_noise=none")
  import jax
  leaves = len(jax.tree_util.tree_leaves(params))
  z = float(dp_lib.noise_multiplier(cfg, int(trainer.data.num_clients), leaves))
  c, m, big_m, mode = float(d.clip), mech.cohort(cfg), mech.noise_cohort(cfg), str(d.mode)
  if mode != 'local' and _DP_NOISE.value == 'release':   # the sum's noise, seen by one who knows the other uploads
    return z * c * mech.sum_noise_share(mode, m, big_m), c
  return z * c * mech.client_noise_share(mode, m, big_m), c    # what the client itself added (0: central)


def _inversion(trainer, model, params, out, report):
  import jax
  import numpy as np
  from fedjax_flat.analysis import inversion as inv
  from fedjax_flat.analysis import plots
  import optax
  from fedjax_flat.optimizers.client import make_client_tx
  data = trainer.data
  k = _CLIENT.value
  if k >= data.num_clients:
    raise BadInputError(f'--client={k}: the run has clients 0..{data.num_clients - 1}')
  x, y = data.client_examples(k)
  if len(y) < _NUM_IMAGES.value:
    raise BadInputError(f'--num_images={_NUM_IMAGES.value}: client {k} has {len(y)} examples; choose fewer or '
                        'another --client')
  x = np.asarray(trainer.plan.eval_transform(np.asarray(x[:_NUM_IMAGES.value])), np.float32)
  y = np.asarray(y[:_NUM_IMAGES.value], np.int32)
  train_x = np.asarray(trainer.plan.eval_transform(np.asarray(data.x[:2000])), np.float32)
  image_range = (float(train_x.min()), float(train_x.max()))   # the data's range: the dummies are clipped to it
  cfg = trainer.config.client
  lr, wd = float(cfg.lr), float(cfg.get('weight_decay', 0.0) or 0.0)
  noise_std, clip = _dp_view(trainer, params)       # refused (one line) before any compilation
  if _UPLOAD.value == 'local':
    rho = float(cfg.get('rho', 0.0) or 0.0)
    upload_fn = inv.ClientUpload(model.apply, trainer.task, make_client_tx(cfg, {'lr': lr, 'rho': rho}),
                                 steps=_LOCAL_STEPS.value, batch_size=_LOCAL_BATCH.value)
    sent = upload_fn(params, x, y)                                                # what the client sends
  else:
    upload_fn = inv.ClientUpload(model.apply, trainer.task)                       # the gradient
    g = upload_fn(params, x, y)
    sent = jax.tree_util.tree_map(lambda a, w: -lr * (a + wd * w), g, params) if _UPLOAD.value == 'delta' else g
  observed, target = sent, sent
  if clip is not None:                    # what DP leaves of it (--dp_noise); the cosine ignores the clip's scale
    d = trainer.config.dp
    observed = target = inv.dp_observed(sent, jax.random.key(_SEED.value + 2), clip, noise_std,
                                        per_layer=bool(d.per_layer), per_tensor=bool(d.get('per_tensor', False)))
    if _UPLOAD.value == 'delta':          # an unknown clip factor: match the delta itself (one SGD step of x)
      sgd = optax.with_extra_args_support(optax.chain(optax.add_decayed_weights(wd), optax.sgd(lr)))
      upload_fn = inv.ClientUpload(model.apply, trainer.task, sgd)
  elif _UPLOAD.value == 'delta':          # the gradient the one-step delta implies, exactly
    target = inv.gradient_from_delta(sent, lr, params, wd)
  labels = y
  if _LABELS.value == 'inferred':
    bias = [v for path, v in jax.tree_util.tree_leaves_with_path(target)
            if 'bias' in jax.tree_util.keystr(path) and np.ndim(v) == 1]
    target_is_gradient = _UPLOAD.value == 'gradient' or (_UPLOAD.value == 'delta' and clip is None)
    # a delta's bias moves against the gradient
    labels = inv.infer_labels(bias[-1] if target_is_gradient else -bias[-1], len(y))
  t0 = time.time()
  res = inv.invert_upload(upload_fn, params, target, labels, x.shape, jax.random.key(_SEED.value),
                          steps=_STEPS.value, lr=_STEP_SIZE.value, tv_weight=_TV.value, image_range=image_range)
  s = inv.score_reconstruction(res['x'], x, image_range, key=jax.random.key(_SEED.value + 1))
  cos = np.asarray(res['cosine'])
  signal = 1.0 - float(inv.cosine_distance(observed, sent, per_layer=False))   # cos(observed, sent)
  rep = {'client': k, 'num_images': len(y), 'upload': _UPLOAD.value, 'client_lr': lr, 'weight_decay': wd,
         'client_optimizer': str(cfg.optimizer) if _UPLOAD.value == 'local' else 'sgd',
         'local_steps': _LOCAL_STEPS.value, 'local_batch': _LOCAL_BATCH.value or len(y),
         'dp_noise': _DP_NOISE.value if clip is not None else 'none', 'dp_clip': clip, 'dp_noise_std': noise_std,
         'observed_cosine_to_sent': signal,
         'labels': _LABELS.value, 'labels_true': y.tolist(), 'labels_used': np.asarray(labels).tolist(),
         'steps': _STEPS.value, 'step_size': _STEP_SIZE.value, 'tv_weight': _TV.value,
         'image_range': list(image_range), 'cosine_start': float(cos[0]), 'cosine_end': float(cos[-1]),
         'nonfinite_steps': res['nonfinite_steps'],
         'psnr': s['psnr'].tolist(), 'ssim': s['ssim'].tolist(), 'psnr_mean': float(s['psnr'].mean()),
         'ssim_mean': float(s['ssim'].mean()), 'psnr_random': s['psnr_random'].tolist(),
         'ssim_random': s['ssim_random'].tolist(), 'seconds': time.time() - t0}
  with open(os.path.join(out, 'inversion.json'), 'w') as f:
    json.dump(rep, f, indent=2)
  what = (f"{_LOCAL_STEPS.value} {rep['client_optimizer']} steps" if _UPLOAD.value == 'local' else _UPLOAD.value)
  if clip is not None and _DP_NOISE.value != 'none':
    what += f', DP {_DP_NOISE.value} (noise std {noise_std:.3g})'
  plots.plot_reconstruction(x, s['x'], os.path.join(out, 'inversion.png'), psnr=s['psnr'], ssim=s['ssim'],
                            title=f'client {k}, {what} of {len(y)} images, round {report["round"]}')
  report['inversion'] = rep
  print(f"inversion: client {k}, {what} of {len(y)} images: PSNR {rep['psnr_mean']:.2f} dB (random image "
        f"{float(np.mean(rep['psnr_random'])):.2f}), SSIM {rep['ssim_mean']:.3f} (random "
        f"{float(np.mean(rep['ssim_random'])):.3f}); cosine {rep['cosine_start']:.3f} -> {rep['cosine_end']:.3f}")


def _membership(trainer, model, params, out, report):
  import jax
  import numpy as np
  from fedjax_flat.analysis import membership as mi
  from fedjax_flat.algorithms.wrappers import dp as dp_lib
  data = trainer.data
  cfg = trainer.config
  dp_on = dp_lib.enabled(cfg)
  delta = _DELTA.value if _DELTA.value >= 0 else (float(cfg.dp.delta) if dp_on else 1e-5)
  tx, ty = data.test_examples()
  rng = np.random.default_rng(_SEED.value)
  n_train, n_test = len(data.y), len(ty)
  n = _N.value or min(n_train, n_test)
  if n > min(n_train, n_test):
    raise BadInputError(f'--num_examples={n}: the run has {n_train} training and {n_test} test examples; '
                        f'choose <= {min(n_train, n_test)} (0: that many)')
  mi_idx, mo_idx = rng.choice(n_train, n, replace=False), rng.choice(n_test, n, replace=False)
  mx = np.asarray(trainer.plan.eval_transform(np.asarray(data.x[np.sort(mi_idx)])), np.float32)
  my = np.asarray(data.y[np.sort(mi_idx)], np.int32)
  ox = np.asarray(trainer.plan.eval_transform(np.asarray(tx[np.sort(mo_idx)])), np.float32)
  oy = np.asarray(ty[np.sort(mo_idx)], np.int32)
  ms, os_ = mi.example_stats(model.apply, params, mx, my), mi.example_stats(model.apply, params, ox, oy)
  rep = {'num_members': n, 'num_nonmembers': n, 'delta': delta, 'confidence': 1 - _ALPHA.value,
         'train_accuracy': float(ms['correct'].mean()), 'test_accuracy': float(os_['correct'].mean()),
         'loss_threshold': mi.attack_report(-ms['loss'], -os_['loss'], delta, _ALPHA.value, _SEED.value)}
  if _SHADOWS.value:
    if getattr(model, 'batch_stats', False):
      raise BadInputError('--lira_shadows: the run\'s model keeps BatchNorm statistics, which the shadow trainer '
                          'does not update; use --lira_shadows=0')
    t0 = time.time()
    x, y = np.concatenate([mx, ox]), np.concatenate([my, oy])
    member = np.arange(2 * n) < n
    lr = _SH_LR.value if _SH_LR.value > 0 else float(cfg.client.lr)
    if _SH_TRAINER.value == 'federated':    # the shadows: runs of the target's config, lanes of one program
      from fedjax_flat.training import shadows as shadows_lib
      raw_x = np.concatenate([np.asarray(data.x[np.sort(mi_idx)]), np.asarray(tx[np.sort(mo_idx)])])
      home = shadows_lib.home_clients(data, np.sort(mi_idx), n, _SEED.value)
      masks = mi.shadow_masks(_SHADOWS.value, 2 * n, _SEED.value)
      sets = shadows_lib.shadow_datasets(data, raw_x, y, home, masks)
      trained, _ = shadows_lib.train_shadow_runs(cfg, sets, os.path.join(out, 'shadows'), seed=_SEED.value)
      res = mi.lira_from_shadows(model.apply, params, x, y, member, trained, masks)
    else:
      res = mi.lira(model.init, model.apply, params, x, y, member, jax.random.key(_SEED.value),
                    num_shadows=_SHADOWS.value, epochs=_SH_EPOCHS.value, batch_size=_SH_BATCH.value, lr=lr,
                    weight_decay=float(cfg.client.get('weight_decay', 0.0) or 0.0), seed=_SEED.value)
    rep['lira'] = {**mi.attack_report(res['scores'][member], res['scores'][~member], delta, _ALPHA.value,
                                      _SEED.value),
                   'shadow_trainer': _SH_TRAINER.value,
                   'num_shadows': _SHADOWS.value, 'shadow_epochs': _SH_EPOCHS.value, 'shadow_lr': lr,
                   'fixed_variance': res['fixed_variance'],
                   'shadow_heldout_accuracy': res['shadow_heldout_accuracy'], 'seconds': time.time() - t0}
  if dp_on:
    leaves = len(jax.tree_util.tree_leaves(trainer.plan.param_shapes))
    rep['accountant_epsilon'] = float(dp_lib.epsilon(cfg, report['round'], int(data.num_clients), leaves))
    rep['accountant_delta'] = float(cfg.dp.delta)
  with open(os.path.join(out, 'membership.json'), 'w') as f:
    json.dump(rep, f, indent=2)
  report['membership'] = rep
  acct = (f"; accountant epsilon {rep['accountant_epsilon']:.3g} at delta {rep['accountant_delta']:g}"
          if dp_on else '; no DP (accountant epsilon inf)')
  for name in ('loss_threshold', 'lira'):
    if name in rep:
      r = rep[name]
      print(f"membership ({name}): AUC {r['auc']:.3f}, TPR@1%FPR {r['tpr_at_fpr_0.01']:.3f}, "
            f"epsilon lower bound {r['epsilon_lower_bound']:.3f} ({100 * r['confidence']:.0f}% confidence, "
            f"delta {delta:g}){acct}")


def _markdown(report) -> str:
  lines = [f"# Privacy attacks on {report['workdir']} (round {report['round']}, model {report['model']})", '']
  inv = report.get('inversion')
  if inv:
    lines += ['## Gradient inversion', '',
              f"client {inv['client']}, {inv['num_images']} images, upload {inv['upload']}"
              + (f" ({inv['local_steps']} {inv['client_optimizer']} steps, batch {inv['local_batch']})"
                 if inv['upload'] == 'local' else '')
              + (f", DP view {inv['dp_noise']} (clip {inv['dp_clip']:g}, noise std {inv['dp_noise_std']:.3g}; "
                 f"cos(observed, sent) {inv['observed_cosine_to_sent']:.3f})" if inv['dp_noise'] != 'none' else '')
              + f", labels {inv['labels']}, {inv['steps']} steps: cosine {inv['cosine_start']:.3f} -> "
              f"{inv['cosine_end']:.3f}", '',
              '| image | PSNR dB | SSIM | random PSNR dB | random SSIM |', '|---|---|---|---|---|']
    lines += [f'| {i} | {p:.2f} | {s:.3f} | {pr:.2f} | {sr:.3f} |' for i, (p, s, pr, sr) in
              enumerate(zip(inv['psnr'], inv['ssim'], inv['psnr_random'], inv['ssim_random']))]
    lines.append('')
  mem = report.get('membership')
  if mem:
    eps = mem.get('accountant_epsilon', math.inf)
    lines += ['## Membership inference', '',
              f"{mem['num_members']} members (training examples) vs {mem['num_nonmembers']} non-members (test); "
              f"train accuracy {mem['train_accuracy']:.3f}, test accuracy {mem['test_accuracy']:.3f}", '',
              '| attack | AUC | TPR@1%FPR | eps lower bound | confidence | delta | accountant eps |',
              '|---|---|---|---|---|---|---|']
    for name in ('loss_threshold', 'lira'):
      if name in mem:
        r = mem[name]
        lines.append(f"| {name} | {r['auc']:.3f} | {r['tpr_at_fpr_0.01']:.3f} | {r['epsilon_lower_bound']:.3f} | "
                     f"{r['confidence']:.2f} | {r['delta']:g} | {eps:.3g} |")
    lines.append('')
  return '\n'.join(lines)


def main(argv):
  check_flags(argv)
  import jax
  from fedjax_flat.core.batch_stats import trainable_view
  from fedjax_flat.models.base import float32_model
  from fedjax_flat.tasks.base import DenseClassification
  from fedjax_flat.training.reload import load_run   # the run's trainer, params and round, read-only
  wd = _WORKDIR.value
  trainer, params, step = load_run(wd, _MODEL.value)
  if isinstance(trainer.task, DenseClassification) or getattr(trainer.data, 'label_shape', ()) != ():
    raise BadInputError(f'{wd}: the attacks need a classification run with one label per example (task '
                        f'{trainer.task.name!r})')
  model, params = trainable_view(float32_model(trainer.model), params)
  params = jax.tree_util.tree_map(jax.numpy.asarray, params)
  out = _OUT.value or os.path.join(wd, 'privacy_attacks')
  os.makedirs(out, exist_ok=True)     # only once the run has loaded: a wrong --workdir gets no folder
  report = {'workdir': os.path.abspath(wd), 'round': int(step), 'model': _MODEL.value}
  if _ATTACK.value in ('all', 'inversion'):
    _inversion(trainer, model, params, out, report)
  if _ATTACK.value in ('all', 'membership'):
    _membership(trainer, model, params, out, report)
  path = os.path.join(out, 'privacy_attacks.md')
  with open(path, 'w') as f:
    f.write(_markdown(report))
  print(f'report: {path}')


if __name__ == '__main__':
  cli.run_main(main)   # every error one line and its exit status (training/cli.py)
