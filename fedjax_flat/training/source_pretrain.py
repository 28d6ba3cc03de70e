"""Server pre-training on the labelled source domain (LADD, thesis §5.3 step 2): FDA pre-training and source only.

The release's `fda_inv` pre-training: every source image the server loads is restyled with a style drawn
uniformly from the clients' style bank (amplitude window swap, data/transforms/fda.py), then augmented; SGD with
momentum 0.9, no weight decay, lr 5e-3 with the poly schedule lr_t = lr (1 - t / T) ** 0.9 over the T steps;
the source loss is cross-entropy over the hardest 25% of each image's pixels (the release's `hnm` flag:
tasks/segmentation.Segmentation's ohem='topk'). Without a bank (style 'none') it is the source-only model.
The result is written with models/pretrained.save_params (.npz: no pickle), which `config.init.pretrained` and
`load_source_model` read back with shape checks: pre-train once, reuse it for every federated run.

One step (`make_step`, one jitted program) serves both data paths:
  * in memory (`pretrain_source`: arrays, the synthetic set and benchmarks/studies/ladd_synthetic.py);
  * streamed from files (`train` over any source with `num_examples` / `examples(indices)`, e.g. GTA5's
    data/sources/segmentation.SegmentationSource: each step's images decoded on a thread pool ahead of the
    device, data/prefetch.py; never the whole set in memory).
Step t (everything random is a function of (seed, t), so a resumed run is bit-identical):
  keys = split(fold_in(PRNGKey(seed), t), 4) -> (batch, style, augmentation, dropout)
  batch = the first B of a permutation of the N source images (uniform without replacement within the step)
  x -> [0, 1] -> FDA restyle with a random bank style (at the styles' resolution when the images are another
  size: the release resizes every image to 1024 x 512 for the swap and back) -> augmentation -> normalization
  (mean = std = 0.5) -> loss, gradient, SGD update; BatchNorm statistics written after the step.
Augmentation: the in-memory default is a random horizontal flip per image; the streamed binary passes the
release's (data/transforms/augment.make_seg_augment: random scale 0.7-2, 512 x 1024 crop padded with the ignore
label, colour jitter 0.5; GTA5 gets no flip in the release's transform).

`run(config, workdir)` (experiments/pretrain_source.py): the source (config.source_pretrain.dataset, or the
target's in-memory source), the target clients' styles (`fda.client_styles` over the target's training split,
one client at a time: the bank the LADD trainer clusters), the streamed training with checkpoints every
`checkpoint_every` steps (WORKDIR/pretrain_checkpoint.npz: params, optimizer state, step, losses, the run's
fingerprint; atomic), then WORKDIR/source_model.npz and its evaluation on the target's test set (mIoU and
per-class IoU, evaluation/evaluator.py) -> metrics.jsonl, summary.json / summary.md with config.published;
the style bank is kept as WORKDIR/style_bank.npy.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import glob
import hashlib
import io
import json
import logging
import os
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat import errors
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.config import validate as validate_lib
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.prefetch import prefetch_map
from fedjax_flat.data.transforms import augment as augment_lib
from fedjax_flat.data.transforms import fda
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.evaluation import evaluator as evaluator_lib
from fedjax_flat.models import pretrained as pretrained_lib
from fedjax_flat.models import registry as model_registry
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.training import init as init_lib
from fedjax_flat.training import workdir as workdir_lib
from fedjax_flat.training import writers

log = logging.getLogger(__name__)

CHECKPOINT = 'pretrain_checkpoint.npz'
SOURCE_MODEL = 'source_model.npz'
STYLE_BANK = 'style_bank.npy'      # [K, 2b+1, 2b+1, 3] float32: the target clients' styles (source_fda)
MEAN = STD = (0.5, 0.5, 0.5)      # the release's normalization of GTA5 and the targets


class PretrainCheckpointError(errors.BadInputError):
  """The workdir's checkpoint belongs to another pre-training run (or is not one)."""


class PretrainDivergedError(errors.OperationError):
  """A non-finite source loss."""


def normalize(x):
  """The release's normalization: uint8 / [0, 1] images -> (x - 0.5) / 0.5 (mean = std = 0.5)."""
  return (fda.to_unit(x) - 0.5) / 0.5


# ----------------------------------------------------------------------------------------------------
# The step: one definition for the in-memory and the streamed paths.


def step_keys(seed: int, t):
  """(batch, style, augmentation, dropout) keys of step t."""
  return jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), t), 4)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _indices(seed, t, n, bs):
  return jax.random.permutation(step_keys(seed, t)[0], n)[:bs]


def batch_indices(seed: int, t: int, n: int, batch_size: int) -> np.ndarray:
  """The source images of step t: the first `batch_size` of a permutation of n keyed by (seed, t)."""
  return np.asarray(_indices(int(seed), jnp.int32(t), int(n), int(batch_size)))


def restyle(rng, x, bank, b: int = fda.FDA_B, style_size: Optional[Tuple[int, int]] = None):
  """Every image of x [B, H, W, 3] in [0, 1] with a random bank style. The styles were taken from images of
  `style_size` (their amplitudes scale with the pixel count): images of another size are resized to it (bicubic)
  for the swap and back, as the release's StyleAugment does at 1024 x 512."""
  if style_size is None or tuple(style_size) == tuple(x.shape[1:3]):
    return fda.restyle_batch(rng, x, bank, b)
  n, _, _, c = x.shape
  small = jnp.clip(jax.image.resize(x, (n, *style_size, c), 'cubic'), 0.0, 1.0)
  return jnp.clip(jax.image.resize(fda.restyle_batch(rng, small, bank, b), x.shape, 'cubic'), 0.0, 1.0)


def optimizer(steps: int, lr: float = 5e-3, power: float = 0.9, momentum: float = 0.9):
  """SGD with momentum, lr_t = lr (1 - t / steps) ** power (the release's poly policy), no weight decay."""
  return optax.sgd(optax.polynomial_schedule(lr, 0.0, power, steps), momentum=momentum)


def make_step(model, tx, *, seed: int = 0, task=None, styles=None, fda_b: int = fda.FDA_B,
              style_size: Optional[Tuple[int, int]] = None, augment: Optional[Callable] = None,
              prep: Callable = normalize):
  """step(params, opt_state, x [B, H, W, 3] uint8 or [0, 1], y [B, H, W], t) -> (params, opt_state, loss), jitted.

  augment: a Transform (rng, batch) -> batch returning normalized x (make_seg_augment); None = a random flip
  then `prep`."""
  task = seg_tasks.Segmentation(ignore_index=255) if task is None else task
  loss_fn = local_lib.make_loss(model, task=task)
  bank = None if styles is None else jnp.asarray(styles, jnp.float32)

  @jax.jit
  def step(params, opt_state, x, y, t):
    _, k_style, k_aug, k_drop = step_keys(seed, t)
    x = fda.to_unit(x)
    if bank is not None:
      x = restyle(k_style, x, bank, fda_b, style_size)
    mask = jnp.ones((x.shape[0],), jnp.float32)
    if augment is None:
      x, y = augment_lib.random_flip_pair(k_aug, x, y)
      batch = {'x': prep(x), 'y': y, 'mask': mask}
    else:
      batch = augment(k_aug, {'x': x, 'y': y, 'mask': mask})
    (loss, aux), grads = jax.value_and_grad(lambda p: loss_fn(p, batch, k_drop), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if len(aux) > 2:     # BatchNorm: the running statistics of this step's forward pass
      params = {**params, 'batch_stats': aux[2]}
    return params, opt_state, loss
  return step


class ArraySource:
  """In-memory source images (uint8 [N, H, W, 3], labels [N, H, W]) with the streamed sources' interface."""

  def __init__(self, x, y):
    self.x, self.y = np.asarray(x), np.asarray(y)
    if len(self.x) != len(self.y) or len(self.x) == 0:
      raise ValueError(f'{len(self.x)} source images for {len(self.y)} label maps (need as many, >= 1)')

  @property
  def num_examples(self) -> int:
    return len(self.x)

  def examples(self, indices):
    idx = np.asarray(indices, np.int64)
    return self.x[idx], self.y[idx]


# ----------------------------------------------------------------------------------------------------
# Checkpoints: params, optimizer state, step and losses in one atomic .npz.


def save_checkpoint(path: str, step: int, params, opt_state, losses: np.ndarray, fingerprint: str) -> None:
  leaves = jax.device_get(jax.tree_util.tree_leaves((params, opt_state)))
  arrays = {f'leaf_{i:05d}': np.asarray(v) for i, v in enumerate(leaves)}

  def write(f):
    np.savez(f, step=np.int64(step), losses=np.asarray(losses[:step], np.float32), fingerprint=np.array(fingerprint),
             **arrays)
  writers.atomic_write(path, write, mode='wb')


def load_checkpoint(path: str, params, opt_state, fingerprint: str):
  """(step, params, opt_state, losses [step]) from `path`, or None when there is none. A checkpoint of another
  run (fingerprint) or of other shapes is a PretrainCheckpointError naming the fix."""
  if not os.path.exists(path):
    return None
  with open(path, 'rb') as f:
    raw = f.read()
  with errors.reading(path, 'a pre-training checkpoint (.npz)'):
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
      got = {k: np.asarray(z[k]) for k in z.files}
  like, treedef = jax.tree_util.tree_flatten((params, opt_state))
  fix = 'delete it (or use another --workdir, or --fresh) to start over'
  if str(got.get('fingerprint', '')) != fingerprint:
    raise PretrainCheckpointError(f'{path} is the checkpoint of another pre-training run (config, data or style bank '
                                  f'differ); {fix}')
  leaves = []
  for i, ref in enumerate(like):
    a = got.get(f'leaf_{i:05d}')
    if a is None or a.shape != np.shape(ref) or a.dtype != np.asarray(ref).dtype:
      raise PretrainCheckpointError(f'{path}: leaf {i} does not match the model ({None if a is None else a.shape} '
                                    f'vs {np.shape(ref)}); {fix}')
    leaves.append(jnp.asarray(a))
  step = int(got['step'])
  params, opt_state = jax.tree_util.tree_unflatten(treedef, leaves)
  return step, params, opt_state, np.asarray(got['losses'], np.float32)


def fingerprint(**parts) -> str:
  """sha256 of what determines the run's bits (hyperparameters, seed, data size, style bank, model shapes)."""
  h = hashlib.sha256()
  for k in sorted(parts):
    v = parts[k]
    h.update(k.encode())
    h.update(np.ascontiguousarray(v).tobytes() if isinstance(v, np.ndarray) else json.dumps(v, default=str).encode())
  return h.hexdigest()


# ----------------------------------------------------------------------------------------------------
# The training loop (both paths).


def _eta(seconds: float) -> str:
  s = int(max(seconds, 0))
  return f'{s // 3600}h{s % 3600 // 60:02d}m' if s >= 3600 else f'{s // 60}m{s % 60:02d}s'


def train(model, params, source, *, steps: int, batch_size: int = 16, lr: float = 5e-3, power: float = 0.9,
          momentum: float = 0.9, styles: Optional[np.ndarray] = None, style_size: Optional[Sequence[int]] = None,
          fda_b: int = fda.FDA_B, task=None, seed: int = 0, augment: Optional[Callable] = None,
          prep: Callable = normalize, checkpoint: Optional[str] = None, checkpoint_every: int = 0,
          log_every: int = 0, prefetch: int = 2, on_step: Optional[Callable] = None, run_id: str = '',
          on_start: Optional[Callable] = None) -> Tuple[object, np.ndarray, Dict]:
  """Trains `params` for `steps` steps on `source` (`num_examples`, `examples(indices) -> (x, y)`); returns
  (params, losses [steps], info). With `checkpoint` (a path) the run resumes from it when present and writes it
  every `checkpoint_every` steps, refusing a checkpoint of another run (`run_id`: what else defines it, e.g. the
  config). on_start(first step) is called once the checkpoint (if any) is accepted, on_step(t, loss) after step t
  (1-based)."""
  if steps < 1 or batch_size < 1:
    raise ValueError(f'steps={steps} and batch_size={batch_size} must be >= 1')
  n = int(source.num_examples)
  bs = min(int(batch_size), n)
  tx = optimizer(steps, lr, power, momentum)
  size = None if style_size is None else (int(style_size[0]), int(style_size[1]))
  step_fn = make_step(model, tx, seed=seed, task=task, styles=styles, fda_b=fda_b, style_size=size,
                      augment=augment, prep=prep)
  opt_state = tx.init(params)
  losses = np.zeros(steps, np.float32)
  start, info = 0, {'resumed_from_step': None}
  fp = fingerprint(steps=steps, batch_size=bs, lr=lr, power=power, momentum=momentum, seed=seed, n=n, fda_b=fda_b,
                   style_size=size, augment=augment is not None, run=run_id,
                   styles=np.zeros(0) if styles is None else np.asarray(styles, np.float32),
                   shapes=[(np.shape(v), str(np.asarray(v).dtype)) for v in jax.tree_util.tree_leaves(params)])
  if checkpoint:
    got = load_checkpoint(checkpoint, params, opt_state, fp)
    if got is not None:
      start, params, opt_state, done = got
      losses[:start] = done
      info['resumed_from_step'] = start
      log.info('source pre-training: resumed from step %d of %d (%s)', start, steps, checkpoint)
  if on_start is not None:
    on_start(start)
  t0, t1, last_log = time.time(), None, start      # t1: after the first step (the rate leaves compilation out)
  pool = cf.ThreadPoolExecutor(max(1, int(prefetch)), thread_name_prefix='source-decode')
  # decoded and copied to the device on the pool's threads, ahead of the step that takes them
  load = lambda t: jax.device_put(source.examples(batch_indices(seed, t, n, bs)))     # noqa: E731
  try:
    for t, (x, y) in prefetch_map(pool, load, range(start, steps), max(1, int(prefetch))):
      params, opt_state, loss = step_fn(params, opt_state, x, y, jnp.int32(t))
      losses[t] = float(loss)
      if not np.isfinite(losses[t]):
        raise PretrainDivergedError(f'source pre-training diverged at step {t + 1} (loss {losses[t]}); lower '
                                    'config.source_pretrain.lr')
      done = t + 1
      if t1 is None:
        t1 = time.time()
      if log_every and (done % log_every == 0 or done == steps):
        rate = (done - start - 1) / max(time.time() - t1, 1e-9) if done - start > 1 else 0.0
        log.info('source pre-training step %d/%d: loss %.4f (mean of the last %d), %.2f steps/s, ETA %s', done,
                 steps, float(losses[last_log:done].mean()), done - last_log, rate,
                 _eta((steps - done) / rate) if rate > 0 else '?')
        last_log = done
      if checkpoint and checkpoint_every and done % checkpoint_every == 0 and done < steps:
        save_checkpoint(checkpoint, done, params, opt_state, losses, fp)
      if on_step is not None:
        on_step(done, float(losses[t]))
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
  if checkpoint:
    save_checkpoint(checkpoint, steps, params, opt_state, losses, fp)
  wall = time.time() - t0
  info.update(wall_s=wall, steps_per_s=(steps - start) / max(wall, 1e-9), steps=steps, batch_size=bs,
              num_examples=n, steps_per_s_after_first=(steps - start - 1) / max(time.time() - t1, 1e-9)
              if t1 is not None and steps - start > 1 else None)
  return params, losses, info


def pretrain_source(model, params, source_x, source_y, *, steps: int, batch_size: int = 16, lr: float = 5e-3,
                    power: float = 0.9, momentum: float = 0.9, styles: Optional[np.ndarray] = None,
                    fda_b: int = fda.FDA_B, task=None, seed: int = 0, prep: Callable = normalize,
                    log_every: int = 0, augment: Optional[Callable] = None):
  """Trains `params` on in-memory (source_x uint8 [N, H, W, 3], source_y [N, H, W]) for `steps` steps; returns
  (params, losses [steps]). styles [M, 2b+1, 2b+1, 3] (the bank) restyles every image (None: no style transfer,
  the plain source-only model). The streamed `train` with the arrays as its source."""
  params, losses, _ = train(model, params, ArraySource(source_x, source_y), steps=steps, batch_size=batch_size,
                            lr=lr, power=power, momentum=momentum, styles=styles, fda_b=fda_b, task=task, seed=seed,
                            augment=augment, prep=prep, log_every=log_every, prefetch=1)
  return params, losses


def save_source_model(path: str, params) -> None:
  """The pre-trained checkpoint (.npz, one array per leaf), written atomically."""
  def write(f):
    flat = {k: np.asarray(jax.device_get(v)) for k, v in pretrained_lib.flatten(params).items()}
    np.savez(f, **flat)
  d = os.path.dirname(os.fspath(path))
  if d:
    os.makedirs(d, exist_ok=True)
  writers.atomic_write(path, write, mode='wb')


def load_source_model(model, params_init, path: str):
  """The checkpoint back, every leaf checked against `params_init` (classifier included: same classes)."""
  return pretrained_lib.load_pretrained(model, params_init, path, reinit_classifier=False)


# ----------------------------------------------------------------------------------------------------
# The run of experiments/pretrain_source.py.


def steps_of(config, num_examples: int) -> int:
  s = config.source_pretrain
  return int(s.steps) if s.steps else int(s.epochs) * -(-int(num_examples) // int(s.batch_size))


def build_source(config, target):
  """(source with num_examples / examples, augmentation Transform or None) of config.source_pretrain."""
  s = config.source_pretrain
  if not s.dataset:
    if not hasattr(target, 'source_x'):
      raise errors.ConfigError('source_pretrain.dataset', '', f'dataset {config.dataset!r} carries no source '
                               "images (source_x / source_y): name the source dataset, e.g. 'gta5'")
    return ArraySource(target.source_x, target.source_y), None
  src = data_registry.get_dataset(s.dataset, **s.data.to_dict())
  if tuple(src.class_names) != tuple(getattr(target, 'class_names', ())):
    raise errors.ConfigError('source_pretrain.data.target', s.data.get('target'), f'the source is labelled with '
                             f'{len(src.class_names)} classes, the target {config.dataset!r} has '
                             f'{len(target.class_names)}: map the source onto the target\'s classes')
  declared = data_registry.declared_fields(s.dataset)
  get = lambda k: s.data.get(k, declared[k])     # noqa: E731
  aug = augment_lib.make_seg_augment(crop=tuple(get('crop')) or None, scale=tuple(get('scale')),
                                     mode=get('scale_mode'), flip=get('flip'), jitter=get('jitter'), mean=MEAN,
                                     std=STD)
  return src, aug


def _published(config, miou: float) -> Dict:
  p = config.get('published')
  if p is None or p.get('miou') is None:
    return {}
  out = {'published_source': p.get('source', ''), 'published_miou': float(p.miou)}
  if p.get('miou_std') is not None:
    out['published_miou_std'] = float(p.miou_std)
  out['miou_minus_published'] = 100 * miou - float(p.miou)
  return out


def _summary_md(summary: Dict, class_names: Sequence[str]) -> str:
  lines = [f"# source pre-training ({summary['style']}) -> {summary['dataset']}", '',
           f"source `{summary['source']}` ({summary['num_source_examples']} images), {summary['steps']} steps of "
           f"{summary['batch_size']}, {summary['wall_time_s']:.1f} s ({summary['steps_per_s']:.2f} steps/s this "
           f"process); model `{summary['source_model']}`", '',
           '| | mIoU % | pixel accuracy |', '|---|---|---|',
           f"| target test set | {100 * summary['final_test_miou']:.2f} | {summary['final_test_accuracy']:.4f} |"]
  if 'published_miou' in summary:
    std = summary.get('published_miou_std')
    lines.append(f"| published ({summary['published_source']}) | {summary['published_miou']:.2f}"
                 f"{'' if std is None else f' +- {std:.2f}'} | |")
  lines += ['', '| class | IoU % |', '|---|---|']
  for name, v in zip(class_names, summary['final_test_iou']):
    lines.append(f"| {name} | {'-' if v is None else f'{100 * v:.2f}'} |")
  return '\n'.join(lines) + '\n'


def run(config, workdir: str, *, fresh: bool = False, data=None, on_step: Optional[Callable] = None) -> Dict:
  """Pre-trains on config.source_pretrain's source, writes WORKDIR/source_model.npz, evaluates it on the target's
  test set; returns the summary (also WORKDIR/summary.json, summary.md, metrics.jsonl, config.json)."""
  if config.get('source_pretrain') is None:
    raise errors.ConfigError('source_pretrain', None, 'this config has no source pre-training section: use '
                             'configs/ladd.py:<target>,source_fda or <target>,source_only')
  validate_lib.validate_config(config)
  s = config.source_pretrain
  with workdir_lib.WorkdirLock(workdir):
    workdir = os.path.abspath(workdir)
    workdir_lib.remove_interrupted_writes(workdir)
    for pattern in (f'{CHECKPOINT}.*.tmp', f'{SOURCE_MODEL}.*.tmp', f'{STYLE_BANK}.*.tmp'):   # this run's own
      for p in glob.glob(os.path.join(glob.escape(workdir), pattern)):
        os.remove(p)
    ckpt = os.path.join(workdir, CHECKPOINT)
    if fresh:
      for name in (CHECKPOINT, SOURCE_MODEL, STYLE_BANK, 'metrics.jsonl', 'metrics.csv', 'summary.json', 'summary.md'):
        if os.path.exists(os.path.join(workdir, name)):
          os.remove(os.path.join(workdir, name))
    target = data if data is not None else data_registry.get_dataset(config.dataset, **config.data.to_dict())
    source, aug = build_source(config, target)
    model = model_registry.get_model(config.model, target.num_classes, target.input_shape,
                                     compute_dtype=model_registry.compute_dtype(config),
                                     **config.model_kwargs.to_dict())
    key = jax.random.PRNGKey(config.seed)
    # jitted: one compiled init (cached), where the eager one dispatches every initializer op by op
    params = jax.jit(model.init)(jax.random.fold_in(key, 0), jnp.zeros((1,) + tuple(target.input_shape), jnp.float32))
    if init_lib.requested(config):          # e.g. ImageNet MobileNetV2 weights (the release's backbone)
      params = jax.tree_util.tree_map(jnp.asarray, init_lib.initial_params(config, model, jax.device_get(params)))
    styles = None
    if s.style == 'fda':
      t0 = time.time()
      styles = fda.client_styles(target, int(s.fda_b), max_images=int(s.style_images))
      log.info('style bank: %d target clients, %s window, %.1f s', len(styles), styles.shape[1:], time.time() - t0)
      writers.atomic_write(os.path.join(workdir, STYLE_BANK), lambda f: np.save(f, styles), mode='wb')
    task = tasks_lib.from_config(tasks_lib.task_of(target), config)
    steps = steps_of(config, source.num_examples)
    metrics = writers.MetricsWriter(workdir, tensorboard=False)

    def start(first):       # the checkpoint (if any) is this run's: its config and training records are kept
      writers.atomic_write(os.path.join(workdir, 'config.json'),
                           lambda f: f.write(config.to_json_best_effort(indent=2)))
      _drop_evaluations(metrics.jsonl_path)
      metrics.load_existing(first)

    def record(t, loss):
      if s.log_every and (t % s.log_every == 0 or t == steps):
        metrics.write({'round': t, 'step': t, 'train_loss': loss})
      if on_step is not None:
        on_step(t, loss)
    params, losses, info = train(
        model, params, source, steps=steps, batch_size=int(s.batch_size), lr=float(s.lr), power=float(s.power),
        momentum=float(s.momentum), styles=styles, style_size=tuple(target.input_shape[:2]), fda_b=int(s.fda_b),
        task=task, seed=int(config.seed), augment=aug, checkpoint=ckpt, checkpoint_every=int(s.checkpoint_every),
        log_every=int(s.log_every), prefetch=int(s.prefetch), on_step=record, run_id=_run_id(config), on_start=start)
    model_path = os.path.join(workdir, SOURCE_MODEL)
    save_source_model(model_path, params)
    _, eval_tf = transforms.make_transforms(config, target.num_classes)
    evaluate = evaluator_lib.make_evaluator(config, model, target, task, preprocess=eval_tf)
    res = evaluate(params)
    class_names = list(getattr(target, 'class_names', None) or [str(i) for i in range(target.num_classes)])
    metrics.write({'round': steps, 'step': steps, **{f'test_{k}': v for k, v in res.items()}})
    metrics.close()
    summary = {'experiment': 'source pre-training', 'dataset': config.dataset, 'model': config.model,
               'source': s.dataset or f'{config.dataset} (in memory)', 'style': s.style,
               'num_source_examples': info['num_examples'], 'num_style_clients': 0 if styles is None else len(styles),
               'steps': steps, 'batch_size': info['batch_size'], 'seed': int(config.seed),
               'final_train_loss': float(losses[-max(1, int(s.log_every or 1)):].mean()),
               'final_test_miou': res['miou'], 'final_test_accuracy': res['accuracy'], 'final_test_loss': res['loss'],
               'final_test_iou': res['iou'], 'class_names': class_names,
               **{f'final_test_{k}': v for k, v in res.items() if k.endswith('_miou')},
               **_published(config, res['miou']),
               'source_model': model_path, 'resumed_from_step': info['resumed_from_step'],
               'wall_time_s': info['wall_s'], 'steps_per_s': info['steps_per_s']}
    writers.atomic_write(os.path.join(workdir, 'summary.json'),
                         lambda f: json.dump(summary, f, indent=2, default=float))
    writers.atomic_write(os.path.join(workdir, 'summary.md'), lambda f: f.write(_summary_md(summary, class_names)))
  return summary


def _run_id(config) -> str:
  """What of the config defines the pre-training's bits (not its logging / checkpoint cadence or worker counts)."""
  where = ('num_workers', 'cache_clients', 'data_dir', 'root')      # how and where, not what: data may move
  s = config.source_pretrain.to_dict()
  for k in ('checkpoint_every', 'log_every', 'prefetch'):
    s.pop(k, None)
  s['data'] = {k: v for k, v in s.get('data', {}).items() if k not in where}
  data = {k: v for k, v in config.data.to_dict().items() if k not in where}
  return json.dumps({'source_pretrain': s, 'dataset': config.dataset, 'data': data, 'model': config.model,
                     'model_kwargs': config.model_kwargs.to_dict(), 'seed': config.seed,
                     'segmentation': config.get('segmentation', {}) and config.segmentation.to_dict(),
                     'init': config.init.to_dict() if config.get('init') is not None else {}},
                    sort_keys=True, default=str)


def _drop_evaluations(path: str) -> None:
  """metrics.jsonl without the final evaluation of an earlier process (a resumed run evaluates again)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  keep = []
  for line in lines:
    try:
      r = json.loads(line)
    except json.JSONDecodeError:
      break          # a torn last line
    if not any(k.startswith('test_') for k in r):
      keep.append(line if line.endswith('\n') else line + '\n')
  writers.atomic_write(path, lambda f: f.writelines(keep))
