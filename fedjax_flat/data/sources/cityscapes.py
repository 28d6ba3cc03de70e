"""Cityscapes (Cordts et al. 2016) for federated semantic segmentation: FedDrive's uniform / heterogeneous
splits, 19 classes, unseen-city test client.

Files: the official `gtFine_trainvaltest.zip` and `leftImg8bit_trainvaltest.zip`
(https://www.cityscapes-dataset.com/downloads/, login required; `python experiments/download.py
--dataset=cityscapes --data_dir=D` prints the URLs and extracts the zips once they are in D/cityscapes/),
extracted to

  <root>/leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png      RGB, 2048 x 1024
  <root>/gtFine/{train,val}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png        8-bit label ids

with <root> = <data_dir>/cityscapes by default. Labels: the official labelIds -> trainIds table
(cityscapesScripts labels.py): 19 evaluated classes, every other id (void, parking, rail track, guard rail,
bridge, tunnel, pole group, caravan, trailer, license plate, ...) -> 255 = ignore.

Splits (data/sources/feddrive_splits.py): training clients from the 18 train cities (2,975 images), the test client
holds the 500 val images of the 3 unseen cities. FedDrive trains at the native 1024 x 2048 with random scale
(0.5-1.5) + 512 x 1024 crops (config.data.crop / scale, on the device) and evaluates whole images at full
resolution; `image_size` resizes at load (e.g. (512, 1024) for CPU-sized runs).
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

from fedjax_flat.data.sources import feddrive_splits as fds
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources.segmentation import RELEASE_RULES, SegClient, SegmentationSource, lookup_table
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT, number
from fedjax_flat.data.download import default_data_dir

# labelId -> trainId of the 19 evaluated classes (cityscapesScripts helpers/labels.py).
LABEL_TO_TRAIN = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12,
                  26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}
CLASS_NAMES = ('road', 'sidewalk', 'building', 'wall', 'fence', 'pole', 'traffic light', 'traffic sign',
               'vegetation', 'terrain', 'sky', 'person', 'rider', 'car', 'truck', 'bus', 'train', 'motorcycle',
               'bicycle')
# Official image counts per city (train: 2,975 in 18 cities; val: 500 in 3 cities).
TRAIN_CITIES = {'aachen': 174, 'bochum': 96, 'bremen': 316, 'cologne': 154, 'darmstadt': 85, 'dusseldorf': 221,
                'erfurt': 109, 'hamburg': 248, 'hanover': 196, 'jena': 119, 'krefeld': 99, 'monchengladbach': 94,
                'strasbourg': 365, 'stuttgart': 196, 'tubingen': 144, 'ulm': 95, 'weimar': 142, 'zurich': 122}
VAL_CITIES = {'frankfurt': 267, 'lindau': 59, 'munster': 174}
IMAGE_SUFFIX = '_leftImg8bit.png'
LABEL_SUFFIX = '_gtFine_labelIds.png'
URLS = {'gtFine_trainvaltest.zip': 'https://www.cityscapes-dataset.com/file-handling/?packageID=1',
        'leftImg8bit_trainvaltest.zip': 'https://www.cityscapes-dataset.com/file-handling/?packageID=3'}


def default_root(data_dir: str) -> str:
  return os.path.join(data_dir, 'cityscapes')


def download_hint(data_dir: str) -> str:
  return (f'Get Cityscapes with: python experiments/download.py --dataset=cityscapes --data_dir={data_dir} '
          f'(prints the official URLs; the site needs a login)')


def find_images(root: str, split: str) -> List[Tuple[str, str, str]]:
  """(image, label, city) of every image of an official split; paths relative to leftImg8bit/ and gtFine/."""
  img_dir = os.path.join(root, 'leftImg8bit', split)
  if not os.path.isdir(img_dir):
    raise FileNotFoundError(f'Cityscapes: {img_dir} not found (expected <root>/leftImg8bit/{split}/<city>/'
                            f'*{IMAGE_SUFFIX}). {download_hint(os.path.dirname(root))}')
  out = []
  for city in sorted(os.listdir(img_dir)):
    cdir = os.path.join(img_dir, city)
    if not os.path.isdir(cdir):
      continue
    for f in sorted(os.listdir(cdir)):
      if f.endswith(IMAGE_SUFFIX):
        stem = f[:-len(IMAGE_SUFFIX)]
        out.append((f'{split}/{city}/{f}', f'{split}/{city}/{stem}{LABEL_SUFFIX}', city))
  if not out:
    raise FileNotFoundError(f'Cityscapes: no *{IMAGE_SUFFIX} under {img_dir}. {download_hint(os.path.dirname(root))}')
  return out


def _city(path: str) -> str:
  return path.replace('\\', '/').split('/')[1] if path.count('/') >= 2 else ''


def _to_clients(clients: Sequence[fds.Client], per_client_domain: bool) -> List[SegClient]:
  out = []
  for c in clients:
    cities = [_city(x) for x in c.x]
    domain = cities[0] if per_client_domain and cities and len(set(cities)) == 1 else None
    out.append(SegClient(c.name, c.x, c.y, domain=domain, example_domains=cities))
  return out


def get_split(root: str, distribution: str, *, data_dir: str, seed: int = 0, split_source: str = 'generate',
              split_dir: str = '', uniform_clients: int = 146,
              clients_per_city: int = fds.CITYSCAPES_CLIENTS_PER_CITY) -> fds.Split:
  if split_source == 'released':
    return fds.load_released_split(data_dir, 'cityscapes', distribution, split_dir=split_dir)
  if split_source != 'generate':
    raise ValueError(f"split_source={split_source!r}; allowed: 'generate', 'released'")
  train, test = find_images(root, 'train'), find_images(root, 'val')
  fp = fds.fingerprint([t[0] for t in train] + [t[0] for t in test])
  tag = distribution            # non-default client counts get their own saved split
  if distribution == 'uniform' and uniform_clients != 146:
    tag += f'_k{uniform_clients}'
  if distribution == 'heterogeneous' and clients_per_city != fds.CITYSCAPES_CLIENTS_PER_CITY:
    tag += f'_cpc{clients_per_city}'
  path = split_dir or fds.split_dir(data_dir, 'cityscapes', tag, seed)
  return fds.load_or_make(path, lambda: fds.cityscapes_split(
      train, test, distribution, seed, num_clients=uniform_clients, clients_per_city=clients_per_city), fp)


def load(data_dir: Optional[str] = None, *, root: str = '', distribution: str = 'heterogeneous',
         split_source: str = 'generate', split_dir: str = '', seed: int = 0, image_size: Sequence[int] = (),
         uniform_clients: int = 146, clients_per_city: int = fds.CITYSCAPES_CLIENTS_PER_CITY, double: bool = True,
         num_workers: int = 2, cache_clients: int = 0) -> SegmentationSource:
  """The FedDrive Cityscapes split as a SegmentationSource (see the module docstring)."""
  data_dir = data_dir or default_data_dir()
  root = root or default_root(data_dir)
  split = get_split(root, distribution, data_dir=data_dir, seed=seed, split_source=split_source,
                    split_dir=split_dir, uniform_clients=uniform_clients, clients_per_city=clients_per_city)
  return SegmentationSource(
      name=f'cityscapes_{distribution}', image_root=os.path.join(root, 'leftImg8bit'),
      label_root=os.path.join(root, 'gtFine'), clients=_to_clients(split.train, True),
      test_clients=_to_clients(split.test, False), lut=lookup_table(LABEL_TO_TRAIN), class_names=CLASS_NAMES,
      image_size=tuple(image_size) or None, resample='bilinear', double=double, num_workers=num_workers,
      cache_clients=cache_clients, missing_hint=download_hint(data_dir), meta=split.meta)


# config.data (config/default_config.segmentation_data): the augmentation fields with the FedDrive release's
# Cityscapes defaults (cv2 random scale 0.5-1.5 + 512 x 1024 crop, colour jitter 0.4, the data doubled with
# flipped copies instead of random flips), then the builder's own fields.
FIELDS = dict(SEG_AUGMENT, jitter=0.4, flip=False, data_dir='', root='', distribution='heterogeneous',
              split_source='generate', split_dir='', seed=0, image_size=(), uniform_clients=146, clients_per_city=8,
              double=True, num_workers=2, cache_clients=0)


RULES = dict(RELEASE_RULES, uniform_clients=number(1, integer=True), clients_per_city=number(1, integer=True))


@register('cityscapes', task='segmentation', fields=FIELDS, rules=RULES)
def _cityscapes(data_dir='', root='', distribution='heterogeneous', split_source='generate', split_dir='', seed=0,
                image_size=(), uniform_clients=146, clients_per_city=fds.CITYSCAPES_CLIENTS_PER_CITY, double=True,
                num_workers=2, cache_clients=0, **unused):
  del unused   # augmentation fields of config.data (crop, scale, style, ...) are read by data/transforms/pipeline.py
  return load(data_dir or None, root=root, distribution=distribution, split_source=split_source,
              split_dir=split_dir, seed=seed, image_size=image_size, uniform_clients=uniform_clients,
              clients_per_city=clients_per_city, double=double, num_workers=num_workers,
              cache_clients=cache_clients)
