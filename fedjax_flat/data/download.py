"""Downloads of the real datasets: official URLs, resumable transfers, checksums verified before use.

`fetch(resource, data_dir)` downloads into `<data_dir>/<file>.part`, resuming with an HTTP Range request
when a partial file exists, then verifies the size and the md5/sha256 before renaming it to its final
name. A mismatch deletes the .part file and raises `ChecksumError`. A network failure (e.g. this machine
is offline) raises `DownloadError` saying where to put the file by hand; the .part file is kept so the
next attempt resumes. Only urllib is used.

`download(dataset, data_dir)` fetches every file of a dataset and runs its post-processing (archive
extraction with path checks; CIFAR100-PAM: LZMA-decompress TFF's cifar100.sqlite and convert it to
FedJAX's per-client SQLite files without TensorFlow). Segmentation: `feddrive_splits` fetches FedDrive's
released split JSONs (sha256-pinned); Cityscapes (login) and IDDA (on request) cannot be fetched by a
program, so `cityscapes` extracts the official zips once they are placed by hand and otherwise raises
`ManualDownloadRequired` with the URLs and the expected layout, and `idda` checks the layout likewise.
"""
from __future__ import annotations

import dataclasses
import hashlib
import lzma
import os
import shutil
import socket
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from typing import Callable, Dict, List, Optional, Sequence

CHUNK = 1 << 20


class DownloadError(RuntimeError):
  """The file could not be fetched (network failure, HTTP error)."""


class ChecksumError(DownloadError):
  """The fetched bytes do not match the expected size or checksum (the .part file was deleted)."""


class ManualDownloadRequired(DownloadError):
  """The dataset cannot be fetched by a program (login, request form): the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Resource:
  filename: str
  url: str
  size: Optional[int] = None  # bytes; None = not published
  md5: Optional[str] = None
  sha256: Optional[str] = None
  note: str = ''

  def checksum(self):
    if self.sha256:
      return 'sha256', self.sha256
    if self.md5:
      return 'md5', self.md5
    return None, None


# Checksums: CIFAR tarballs = the md5 published on the CIFAR page; CIFAR-C = md5 listed on the Zenodo
# records; cifar100.sqlite.lzma = the sha256/size pinned in fedjax/datasets/cifar100.py; GLDv2 split
# files = the md5 pinned in TFF's gldv2.py (their sizes are not published, so only the md5 is checked).
RESOURCES: Dict[str, List[Resource]] = {
    'cifar10': [Resource('cifar-10-python.tar.gz', 'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz',
                         170498071, md5='c58f30108f718f92721af3b95e74349a')],
    'cifar100': [Resource('cifar-100-python.tar.gz', 'https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz',
                          169001437, md5='eb9058c3a382ffc7106e4002c42a8d85')],
    'cifar100_pam': [Resource(
        'cifar100.sqlite.lzma', 'https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma',
        153019920, sha256='23d3916c9caa33395737ee560cc7cb77bbd05fc7b73647ee7be3a7e764172939',
        note='TFF cifar100 (Pachinko split), converted to federated_cifar100_{train,test}.sqlite')],
    'cifar10_c': [Resource('CIFAR-10-C.tar', 'https://zenodo.org/records/2535967/files/CIFAR-10-C.tar',
                           2918471680, md5='56bf5dcef84df0e2308c6dcbcbbd8499')],
    'cifar100_c': [Resource('CIFAR-100-C.tar', 'https://zenodo.org/records/3555552/files/CIFAR-100-C.tar',
                            2918473216, md5='11f0ed0f1191edbf9fa23466ae6021d3')],
    'gld160k': [Resource(
        'landmarks-user-160k.zip',
        'http://storage.googleapis.com/gresearch/federated-vision-datasets/landmarks-user-160k.zip',
        None, md5='53c36bd7d5fc12f927af2820b7e4a57c', note='size not published; md5 from TFF gldv2.py')],
    'gld23k': [
        Resource(os.path.join('gld23k', 'mini_gld_train_split.csv'),
                 'https://storage.googleapis.com/tff-datasets-public/mini_gld_train_split.csv',
                 None, md5='9fd62cf79a67046fdd673d3a0ac52841', note='size not published; md5 from TFF gldv2.py'),
        Resource(os.path.join('gld23k', 'mini_gld_test.csv'),
                 'https://storage.googleapis.com/tff-datasets-public/mini_gld_test.csv',
                 None, md5='298e9d19d66357236f66fe8e22920933', note='size not published; md5 from TFF gldv2.py'),
    ],
    # TFF publishes no checksum or size of stackoverflow.sqlite.lzma (its loader downloads it unchecked); the
    # word counts' sha256 is the one pinned in TFF's stackoverflow.load_word_counts.
    'stackoverflow': [
        Resource('stackoverflow.sqlite.lzma', 'https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma',
                 None, note='no published checksum; decompressed to stackoverflow.sqlite'),
        Resource('stackoverflow.word_count.tar.bz2',
                 'https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2', None,
                 sha256='1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c',
                 note='sha256 from TFF stackoverflow.load_word_counts; read as it is'),
    ],
}
# LEAF's FEMNIST and Shakespeare have no file to download: LEAF's scripts build the JSON files from NIST SD19
# (by_class.zip, by_write.zip) and Project Gutenberg's complete works (data/sources/leaf.py).
LEAF_DATASETS = ('femnist', 'shakespeare')


def leaf_instructions(dataset: str, data_dir: str) -> str:
  return (f'{dataset} is built by LEAF\'s own scripts (no file of it is published): on a machine with internet '
          f'access run\n  git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/{dataset} && ./preprocess.sh\n'
          f'(it downloads the raw data and writes data/all_data/*.json), then copy leaf/data/{dataset}/data to '
          f'{os.path.join(data_dir, dataset)} or pass --config.data.data_dir=<...>/leaf/data/{dataset}/data')


GLDV2_BASE_URL = 'https://s3.amazonaws.com/google-landmark'
GLDV2_NUM_TRAIN_SHARDS = 500
DATASETS = tuple(RESOURCES) + ('gldv2_images', 'feddrive_splits', 'cityscapes', 'idda') + LEAF_DATASETS


def _hash(path: str, algo: str) -> str:
  h = hashlib.new(algo)
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(CHUNK), b''):
      h.update(chunk)
  return h.hexdigest()


def verify(path: str, resource: Resource) -> None:
  """Raises ChecksumError unless path has the resource's size and checksum."""
  size = os.path.getsize(path)
  if resource.size is not None and size != resource.size:
    raise ChecksumError(f'{path}: {size} bytes, expected {resource.size} ({resource.url})')
  algo, want = resource.checksum()
  if algo:
    got = _hash(path, algo)
    if got != want.lower():
      raise ChecksumError(f'{path}: {algo} {got}, expected {want} ({resource.url}); the file is corrupted or '
                          f'not the official one')


def manual_hint(resource: Resource, dest: str) -> str:
  algo, want = resource.checksum()
  check = f'{algo} {want}' if algo else 'no published checksum'
  size = f'{resource.size} bytes, ' if resource.size else ''
  return (f'Download it on a machine with internet access and place it at\n  {dest}\n'
          f'(from {resource.url}; {size}{check}). Then re-run the same command: the file is verified and used.')


def _default_opener():
  return urllib.request.build_opener()


def fetch(resource: Resource, data_dir: str, *, opener=None, timeout: float = 60.0, retries: int = 3,
          retry_wait: float = 2.0, progress: Optional[Callable[[int, Optional[int]], None]] = None) -> str:
  """Downloads resource into data_dir (resuming <file>.part), verifies it, returns its final path."""
  dest = os.path.join(data_dir, resource.filename)
  os.makedirs(os.path.dirname(dest) or '.', exist_ok=True)
  if os.path.isfile(dest):
    verify(dest, resource)  # a hand-placed or earlier file must match too
    return dest
  part = dest + '.part'
  opener = opener or _default_opener()
  last_err = None
  for attempt in range(max(1, retries)):
    if attempt:
      time.sleep(retry_wait)
    offset = os.path.getsize(part) if os.path.isfile(part) else 0
    if resource.size is not None and offset > resource.size:
      os.remove(part)
      offset = 0
    if resource.size is not None and offset == resource.size:
      break  # complete already; verify below
    req = urllib.request.Request(resource.url, headers={'User-Agent': 'fedjax_flat-download/1'})
    if offset:
      req.add_header('Range', f'bytes={offset}-')
    try:
      with opener.open(req, timeout=timeout) as resp:
        status = getattr(resp, 'status', None) or resp.getcode()
        if offset and status == 206:
          crange = resp.headers.get('Content-Range', '')
          if not crange.startswith(f'bytes {offset}-'):
            raise DownloadError(f'{resource.url}: server answered Range bytes={offset}- with {crange!r}')
          mode = 'ab'
        else:
          mode, offset = 'wb', 0  # server ignored the Range request: start over
        total = resp.headers.get('Content-Length')
        total = offset + int(total) if total is not None else resource.size
        with open(part, mode) as f:
          done = offset
          while True:
            chunk = resp.read(CHUNK)
            if not chunk:
              break
            f.write(chunk)
            done += len(chunk)
            if progress:
              progress(done, total)
        if total is not None and done < total:
          raise DownloadError(f'{resource.url}: connection closed after {done} of {total} bytes')
      last_err = None
      break
    except urllib.error.HTTPError as e:
      if e.code == 416 and offset:  # Range not satisfiable: the .part file is probably complete
        last_err = None
        break
      last_err = e
      if 400 <= e.code < 500:
        break
    except (urllib.error.URLError, socket.timeout, ConnectionError, DownloadError, OSError) as e:
      last_err = e
  if last_err is not None:
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    kept = f' {have} bytes kept in {part} (a later run resumes).' if have else ''
    raise DownloadError(
        f'could not download {resource.url} ({type(last_err).__name__}: {last_err}); this machine may be '
        f'offline.{kept}\n{manual_hint(resource, dest)}'
    ) from last_err
  try:
    verify(part, resource)
  except ChecksumError as e:
    os.remove(part)
    raise ChecksumError(f'{e}\nThe partial file was deleted; run again to re-download.') from None
  os.replace(part, dest)
  return dest


# ----------------------------------------------------------------------------------------------------
# Post-processing.


def safe_extract_tar(path: str, out_dir: str) -> None:
  with tarfile.open(path) as tar:
    try:
      tar.extractall(out_dir, filter='data')  # rejects absolute paths, '..', links outside, devices
    except TypeError:  # pragma: no cover - Python without extraction filters
      for m in tar.getmembers():
        target = os.path.realpath(os.path.join(out_dir, m.name))
        if not target.startswith(os.path.realpath(out_dir) + os.sep) or not (m.isfile() or m.isdir()):
          raise ValueError(f'{path}: refusing to extract member {m.name!r}')
      tar.extractall(out_dir)


def safe_extract_zip(path: str, out_dir: str) -> None:
  root = os.path.realpath(out_dir)
  with zipfile.ZipFile(path) as z:
    for name in z.namelist():
      target = os.path.realpath(os.path.join(out_dir, name))
      if not (target == root or target.startswith(root + os.sep)):
        raise ValueError(f'{path}: refusing to extract member {name!r} outside {out_dir}')
    z.extractall(out_dir)


def _lzma_decompress(src: str, dest: str) -> None:
  tmp = dest + '.tmp'
  with lzma.open(src, 'rb') as fi, open(tmp, 'wb') as fo:
    shutil.copyfileobj(fi, fo, CHUNK)
  os.replace(tmp, dest)


def _post(dataset: str, paths: List[str], data_dir: str) -> List[str]:
  if dataset in ('cifar10_c', 'cifar100_c'):
    marker = os.path.join(data_dir, {'cifar10_c': 'CIFAR-10-C', 'cifar100_c': 'CIFAR-100-C'}[dataset], 'labels.npy')
    if not os.path.isfile(marker):
      safe_extract_tar(paths[0], data_dir)
    return [os.path.dirname(marker)]
  if dataset == 'gld160k':
    marker = os.path.join(data_dir, 'landmarks-user-160k', 'federated_train.csv')
    if not os.path.isfile(marker):
      safe_extract_zip(paths[0], data_dir)
    return [os.path.dirname(marker)]
  if dataset == 'cifar100_pam':
    from fedjax_flat.data.sources import pam
    sqlite_path = os.path.join(data_dir, pam.TFF_SQLITE)
    outs = [os.path.join(data_dir, pam.TRAIN_FILE), os.path.join(data_dir, pam.TEST_FILE)]
    if not all(os.path.isfile(p) for p in outs):
      if not os.path.isfile(sqlite_path):
        _lzma_decompress(paths[0], sqlite_path)
      pam.convert_tff_sqlite(sqlite_path, data_dir)
    return outs
  if dataset == 'stackoverflow':
    from fedjax_flat.data.sources import stackoverflow
    sqlite_path = os.path.join(data_dir, stackoverflow.TFF_FILE)
    if not os.path.isfile(sqlite_path):
      _lzma_decompress(paths[0], sqlite_path)
    return [sqlite_path, paths[1]]
  return paths  # CIFAR tarballs are read directly; gld23k CSVs are used as they are


def download(dataset: str, data_dir: str, *, opener=None, progress=None, shards: Sequence[int] = ()) -> List[str]:
  """Fetches and post-processes one dataset; returns the paths ready for the loaders."""
  if dataset == 'gldv2_images':
    return download_gldv2_images(data_dir, shards or range(GLDV2_NUM_TRAIN_SHARDS), opener=opener,
                                 progress=progress)
  if dataset == 'feddrive_splits':
    return download_feddrive_splits(data_dir, opener=opener)
  if dataset == 'cityscapes':
    return prepare_cityscapes(data_dir)
  if dataset == 'idda':
    return check_idda(data_dir)
  if dataset in LEAF_DATASETS:
    raise DownloadError(leaf_instructions(dataset, data_dir))
  if dataset not in RESOURCES:
    raise ValueError(f'unknown dataset {dataset!r}; allowed: {DATASETS}')
  paths = [fetch(r, data_dir, opener=opener, progress=progress) for r in RESOURCES[dataset]]
  return _post(dataset, paths, data_dir)


def download_gldv2_images(data_dir: str, shards: Sequence[int], *, opener=None, progress=None,
                          keep_tars: bool = False) -> List[str]:
  """GLDv2 train shards images_%03d.tar (each checked against its md5sum/train/md5.images_%03d.txt),
  extracted into <data_dir>/gldv2/train/<a>/<b>/<c>/<id>.jpg. Several hundred GB in total."""
  out_dir = os.path.join(data_dir, 'gldv2', 'train')
  tar_dir = os.path.join(data_dir, 'gldv2', 'tars')
  os.makedirs(out_dir, exist_ok=True)
  done = []
  for s in shards:
    marker = os.path.join(out_dir, f'.images_{s:03d}.done')
    if os.path.isfile(marker):
      done.append(marker)
      continue
    md5_res = Resource(f'md5.images_{s:03d}.txt', f'{GLDV2_BASE_URL}/md5sum/train/md5.images_{s:03d}.txt',
                       note='checksum file; no checksum of its own')
    md5_path = fetch(md5_res, tar_dir, opener=opener)
    with open(md5_path) as f:
      tokens = f.read().split()
    if not tokens or len(tokens[0]) != 32:
      os.remove(md5_path)
      raise DownloadError(f'{md5_res.url}: unexpected content {tokens[:2]!r}')
    tar_res = Resource(f'images_{s:03d}.tar', f'{GLDV2_BASE_URL}/train/images_{s:03d}.tar', md5=tokens[0])
    tar_path = fetch(tar_res, tar_dir, opener=opener, progress=progress)
    safe_extract_tar(tar_path, out_dir)
    if not keep_tars:
      os.remove(tar_path)
    open(marker, 'w').close()
    done.append(marker)
  return done


# ----------------------------------------------------------------------------------------------------
# Segmentation (FedDrive): split files from the release; Cityscapes and IDDA need a manual step.


def download_feddrive_splits(data_dir: str, *, opener=None) -> List[str]:
  """FedDrive's released split JSONs (sha256-pinned) into <data_dir>/feddrive_splits/<dataset>/..."""
  from fedjax_flat.data.sources import feddrive_splits as fds
  paths = [fetch(Resource(os.path.join('feddrive_splits', *path.split('/')), fds.release_url(path), size,
                          sha256=sha), data_dir, opener=opener)
           for path, size, sha in fds.RELEASED_FILES]
  return sorted({os.path.dirname(os.path.dirname(p)) for p in paths})


def prepare_cityscapes(data_dir: str) -> List[str]:
  """Extracts the official zips placed in <data_dir>/cityscapes/; without them says where to get them."""
  from fedjax_flat.data.sources import cityscapes
  root = cityscapes.default_root(data_dir)
  ready = lambda: all(os.path.isdir(os.path.join(root, d, s)) for d in ('leftImg8bit', 'gtFine')
                      for s in ('train', 'val'))
  if ready():
    return [root]
  zips = [os.path.join(root, name) for name in cityscapes.URLS]
  if all(os.path.isfile(z) for z in zips):
    for z in zips:
      safe_extract_zip(z, root)
    if ready():
      return [root]
    raise DownloadError(f'extracted {zips} but {root} still lacks leftImg8bit/{{train,val}} and gtFine/{{train,val}}')
  urls = '\n'.join(f'  {name}: {url}' for name, url in cityscapes.URLS.items())
  raise ManualDownloadRequired(
      f'Cityscapes needs a login at https://www.cityscapes-dataset.com (free registration). Download\n{urls}\n'
      f'and put both zips in {root}/, then re-run this command to extract them. Expected layout:\n'
      f'  {root}/leftImg8bit/{{train,val}}/<city>/<city>_<seq>_<frame>_leftImg8bit.png\n'
      f'  {root}/gtFine/{{train,val}}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png')


def check_idda(data_dir: str) -> List[str]:
  """IDDA is distributed on request: checks the layout or says where to get it and where to put it."""
  from fedjax_flat.data.sources import idda
  root = idda.default_root(data_dir)
  if os.path.isdir(root) and any(os.path.isdir(os.path.join(root, d, idda.IMAGE_DIR)) for d in os.listdir(root)):
    return [root]
  raise ManualDownloadRequired(
      'IDDA is distributed on request: ask for the "IDDA V3" release at '
      'https://idda-dataset.github.io/home/download/ (FedDrive uses its IDDAsmall folder). Extract it so that\n'
      f'  {root}/<domain>/{idda.IMAGE_DIR}/<id>_<domain>{idda.IMAGE_EXT}\n'
      f'  {root}/<domain>/{idda.LABEL_DIR}/<id>_<domain>{idda.LABEL_EXT}\n'
      'with <domain> = T<town>_<weather>_<viewpoint> (e.g. T01_CN_A), then re-run this command to check it.')
