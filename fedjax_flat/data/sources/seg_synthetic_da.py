"""A synthetic FFREEDA set (LADD, thesis §5.3): a labelled source domain and unlabelled styled target clients.

The stand-in for GTA5 -> Cityscapes / CrossCity / Mapillary, small enough for a CPU. Images and label maps are
drawn as in `seg_synthetic` (background + shapes of 3 classes, 255 on shape borders; classes 0..3):

  source          `source_examples` images in the neutral style (x unchanged), uniform class frequencies:
                  the server's labelled data, used for pre-training only (`ds.source_x`, `ds.source_y`)
  target styles   `num_styles` planted styles (colour gain / offset / gamma, `seg_synthetic.apply_domain_style`,
                  drawn with a margin between them) with their own class frequencies (Dirichlet(class_alpha))
  target clients  `clients_per_style` clients per style, `examples_per_client` images each, with a small
                  client-level jitter of the style (`client_jitter`); `ds.client_style` [K] is the planted style
                  of each client (what style clustering should find)
  target test     `test_per_style` images per style, held out: the global test set (`test_x`, `test_y`), one test
                  client per style (`test_client_names` = style names), `ds.test_style` [N_test]

The target clients' label maps ARE stored in `ds.y`: the oracles (federated / centralized supervised target
training) need them. The FFREEDA algorithms (algorithms/ladd.py) never read them: their client loss is computed
from the images alone (tests/algorithms/test_ladd.py checks that changing `y` changes nothing).

Everything is a function of the arguments (numpy Generators keyed by (seed, part, index)).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.data.sources import seg_synthetic
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT

CLASS_NAMES = seg_synthetic.CLASS_NAMES
IGNORE = seg_synthetic.IGNORE


def planted_styles(num_styles: int, seed: int, min_gap: float = 0.3, tries: int = 20000):
  """(gain [S, 3], offset [S, 3], gamma [S]): styles whose mean colours (per channel, over a fixed probe set of
  rendered images) are at least `min_gap` apart (L2, in [0, 1] units) pairwise: rejection sampling keyed by the
  seed. The mean colour is the FFT's DC term, the centre of the FDA style window, so the planted groups are what
  style clustering can separate; client jitter and image content move it by a few hundredths."""
  rng = np.random.default_rng([seed, 11])
  probe, _ = seg_synthetic.render(np.random.default_rng([seed, 10]), 8, (16, 16), np.full(3, 1.0 / 3))
  gains, offsets, gammas, means = [], [], [], []
  for _ in range(tries):
    if len(gains) == num_styles:
      break
    g = rng.uniform(0.45, 1.55, 3).astype(np.float32)
    o = rng.uniform(-0.1, 0.1, 3).astype(np.float32)
    gm = np.float32(np.exp(rng.uniform(np.log(0.6), np.log(1.7))))
    m = seg_synthetic.apply_domain_style(probe, g, o, gm).mean(axis=(0, 1, 2))
    if all(np.linalg.norm(m - q) >= min_gap for q in means):
      gains.append(g)
      offsets.append(o)
      gammas.append(gm)
      means.append(m)
  if len(gains) < num_styles:
    raise ValueError(f'could not draw {num_styles} styles {min_gap} apart; lower num_styles')
  return np.stack(gains), np.stack(offsets), np.asarray(gammas, np.float32)


def load(*, num_styles: int = 4, clients_per_style: int = 4, examples_per_client: int = 12,
         source_examples: int = 96, test_per_style: int = 16, image_size: Sequence[int] = (32, 32),
         max_shapes: int = 3, class_alpha: float = 2.0, client_jitter: float = 0.04, ignore_border: bool = True,
         seed: int = 0) -> FederatedDataset:
  """Builds the dataset (see the module docstring)."""
  for name, v in (('num_styles', num_styles), ('clients_per_style', clients_per_style),
                  ('examples_per_client', examples_per_client), ('source_examples', source_examples),
                  ('test_per_style', test_per_style)):
    if int(v) < 1:
      raise ValueError(f'{name}={v} must be >= 1')
  size = (int(image_size[0]), int(image_size[1]))
  gain, offset, gamma = planted_styles(num_styles, seed)
  class_probs = np.random.default_rng([seed, 12]).dirichlet(np.full(3, float(class_alpha)), num_styles)
  to8 = lambda a: np.round(a * 255.0).astype(np.uint8)  # noqa: E731

  src_x, src_y = seg_synthetic.render(np.random.default_rng([seed, 13]), source_examples, size,
                                      np.full(3, 1.0 / 3), max_shapes, ignore_border)
  xs, ys, clients, client_style = [], [], [], []
  n = 0
  for s in range(num_styles):
    for c in range(clients_per_style):
      rng = np.random.default_rng([seed, 14, s, c])
      cg = gain[s] * np.exp(rng.normal(0, client_jitter, 3)).astype(np.float32)
      co = offset[s] + rng.normal(0, client_jitter / 2, 3).astype(np.float32)
      x, y = seg_synthetic.render(rng, examples_per_client, size, class_probs[s], max_shapes, ignore_border)
      xs.append(to8(seg_synthetic.apply_domain_style(x, cg, co, gamma[s])))
      ys.append(y)
      clients.append(np.arange(n, n + examples_per_client))
      n += examples_per_client
      client_style.append(s)
  test_x, test_y, test_style, pops = [], [], [], []
  for s in range(num_styles):
    rng = np.random.default_rng([seed, 15, s])
    x, y = seg_synthetic.render(rng, test_per_style, size, class_probs[s], max_shapes, ignore_border)
    test_x.append(to8(seg_synthetic.apply_domain_style(x, gain[s], offset[s], gamma[s])))
    test_y.append(y)
    test_style.append(np.full(test_per_style, s, np.int32))
    pops.append(np.arange(s * test_per_style, (s + 1) * test_per_style))
  ds = FederatedDataset.from_client_indices(
      np.concatenate(xs), np.concatenate(ys), clients, np.concatenate(test_x), np.concatenate(test_y),
      num_classes=len(CLASS_NAMES), name=f'seg_synthetic_da(styles={num_styles},clients={len(clients)})',
      client_names=[f's{client_style[k]}_c{k % clients_per_style}' for k in range(len(clients))],
      test_population_indices=pops, test_client_names=[f'style{s}' for s in range(num_styles)],
      task=seg_tasks.Segmentation(ignore_index=IGNORE))
  ds.class_names = CLASS_NAMES
  ds.ignore_index = IGNORE
  ds.source_x, ds.source_y = to8(src_x), src_y
  ds.client_style = np.asarray(client_style, np.int32)
  ds.test_style = np.concatenate(test_style)
  ds.planted_styles = {'gain': gain, 'offset': offset, 'gamma': gamma, 'class_probs': class_probs}
  return ds


FIELDS = dict(SEG_AUGMENT, crop=(32, 32), scale=(0.75, 1.5), num_styles=4, clients_per_style=4,
              examples_per_client=12, source_examples=96, test_per_style=16, image_size=(32, 32), max_shapes=3,
              class_alpha=2.0, client_jitter=0.04, ignore_border=True, seed=0)


def _is_int(v):
  return isinstance(v, int) and not isinstance(v, bool)


def check_fields(d) -> None:
  """The generator's fields (config.data), before anything is built: ConfigError naming the field."""
  size = d['image_size']
  check_arg('image_size', size, isinstance(size, (tuple, list)) and len(size) == 2
            and all(_is_int(v) and v >= 8 for v in size), 'two integers >= 8 (H, W)')
  for k in ('num_styles', 'clients_per_style', 'examples_per_client', 'source_examples', 'test_per_style',
            'max_shapes'):
    check_arg(k, d[k], _is_int(d[k]) and d[k] >= 1, 'an integer >= 1')
  check_arg('num_styles', d['num_styles'], d['num_styles'] <= 8, 'at most 8 planted styles (they are drawn apart)')
  for k, open_lo in (('class_alpha', True), ('client_jitter', False)):
    v = d[k]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and (v > 0 if open_lo else v >= 0)
    check_arg(k, v, ok, f'a finite number {">" if open_lo else ">="} 0')
  check_arg('ignore_border', d['ignore_border'], isinstance(d['ignore_border'], bool), 'True or False')


@register('seg_synthetic_da', task='segmentation', fields=FIELDS, check=check_fields)
def _seg_synthetic_da(num_styles=4, clients_per_style=4, examples_per_client=12, source_examples=96,
                      test_per_style=16, image_size=(32, 32), max_shapes=3, class_alpha=2.0, client_jitter=0.04,
                      ignore_border=True, seed=0, **unused):
  del unused
  return load(num_styles=num_styles, clients_per_style=clients_per_style, examples_per_client=examples_per_client,
              source_examples=source_examples, test_per_style=test_per_style, image_size=image_size,
              max_shapes=max_shapes, class_alpha=class_alpha, client_jitter=client_jitter,
              ignore_border=ignore_border, seed=seed)
