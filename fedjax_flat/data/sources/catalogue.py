"""The download catalogue: every dataset's official files (URL, size, checksum) and post-processing.

`download(dataset, data_dir)` fetches every file of a dataset with data/download.py (resumable, verified) and
runs its post-processing (archive extraction with path checks; CIFAR100-PAM: LZMA-decompress TFF's
cifar100.sqlite and convert it to FedJAX's per-client SQLite files without TensorFlow). Segmentation:
`feddrive_splits` fetches FedDrive's released split JSONs (sha256-pinned); Cityscapes (login) and IDDA (on
request) cannot be fetched by a program, so `cityscapes` extracts the official zips once they are placed by hand
and otherwise raises `ManualDownloadRequired` with the URLs and the expected layout, and `idda` checks the layout
likewise. FEMNIST / Shakespeare are built by LEAF's scripts (data/sources/leaf.leaf_instructions); CelebA's
files sit behind the CelebA page's Google Drive (data/sources/celeba.celeba_instructions).
"""
from __future__ import annotations

import os
from typing import Dict, List, Sequence

from fedjax_flat.data.download import (ChecksumError, DownloadError, ManualDownloadRequired, Resource,  # noqa: F401
                                       fetch, fetch_all, lzma_decompress, safe_extract_tar, safe_extract_zip)
from fedjax_flat.data.sources import (camelyon17, cityscapes, feddrive_splits as fds, idda, ladd_data, msls, pam,
                                      retina_fundus, stackoverflow)
from fedjax_flat.data.sources.celeba import celeba_instructions
from fedjax_flat.data.sources.leaf import LEAF_DATASETS, leaf_instructions

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
    'camelyon17': [Resource(
        'camelyon17_v1.0.tar.gz',
        'https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/',
        note='WILDS camelyon17 v1.0 (about 10.7 GB; no published checksum), extracted into '
             'camelyon17_v1.0/ as WILDS does (metadata.csv + patches/; data/sources/camelyon17.py)')],
    'tiny_imagenet': [Resource('tiny-imagenet-200.zip', 'http://cs231n.stanford.edu/tiny-imagenet-200.zip',
                               248100043, md5='90528d7ca1a48142e341f4ef8d21d0de',
                               note='extracted to tiny-imagenet-200/ (data/sources/tiny_imagenet.py)')],
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


GLDV2_BASE_URL = 'https://s3.amazonaws.com/google-landmark'
GLDV2_NUM_TRAIN_SHARDS = 500
DATASETS = (tuple(RESOURCES) + ('gldv2_images', 'feddrive_splits', 'cityscapes', 'idda', 'ladd_splits', 'gta5',
                                'celeba', 'retina_fundus', 'camelyon17_release', 'msls') + LEAF_DATASETS)


def _post(dataset: str, paths: List[str], data_dir: str) -> List[str]:
  if dataset in ('cifar10_c', 'cifar100_c'):
    marker = os.path.join(data_dir, {'cifar10_c': 'CIFAR-10-C', 'cifar100_c': 'CIFAR-100-C'}[dataset], 'labels.npy')
    if not os.path.isfile(marker):
      safe_extract_tar(paths[0], data_dir)
    return [os.path.dirname(marker)]
  if dataset == 'camelyon17':
    root = os.path.join(data_dir, camelyon17.DIRNAME)
    if not os.path.isfile(os.path.join(root, 'metadata.csv')):
      safe_extract_tar(paths[0], root)
    return [root]
  if dataset == 'tiny_imagenet':
    marker = os.path.join(data_dir, 'tiny-imagenet-200', 'val', 'val_annotations.txt')
    if not os.path.isfile(marker):
      safe_extract_zip(paths[0], data_dir)
    return [os.path.join(data_dir, 'tiny-imagenet-200')]
  if dataset == 'gld160k':
    marker = os.path.join(data_dir, 'landmarks-user-160k', 'federated_train.csv')
    if not os.path.isfile(marker):
      safe_extract_zip(paths[0], data_dir)
    return [os.path.dirname(marker)]
  if dataset == 'cifar100_pam':
    sqlite_path = os.path.join(data_dir, pam.TFF_SQLITE)
    outs = [os.path.join(data_dir, pam.TRAIN_FILE), os.path.join(data_dir, pam.TEST_FILE)]
    if not all(os.path.isfile(p) for p in outs):
      if not os.path.isfile(sqlite_path):
        lzma_decompress(paths[0], sqlite_path)
      pam.convert_tff_sqlite(sqlite_path, data_dir)
    return outs
  if dataset == 'stackoverflow':
    sqlite_path = os.path.join(data_dir, stackoverflow.TFF_FILE)
    if not os.path.isfile(sqlite_path):
      lzma_decompress(paths[0], sqlite_path)
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
  if dataset == 'ladd_splits':
    paths = ladd_data.download_released(data_dir, opener=opener)
    return sorted({os.path.dirname(p) for p in paths})
  if dataset == 'gta5':
    return download_gta5(data_dir, opener=opener, progress=progress)
  if dataset in LEAF_DATASETS:
    raise DownloadError(leaf_instructions(dataset, data_dir))
  if dataset == 'celeba':
    raise DownloadError(celeba_instructions(data_dir))
  if dataset == 'retina_fundus':      # the FedSoup release's archives sit behind Google Drive pages
    raise ManualDownloadRequired(retina_fundus.instructions(os.path.join(data_dir, 'retina')))
  if dataset == 'camelyon17_release':
    root = os.path.join(data_dir, 'tiny_camelyon17')
    raise ManualDownloadRequired(f"download the FedSoup release's tiny Camelyon17 by hand ({camelyon17.RELEASE_URL}) "
                                 f'and extract it so that {root}/train/0.npz ... exist')
  if dataset == 'msls':
    return check_msls(data_dir)
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
  paths = fetch_all([Resource(os.path.join('feddrive_splits', *path.split('/')), fds.release_url(path), size,
                              sha256=sha) for path, size, sha in fds.RELEASED_FILES], data_dir, opener=opener)
  return sorted({os.path.dirname(os.path.dirname(p)) for p in paths})


def prepare_cityscapes(data_dir: str) -> List[str]:
  """Extracts the official zips placed in <data_dir>/cityscapes/; without them says where to get them."""
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


def check_msls(data_dir: str) -> List[str]:
  """MSLS (FedVPR) is not downloadable by a program: its root when train_val/ is in place, else the steps."""
  root = msls.default_root(data_dir)
  if os.path.isdir(os.path.join(root, 'train_val')):
    return [root]
  raise ManualDownloadRequired(msls.INSTRUCTIONS.replace('<data_dir>/msls', root))


def download_gta5(data_dir: str, *, opener=None, progress=None) -> List[str]:
  """GTA5 (LADD's source): the 10 image and 10 label zips of the official site (no published checksums),
  extracted into <data_dir>/gta5/{images,labels}; the split lines are in 'ladd_splits'."""
  root = ladd_data.default_root(data_dir, 'gta5')
  marker = lambda r: os.path.join(root, f'.{os.path.basename(r.filename)}.done')   # noqa: E731

  def extract(r, path):
    kind = 'images' if '_images' in r.filename else 'labels'
    safe_extract_zip(path, root)
    if not os.path.isdir(os.path.join(root, kind)):
      raise DownloadError(f'{r.filename} did not extract into {root}/{kind}/')
    open(marker(r), 'w').close()
  fetch_all(ladd_data.GTA5_RESOURCES, data_dir, opener=opener, progress=progress, then=extract,
            done=lambda r: os.path.isfile(marker(r)))
  return [root]


def check_idda(data_dir: str) -> List[str]:
  """IDDA is distributed on request: checks the layout or says where to get it and where to put it."""
  root = idda.default_root(data_dir)
  if os.path.isdir(root) and any(os.path.isdir(os.path.join(root, d, idda.IMAGE_DIR)) for d in os.listdir(root)):
    return [root]
  raise ManualDownloadRequired(
      'IDDA is distributed on request: ask for the "IDDA V3" release at '
      'https://idda-dataset.github.io/home/download/ (FedDrive uses its IDDAsmall folder). Extract it so that\n'
      f'  {root}/<domain>/{idda.IMAGE_DIR}/<id>_<domain>{idda.IMAGE_EXT}\n'
      f'  {root}/<domain>/{idda.LABEL_DIR}/<id>_<domain>{idda.LABEL_EXT}\n'
      'with <domain> = T<town>_<weather>_<viewpoint> (e.g. T01_CN_A), then re-run this command to check it.')
