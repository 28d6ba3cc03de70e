"""Download tests against a local http.server on 127.0.0.1 (loopback only, no internet)."""
import hashlib
import io
import os
import socket
import tarfile

import numpy as np
import pytest

from fedjax_flat.data.sources import cifar_c
from fedjax_flat.data import download as dl
from fedjax_flat.data.sources import catalogue
from tests.fixtures.http_server import loopback_opener as _opener

PAYLOAD = os.urandom(300_000)


def _res(url, data, **kw):
  kw.setdefault('size', len(data))
  kw.setdefault('md5', hashlib.md5(data).hexdigest())
  return dl.Resource('sub/file.bin', url, **kw)


def test_resume_with_range(server, tmp_path):
  handler, base = server
  handler.files['/f'] = PAYLOAD
  handler.cut_after = 100_000
  res = _res(base + '/f', PAYLOAD)
  with pytest.raises(dl.DownloadError) as e:
    dl.fetch(res, str(tmp_path), opener=_opener(), retries=1, timeout=10)
  part = tmp_path / 'sub' / 'file.bin.part'
  assert part.stat().st_size == 100_000 and 'a later run resumes' in str(e.value)
  assert not (tmp_path / 'sub' / 'file.bin').exists()
  handler.cut_after = None
  path = dl.fetch(res, str(tmp_path), opener=_opener(), retries=1, timeout=10)
  assert handler.seen_ranges[-1] == 'bytes=100000-'
  assert open(path, 'rb').read() == PAYLOAD and not part.exists()
  # already present and verified: no new request
  n = len(handler.seen_ranges)
  dl.fetch(res, str(tmp_path), opener=_opener())
  assert len(handler.seen_ranges) == n


def test_retries_resume_within_one_call(server, tmp_path):
  handler, base = server
  handler.files['/f'] = PAYLOAD
  handler.cut_after = 120_000  # each response is cut: three attempts finish the file
  path = dl.fetch(_res(base + '/f', PAYLOAD), str(tmp_path), opener=_opener(), retries=3, retry_wait=0)
  assert open(path, 'rb').read() == PAYLOAD
  assert handler.seen_ranges == [None, 'bytes=120000-', 'bytes=240000-']


def test_server_ignoring_range_restarts(server, tmp_path):
  handler, base = server
  handler.files['/f'] = PAYLOAD
  part = tmp_path / 'sub' / 'file.bin.part'
  part.parent.mkdir()
  part.write_bytes(b'x' * 5000)  # stale junk; the server answers 200 with the full body
  handler.ignore_range = True
  path = dl.fetch(_res(base + '/f', PAYLOAD), str(tmp_path), opener=_opener(), retries=1)
  assert open(path, 'rb').read() == PAYLOAD


def test_checksum_mismatch_deletes_part(server, tmp_path):
  handler, base = server
  handler.files['/f'] = PAYLOAD
  res = _res(base + '/f', PAYLOAD, md5='0' * 32)
  with pytest.raises(dl.ChecksumError, match='md5'):
    dl.fetch(res, str(tmp_path), opener=_opener(), retries=1)
  assert not (tmp_path / 'sub' / 'file.bin.part').exists() and not (tmp_path / 'sub' / 'file.bin').exists()
  res = _res(base + '/f', PAYLOAD, size=None, md5=None, sha256='1' * 64)
  with pytest.raises(dl.ChecksumError, match='sha256'):
    dl.fetch(res, str(tmp_path), opener=_opener(), retries=1)
  # a wrong hand-placed file is rejected too
  (tmp_path / 'sub' / 'file.bin').write_bytes(b'not it')
  with pytest.raises(dl.ChecksumError, match='bytes, expected'):
    dl.fetch(_res(base + '/f', PAYLOAD), str(tmp_path), opener=_opener())


def test_offline_error_says_where_to_put_the_file(tmp_path):
  s = socket.socket()
  s.bind(('127.0.0.1', 0))
  port = s.getsockname()[1]
  s.close()  # nothing listens there
  res = dl.Resource('cifar-10-python.tar.gz', f'http://127.0.0.1:{port}/cifar-10-python.tar.gz', 10, md5='a' * 32)
  with pytest.raises(dl.DownloadError) as e:
    dl.fetch(res, str(tmp_path), opener=_opener(), retries=1, timeout=5)
  msg = str(e.value)
  assert 'offline' in msg and str(tmp_path / 'cifar-10-python.tar.gz') in msg and 'a' * 32 in msg


def test_official_table():
  r = {k: v for k, v in catalogue.RESOURCES.items()}
  assert r['cifar10'][0].md5 == 'c58f30108f718f92721af3b95e74349a'
  assert r['cifar100'][0].md5 == 'eb9058c3a382ffc7106e4002c42a8d85'
  assert all(res.url.startswith('http') and (res.checksum()[0] or 'no published checksum' in res.note)
             for v in r.values() for res in v)
  assert r['stackoverflow'][1].sha256 == '1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c'


def test_download_and_extract_cifar10_c(server, tmp_path, monkeypatch):
  handler, base = server
  buf = io.BytesIO()
  labels = np.tile(np.arange(2), 5).astype(np.uint8)
  with tarfile.open(fileobj=buf, mode='w') as tar:
    for name, arr in (('labels.npy', labels), ('fog.npy', np.full((10, 32, 32, 3), 7, np.uint8))):
      b = io.BytesIO()
      np.save(b, arr)
      info = tarfile.TarInfo(f'CIFAR-10-C/{name}')
      info.size = len(b.getvalue())
      tar.addfile(info, io.BytesIO(b.getvalue()))
  data = buf.getvalue()
  handler.files['/CIFAR-10-C.tar'] = data
  res = dl.Resource('CIFAR-10-C.tar', base + '/CIFAR-10-C.tar', len(data), md5=hashlib.md5(data).hexdigest())
  monkeypatch.setitem(catalogue.RESOURCES, 'cifar10_c', [res])
  out = catalogue.download('cifar10_c', str(tmp_path), opener=_opener())
  assert out == [str(tmp_path / 'CIFAR-10-C')]
  x, y = cifar_c.load_corruption(str(tmp_path), 'fog', 2, check_official_sizes=False)
  assert x.shape == (2, 32, 32, 3) and np.all(x == 7)


def test_unsafe_tar_member_refused(tmp_path):
  p = tmp_path / 'evil.tar'
  with tarfile.open(p, 'w') as tar:
    info = tarfile.TarInfo('../escape.txt')
    info.size = 1
    tar.addfile(info, io.BytesIO(b'x'))
  with pytest.raises(Exception):
    dl.safe_extract_tar(str(p), str(tmp_path / 'out'))
  assert not (tmp_path / 'escape.txt').exists()


def test_download_stackoverflow_decompresses_and_loads(server, tmp_path, monkeypatch):
  import lzma
  from fedjax_flat.data import registry
  from fedjax_flat.data.sources import stackoverflow as so
  from tests.fixtures.data_files import make_stackoverflow_tff, write_word_counts
  handler, base = server
  src = tmp_path / 'src'
  src.mkdir()
  make_stackoverflow_tff(str(src / 'so.sqlite'), {'train': {'1': ['the a', 'a b c']}, 'test': {'2': ['the']}})
  sql = lzma.compress((src / 'so.sqlite').read_bytes())
  write_word_counts(str(src / so.WORD_COUNT_FILE), [('the', 5), ('a', 3)])
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:bz2') as tar:
    tar.add(str(src / so.WORD_COUNT_FILE), arcname=so.WORD_COUNT_FILE)
  wc = buf.getvalue()
  handler.files['/stackoverflow.sqlite.lzma'] = sql
  handler.files['/wc.tar.bz2'] = wc
  monkeypatch.setitem(catalogue.RESOURCES, 'stackoverflow', [
      dl.Resource('stackoverflow.sqlite.lzma', base + '/stackoverflow.sqlite.lzma', note='no published checksum'),
      dl.Resource(so.WORD_COUNT_ARCHIVE, base + '/wc.tar.bz2', len(wc), sha256=hashlib.sha256(wc).hexdigest())])
  out = catalogue.download('stackoverflow', str(tmp_path / 'd'), opener=_opener())
  assert out == [str(tmp_path / 'd' / so.TFF_FILE), str(tmp_path / 'd' / so.WORD_COUNT_ARCHIVE)]
  ds = registry.get_dataset('stackoverflow', data_dir=str(tmp_path / 'd'), vocab_size=2, sequence_length=3,
                            test_examples=0, cache=False)
  np.testing.assert_array_equal(ds.x, [[4, 1, 2], [4, 2, 3]])     # bos the a | bos a oov(b)
  np.testing.assert_array_equal(ds.test_y, [[1, 5, 0]])            # the eos pad


def test_leaf_datasets_explain_how_to_build_them(tmp_path):
  for name in ('femnist', 'shakespeare'):
    with pytest.raises(dl.DownloadError, match=f'cd leaf/data/{name} && ./preprocess.sh'):
      catalogue.download(name, str(tmp_path))
