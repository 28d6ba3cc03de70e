"""Round validation data in the round batches (FedSoup's model selection needs each client's validation split
after local training, inside the round program).

Without an engine change, the validation examples travel in the round batches: an algorithm that declares the
hyperparameter `val_source` ('val' | 'local_test') gets every client's validation (or local test) examples
appended as S_val extra steps AFTER its padded training steps, with a per-example flag batch['split']
(0 = train, 1 = validation) on every step (`append_validation_steps`; the Trainer calls it in prepare_round).
S_val = ceil(max_k |val_k| / B) is fixed per run: no recompilation.
Caveat: the train augmentation (config.augment) is applied by the engine to those steps too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from fedjax_flat.data import batching
from fedjax_flat.errors import ConfigError

VAL_SOURCES = ('val', 'local_test')


def round_validation_source(config, defaults: dict) -> Optional[str]:
  """'val' | 'local_test' if the configured algorithm declares the hyperparameter `val_source` (`defaults`: its
  registered hyperparameters), else None."""
  if 'val_source' not in defaults:
    return None
  src = config.algo.get('val_source', defaults['val_source'])
  if src not in VAL_SOURCES:
    raise ConfigError('algo.val_source', src, f'allowed values: {list(VAL_SOURCES)}')
  return src


def client_validation_examples(data, k: int, source: str):
  if source == 'val':
    return data.client_val_examples(k)
  return data.client_test_examples(k)


def check_validation_data(data, source: str) -> None:
  if source == 'val' and not hasattr(data, 'client_val_examples'):
    raise ConfigError('algo.val_source', source, f"dataset {getattr(data, 'name', '?')!r} has no per-client "
                      "validation splits; use a dataset with them (digits_feature_shift) or "
                      "algo.val_source='local_test'")
  if source == 'local_test' and getattr(data, 'client_test_offsets', None) is None:
    raise ConfigError('algo.val_source', source, f"dataset {getattr(data, 'name', '?')!r} has no per-client "
                      'test splits')


def validation_num_steps(data, source: str, batch_size: int) -> int:
  check_validation_data(data, source)
  sizes = [len(client_validation_examples(data, k, source)[1]) for k in range(data.num_clients)]
  return max(1, int(math.ceil(max(sizes) / batch_size)))


@dataclasses.dataclass
class ValRoundBatches(batching.RoundBatches):
  split: np.ndarray = None   # [C, S + S_val, B] float32: 1 = validation example

  def as_dict(self):
    return {**super().as_dict(), 'split': self.split}


def append_validation_steps(rb, data, source: str, num_val_steps: int) -> ValRoundBatches:
  """Appends each client's validation examples (fixed order, masked padding) as the last steps."""
  c, s, b = rb.mask.shape
  vx = np.zeros((c, num_val_steps, b) + rb.x.shape[3:], rb.x.dtype)
  vy = np.zeros((c, num_val_steps, b), rb.y.dtype)
  vm = np.zeros((c, num_val_steps, b), np.float32)
  for i, k in enumerate(rb.client_ids):
    if k < 0:
      continue
    x, y = client_validation_examples(data, int(k), source)
    n = len(y)
    if n > num_val_steps * b:
      raise ValueError(f'client {k} has {n} validation examples > {num_val_steps} steps x {b}')
    vx[i].reshape((-1,) + vx.shape[3:])[:n] = x
    vy[i].reshape(-1)[:n] = y
    vm[i].reshape(-1)[:n] = 1.0
  split = np.concatenate([np.zeros_like(rb.mask), np.ones_like(vm)], axis=1)
  client = None if rb.client is None else batching.client_steps(rb.client_ids, split.shape[1])
  return ValRoundBatches(np.concatenate([rb.x, vx], 1), np.concatenate([rb.y, vy], 1),
                         np.concatenate([rb.mask, vm], 1), rb.num_examples, rb.client_ids, client=client,
                         split=split)
