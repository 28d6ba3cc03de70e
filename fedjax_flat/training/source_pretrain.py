"""Server pre-training on the labelled source domain with FDA style transfer (LADD, thesis §5.3 step 2).

The release's `fda_inv` pre-training: every source image the server loads is restyled with a style drawn
uniformly from the clients' style bank (amplitude window swap, data/transforms/fda.py), then augmented; SGD with
momentum 0.9, no weight decay, lr 5e-3 with the poly schedule lr_t = lr (1 - t / T) ** 0.9 over the T steps;
the source loss is cross-entropy over the hardest 25% of each image's pixels (the release's `hnm` flag:
tasks/segmentation.Segmentation's ohem='topk', its default). The result is written with
models/pretrained.save_params (.npz: no pickle), which `config.init` and `load_source_model` read back with shape
checks: pre-train once, reuse it for every federated run (source-only, FedAvg + ST, LADD, ...).

Augmentation here: a random horizontal flip per image (keyed by (seed, step)). The release's random scale
(0.7, 2), 1024 x 512 crop and colour jitter 0.5 are not reproduced (the synthetic set's images are small).
Batches: each step draws `batch_size` source images uniformly without replacement within the step, keyed by
(seed, step). Everything is a function of the seed.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.data.transforms import fda
from fedjax_flat.models import pretrained as pretrained_lib
from fedjax_flat.tasks import segmentation as seg_tasks

log = logging.getLogger(__name__)


def normalize(x):
  """The release's normalization: uint8 / [0, 1] images -> (x - 0.5) / 0.5 (mean = std = 0.5)."""
  return (fda.to_unit(x) - 0.5) / 0.5


def pretrain_source(model, params, source_x, source_y, *, steps: int, batch_size: int = 16, lr: float = 5e-3,
                    power: float = 0.9, momentum: float = 0.9, styles: Optional[np.ndarray] = None,
                    fda_b: int = fda.FDA_B, task=None, seed: int = 0, prep: Callable = normalize,
                    log_every: int = 0):
  """Trains `params` on (source_x uint8 [N, H, W, 3], source_y [N, H, W]) for `steps` steps; returns
  (params, losses [steps]). styles [M, 2b+1, 2b+1, 3] (the bank) restyles every image (None: no style transfer,
  the plain source-only model)."""
  if steps < 1 or batch_size < 1:
    raise ValueError(f'steps={steps} and batch_size={batch_size} must be >= 1')
  task = seg_tasks.Segmentation(ignore_index=255) if task is None else task
  loss_fn = local_lib.make_loss(model, task=task)
  sched = optax.polynomial_schedule(lr, 0.0, power, steps)
  tx = optax.sgd(sched, momentum=momentum)
  xs, ys = jnp.asarray(source_x), jnp.asarray(source_y)
  n = xs.shape[0]
  bank = None if styles is None else jnp.asarray(styles, jnp.float32)
  bs = min(int(batch_size), n)

  @jax.jit
  def step(params, opt_state, t):
    key = jax.random.fold_in(jax.random.PRNGKey(seed), t)
    k_idx, k_style, k_flip, k_drop = jax.random.split(key, 4)
    idx = jax.random.permutation(k_idx, n)[:bs]
    x, y = fda.to_unit(xs[idx]), ys[idx]
    if bank is not None:
      x = fda.restyle_batch(k_style, x, bank, fda_b)
    flip = jax.random.bernoulli(k_flip, 0.5, (bs,))
    x = jnp.where(flip[:, None, None, None], x[:, :, ::-1], x)
    y = jnp.where(flip[:, None, None], y[:, :, ::-1], y)
    batch = {'x': prep(x), 'y': y, 'mask': jnp.ones((bs,), jnp.float32)}
    (loss, aux), grads = jax.value_and_grad(lambda p: loss_fn(p, batch, k_drop), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if len(aux) > 2:     # BatchNorm: the running statistics of this step's forward pass
      params = {**params, 'batch_stats': aux[2]}
    return params, opt_state, loss

  opt_state = tx.init(params)
  losses = np.zeros(steps, np.float32)
  for t in range(steps):
    params, opt_state, loss = step(params, opt_state, jnp.int32(t))
    losses[t] = float(loss)
    if log_every and (t + 1) % log_every == 0:
      log.info('source pre-training step %d/%d loss %.4f', t + 1, steps, losses[t])
  return params, losses


def save_source_model(path: str, params) -> None:
  """The pre-trained checkpoint (.npz, one array per leaf)."""
  pretrained_lib.save_params(path, params)


def load_source_model(model, params_init, path: str):
  """The checkpoint back, every leaf checked against `params_init` (classifier included: same classes)."""
  return pretrained_lib.load_pretrained(model, params_init, path, reinit_classifier=False)
