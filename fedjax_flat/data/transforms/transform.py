"""The one training-transform contract: `transform(rng, batch) -> batch`, jit-traceable, per client step.

A batch is {'x', 'y', 'mask'[, 'client']}. A transform may change the inputs only (crop + flip), or the labels
too (mixup's soft labels, a segmentation crop of image and label map together); it declares what it needs:
`needs_client` = the batch must carry 'client' (the step's client id: style transfer excludes the client's own
style), which data/batching.BatchPlan.with_client then provides. The engine, the chain lanes, the centralized
runner, fine-tuning and the grouping passes all call it the same way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True, eq=False)   # identity hash: jit caches on it, a style bank holds arrays
class Transform:
  fn: Callable                 # (rng, batch) -> batch
  needs_client: bool = False   # the batches must carry 'client'
  style_bank: Any = None       # the style-transfer bank it holds (communication accounting), or None

  def __call__(self, rng, batch):
    return self.fn(rng, batch)


def on_inputs(fn: Callable, **kw) -> Transform:
  """A transform of the inputs only: `fn(rng, x) -> x`."""
  return Transform(lambda rng, batch: {**batch, 'x': fn(rng, batch['x'])}, **kw)


def as_transform(fn) -> Transform:
  """A Transform as it is; a plain `fn(rng, x) -> x` lifted to the batch contract; None stays None."""
  if fn is None or isinstance(fn, Transform):
    return fn
  return on_inputs(fn)
