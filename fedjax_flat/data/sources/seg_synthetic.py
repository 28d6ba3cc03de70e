"""A small synthetic segmentation set with domain styles, for quickstart-sized federated segmentation demos.

Each image is a textured background with 1..max_shapes random shapes; the label map holds the shape class
of every pixel: 0 background, 1 rectangle (rotated), 2 disc, 3 triangle; the one-pixel inner border of each
shape is 255 (ignore), as Cityscapes/VOC leave object boundaries unlabelled. Shapes are drawn in order, so
later shapes occlude earlier ones. Shape colours are class-correlated (a base colour per class plus noise)
so that appearance matters, as in real driving scenes.

Domains imitate FedDrive's appearance shift (IDDA weather / viewpoint, Cityscapes cities): domain d has a
colour cast (per-channel gain and offset), an illumination curve (gamma) and its own class frequencies
(shape classes ~ Dirichlet(class_alpha)); x_styled = clip(x ** gamma * gain + offset, 0, 1). Each training
client belongs to one seen domain (`clients_per_domain` clients per domain), with a small client-level
perturbation of its domain's style (`client_jitter`): the heterogeneous, one-domain-per-client split.
The last `unseen_domains` domains never train: they form the unseen-domain test client.

Returned FederatedDataset (uint8 images [N, H, W, 3], uint8 label maps [N, H, W]):
  training clients        K = (num_domains - unseen_domains) * clients_per_domain, examples_per_client each
  client_test_examples(k) client k's held-out images (its own style): personalized / FedBN evaluation
  test clients            a separate population: 'seen' (every training client's held-out images) and
                          'unseen' (unseen_test_per_domain images of each unseen domain)
  test_examples()         seen + unseen together
task: 'segmentation' (seg_tasks.Segmentation: OHEM loss, mIoU and per-class IoU, ignore index 255).
Extra attributes: class_names, ignore_index, domain_names, unseen_domain_ids, client_domain [K],
test_domain [N_test], domain_styles (gain, offset, gamma per domain).

Everything is a function of the arguments (numpy Generators keyed by (seed, part, index)); the default set
(6 domains, 12 clients, 64 x 64) is generated in well under a second.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.registry import check_rules, register
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT, number, pair
from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import Flag

CLASS_NAMES = ('background', 'rectangle', 'disc', 'triangle')
IGNORE = 255
# Base fill colours of the shape classes (RGB in [0, 1]); background colours are drawn per image.
_CLASS_COLOURS = np.array([[0.85, 0.25, 0.2], [0.2, 0.35, 0.85], [0.9, 0.8, 0.2]], np.float32)


def domain_styles(num_domains: int, seed: int):
  """Per-domain (gain [D, 3], offset [D, 3], gamma [D]) of the colour/illumination shift."""
  rng = np.random.default_rng([seed, 1])
  gain = rng.uniform(0.55, 1.45, (num_domains, 3)).astype(np.float32)
  offset = rng.uniform(-0.12, 0.12, (num_domains, 3)).astype(np.float32)
  gamma = np.exp(rng.uniform(np.log(0.6), np.log(1.7), num_domains)).astype(np.float32)
  return gain, offset, gamma


def apply_domain_style(x: np.ndarray, gain, offset, gamma) -> np.ndarray:
  """x float [..., 3] in [0, 1] -> clip(x ** gamma * gain + offset, 0, 1)."""
  return np.clip(np.power(x, gamma) * gain + offset, 0.0, 1.0)


def _texture(rng, h: int, w: int) -> np.ndarray:
  """A [h, w] texture in about [0.6, 1.4]: two oriented sinusoids and pixel noise."""
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
  t = np.ones((h, w), np.float32)
  for _ in range(2):
    theta, freq, phase = rng.uniform(0, np.pi), rng.uniform(0.15, 0.8), rng.uniform(0, 2 * np.pi)
    t += 0.15 * np.sin(freq * (np.cos(theta) * xx + np.sin(theta) * yy) + phase)
  return t + rng.normal(0, 0.05, (h, w)).astype(np.float32)


def _shape_mask(rng, cls: int, h: int, w: int) -> np.ndarray:
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
  side = min(h, w)
  cy, cx = rng.uniform(0.15, 0.85) * h, rng.uniform(0.15, 0.85) * w
  if cls == 1:                                  # rotated rectangle
    hh, hw, th = rng.uniform(0.1, 0.25) * side, rng.uniform(0.1, 0.35) * side, rng.uniform(0, np.pi)
    dy, dx = yy - cy, xx - cx
    u, v = np.cos(th) * dx + np.sin(th) * dy, -np.sin(th) * dx + np.cos(th) * dy
    return (np.abs(u) <= hw) & (np.abs(v) <= hh)
  if cls == 2:                                  # disc
    r = rng.uniform(0.1, 0.25) * side
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
  r, th = rng.uniform(0.15, 0.35) * side, rng.uniform(0, 2 * np.pi)   # triangle: 3 vertices around the centre
  ang = th + np.array([0, 2 * np.pi / 3, 4 * np.pi / 3]) + rng.uniform(-0.3, 0.3, 3)
  vy, vx = cy + r * np.sin(ang), cx + r * np.cos(ang)
  inside = []
  for i in range(3):
    j = (i + 1) % 3
    inside.append((vx[j] - vx[i]) * (yy - vy[i]) - (vy[j] - vy[i]) * (xx - vx[i]))
  inside = np.stack(inside)
  return np.all(inside >= 0, axis=0) | np.all(inside <= 0, axis=0)


def _inner_border(label: np.ndarray) -> np.ndarray:
  """Foreground pixels with a 4-neighbour of another class (the band marked 255)."""
  diff = np.zeros(label.shape, bool)
  diff[1:] |= label[1:] != label[:-1]
  diff[:-1] |= label[:-1] != label[1:]
  diff[:, 1:] |= label[:, 1:] != label[:, :-1]
  diff[:, :-1] |= label[:, :-1] != label[:, 1:]
  return diff & (label > 0)


def render(rng, n: int, size: Tuple[int, int], class_probs: np.ndarray, max_shapes: int = 3,
           ignore_border: bool = True) -> Tuple[np.ndarray, np.ndarray]:
  """n unstyled images (float32 [n, H, W, 3] in [0, 1]) and label maps (uint8 [n, H, W])."""
  h, w = size
  x = np.empty((n, h, w, 3), np.float32)
  y = np.zeros((n, h, w), np.uint8)
  for i in range(n):
    base = rng.uniform(0.25, 0.75, 3).astype(np.float32)
    img = base * _texture(rng, h, w)[..., None]
    lab = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, max_shapes + 1))):
      cls = int(rng.choice(3, p=class_probs)) + 1
      m = _shape_mask(rng, cls, h, w)
      colour = np.clip(_CLASS_COLOURS[cls - 1] + rng.normal(0, 0.08, 3), 0.05, 0.95).astype(np.float32)
      img[m] = colour * (0.85 + 0.3 * rng.random()) * _texture(rng, h, w)[m][:, None] ** 0.5
      lab[m] = cls
    if ignore_border:
      lab[_inner_border(lab)] = IGNORE
    x[i] = np.clip(img, 0.0, 1.0)
    y[i] = lab
  return x, y


def _to_uint8(x: np.ndarray) -> np.ndarray:
  return np.round(x * 255.0).astype(np.uint8)


def load(*, num_domains: int = 6, unseen_domains: int = 2, clients_per_domain: int = 3,
         examples_per_client: int = 24, client_test_examples: int = 6, unseen_test_per_domain: int = 24,
         image_size: Sequence[int] = (64, 64), max_shapes: int = 3, class_alpha: float = 2.0,
         client_jitter: float = 0.05, ignore_border: bool = True, seed: int = 0) -> FederatedDataset:
  """Builds the dataset (see the module docstring)."""
  if not 1 <= unseen_domains < num_domains:
    raise ValueError(f'unseen_domains={unseen_domains} must be in [1, num_domains={num_domains})')
  for name, v in (('clients_per_domain', clients_per_domain), ('examples_per_client', examples_per_client),
                  ('client_test_examples', client_test_examples),
                  ('unseen_test_per_domain', unseen_test_per_domain)):
    if int(v) < 1:
      raise ValueError(f'{name}={v} must be >= 1')
  size = (int(image_size[0]), int(image_size[1]))
  gain, offset, gamma = domain_styles(num_domains, seed)
  class_probs = np.random.default_rng([seed, 2]).dirichlet(np.full(3, float(class_alpha)), num_domains)
  seen = range(num_domains - unseen_domains)
  xs, ys, clients, client_tests, client_domain = [], [], [], [], []
  test_x, test_y, test_domain = [], [], []
  n = 0
  for d in seen:
    for c in range(clients_per_domain):
      rng = np.random.default_rng([seed, 3, d, c])
      cg = gain[d] * np.exp(rng.normal(0, client_jitter, 3)).astype(np.float32)
      co = offset[d] + rng.normal(0, client_jitter / 2, 3).astype(np.float32)
      x, y = render(rng, examples_per_client + client_test_examples, size, class_probs[d], max_shapes,
                    ignore_border)
      x = _to_uint8(apply_domain_style(x, cg, co, gamma[d]))
      xs.append(x[:examples_per_client])
      ys.append(y[:examples_per_client])
      clients.append(np.arange(n, n + examples_per_client))
      n += examples_per_client
      t0 = sum(len(t) for t in test_y)
      test_x.append(x[examples_per_client:])
      test_y.append(y[examples_per_client:])
      client_tests.append(np.arange(t0, t0 + client_test_examples))
      test_domain.append(np.full(client_test_examples, d, np.int32))
      client_domain.append(d)
  seen_pop = np.concatenate(client_tests)
  t0 = len(seen_pop)
  for d in range(num_domains - unseen_domains, num_domains):
    rng = np.random.default_rng([seed, 4, d])
    x, y = render(rng, unseen_test_per_domain, size, class_probs[d], max_shapes, ignore_border)
    test_x.append(_to_uint8(apply_domain_style(x, gain[d], offset[d], gamma[d])))
    test_y.append(y)
    test_domain.append(np.full(unseen_test_per_domain, d, np.int32))
  n_unseen = unseen_domains * unseen_test_per_domain
  ds = FederatedDataset.from_client_indices(
      np.concatenate(xs), np.concatenate(ys), clients, np.concatenate(test_x), np.concatenate(test_y),
      num_classes=len(CLASS_NAMES), name=f'seg_synthetic(domains={num_domains},unseen={unseen_domains})',
      client_test_indices=client_tests,
      client_names=[f'd{client_domain[k]}_c{k % clients_per_domain}' for k in range(len(clients))],
      test_population_indices=[seen_pop, np.arange(t0, t0 + n_unseen)], test_client_names=['seen', 'unseen'],
      task=seg_tasks.Segmentation(ignore_index=IGNORE))
  ds.class_names = CLASS_NAMES
  ds.ignore_index = IGNORE
  ds.domain_names = [f'domain{d}' for d in range(num_domains)]
  ds.unseen_domain_ids = list(range(num_domains - unseen_domains, num_domains))
  ds.client_domain = np.asarray(client_domain, np.int32)
  ds.test_domain = np.concatenate(test_domain)
  ds.domain_styles = {'gain': gain, 'offset': offset, 'gamma': gamma, 'class_probs': class_probs}
  return ds


# config.data (config/default_config.segmentation_data): augmentation fields + the generator's fields.
FIELDS = dict(SEG_AUGMENT, crop=(64, 64), scale=(0.75, 1.5), num_domains=6, unseen_domains=2, clients_per_domain=3,
              examples_per_client=24, client_test_examples=6, unseen_test_per_domain=24, image_size=(64, 64),
              max_shapes=3, class_alpha=2.0, client_jitter=0.05, ignore_border=True, seed=0)


_COUNT = number(1, integer=True)
RULES = dict(image_size=pair(), num_domains=number(2, integer=True), unseen_domains=_COUNT, clients_per_domain=_COUNT,
             examples_per_client=_COUNT, client_test_examples=_COUNT, unseen_test_per_domain=_COUNT, max_shapes=_COUNT,
             class_alpha=number(0, lo_open=True), client_jitter=number(0), ignore_border=Flag(None))


def check_fields(d) -> None:
  """What spans fields (after RULES): images of at least 8 x 8; at least one domain seen in training."""
  if min(d['image_size']) < 8:
    raise ConfigError('data.image_size', d['image_size'], 'must be at least (8, 8)')
  check_rules(d, {'unseen_domains': number(hi=d['num_domains'] - 1, integer=True)})


@register('seg_synthetic', task='segmentation', fields=FIELDS, rules=RULES, check=check_fields)
def _seg_synthetic(num_domains=6, unseen_domains=2, clients_per_domain=3, examples_per_client=24,
                   client_test_examples=6, unseen_test_per_domain=24, image_size=(64, 64), max_shapes=3,
                   class_alpha=2.0, client_jitter=0.05, ignore_border=True, seed=0, **unused):
  del unused
  return load(num_domains=num_domains, unseen_domains=unseen_domains, clients_per_domain=clients_per_domain,
              examples_per_client=examples_per_client, client_test_examples=client_test_examples,
              unseen_test_per_domain=unseen_test_per_domain, image_size=image_size, max_shapes=max_shapes,
              class_alpha=class_alpha, client_jitter=client_jitter, ignore_border=ignore_border, seed=seed)
