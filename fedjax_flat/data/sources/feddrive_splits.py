"""FedDrive federated splits (Fantauzzo, Fanì et al. 2022; thesis Table 6.1): Cityscapes and IDDA.

Splits are lists of clients, each a list of (image, label) paths relative to the dataset root (Cityscapes:
leftImg8bit/ and gtFine/; IDDA: IDDAsmall/), in the LEAF JSON format of the FedDrive release
(`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`, one or more
files per train/ and test/ folder). Two sources:

* generated (default): the procedures below, from the files present; saved once to
  `<data_dir>/splits/feddrive/<dataset>_<distribution>[_<setting>]_seed<seed>/{train,test}/all_data_0.json`
  with `meta.json` (PROCEDURE tag, seed, a fingerprint of the file list) and reused on every later run, like
  the CIFAR splits (data/sources/cifar.py). A split made for another file list is refused (delete it to regenerate);
  one made by another procedure version is reused with a warning.
* released: FedDrive's own split files (commit RELEASE_COMMIT of github.com/Erosinho13/FedDrive), fetched by
  `python experiments/download.py --dataset=feddrive_splits --data_dir=...` into
  `<data_dir>/feddrive_splits/<dataset>/<distribution>/[<setting>/]{train,test}/*.json` (sha256-checked).

What the released files contain (counted from them; the generated procedures reproduce it):

Cityscapes (train = the 18 official train cities, 2,975 images; test = the official val split, 500 images of
the 3 unseen cities frankfurt, lindau, munster, one test client):
  uniform        146 clients of random images, sizes 10 x 32, 15 x 49, 25 x 40, 30 x 8, 40 x 17 (= 2,975).
                 Other image counts (e.g. small test sets) get near-equal sizes over num_clients clients.
  heterogeneous  8 clients per city (144): each city's images shuffled and dealt into 8 equal parts of
                 floor(n_city / 8); the remainder is dropped (2,904 of 2,975 images are used), sizes 10-45.
IDDA (IDDAsmall: 104 domains town_weather_viewpoint x 60 images; T07_CN_M absent):
  each training domain: 48 training images + 12 held out for the seen-domain test client (20 %);
  unseen domains: all 60 images go to the unseen-domain test client.
  settings       country: unseen = town T07 (90 training domains); rainy: unseen = weather HRN (69);
                 bus: unseen = viewpoint B (83; FedDrive v2).
  heterogeneous  one client per training domain (48 images, named by the domain).
  uniform        the same 48 x D training images dealt into D clients of 48 from 48 distinct domains (client
                 c takes image j of domain (c + j) mod D, over a random domain order): no client sees one
                 domain twice, as in the released files.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat.errors import DataFormatError, reading

PROCEDURE = 'feddrive_splits/v1'
RELEASE_COMMIT = '66f530b5777fc76ddcf66858c41d9cd49f48006a'
RELEASE_URL = 'https://raw.githubusercontent.com/Erosinho13/FedDrive/{commit}/data/{dataset}/data/{rest}'
DISTRIBUTIONS = ('uniform', 'heterogeneous')
IDDA_SETTINGS = ('country', 'rainy', 'bus')
# Published Cityscapes uniform client sizes (size, number of clients): 146 clients, 2,975 images.
CITYSCAPES_UNIFORM_SIZES = ((10, 32), (15, 49), (25, 40), (30, 8), (40, 17))
CITYSCAPES_CLIENTS_PER_CITY = 8
IDDA_SEEN_TEST_FRACTION = 0.2            # 12 of 60 images per training domain
# Test users of the release -> our test-client names.
TEST_NAMES = {'test_user': 'unseen', 'test_user_diff_domain': 'unseen', 'test_user_same_domain': 'seen'}
TEST_ORDER = ('seen', 'unseen')
IDDA_DOMAIN = re.compile(r'^(T\d{2})_([A-Z]+)_([A-Z]+)$')   # town, weather, viewpoint

log = logging.getLogger(__name__)


class Client(NamedTuple):
  name: str
  x: List[str]
  y: List[str]


class Split(NamedTuple):
  train: List[Client]
  test: List[Client]
  meta: dict


# ----------------------------------------------------------------------------------------------------
# LEAF JSON files (untrusted input).


def _natural(s: str):
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', s)]


def split_json_files(path: str) -> List[str]:
  """The *.json file names of a split folder in natural order (file2 before file10); a missing folder or one
  without JSON files is a FileNotFoundError. The one folder walk of the LEAF-style split readers (FedDrive's
  here, LADD's in data/sources/ladd_data.py)."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f'split folder {path} not found')
  files = sorted((f for f in os.listdir(path) if f.endswith('.json')), key=_natural)
  if not files:
    raise FileNotFoundError(f'no *.json split files in {path}')
  return files


def read_leaf_dir(path: str) -> List[Client]:
  """Every user of every *.json in a folder (files in natural order, users in file order)."""
  files = split_json_files(path)
  out, seen = [], set()
  for f in files:
    p = os.path.join(path, f)
    with open(p) as fh:
      try:
        d = json.load(fh)
      except (ValueError, RecursionError) as e:      # JSONDecodeError, UnicodeDecodeError, nesting
        raise DataFormatError(f'{p} is not valid JSON ({e}); is the file truncated?') from None
    if not isinstance(d, dict) or not isinstance(d.get('users'), list) or not isinstance(d.get('user_data'), dict):
      raise DataFormatError(f'{p}: not a LEAF split file (expected users, num_samples, user_data)')
    for i, u in enumerate(d['users']):
      entry = d['user_data'].get(u) if isinstance(u, str) else None
      if entry is None or not isinstance(entry, dict):
        raise DataFormatError(f'{p}: user {u!r} is listed in users but has no user_data entry')
      xs, ys = entry.get('x'), entry.get('y')
      if not (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys)
              and all(isinstance(v, str) for v in xs + ys)):
        raise DataFormatError(f'{p}: user {u!r}: x and y must be lists of paths of equal length')
      ns = d.get('num_samples')
      if isinstance(ns, list) and i < len(ns) and ns[i] != len(xs):
        raise DataFormatError(f'{p}: user {u!r}: num_samples says {ns[i]} but x has {len(xs)} paths')
      if u in seen:
        raise DataFormatError(f'{path}: user {u!r} appears twice')
      seen.add(u)
      out.append(Client(u, list(xs), list(ys)))
  return out


def write_leaf(path: str, clients: Sequence[Client]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  d = {'users': [c.name for c in clients], 'num_samples': [len(c.x) for c in clients],
       'user_data': {c.name: {'x': list(c.x), 'y': list(c.y)} for c in clients}}
  with open(path, 'w') as f:
    json.dump(d, f)


def check_split(split: Split, where: str = 'split') -> None:
  """No image twice among training clients, none both in training and test; non-empty clients."""
  train = [x for c in split.train for x in c.x]
  if len(set(train)) != len(train):
    dup = next(x for x in train if train.count(x) > 1)
    raise DataFormatError(f'{where}: training image {dup!r} belongs to more than one client')
  both = set(train) & {x for c in split.test for x in c.x}
  if both:
    raise DataFormatError(f'{where}: {len(both)} images are both training and test images (e.g. {sorted(both)[:2]})')
  empty = [c.name for c in split.train if not c.x]
  if empty:
    raise DataFormatError(f'{where}: training clients without images: {empty[:5]}')


def _canonical_test(clients: Sequence[Client]) -> List[Client]:
  named = [Client(TEST_NAMES.get(c.name, c.name), c.x, c.y) for c in clients]
  order = {n: i for i, n in enumerate(TEST_ORDER)}
  return sorted(named, key=lambda c: order.get(c.name, len(order)))


def load_released(path: str) -> Split:
  """A FedDrive release folder with train/ and test/ (or any folder in that layout)."""
  split = Split(read_leaf_dir(os.path.join(path, 'train')), _canonical_test(read_leaf_dir(os.path.join(path, 'test'))),
                {'source': 'released', 'path': path, 'release_commit': RELEASE_COMMIT})
  check_split(split, path)
  return split


def released_dir(data_dir: str, dataset: str, distribution: str, setting: Optional[str] = None) -> str:
  parts = [data_dir, 'feddrive_splits', dataset, distribution] + ([setting] if setting else [])
  return os.path.join(*parts)


def load_released_split(data_dir: str, dataset: str, distribution: str, setting: Optional[str] = None,
                        split_dir: str = '') -> Split:
  """The release's split of a setting from split_dir or its place under data_dir; names the download."""
  path = split_dir or released_dir(data_dir, dataset, distribution, setting)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'FedDrive split files not found in {path}. Get them with: python '
                            f'experiments/download.py --dataset=feddrive_splits --data_dir={data_dir}')
  return load_released(path)


# ----------------------------------------------------------------------------------------------------
# Saved generated splits.


def fingerprint(paths: Sequence[str]) -> str:
  h = hashlib.sha256()
  for p in sorted(paths):
    h.update(p.encode())
    h.update(b'\0')
  return h.hexdigest()[:16]


def split_dir(data_dir: str, dataset: str, distribution: str, seed: int, setting: Optional[str] = None) -> str:
  tag = f'{dataset}_{distribution}' + (f'_{setting}' if setting else '') + f'_seed{int(seed)}'
  return os.path.join(data_dir, 'splits', 'feddrive', tag)


def save(path: str, split: Split) -> None:
  """Atomically writes train/all_data_0.json, test/all_data_0.json and meta.json under path."""
  parent = os.path.dirname(path) or '.'
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix='.tmp_split_')
  try:
    write_leaf(os.path.join(tmp, 'train', 'all_data_0.json'), split.train)
    write_leaf(os.path.join(tmp, 'test', 'all_data_0.json'), split.test)
    with open(os.path.join(tmp, 'meta.json'), 'w') as f:
      json.dump(split.meta, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def load_or_make(path: str, make, files_fingerprint: str) -> Split:
  """The split saved at path (checked against the files present), else make() saved there."""
  meta_path = os.path.join(path, 'meta.json')
  if os.path.isfile(meta_path):
    with open(meta_path, 'rb') as f, reading(meta_path, "a saved FedDrive split's meta.json (delete the folder "
                                                         'to regenerate it)'):
      meta = json.loads(f.read())
      meta.get('files_fingerprint')
    if meta.get('files_fingerprint') != files_fingerprint:
      raise DataFormatError(f'split {path} was made for another set of files (fingerprint '
                       f'{meta.get("files_fingerprint")} vs {files_fingerprint} now); delete the folder to '
                       f'regenerate it for the current files')
    if meta.get('procedure') != PROCEDURE:
      log.warning('split %s was made by %r, not the current %r; reusing it. Delete the folder to regenerate.',
                  path, meta.get('procedure'), PROCEDURE)
    split = Split(read_leaf_dir(os.path.join(path, 'train')), read_leaf_dir(os.path.join(path, 'test')), meta)
    check_split(split, path)
    return split
  split = make()
  check_split(split, 'generated split')
  split.meta.update(procedure=PROCEDURE, files_fingerprint=files_fingerprint)
  save(path, split)
  return split


# ----------------------------------------------------------------------------------------------------
# Procedures.


def _shuffled(items: Sequence, seed_key) -> list:
  items = sorted(items)
  perm = np.random.default_rng(seed_key).permutation(len(items))
  return [items[i] for i in perm]


def uniform_sizes(n: int, num_clients: int) -> List[int]:
  """The released Cityscapes sizes for (2975, 146); near-equal sizes otherwise."""
  if (n, num_clients) == (2975, 146):
    return [s for s, count in CITYSCAPES_UNIFORM_SIZES for _ in range(count)]
  if not 1 <= num_clients <= n:
    raise ValueError(f'cannot split {n} images into {num_clients} non-empty clients')
  return [n // num_clients + (1 if i < n % num_clients else 0) for i in range(num_clients)]


def cityscapes_split(train: Sequence[Tuple[str, str, str]], test: Sequence[Tuple[str, str, str]],
                     distribution: str, seed: int, *, num_clients: int = 146,
                     clients_per_city: int = CITYSCAPES_CLIENTS_PER_CITY) -> Split:
  """train/test: (image, label, city) triples (official train split; val split = unseen-city test client)."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f'distribution={distribution!r}; allowed: {DISTRIBUTIONS}')
  train_cities = {c for _, _, c in train}
  shared = train_cities & {c for _, _, c in test}
  if shared:
    raise ValueError(f'cities {sorted(shared)} are in both the training and the test split: the test client '
                     'must hold unseen cities')
  clients = []
  if distribution == 'uniform':
    items = _shuffled(train, [seed, 0])
    lo = 0
    for i, size in enumerate(uniform_sizes(len(items), num_clients)):
      part = items[lo:lo + size]
      lo += size
      clients.append(Client(f'client_{i}', [t[0] for t in part], [t[1] for t in part]))
  else:
    for ci, city in enumerate(sorted(train_cities)):
      items = _shuffled([t for t in train if t[2] == city], [seed, 1, ci])
      per = len(items) // clients_per_city
      if per == 0:
        raise ValueError(f'city {city} has {len(items)} images: fewer than clients_per_city={clients_per_city}')
      for i in range(clients_per_city):
        part = items[i * per:(i + 1) * per]
        clients.append(Client(f'{city}{i}', [t[0] for t in part], [t[1] for t in part]))
  test_items = sorted(test)
  meta = dict(source='generated', dataset='cityscapes', distribution=distribution, seed=int(seed),
              num_clients=len(clients), train_images=sum(len(c.x) for c in clients), test_images=len(test_items),
              train_cities=sorted(train_cities), test_cities=sorted({c for _, _, c in test}))
  return Split(clients, [Client('unseen', [t[0] for t in test_items], [t[1] for t in test_items])], meta)


def idda_domain(name: str) -> Tuple[str, str, str]:
  """'T01_HRN_A' -> ('T01', 'HRN', 'A'): town, weather, viewpoint."""
  m = IDDA_DOMAIN.match(name)
  if not m:
    raise ValueError(f'{name!r} is not an IDDA domain name (T<town>_<weather>_<viewpoint>, e.g. T01_CN_A)')
  return m.group(1), m.group(2), m.group(3)


def idda_unseen(domain: str, setting: str) -> bool:
  town, weather, viewpoint = idda_domain(domain)
  if setting == 'country':
    return town == 'T07'
  if setting == 'rainy':
    return weather == 'HRN'
  if setting == 'bus':
    return viewpoint == 'B'
  raise ValueError(f'setting={setting!r}; allowed: {IDDA_SETTINGS}')


def idda_split(items: Sequence[Tuple[str, str, str]], setting: str, distribution: str, seed: int, *,
               seen_test_fraction: float = IDDA_SEEN_TEST_FRACTION) -> Split:
  """items: (image, label, domain) triples of every IDDA image present."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f'distribution={distribution!r}; allowed: {DISTRIBUTIONS}')
  domains = sorted({d for _, _, d in items})
  by_domain: Dict[str, list] = {d: [] for d in domains}
  for t in items:
    by_domain[t[2]].append(t)
  train_domains = [d for d in domains if not idda_unseen(d, setting)]
  unseen_domains = [d for d in domains if idda_unseen(d, setting)]
  if not train_domains or not unseen_domains:
    raise ValueError(f'IDDA {setting}: {len(train_domains)} training and {len(unseen_domains)} unseen domains '
                     f'among the files present; both must be non-empty')
  train_part, seen_test = {}, []
  for di, d in enumerate(domains):
    if d not in train_domains:
      continue
    shuffled = _shuffled(by_domain[d], [seed, 2, di])
    n_test = int(round(seen_test_fraction * len(shuffled)))
    seen_test += shuffled[len(shuffled) - n_test:]
    train_part[d] = shuffled[:len(shuffled) - n_test]
  clients = []
  if distribution == 'heterogeneous':
    clients = [Client(d, [t[0] for t in train_part[d]], [t[1] for t in train_part[d]]) for d in train_domains]
  else:
    order = _shuffled(train_domains, [seed, 3])
    counts = {len(train_part[d]) for d in order}
    n_dom = len(order)
    m = counts.pop() if len(counts) == 1 else 0
    if 0 < m <= n_dom:   # Latin square: client c, slot j <- image j of domain (c + j) mod D
      for c in range(n_dom):
        part = [train_part[order[(c + j) % n_dom]][j] for j in range(m)]
        clients.append(Client(f'client_{c + 1}', [t[0] for t in part], [t[1] for t in part]))
    else:                # unequal domains: shuffled pool dealt round-robin into D clients
      pool = _shuffled([t for d in order for t in train_part[d]], [seed, 4])
      for c in range(n_dom):
        part = pool[c::n_dom]
        clients.append(Client(f'client_{c + 1}', [t[0] for t in part], [t[1] for t in part]))
  unseen_test = sorted(t for d in unseen_domains for t in by_domain[d])
  seen_test = sorted(seen_test)
  meta = dict(source='generated', dataset='idda', setting=setting, distribution=distribution, seed=int(seed),
              seen_test_fraction=float(seen_test_fraction), num_clients=len(clients),
              train_images=sum(len(c.x) for c in clients), train_domains=train_domains,
              unseen_domains=unseen_domains)
  test = [Client('seen', [t[0] for t in seen_test], [t[1] for t in seen_test]),
          Client('unseen', [t[0] for t in unseen_test], [t[1] for t in unseen_test])]
  return Split(clients, test, meta)


# ----------------------------------------------------------------------------------------------------
# The release's split files: (path under <data_dir>/feddrive_splits, size in bytes, sha256), from commit
# RELEASE_COMMIT; URL: RELEASE_URL with path = <dataset>/<rest>.

RELEASED_FILES = (
    ('cityscapes/heterogeneous/test/all_data_0.json', 56990,
     'c2940cdbe701ae99076928226de0cb7f4ef9ddc1592de5d6754da0d46ebd9a69'),
    ('cityscapes/heterogeneous/train/all_data_0.json', 8875,
     '7ffbc8ca50d1fe12b3b370bc42f5fb832e6862a91a3679635737797ee64b5a3d'),
    ('cityscapes/heterogeneous/train/all_data_1.json', 8635,
     '1b63d99533fb60362bcbb29a25fa1ad522fed324a31b289b443ca66a6d51ed36'),
    ('cityscapes/heterogeneous/train/all_data_2.json', 9515,
     '0c41d3c8394513e398818529f4f21b2ddd45ae77493d271bb4ef974a05a67d3c'),
    ('cityscapes/heterogeneous/train/all_data_3.json', 11515,
     '55490d52e3ff3911cd3fe83745fbda98037770d67021170c80563258148baced'),
    ('cityscapes/heterogeneous/train/all_data_4.json', 14155,
     '101d9cc9a531a017b634fb79fcde6f381f631a1c620dd3913dcc91f32e2b446c'),
    ('cityscapes/heterogeneous/train/all_data_5.json', 27627,
     '35775bcc3f13a054bc3c2865dde8bdef75877d9e3721bf100829118d0731f874'),
    ('cityscapes/heterogeneous/train/all_data_6.json', 26307,
     '5e365e86e99e1d8f8aec8b0ace5e87a8779502827afdf7a6764c187470064bdf'),
    ('cityscapes/heterogeneous/train/all_data_7.json', 10195,
     'c7183f924e334cf06c80b5ae790c711a3a3d01b500459f86980c3f35279c6d99'),
    ('cityscapes/heterogeneous/train/all_data_8.json', 8839,
     '8483095d5f15e3e786eb25800fb35d86306b801bd8769e36cd3aaca4d52ba074'),
    ('cityscapes/heterogeneous/train/all_data_9.json', 14879,
     'd740e71487e21ec66e21f6d513a84f527e984d8430c8d1b20866434c998ad9bb'),
    ('cityscapes/heterogeneous/train/all_data_10.json', 14175,
     'd66f157a776f5900b5ed776f52c7ee0bb2b022faf5bfedede0f975031206fc72'),
    ('cityscapes/heterogeneous/train/all_data_11.json', 6727,
     'eeed1e0052385b07f59cd464ccf2bf1421dce9dddd9c183f12b951bba020527a'),
    ('cityscapes/heterogeneous/train/all_data_12.json', 21511,
     'd91ff27d482cde5e3a02ddadc3f8ecd33a94f5ec4ad3674a2a39d4dfdcd3649a'),
    ('cityscapes/heterogeneous/train/all_data_13.json', 12271,
     'cc3d1939d66058c02b0cbd980fedd04395cf00c60dcc343e9778409137a9f5df'),
    ('cityscapes/heterogeneous/train/all_data_14.json', 9535,
     'fdabd9fcc7c04d0e36e07f1a77b51db02accd476b15a33d936fe77fc5f0d5ecf'),
    ('cityscapes/heterogeneous/train/all_data_15.json', 13303,
     '338e60c5e1faa869cda4ad287ab58ca0eb86d4a5f4d2c80f4ad92d9ad6806cf7'),
    ('cityscapes/heterogeneous/train/all_data_16.json', 26035,
     'a7ba825298a85494a4e531dec27841aa31b62dd604c4221503758300d0d3fe5e'),
    ('cityscapes/heterogeneous/train/all_data_17.json', 22515,
     'b95fbe265d3fc2232eb111692b86f3ca627f5996c39773effc89965406cb6726'),
    ('cityscapes/heterogeneous/train/all_data_18.json', 16575,
     '78f6949b429e32c3b976523565f90d6956fe3ba2c4bd53c379021ca2ec261ff4'),
    ('cityscapes/heterogeneous/train/all_data_19.json', 8215,
     'ce7c4a1480fb9b9300f055eba5cd9afeb3954556aec74070444f8c30b3a63b38'),
    ('cityscapes/heterogeneous/train/all_data_20.json', 16723,
     '1e6d507595299172439594a6c3f9297b462a77e757b9fd7ee9db7e85e303bb85'),
    ('cityscapes/heterogeneous/train/all_data_21.json', 12267,
     'e5763132bfa588d8dc8c227ed0ea14675f7b4d4ab369884b584aafc2088faf81'),
    ('cityscapes/heterogeneous/train/all_data_22.json', 11047,
     '802997a16ec7cd4323aab6868b1cd14df9f6f79926fad41ae8d5d2a865befbeb'),
    ('cityscapes/heterogeneous/train/all_data_23.json', 13063,
     '12ad6d9d436592aac5522cadc6711addb0046108e545763654adb1ea6bdc3b6b'),
    ('cityscapes/uniform/test/all_data_0.json', 56990,
     'd985b99cc6e54d150d435cf69eccdb1c40dbb905a46fd4ce906e191bde25c91e'),
    ('cityscapes/uniform/train/all_data_0.json', 7319,
     '5744bcb714e9d122b59feac8f35104d7fb3b236121d7d589f3db43852ed33bc3'),
    ('cityscapes/uniform/train/all_data_1.json', 7227,
     'dc37fe79e70a52a2162fcc859121e86567275ade734c40b5e9b680d8dbb17b12'),
    ('cityscapes/uniform/train/all_data_2.json', 7323,
     '3c0652836d89da3ecda303d6652e9a03c235c19ef18f7f6f9d0dda995951c1fb'),
    ('cityscapes/uniform/train/all_data_3.json', 7339,
     '8077cf6da92ce0f598d627d789f0cc6b71c96c0c57acda93d61069367679af60'),
    ('cityscapes/uniform/train/all_data_4.json', 7311,
     '17e46f13305f55f816e9c7c61c755d7d6e86c3e096154bdcb163291d006ea495'),
    ('cityscapes/uniform/train/all_data_5.json', 9707,
     'ba6e2545ae5865dc23b15ebe8a9e8548f712d833ff806b5180f68039cf98a6a7'),
    ('cityscapes/uniform/train/all_data_6.json', 10719,
     '7243aa377c382de70b024ba47d2f12b6cb1c8b096ff1036bba26eeb7335e71bc'),
    ('cityscapes/uniform/train/all_data_7.json', 10663,
     '5eefdc52be01755ecc5933a4b3f1964557d101b7e3541113ad645224ade7bfa2'),
    ('cityscapes/uniform/train/all_data_8.json', 10827,
     'a995d29ed641d747ad1fe7a18b26042351320286403ce919ecd946de4ddd5067'),
    ('cityscapes/uniform/train/all_data_9.json', 10771,
     '4696f8f736f69635ef8e4283d7ed313d14e334376967a60dc5ef701929b93273'),
    ('cityscapes/uniform/train/all_data_10.json', 10867,
     'fd38ad9f561527b0cee48ac7dcb6342ee9f4e24ee11ddb21880f6fb4da6ffff5'),
    ('cityscapes/uniform/train/all_data_11.json', 10795,
     '906ca78ecdf7d5354452dd305bfc3eeb72316c9a3327dbbe082d15fca4dcc27c'),
    ('cityscapes/uniform/train/all_data_12.json', 10711,
     '2b9ccaa9774bb452b2d25dfc77ce1c3e2fbae476898ee49a832aa6858917ae2b'),
    ('cityscapes/uniform/train/all_data_13.json', 14175,
     'b08984468b83f3dd86498d068dfee90e8dc90fc0c0dea515640ea326fd4aa9fc'),
    ('cityscapes/uniform/train/all_data_14.json', 17683,
     'f1925bf323c949ad56b0a30caff56a7a3a66ab014cdc6876e440d2ab9990c371'),
    ('cityscapes/uniform/train/all_data_15.json', 17759,
     'b33f0886a7651e4512b2f911f7673230ab4bae5b1272f01ac0f778dd7d69e9f0'),
    ('cityscapes/uniform/train/all_data_16.json', 17615,
     'ff843e96d2ca669ef7267e3a2563691d136b71e321d2d27bbebffb1119e600ff'),
    ('cityscapes/uniform/train/all_data_17.json', 17659,
     '328ef2684034b1df2cf06c550bfa77540d7c7ad1c662264191558749ef756420'),
    ('cityscapes/uniform/train/all_data_18.json', 17875,
     '31ced4a1ffab276d09333a4f75878422669cc5c8c9285fc17efd70ba5aec3792'),
    ('cityscapes/uniform/train/all_data_19.json', 17691,
     'fa67c621e94cde3221128d966f2197b93b5ffd8c40e8333e795797c2317ec846'),
    ('cityscapes/uniform/train/all_data_20.json', 20677,
     '0b9f889d259546adad48e51fc5f66c5c7e0589fa65011a12dc5adaa148925c55'),
    ('cityscapes/uniform/train/all_data_21.json', 24667,
     '8731fa772bfbda732189b38e27f0a3039767544a0eda888113e2948e06dd8f6f'),
    ('cityscapes/uniform/train/all_data_22.json', 28103,
     '5bebf2a723adcb32b47836984615cdcfc9202818f23a6526092e4ca0651436fb'),
    ('cityscapes/uniform/train/all_data_23.json', 28091,
     '95cb6a7851d8e8b8ee3b3b7a16d88db17fd130f74c35f4b0377c648e84c6d60c'),
    ('cityscapes/uniform/train/all_data_24.json', 9519,
     'b1379854cec6480769c59970bfe0dd5e392bbd15ded57daccc58d7479ff9e468'),
    ('idda/heterogeneous/bus/test/idda_by_city_bus_test_clients.json', 172912,
     'fc0f2a2a2867cadc63edf78ce71e82d8e3ab15f61fe942dbb0c484cf634dafeb'),
    ('idda/heterogeneous/bus/train/idda_by_city_bus_train_clients.json', 309095,
     '34c1e1ca3337756b0d1b15cf272208b18b89df150473512112f4032f3a272501'),
    ('idda/heterogeneous/country/test/idda_by_city_country_test_clients.json', 147914,
     '0da4ea7fc11d0305f6ce1ca991f518db703b819ddf524e6b453f746236f346e5'),
    ('idda/heterogeneous/country/train/idda_by_city_country_train_clients.json', 334405,
     '134a68a590af4f92b1a6680cd8f0cf4fc000cf7028e70c24a7d9353b9f6c8c9a'),
    ('idda/heterogeneous/rainy/test/idda_by_city_rainy_test_clients.json', 229026,
     '6c9081d210edec0cea93cc05c4d636944bc1886296e55abc11ed7d44cac6ebfe'),
    ('idda/heterogeneous/rainy/train/idda_by_city_rainy_train_clients.json', 252309,
     'd80927826c45d76aef589fcfe668341d7bdb916b9cb925fe9a6b5e6deefbd2af'),
    ('idda/uniform/bus/test/idda_uniform_bus_test_clients.json', 172912,
     'fc0f2a2a2867cadc63edf78ce71e82d8e3ab15f61fe942dbb0c484cf634dafeb'),
    ('idda/uniform/bus/train/idda_uniform_bus_train_clients.json', 309187,
     '9a51c14a48957b50fe9aa6bf95515ee2c9ea325c921ce028e8fd485780230423'),
    ('idda/uniform/country/test/idda_uniform_country_test_clients.json', 147914,
     '0da4ea7fc11d0305f6ce1ca991f518db703b819ddf524e6b453f746236f346e5'),
    ('idda/uniform/country/train/idda_uniform_country_train_clients.json', 334507,
     '50f2927e79312d9c5c725c4128db72a82e6853fe1ae3c71c5a8faf5d0ce93f22'),
    ('idda/uniform/rainy/test/idda_uniform_rainy_test_clients.json', 229026,
     '6c9081d210edec0cea93cc05c4d636944bc1886296e55abc11ed7d44cac6ebfe'),
    ('idda/uniform/rainy/train/idda_uniform_rainy_train_clients.json', 252429,
     'd690af2bec900e0d51dc3f9da47397ff4ca5ee0e7a404edb33cff4ad7fc55c48'),
)


def release_url(path: str) -> str:
  dataset, rest = path.split('/', 1)
  return RELEASE_URL.format(commit=RELEASE_COMMIT, dataset=dataset, rest=rest)
