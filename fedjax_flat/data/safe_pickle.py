"""A restricted unpickler for data files (CIFAR python batches are pickles).

`pickle.load` runs whatever callables a pickle names, so a downloaded or hand-placed file could execute
code. `load`/`loads` here admit only the globals needed to rebuild plain data: builtin containers and
scalars, and numpy arrays/dtypes/scalars. Any other global (os.system, builtins.eval, subprocess.Popen,
getattr, ...) raises `UnsafePickleError` naming it, before anything is called.

`_codecs.encode` (how Python 3 writes `bytes` at protocol <= 2) is admitted only with the 'latin1'
codec, so a pickle cannot reach other codecs through it.

Sizes: a few bytes of pickle can ask for gigabytes (`bytes(4000000000)`, `numpy.ndarray((10**10,))`). Real data
pickles never do: their arrays and strings are spelled out in the stream. So what the admitted constructors
would allocate from a size argument alone (bytes/bytearray of an int, an array from its shape) is bounded by
`max_alloc_bytes` in total per load (64 MiB by default); above it, `UnsafePickleError`, before allocating.
"""
from __future__ import annotations

import codecs
import io
import math
import numbers
import pickle
from typing import Any, BinaryIO

import numpy as np

from fedjax_flat import errors

try:  # numpy >= 2
  from numpy._core import multiarray as _multiarray
  from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
  from numpy.core import multiarray as _multiarray  # type: ignore
  from numpy.core import numeric as _numeric  # type: ignore


class UnsafePickleError(pickle.UnpicklingError, errors.DataFormatError):
  """A pickle referenced a global outside the allow-list."""


def _latin1_encode(obj, encoding='utf-8', errors='strict'):
  # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(str, 'latin1').
  if not isinstance(obj, str) or codecs.lookup(encoding).name != 'iso8859-1':
    raise UnsafePickleError(f'refused _codecs.encode with encoding={encoding!r} (only latin1 is allowed)')
  return codecs.encode(obj, 'latin1', errors)


_BUILTINS = {
    'dict': dict, 'list': list, 'tuple': tuple, 'set': set, 'frozenset': frozenset, 'str': str,
    'bytes': bytes, 'bytearray': bytearray, 'int': int, 'float': float, 'complex': complex, 'bool': bool,
}
_NUMPY = {'_reconstruct': _multiarray._reconstruct, 'scalar': _multiarray.scalar}

_ALLOWED = {}
for _mod in ('builtins', '__builtin__'):  # '__builtin__': Python 2 pickles (CIFAR)
  for _name, _obj in _BUILTINS.items():
    _ALLOWED[(_mod, _name)] = _obj
for _mod in ('numpy.core.multiarray', 'numpy._core.multiarray'):
  for _name, _obj in _NUMPY.items():
    _ALLOWED[(_mod, _name)] = _obj
for _mod in ('numpy.core.numeric', 'numpy._core.numeric'):  # protocol-5 array pickles
  _ALLOWED[(_mod, '_frombuffer')] = _numeric._frombuffer
_ALLOWED[('numpy', 'ndarray')] = np.ndarray
_ALLOWED[('numpy', 'dtype')] = np.dtype
_ALLOWED[('_codecs', 'encode')] = _latin1_encode
_ALLOWED[('collections', 'OrderedDict')] = __import__('collections').OrderedDict


MAX_ALLOC_BYTES = 64 << 20


class _NdarrayName:
  """What `numpy.ndarray` resolves to: calling it checks the size; `_reconstruct` maps it to np.ndarray."""

  def __init__(self, call):
    self._call = call

  def __call__(self, *args, **kwargs):
    return self._call(*args, **kwargs)


class SafeUnpickler(pickle.Unpickler):
  """pickle.Unpickler whose find_class consults the allow-list only (no imports), with bounded allocations."""

  def __init__(self, file, *, max_alloc_bytes: int = MAX_ALLOC_BYTES, **kwargs):
    super().__init__(file, **kwargs)
    self._budget = int(max_alloc_bytes)
    self._ndarray = _NdarrayName(self._new_ndarray)
    self._sized = {bytes: self._bytes, bytearray: self._bytearray}

  def _charge(self, nbytes, what: str) -> None:
    if nbytes > self._budget:
      raise UnsafePickleError(f'refused {what}: the pickle asks for {nbytes} bytes from a size argument alone, '
                              f'more than the {self._budget} left of its allowance (data pickles spell their '
                              'contents out)')
    self._budget -= nbytes

  def _sized_call(self, ctor, *args, **kwargs):
    if args and isinstance(args[0], numbers.Integral):
      self._charge(int(args[0]), f'{ctor.__name__}({int(args[0])})')
    return ctor(*args, **kwargs)

  def _bytes(self, *args, **kwargs):
    return self._sized_call(bytes, *args, **kwargs)

  def _bytearray(self, *args, **kwargs):
    return self._sized_call(bytearray, *args, **kwargs)

  def _array_bytes(self, shape, dtype, what):
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    if not all(isinstance(d, numbers.Integral) and d >= 0 for d in shape):
      raise UnsafePickleError(f'refused {what} with shape {shape!r}')
    self._charge(math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize, f'{what} of shape {shape}')

  def _reconstruct(self, subtype, shape, dtype):
    if subtype is not self._ndarray:
      raise UnsafePickleError(f'refused numpy _reconstruct of {subtype!r} (only numpy.ndarray)')
    self._array_bytes(shape, np.uint8 if isinstance(dtype, bytes) else dtype, 'an array')
    return _multiarray._reconstruct(np.ndarray, shape, dtype)

  def _new_ndarray(self, shape, dtype=float, buffer=None, *args, **kwargs):
    if buffer is None:          # a view of a buffer from the stream allocates nothing new
      self._array_bytes(shape, dtype, 'numpy.ndarray')
    return np.ndarray(shape, dtype, buffer, *args, **kwargs)

  def find_class(self, module: str, name: str) -> Any:
    obj = _ALLOWED.get((module, name))
    if obj is None:
      raise UnsafePickleError(f'refused to load global {module}.{name}: data pickles may only contain '
                              f'builtin containers/scalars and numpy arrays')
    if obj is bytes or obj is bytearray:
      return self._sized[obj]
    if obj is np.ndarray:
      return self._ndarray
    if obj is _multiarray._reconstruct:
      return self._reconstruct
    return obj

  def persistent_load(self, pid):
    raise UnsafePickleError(f'refused persistent id {pid!r}')


def load(f: BinaryIO, *, encoding: str = 'bytes', max_alloc_bytes: int = MAX_ALLOC_BYTES) -> Any:
  """Unpickles plain data from a binary file (encoding='bytes' for Python 2 pickles such as CIFAR)."""
  return SafeUnpickler(f, encoding=encoding, max_alloc_bytes=max_alloc_bytes).load()


def loads(data: bytes, *, encoding: str = 'bytes', max_alloc_bytes: int = MAX_ALLOC_BYTES) -> Any:
  return load(io.BytesIO(data), encoding=encoding, max_alloc_bytes=max_alloc_bytes)


__all__ = ['UnsafePickleError', 'SafeUnpickler', 'load', 'loads']
