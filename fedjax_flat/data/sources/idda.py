"""IDDA (Alberti, Tavera, Masone, Caputo 2020) for federated semantic segmentation: FedDrive's country /
rainy / bus settings, uniform and heterogeneous splits, 16 classes, seen- and unseen-domain test clients.

IDDA is synthetic (CARLA): 7 towns x 5 viewpoints x 3 weathers = 105 domains, named
`T<town>_<weather>_<viewpoint>` (weathers CN = ClearNoon, CS = ClearSunset, HRN = HardRainNoon; viewpoint B
is the bus of FedDrive's 'bus' setting). FedDrive uses the "IDDA V3" release's `IDDAsmall` folder (obtained
on request from https://idda-dataset.github.io/home/download/). The layout below is what the FedDrive code
(src/dataset/idda.py, src/utils/client_utils.py) and its released split files rely on; no other public
description of IDDAsmall exists, so this is the contract:

  <root>/<domain>/RGB/<id>_<domain>.jpg           RGB, 1920 x 1080
  <root>/<domain>/Semantic/<id>_<domain>.png      label map, raw class values 0..20 in one channel

with <root> = <data_dir>/idda/IDDAsmall by default. The split files hold 104 domains x 60 images
(T07_CN_M is absent). The release reads label PNGs as single-channel (cv2.imread(..., 0) / PIL); should a
copy hold CARLA-style RGB labels, the class is taken from the red channel (CARLA's convention).

Labels: the release's 16-class remap (`remap=True`, `class_eval` in src/dataset/idda.py), raw value ->
train id: 1 building, 2 fence, 4 person, 5 pole, 6 road line + 7 road -> road, 8 sidewalk, 9 vegetation,
10 vehicle -> car, 11 wall, 12 traffic sign, 13 traffic light, 16 bicycle, 17 motorcycle, 18 rider,
19 terrain, 20 sky; 0, 3 and 14, 15 (and anything above 20) -> 255. The 16 classes are Cityscapes' 19 without
truck, bus and train (the release's 16-class colour map uses the Cityscapes colours).

Resolution: the release resizes every image to 1856 x 1024 at load (bicubic; labels nearest) and trains on
random resized crops (area 0.5-2.0) of 512 x 928; its test images are fed at 512 x 928 and the logits
upsampled x2 to the 1024 x 1856 labels. `image_size` defaults to (1024, 1856) accordingly.
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional, Sequence, Tuple

from fedjax_flat.data.sources import feddrive_splits as fds
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources.segmentation import RELEASE_RULES, SegClient, SegmentationSource, lookup_table
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.schema import Choice

RAW_TO_TRAIN = {1: 2, 2: 4, 4: 11, 5: 5, 6: 0, 7: 0, 8: 1, 9: 8, 10: 13, 11: 3, 12: 7, 13: 6, 16: 15, 17: 14,
                18: 12, 19: 9, 20: 10}
CLASS_NAMES = ('road', 'sidewalk', 'building', 'wall', 'fence', 'pole', 'traffic light', 'traffic sign',
               'vegetation', 'terrain', 'sky', 'person', 'rider', 'car', 'motorcycle', 'bicycle')
DEFAULT_IMAGE_SIZE = (1024, 1856)
IMAGE_DIR, LABEL_DIR = 'RGB', 'Semantic'
IMAGE_EXT, LABEL_EXT = '.jpg', '.png'

log = logging.getLogger(__name__)


def default_root(data_dir: str) -> str:
  return os.path.join(data_dir, 'idda', 'IDDAsmall')


def download_hint(data_dir: str) -> str:
  return (f'Get IDDA with: python experiments/download.py --dataset=idda --data_dir={data_dir} (IDDA is '
          f'distributed on request; the command prints where to ask and the expected layout)')


def find_images(root: str) -> List[Tuple[str, str, str]]:
  """(image, label, domain) of every image with a label map; paths relative to root."""
  if not os.path.isdir(root):
    raise FileNotFoundError(f'IDDA: {root} not found (expected <root>/<domain>/{IMAGE_DIR}/*{IMAGE_EXT}). '
                            f'{download_hint(os.path.dirname(os.path.dirname(root)))}')
  out, unlabelled = [], []
  for domain in sorted(os.listdir(root)):
    img_dir = os.path.join(root, domain, IMAGE_DIR)
    if not (fds.IDDA_DOMAIN.match(domain) and os.path.isdir(img_dir)):
      continue
    for f in sorted(os.listdir(img_dir)):
      if f.endswith(IMAGE_EXT):
        label = f'{domain}/{LABEL_DIR}/{f[:-len(IMAGE_EXT)]}{LABEL_EXT}'
        if os.path.isfile(os.path.join(root, label)):
          out.append((f'{domain}/{IMAGE_DIR}/{f}', label, domain))
        else:
          unlabelled.append(f'{domain}/{IMAGE_DIR}/{f}')
  if unlabelled:   # not in any split; said, since a partial extraction looks the same
    log.warning('IDDA: %d images under %s have no %s/ label map and are left out (e.g. %s)', len(unlabelled),
                root, LABEL_DIR, unlabelled[:3])
  if not out:
    raise FileNotFoundError(f'IDDA: no <domain>/{IMAGE_DIR}/*{IMAGE_EXT} with a {LABEL_DIR}/ label map under '
                            f'{root}. {download_hint(os.path.dirname(os.path.dirname(root)))}')
  return out


def _domain(path: str) -> str:
  return path.replace('\\', '/').split('/')[0]


def _to_clients(clients: Sequence[fds.Client]) -> List[SegClient]:
  out = []
  for c in clients:
    doms = [_domain(x) for x in c.x]
    out.append(SegClient(c.name, c.x, c.y, domain=doms[0] if doms and len(set(doms)) == 1 else None,
                         example_domains=doms))
  return out


def get_split(root: str, setting: str, distribution: str, *, data_dir: str, seed: int = 0,
              split_source: str = 'generate', split_dir: str = '') -> fds.Split:
  if setting not in fds.IDDA_SETTINGS:
    raise ValueError(f'setting={setting!r}; allowed: {fds.IDDA_SETTINGS}')
  if split_source == 'released':
    return fds.load_released_split(data_dir, 'idda', distribution, setting, split_dir)
  if split_source != 'generate':
    raise ValueError(f"split_source={split_source!r}; allowed: 'generate', 'released'")
  items = find_images(root)
  path = split_dir or fds.split_dir(data_dir, 'idda', distribution, seed, setting)
  return fds.load_or_make(path, lambda: fds.idda_split(items, setting, distribution, seed),
                          fds.fingerprint([t[0] for t in items]))


def load(data_dir: Optional[str] = None, *, root: str = '', setting: str = 'country',
         distribution: str = 'heterogeneous', split_source: str = 'generate', split_dir: str = '', seed: int = 0,
         image_size: Sequence[int] = DEFAULT_IMAGE_SIZE, double: bool = False, num_workers: int = 2,
         cache_clients: int = 0) -> SegmentationSource:
  """The FedDrive IDDA split as a SegmentationSource (see the module docstring)."""
  data_dir = data_dir or default_data_dir()
  root = root or default_root(data_dir)
  split = get_split(root, setting, distribution, data_dir=data_dir, seed=seed, split_source=split_source,
                    split_dir=split_dir)
  return SegmentationSource(
      name=f'idda_{setting}_{distribution}', image_root=root, label_root=root, clients=_to_clients(split.train),
      test_clients=_to_clients(split.test), lut=lookup_table(RAW_TO_TRAIN), class_names=CLASS_NAMES,
      image_size=tuple(image_size) or None, resample='bicubic', label_rgb_channel=0, double=double,
      num_workers=num_workers, cache_clients=cache_clients, missing_hint=download_hint(data_dir), meta=split.meta)


# config.data (config/default_config.segmentation_data): the FedDrive release's IDDA defaults (images resized
# to 1024 x 1856 at load, random resized crop area 0.5-2.0 to 512 x 928, random flip).
FIELDS = dict(SEG_AUGMENT, crop=(512, 928), scale=(0.5, 2.0), scale_mode='resized_crop', data_dir='', root='',
              setting='country', distribution='heterogeneous', split_source='generate', split_dir='', seed=0,
              image_size=(1024, 1856), double=False, num_workers=2, cache_clients=0)


RULES = dict(RELEASE_RULES, setting=Choice(None, ('country', 'rainy', 'bus'), sort=True))


@register('idda', task='segmentation', fields=FIELDS, rules=RULES)
def _idda(data_dir='', root='', setting='country', distribution='heterogeneous', split_source='generate',
          split_dir='', seed=0, image_size=DEFAULT_IMAGE_SIZE, double=False, num_workers=2, cache_clients=0,
          **unused):
  del unused   # augmentation fields of config.data (crop, scale, style, ...) are read by data/transforms/pipeline.py
  return load(data_dir or None, root=root, setting=setting, distribution=distribution, split_source=split_source,
              split_dir=split_dir, seed=seed, image_size=image_size, double=double, num_workers=num_workers,
              cache_clients=cache_clients)
