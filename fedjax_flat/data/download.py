"""Downloads of the real datasets: official URLs, resumable transfers, checksums verified before use.

`fetch(resource, data_dir)` downloads into `<data_dir>/<file>.part`, resuming with an HTTP Range request
when a partial file exists, then verifies the size and the md5/sha256 before renaming it to its final
name. A mismatch deletes the .part file and raises `ChecksumError`. A network failure (e.g. this machine
is offline) raises `DownloadError` saying where to put the file by hand; the .part file is kept so the
next attempt resumes. Only urllib is used.

Archives are extracted with path checks (`safe_extract_tar`, `safe_extract_zip`). What each dataset fetches
and how it is post-processed is the catalogue's (data/sources/catalogue.py).
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
from typing import Callable, List, Optional, Sequence

from fedjax_flat import errors

CHUNK = 1 << 20


class DownloadError(errors.OperationError):
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
# Tiny-ImageNet zip = the md5 (and size) that torchvision-style loaders pin for the CS231n file.
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


def _provenance(resource: Resource) -> str:
  """'<size> bytes, <algo> <checksum>': what a hand-placed copy of the file must match."""
  algo, want = resource.checksum()
  return (f'{resource.size} bytes, ' if resource.size else '') + (f'{algo} {want}' if algo else 'no published checksum')


def manual_hint(resource: Resource, dest: str) -> str:
  return (f'Download it on a machine with internet access and place it at\n  {dest}\n'
          f'(from {resource.url}; {_provenance(resource)}). Then re-run the same command: the file is verified and '
          'used.')


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


def fetch_all(resources: Sequence[Resource], data_dir: str, *, opener=None, progress=None,
              then: Optional[Callable[[Resource, str], None]] = None, done: Optional[Callable[[Resource], bool]] = None,
              **kwargs) -> List[str]:
  """fetch() of every resource of a multi-file set; those that fail do not stop the others, and one
  DownloadError at the end lists every file still missing, each with its URL and where to place it by hand (an
  offline user fetches the whole list at once instead of one file per attempt). `then(resource, path)` runs after
  each file arrives (extraction); `done(resource)` skips a file already handled (its marker exists)."""
  paths, missing = [], []
  for r in resources:
    if done is not None and done(r):
      continue
    try:
      path = fetch(r, data_dir, opener=opener, progress=progress, **kwargs)
    except ChecksumError:
      raise
    except DownloadError as e:
      missing.append((r, str(e).split('\n')[0]))
      continue
    if then is not None:
      then(r, path)
    paths.append(path)
  if missing:
    lines = [f'{len(missing)} of {len(resources)} files could not be downloaded (this machine may be offline). '
             f'Download them on a machine with internet access and place each at its path, then re-run the same '
             f'command (each file is verified; the ones already here are kept):']
    for r, _ in missing:
      lines.append(f'  {os.path.join(data_dir, r.filename)}  <-  {r.url}  ({_provenance(r)})')
    lines.append(f'first error: {missing[0][1]}')
    raise DownloadError('\n'.join(lines))
  return paths


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


def lzma_decompress(src: str, dest: str) -> None:
  tmp = dest + '.tmp'
  with lzma.open(src, 'rb') as fi, open(tmp, 'wb') as fo:
    shutil.copyfileobj(fi, fo, CHUNK)
  os.replace(tmp, dest)


def default_data_dir() -> str:
  """Where datasets live unless config.data.data_dir says otherwise: $FEDJAX_FLAT_DATA or ~/.cache/fedjax_flat."""
  return os.environ.get('FEDJAX_FLAT_DATA', os.path.expanduser('~/.cache/fedjax_flat'))
