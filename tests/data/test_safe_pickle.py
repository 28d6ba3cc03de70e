import builtins
import os
import pickle
import re
import subprocess

import numpy as np
import pytest

from fedjax_flat.data import safe_pickle
from tests.fixtures.data_files import py2_pickle


class _Evil:
  def __init__(self, fn, args):
    self.fn, self.args = fn, args

  def __reduce__(self):
    return self.fn, self.args


def test_loads_cifar_like_python2_pickle():
  x = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
  obj = {b'batch_label': b'training batch 1 of 5', b'labels': [3, 7], b'data': x, b'filenames': [b'a.png', b'b.png']}
  out = safe_pickle.loads(py2_pickle(obj))
  assert out[b'labels'] == [3, 7] and out[b'filenames'] == [b'a.png', b'b.png']
  np.testing.assert_array_equal(out[b'data'], x)
  assert out[b'data'].dtype == np.uint8


@pytest.mark.parametrize('protocol', [0, 2, 4, 5])
def test_roundtrip_all_protocols(protocol):
  obj = {'a': np.float32(1.5), 'b': (1, 2.0, 'x', b'y', None, True), 'c': {1, 2}, 'd': np.ones((2, 2), np.int64)}
  out = safe_pickle.loads(pickle.dumps(obj, protocol=protocol))
  assert out['a'] == np.float32(1.5) and out['b'] == obj['b'] and out['c'] == {1, 2}
  np.testing.assert_array_equal(out['d'], obj['d'])


@pytest.mark.parametrize('fn, name', [(os.system, 'system'), (builtins.eval, 'eval'),
                                      (subprocess.call, 'call'), (builtins.exec, 'exec')])
@pytest.mark.parametrize('protocol', [0, 2, 4])
def test_malicious_pickle_refused_without_executing(tmp_path, fn, name, protocol):
  marker = tmp_path / 'pwned'
  if fn is os.system:
    args = (f'touch {marker}',)
  elif fn is subprocess.call:
    args = (['touch', str(marker)],)
  else:
    args = (f'open({str(marker)!r}, "w").close()',)
  payload = pickle.dumps({b'data': _Evil(fn, args)}, protocol=protocol)
  with pytest.raises(safe_pickle.UnsafePickleError, match=name):
    safe_pickle.loads(payload)
  assert not marker.exists()


def test_refuses_getattr_and_codecs_tricks(tmp_path):
  with pytest.raises(safe_pickle.UnsafePickleError, match=r'(__builtin__|builtins)\.getattr'):
    safe_pickle.loads(pickle.dumps(_Evil(getattr, ('x', 'upper')), protocol=2))
  # _codecs.encode is admitted only with latin1 (how Python 3 writes bytes at protocol 2)
  import _codecs
  with pytest.raises(safe_pickle.UnsafePickleError, match='latin1'):
    safe_pickle.loads(pickle.dumps(_Evil(_codecs.encode, ('eA==', 'base64')), protocol=2))
  assert safe_pickle.loads(pickle.dumps(b'\xff\x00abc', protocol=2)) == b'\xff\x00abc'


def test_hand_written_global_opcode_is_refused(tmp_path):
  marker = tmp_path / 'pwned2'
  payload = f"cposix\nsystem\n(Vtouch {marker}\ntR.".encode()
  with pytest.raises(safe_pickle.UnsafePickleError, match='posix.system'):
    safe_pickle.loads(payload)
  assert not marker.exists()


@pytest.mark.parametrize('protocol', [0, 2, 4, 5])
def test_sizes_a_pickle_may_construct_are_bounded(protocol):
  """A few bytes of pickle must not allocate gigabytes: refused before allocating."""
  for evil, name in [(_Evil(bytes, (4_000_000_000,)), 'bytes(4000000000)'),
                     (_Evil(bytearray, (10**10,)), 'bytearray'),
                     (_Evil(np.ndarray, ((10**5, 10**5),)), 'numpy.ndarray'),
                     (_Evil(safe_pickle._multiarray._reconstruct, (np.ndarray, (10**11,), b'b')), 'an array')]:
    payload = pickle.dumps(evil, protocol=protocol)
    assert len(payload) < 200
    with pytest.raises(safe_pickle.UnsafePickleError, match=r'refused .*' + re.escape(name)):
      safe_pickle.loads(payload)
  # The allowance is per load, so many small requests cannot add up to a large one.
  many = pickle.dumps([_Evil(bytes, (1 << 20,)) for _ in range(100)], protocol=protocol)
  with pytest.raises(safe_pickle.UnsafePickleError, match='allowance'):
    safe_pickle.loads(many)
  assert len(safe_pickle.loads(pickle.dumps([_Evil(bytes, (1 << 20,)) for _ in range(3)], protocol=protocol))) == 3


@pytest.mark.parametrize('protocol', [0, 2, 4, 5])
def test_large_real_data_is_not_bounded(protocol):
  """Arrays spelled out in the stream do not count against the allowance (CIFAR batches are 30 MB)."""
  x = np.arange(10000 * 3072, dtype=np.uint8).reshape(-1, 3072) if protocol > 0 else np.zeros((4, 3), np.float32)
  obj = {b'data': x, b'blob': bytes(range(256)) * 1000, b'ba': bytearray(b'xy' * 100)}
  out = safe_pickle.loads(pickle.dumps(obj, protocol=protocol), max_alloc_bytes=1 << 20)
  assert type(out[b'data']) is np.ndarray and out[b'data'].dtype == x.dtype
  np.testing.assert_array_equal(out[b'data'], x)
  assert out[b'blob'] == obj[b'blob'] and out[b'ba'] == obj[b'ba']
