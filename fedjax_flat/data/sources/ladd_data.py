"""LADD / FFREEDA data (thesis §5.3 and Table 6.4; Shenaj et al., WACV 2023): GTA5 as the labelled source, and
Cityscapes / CrossCity / Mapillary Vistas as unlabelled targets with the LADD release's federated splits.

Layouts (<root> defaults to <data_dir>/<name>):

  gta5        <root>/images/NNNNN.png, <root>/labels/NNNNN.png (the official 01..10_{images,labels}.zip of
              download.visinf.tu-darmstadt.de/data/from_games, extracted); split lines "/images/NNNNN.png
              /labels/NNNNN.png" in <root>/splits/{train,test}.txt or the release's copy under
              <data_dir>/ladd_splits/gta5/splits/ (23,905 train / 999 test lines). Label maps hold Cityscapes label
              ids: mapped with the target's table (19 classes for Cityscapes and Mapillary, 13 for CrossCity).
  cityscapes  <root>/leftImg8bit/{train,val}/..., <root>/gtFine/.../*_gtFine_labelIds.png (data/sources/cityscapes.py);
              the LADD heterogeneous split: 144 clients / 2,904 images, test 500 val images
  crosscity   <root>/cities/<City>/Images/{Train,Test}/*.{jpg,png}, <root>/cities/<City>/Labels/Test/*_eval.png
              (Cityscapes label ids, 13 classes); Rio / Rome / Taipei / Tokyo, 472 clients / 12,800 images (training
              images carry no labels at all), test 400 labelled images
  mapillary   <root>/training/images/<key>.jpg, <root>/training/v1.2/labels/<key>.png (and validation/...): v1.2
              label ids mapped onto the 19 Cityscapes classes (`MAPILLARY_LABEL_TO_TRAIN`, the release's table);
              357 clients / 17,969 images, test 2,000 validation images

Splits: the release's LEAF-style JSON files (`users`, `num_samples` (a list, or one integer for a single user),
`user_data{user: {x: [image paths], y: [label paths]}}`; CrossCity's training users have no `y`), fetched with
`python experiments/download.py --dataset=ladd_splits --data_dir=D` into <data_dir>/ladd_splits/ and checked
against the sha256 and size of every released file (`RELEASED_FILES`, commit `RELEASE_COMMIT`) when read. The
counts above are the files' (the thesis' Table 6.4 says 2,975 Cityscapes images, 476 CrossCity clients): the
released files are what the published runs used. `split_dir` reads another folder in the same format (unpinned).

FFREEDA: the targets' training clients are built UNLABELLED (label paths '': all-255 label maps, the label files
are not even opened; data/sources/segmentation.py) unless `labelled_train=True` (the oracles; refused for
CrossCity, which has no training labels). Test clients are labelled. Access: GTA5 is a public download (no
published checksums); Cityscapes and Mapillary Vistas need a registration, CrossCity is on request
(`ManualDownloadRequired` names the steps).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import List, NamedTuple, Optional, Sequence, Tuple

from fedjax_flat.data.download import Resource, default_data_dir, fetch_all
from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.data.sources import cityscapes
from fedjax_flat.data.sources.feddrive_splits import split_json_files
from fedjax_flat.data.sources.segmentation import SegClient, SegmentationSource, lookup_table
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT
from fedjax_flat.errors import DataFormatError

RELEASE_COMMIT = 'bbaec0f2202863e25e671d02c72457b677ee3816'
RELEASE_URL = 'https://raw.githubusercontent.com/Erosinho13/LADD/{commit}/data/{path}'
TARGETS = {'cityscapes': 'heterogeneous', 'crosscity': 'by_city_cpc0_ms27_me10', 'mapillary': 'clustering'}
# (training clients, training images, test images) counted in the released files.
RELEASED_COUNTS = {'cityscapes': (144, 2904, 500), 'crosscity': (472, 12800, 400), 'mapillary': (357, 17969, 2000)}
GTA5_SPLIT_LINES = {'train': 23905, 'test': 999}

# CrossCity: Cityscapes label ids -> its 13 train ids (the release's CrossCity / GTA5->CrossCity table).
CROSSCITY_LABEL_TO_TRAIN = {7: 0, 8: 1, 11: 2, 19: 3, 20: 4, 21: 5, 23: 6, 24: 7, 25: 8, 26: 9, 28: 10, 32: 11, 33: 12}
CROSSCITY_CLASSES = ('road', 'sidewalk', 'building', 'traffic light', 'traffic sign', 'vegetation', 'sky', 'person',
                     'rider', 'car', 'bus', 'motorcycle', 'bicycle')
# Mapillary Vistas v1.2 label ids -> the 19 Cityscapes train ids (the release's table):
#   curb 2, bike lane 7, curb cut 9, pedestrian area 11, sidewalk 15 -> sidewalk; fence 3 -> fence; wall 6 -> wall;
#   road 13, service lane 14, lane marking (general) 24, pothole 43 -> road; building 17; person 19;
#   bicyclist 20, motorcyclist 21, other rider 22 -> rider; sand 26, terrain 29 -> terrain; sky 27;
#   vegetation 30; street light 44, pole 45, traffic sign frame 46, utility pole 47 -> pole; traffic light 48;
#   traffic sign (front) 50; bicycle 52; bus 54; car 55; motorcycle 57; on rails 58 -> train; truck 61.
MAPILLARY_LABEL_TO_TRAIN = {2: 1, 3: 4, 6: 3, 7: 1, 9: 1, 11: 1, 13: 0, 14: 0, 15: 1, 17: 2, 19: 11, 20: 12, 21: 12,
                            22: 12, 24: 0, 26: 9, 27: 10, 29: 9, 30: 8, 43: 0, 44: 5, 45: 5, 46: 5, 47: 5, 48: 6,
                            50: 7, 52: 18, 54: 15, 55: 13, 57: 17, 58: 16, 61: 14}
LABEL_TO_TRAIN = {'cityscapes': cityscapes.LABEL_TO_TRAIN, 'crosscity': CROSSCITY_LABEL_TO_TRAIN,
                  'mapillary': MAPILLARY_LABEL_TO_TRAIN}
# GTA5's label maps hold Cityscapes label ids: mapped with the table of the target the run adapts to.
GTA5_LABEL_TO_TRAIN = {'cityscapes': cityscapes.LABEL_TO_TRAIN, 'crosscity': CROSSCITY_LABEL_TO_TRAIN,
                       'mapillary': cityscapes.LABEL_TO_TRAIN}
CLASSES = {'cityscapes': cityscapes.CLASS_NAMES, 'crosscity': CROSSCITY_CLASSES, 'mapillary': cityscapes.CLASS_NAMES}
GTA5_URL = 'https://download.visinf.tu-darmstadt.de/data/from_games/data/{part:02d}_{kind}.zip'
GTA5_RESOURCES = tuple(Resource(os.path.join('gta5', 'zips', f'{p:02d}_{k}.zip'), GTA5_URL.format(part=p, kind=k),
                                note='no published checksum') for p in range(1, 11) for k in ('images', 'labels'))

# Every released split file: (path under data/, bytes, sha256), at RELEASE_COMMIT.
RELEASED_FILES = (
    ('cityscapes/splits/heterogeneous/test/all_data_0.json', 56990,
     '57d2d6eb5ee5339e3e6632e38a6ded802b8247448877ab5e345e18d9a1ee3e3b'),
    ('cityscapes/splits/heterogeneous/train/all_data_0.json', 8839,
     'e648c576b2bcdf5ef9ec82de2d18746fce63a75c50551614c0df6df82a212cc3'),
    ('cityscapes/splits/heterogeneous/train/all_data_1.json', 14879,
     '62dcc5e94491abad477ee27057552f003b37ec85c0db74967967522751407c5d'),
    ('cityscapes/splits/heterogeneous/train/all_data_2.json', 14175,
     '47b56d61f16b7d4068ec369c2f797dba43ed32b9ad4048e4f02bfbbfd1c93858'),
    ('cityscapes/splits/heterogeneous/train/all_data_3.json', 6727,
     '1328a96bb33ce6cc2d091b4eda00873111edd982bacedd01c97dce40504fb5a4'),
    ('cityscapes/splits/heterogeneous/train/all_data_4.json', 20755,
     '410f486e93019a6d410fc47ad88f6c8f23d63b8e4f1f3bfa2f3fef351b6dce9c'),
    ('cityscapes/splits/heterogeneous/train/all_data_5.json', 12019,
     'ccb0253ba38f4b6f927a0ce50c72f92a454c22266c5c2a368cbf914ec5fbdfe9'),
    ('cityscapes/splits/heterogeneous/train/all_data_6.json', 8499,
     'e88993058c68cd86254890e9b84a2b55f14d45d9cdcd76ec3d1ba204c3bb3b59'),
    ('cityscapes/splits/heterogeneous/train/all_data_7.json', 10195,
     '02adeec02193075e42fa4e44a9f162ae179ea6167f565cddf4b30bd8b16cc9ed'),
    ('cityscapes/splits/heterogeneous/train/all_data_8.json', 26035,
     '55160ae435f1daaedd04f05623de41615563e55205484bf275b9b7beff99dd7c'),
    ('cityscapes/splits/heterogeneous/train/all_data_9.json', 14155,
     '084c0cea8fa1206f801e7d1d34921c3915c2d4bf456a32939bdf1e8aaf4cf35e'),
    ('cityscapes/splits/heterogeneous/train/all_data_10.json', 12647,
     'f7ad44ef39f18a9b13bf8e680d3f7696586e9cfd3116115f9d121ce20c1fac7f'),
    ('cityscapes/splits/heterogeneous/train/all_data_11.json', 21511,
     '78635b039a20a13ad347c007fa8417584f8cb8cb67be1aea9df000040020d531'),
    ('cityscapes/splits/heterogeneous/train/all_data_12.json', 13063,
     '3219c614af88b8a7ef1320993979f3815f7f8d05e2e1d7802e9508ef52c85ae0'),
    ('cityscapes/splits/heterogeneous/train/all_data_13.json', 13791,
     'af5a427a7c45337ca40ed95f783ca17756863cc8786612a9a5ffe3d314c1aefd'),
    ('cityscapes/splits/heterogeneous/train/all_data_14.json', 12275,
     'fbd7cd5e7f2a00f9d093ec5e8e8d2a873b55f2fd2a7a7f5434fa2765146de143'),
    ('cityscapes/splits/heterogeneous/train/all_data_15.json', 8515,
     'aa7311e7fbc94e7e551cbf754ff6756b7c67e5ab90f40ebac2beb07c5237d644'),
    ('cityscapes/splits/heterogeneous/train/all_data_16.json', 16723,
     'ceeb9e70caa06233b9e488952e6df4ec222315e61aa84c4e22df7900b376a15f'),
    ('cityscapes/splits/heterogeneous/train/all_data_17.json', 13251,
     '1cf0675c56a04d11b97cd75399150e3f0a108ecd912c5101d66402b93bdce34e'),
    ('cityscapes/splits/heterogeneous/train/all_data_18.json', 19131,
     '8b0005074218a37e7bbdcd5ad1cf1fa821c603f34027888336da8847c51f3f4a'),
    ('cityscapes/splits/heterogeneous/train/all_data_19.json', 34363,
     '7065b8995744a94309e54895b33ce30bed52ce097b2aaa44361cff035b6d03a0'),
    ('cityscapes/splits/heterogeneous/train/all_data_20.json', 13303,
     '09e85af6acb2f11409466e508f0eb69fde16ef1f6cb888c7aa45a1dbe9feb4a6'),
    ('cityscapes/splits/heterogeneous/train/all_data_21.json', 10351,
     'b474eee48b7a33543f14273ceeae5ba3f80e13480bc41b02bea50e7ad3780fac'),
    ('cityscapes/splits/heterogeneous/train/all_data_22.json', 9263,
     'eb5dea168867616897cf01b5a527af85a46eede09060e6bcb72dc0ed5b6d2ce9'),
    ('cityscapes/splits/heterogeneous/train/all_data_23.json', 10039,
     '8c4fa40b8ef1f4c8e027f2987c3e668e92d4b5605bcc0d3d276742bb571a658c'),
    ('crosscity/splits/by_city_cpc0_ms27_me10/test/test_user.json', 37816,
     '3f31f85efa8aefaca28e645545d48a5de2e075727eeb489e0711d546d320fb87'),
    ('crosscity/splits/by_city_cpc0_ms27_me10/train/Rio.json', 131727,
     '2321907cd2d1935e7242e87e25e0bc53a39cdbebd93bd7ab6f07fc15680423ae'),
    ('crosscity/splits/by_city_cpc0_ms27_me10/train/Rome.json', 135294,
     '9dfc2f01fbb33a81d370f1093380d4efce30f2c15d55eb62e4d681577d56a177'),
    ('crosscity/splits/by_city_cpc0_ms27_me10/train/Taipei.json', 142095,
     '679ba910ef20488f7f4f48a19c5d29bb14c137e03af9431f12ba2d5d9ad10b8d'),
    ('crosscity/splits/by_city_cpc0_ms27_me10/train/Tokyo.json', 138582,
     'e548d6f5f070b05dcdef108848c52801bee3f2014fa40ec3de9b3741cb662913'),
    ('gta5/splits/test.txt', 35964,
     '782c322e1f5bcbb1ee0665da2f2bccaff03071395cadb78fd15c22accb1ea731'),
    ('gta5/splits/train.txt', 860580,
     'a6a36410923b7a309bd9c8ddc9ed7087dd03ad5c0f6abd631d14d2f6d6b31983'),
    ('mapillary/splits/clustering/test/test_user.json', 202089,
     '0389ee87d59179649d65bdc802aa49eec5f1bb697d63716ec53da1c52524a3c5'),
    ('mapillary/splits/clustering/train/AF.json', 27470,
     '0fdb1427cfab0309bbd3d634b2a6c59ad2254b2154239bc18cbd52a66a6606f7'),
    ('mapillary/splits/clustering/train/AS.json', 392858,
     '283ed1327321243d3b3cc5e70c80268e155e00a957f3c3bfb0d4ed7854914024'),
    ('mapillary/splits/clustering/train/EU.json', 592935,
     'bb7832e21416dc9ce222be59a69d1de6a1c32c40d699634139372370c25d1bb0'),
    ('mapillary/splits/clustering/train/NA.json', 509740,
     '3f752bdf1c66ca0795d3f81d051bdada7dc3af174a19e831d25a16227198585c'),
    ('mapillary/splits/clustering/train/OC.json', 108972,
     '36e86da164a1834ba08eb9695cb0fcf5ceb278931ed89a716f7535fd3aee3de4'),
    ('mapillary/splits/clustering/train/SA.json', 124115,
     '3e2a2058e8e8c860505452fb4848e2911780c4ae74f17f3920871a14764874b9'),
)
_RELEASED = {path: (size, sha) for path, size, sha in RELEASED_FILES}


class SplitClient(NamedTuple):
  name: str
  x: List[str]
  y: List[str]        # [] when the release gives no labels (CrossCity's training users)


# ----------------------------------------------------------------------------------------------------
# The released files: download, checksums, parsing (untrusted input).


def release_url(path: str) -> str:
  return RELEASE_URL.format(commit=RELEASE_COMMIT, path=path)


def splits_root(data_dir: str) -> str:
  return os.path.join(data_dir, 'ladd_splits')


def download_hint(data_dir: str) -> str:
  return f'python experiments/download.py --dataset=ladd_splits --data_dir={data_dir}'


def download_released(data_dir: str, *, opener=None) -> List[str]:
  """Every released split file (sha256- and size-pinned) into <data_dir>/ladd_splits/<path>."""
  return fetch_all([Resource(os.path.join('ladd_splits', *path.split('/')), release_url(path), size, sha256=sha)
                    for path, size, sha in RELEASED_FILES], data_dir, opener=opener)


def gta5_manual_steps(data_dir: str) -> str:
  root = os.path.join(data_dir, 'gta5')
  return (f'GTA5 (Richter et al. 2016) is public: download the 20 zips {GTA5_URL.format(part=1, kind="images")} .. '
          f'{GTA5_URL.format(part=10, kind="labels")} (no published checksums) and extract them into {root} '
          f'(images/NNNNN.png, labels/NNNNN.png); the split lines come with {download_hint(data_dir)}')


def verify_released(path: str, rel: str) -> None:
  """The file at `path` is the released `rel` (size and sha256), else DataFormatError naming the fix."""
  size, sha = _RELEASED[rel]
  with open(path, 'rb') as f:
    data = f.read()
  if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
    raise DataFormatError(f'{path}: not the released {rel} (size {len(data)} vs {size} or sha256 differs); '
                          'delete it and fetch it again: python experiments/download.py --dataset=ladd_splits')


def _str_list(v) -> bool:
  return isinstance(v, list) and all(isinstance(e, str) for e in v)


def read_split_json(path: str) -> List[SplitClient]:
  """The users of one LEAF-style split file, in file order (see the module docstring for the format)."""
  with open(path) as f:
    try:
      d = json.load(f)
    except json.JSONDecodeError as e:
      raise DataFormatError(f'{path} is not valid JSON ({e}); is the file truncated?') from None
  if not isinstance(d, dict) or not _str_list(d.get('users')) or not isinstance(d.get('user_data'), dict):
    raise DataFormatError(f'{path}: not a LEAF split file (expected users, num_samples, user_data)')
  ns = d.get('num_samples')
  if isinstance(ns, int) and not isinstance(ns, bool):
    ns = [ns] if len(d['users']) == 1 else None
    if ns is None:
      raise DataFormatError(f'{path}: num_samples is one integer for {len(d["users"])} users')
  out, seen = [], set()
  for i, u in enumerate(d['users']):
    entry = d['user_data'].get(u)
    if not isinstance(entry, dict) or not _str_list(entry.get('x')):
      raise DataFormatError(f'{path}: user {u!r} has no x (a list of image paths) in user_data')
    xs, ys = entry['x'], entry.get('y', [])
    if not _str_list(ys) or (ys and len(ys) != len(xs)):
      raise DataFormatError(f'{path}: user {u!r}: y must be absent or a list of as many label paths as x')
    if isinstance(ns, list) and (i >= len(ns) or ns[i] != len(xs)):
      raise DataFormatError(f'{path}: user {u!r}: num_samples does not match its {len(xs)} images')
    if u in seen:
      raise DataFormatError(f'{path}: user {u!r} appears twice')
    seen.add(u)
    out.append(SplitClient(u, list(xs), list(ys)))
  return out


def read_split_dir(folder: str, released_prefix: Optional[str] = None) -> List[SplitClient]:
  """Every user of every *.json of a folder (files in natural order). With `released_prefix` (the folder's path
  under the release's data/), each file is checked against RELEASED_FILES first."""
  files = split_json_files(folder)
  out, names = [], set()
  for f in files:
    p = os.path.join(folder, f)
    if released_prefix is not None:
      rel = f'{released_prefix}/{f}'
      if rel not in _RELEASED:
        raise DataFormatError(f'{p}: not a file of the LADD release ({released_prefix}); remove it')
      verify_released(p, rel)
    for c in read_split_json(p):
      if c.name in names:
        raise DataFormatError(f'{folder}: user {c.name!r} appears in two files')
      names.add(c.name)
      out.append(c)
  return out


def released_split(data_dir: str, target: str, split_dir: str = '') -> Tuple[List[SplitClient], List[SplitClient]]:
  """(training users, test users) of a target: the release's pinned files, or `split_dir`/{train,test}."""
  if target not in TARGETS:
    raise ValueError(f'target={target!r}; allowed: {sorted(TARGETS)}')
  if split_dir:
    return read_split_dir(os.path.join(split_dir, 'train')), read_split_dir(os.path.join(split_dir, 'test'))
  prefix = f'{target}/splits/{TARGETS[target]}'
  base = os.path.join(splits_root(data_dir), *prefix.split('/'))
  if not os.path.isdir(base):
    raise FileNotFoundError(f'LADD split files not found in {base}. Get them with: {download_hint(data_dir)}')
  train = read_split_dir(os.path.join(base, 'train'), f'{prefix}/train')
  test = read_split_dir(os.path.join(base, 'test'), f'{prefix}/test')
  train_x = [x for c in train for x in c.x]
  if len(set(train_x)) != len(train_x) or set(train_x) & {x for c in test for x in c.x}:
    raise DataFormatError(f'{base}: an image belongs to two training clients or to training and test')
  return train, test


def read_gta5_split(path: str, rel: Optional[str] = None) -> List[Tuple[str, str]]:
  """(image, label) paths relative to the GTA5 root from a split file ("/images/x.png /labels/x.png" lines)."""
  if rel is not None:
    verify_released(path, rel)
  out = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      parts = line.split()
      if len(parts) != 2 or not all(p.startswith(('/images/', '/labels/')) for p in parts) \
         or not parts[0].startswith('/images/') or not parts[1].startswith('/labels/'):
        raise DataFormatError(f'{path}:{n}: expected "/images/<name> /labels/<name>", got {line.strip()[:80]!r}')
      out.append((parts[0].lstrip('/'), parts[1].lstrip('/')))
  if not out:
    raise DataFormatError(f'{path}: no split lines')
  return out


# ----------------------------------------------------------------------------------------------------
# Sources.


def default_root(data_dir: str, name: str) -> str:
  return cityscapes.default_root(data_dir) if name == 'cityscapes' else os.path.join(data_dir, name)


def gta5_source(data_dir: Optional[str] = None, *, root: str = '', split: str = 'train', target: str = 'cityscapes',
                split_file: str = '', image_size: Sequence[int] = (), images_per_client: int = 64,
                num_workers: int = 2, cache_clients: int = 0) -> SegmentationSource:
  """GTA5's `split` images as a SegmentationSource: the server's labelled data, cut into chunks of
  `images_per_client` (so that pre-training can stream them chunk by chunk), labels mapped for `target`."""
  if target not in GTA5_LABEL_TO_TRAIN:
    raise ValueError(f'target={target!r}; allowed: {sorted(GTA5_LABEL_TO_TRAIN)}')
  if split not in GTA5_SPLIT_LINES:
    raise ValueError(f'split={split!r}; allowed: {sorted(GTA5_SPLIT_LINES)}')
  data_dir = data_dir or default_data_dir()
  root = root or default_root(data_dir, 'gta5')
  if split_file:
    pairs = read_gta5_split(split_file)
  else:
    rel = f'gta5/splits/{split}.txt'
    released = os.path.join(splits_root(data_dir), *rel.split('/'))
    own = os.path.join(root, 'splits', f'{split}.txt')
    if os.path.isfile(released):
      pairs = read_gta5_split(released, rel)
    elif os.path.isfile(own):
      pairs = read_gta5_split(own)
    else:
      raise FileNotFoundError(f'GTA5 split file not found ({released} or {own}). Get it with: '
                              f'{download_hint(data_dir)}')
  chunk = max(1, int(images_per_client))
  clients = [SegClient(f'gta5_{split}_{i // chunk}', [p[0] for p in pairs[i:i + chunk]],
                       [p[1] for p in pairs[i:i + chunk]]) for i in range(0, len(pairs), chunk)]
  return SegmentationSource(
      name=f'gta5_{split}_{target}', image_root=root, label_root=root, clients=clients, test_clients=[],
      lut=lookup_table(GTA5_LABEL_TO_TRAIN[target]), class_names=CLASSES[target], image_size=tuple(image_size) or None,
      num_workers=num_workers, cache_clients=cache_clients, missing_hint=gta5_manual_steps(data_dir),
      meta={'source': 'gta5', 'split': split, 'release_commit': RELEASE_COMMIT})


def _roots(target: str, root: str) -> Tuple[str, str]:
  if target == 'cityscapes':
    return os.path.join(root, 'leftImg8bit'), os.path.join(root, 'gtFine')
  if target == 'crosscity':
    return os.path.join(root, 'cities'), os.path.join(root, 'cities')
  return root, root


def target_hint(target: str, data_dir: str) -> str:
  if target == 'cityscapes':
    return cityscapes.download_hint(data_dir)
  if target == 'mapillary':
    return (f'Mapillary Vistas v1.2 needs a registration at https://www.mapillary.com/dataset/vistas: extract it '
            f'into {default_root(data_dir, "mapillary")} (training/images, training/v1.2/labels, validation/...)')
  return (f'CrossCity (Chen et al. 2017) is available on request from its authors: place it in '
          f'{default_root(data_dir, "crosscity")}/cities/<City>/{{Images,Labels}}/...')


def target_source(target: str, data_dir: Optional[str] = None, *, root: str = '', split_dir: str = '',
                  image_size: Sequence[int] = (), labelled_train: bool = False, num_workers: int = 2,
                  cache_clients: int = 0) -> SegmentationSource:
  """A FFREEDA target with the LADD split: unlabelled training clients (unless labelled_train), labelled test."""
  data_dir = data_dir or default_data_dir()
  root = root or default_root(data_dir, target)
  train, test = released_split(data_dir, target, split_dir)
  if labelled_train and any(not c.y for c in train):
    raise ValueError(f'{target}: the split gives no labels for its training clients (labelled_train=True is '
                     'for the oracles of Cityscapes and Mapillary)')
  if any(not c.y for c in test):
    raise DataFormatError(f'{target}: a test user of the split has no labels')
  clients = [SegClient(c.name, c.x, c.y if labelled_train else [''] * len(c.x)) for c in train]
  tests = [SegClient('target' if c.name == 'test_user' else c.name, c.x, c.y) for c in test]
  image_root, label_root = _roots(target, root)
  return SegmentationSource(
      name=f'{target}_ladd', image_root=image_root, label_root=label_root, clients=clients, test_clients=tests,
      lut=lookup_table(LABEL_TO_TRAIN[target]), class_names=CLASSES[target], image_size=tuple(image_size) or None,
      num_workers=num_workers, cache_clients=cache_clients, missing_hint=target_hint(target, data_dir),
      meta={'source': 'released' if not split_dir else split_dir, 'release_commit': RELEASE_COMMIT,
            'labelled_train': bool(labelled_train)})


# ----------------------------------------------------------------------------------------------------
# Registered datasets: config.data = the augmentation fields + the builder's fields.

# seed: the released splits are fixed files; the field is declared as every segmentation dataset's (unused here).
_COMMON = dict(data_dir='', root='', image_size=(), num_workers=2, cache_clients=0, seed=0)
GTA5_FIELDS = dict(SEG_AUGMENT, **_COMMON, split='train', target='cityscapes', split_file='', images_per_client=64)
TARGET_FIELDS = dict(SEG_AUGMENT, **_COMMON, split_dir='', labelled_train=False)


def _check_common(d) -> None:
  for k in ('data_dir', 'root'):
    check_arg(k, d[k], isinstance(d[k], str), 'a string (a path; empty = default)')
  size = d['image_size']
  check_arg('image_size', size, isinstance(size, (tuple, list)) and len(size) in (0, 2)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 8 for v in size),
            '() for the stored size, or two integers >= 8 (H, W)')
  for k, lo in (('num_workers', 1), ('cache_clients', 0)):
    v = d[k]
    check_arg(k, v, isinstance(v, int) and not isinstance(v, bool) and v >= lo, f'an integer >= {lo}')


def check_gta5(d) -> None:
  _check_common(d)
  check_arg('split', d['split'], d['split'] in GTA5_SPLIT_LINES, f'one of {sorted(GTA5_SPLIT_LINES)}')
  check_arg('target', d['target'], d['target'] in GTA5_LABEL_TO_TRAIN, f'one of {sorted(GTA5_LABEL_TO_TRAIN)}')
  check_arg('split_file', d['split_file'], isinstance(d['split_file'], str), 'a string (a path; empty = released)')
  v = d['images_per_client']
  check_arg('images_per_client', v, isinstance(v, int) and not isinstance(v, bool) and v >= 1, 'an integer >= 1')


def _check_target(target):
  def check(d) -> None:
    _check_common(d)
    check_arg('split_dir', d['split_dir'], isinstance(d['split_dir'], str), 'a string (a path; empty = released)')
    check_arg('labelled_train', d['labelled_train'], isinstance(d['labelled_train'], bool), 'True or False')
    check_arg('labelled_train', d['labelled_train'], not (target == 'crosscity' and d['labelled_train']),
              "False: CrossCity's training images have no labels")
  return check


@register('gta5', task='segmentation', fields=GTA5_FIELDS, check=check_gta5)
def _gta5(data_dir='', root='', image_size=(), num_workers=2, cache_clients=0, split='train', target='cityscapes',
          split_file='', images_per_client=64, **unused):
  del unused
  return gta5_source(data_dir or None, root=root, split=split, target=target, split_file=split_file,
                     image_size=image_size, images_per_client=images_per_client, num_workers=num_workers,
                     cache_clients=cache_clients)


def _target_builder(target):
  def build(data_dir='', root='', image_size=(), num_workers=2, cache_clients=0, split_dir='', labelled_train=False,
            **unused):
    del unused
    return target_source(target, data_dir or None, root=root, split_dir=split_dir, image_size=image_size,
                         labelled_train=labelled_train, num_workers=num_workers, cache_clients=cache_clients)
  build.__name__ = f'_{target}_ladd'
  return build


for _t in TARGETS:
  register(f'{_t}_ladd', task='segmentation', fields=TARGET_FIELDS, check=_check_target(_t))(_target_builder(_t))

