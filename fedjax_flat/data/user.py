"""A user's own dataset through the front door: `ff.register_dataset(name, fn)`, then `config.dataset = name`.

    def clinics(num_clients=8, seed=0):            # its keyword arguments are its config.data fields
      rng = np.random.default_rng(seed)
      clients = [(rng.normal(size=(20, 6)).astype('float32'), rng.integers(0, 3, 20)) for _ in range(num_clients)]
      return {'clients': clients, 'test': (test_x, test_y)}        # optional: 'num_classes', 'client_test'

    ff.register_dataset('clinics', clinics)
    config.dataset, config.data.num_clients = 'clinics', 8          # validated like any dataset

`fn(**config.data)` returns one of
  - a dict: 'clients' a sequence of (x_k, y_k) pairs, one per client, or a generator / iterator yielding them
    (read once, kept in memory as a FederatedDataset); 'test' (x, y), the global test split; optional
    'num_classes' (default: the largest label + 1), 'client_test' (one (x, y) per client: per-client test
    splits), 'name' (how outputs name the data; default the registered name);
  - a dict with 'clients' a function k -> (x_k, y_k), 'sizes' [K] the number of examples of each client,
    'num_classes' (the clients are not read ahead to find it), 'test' and optional 'name': a streamed source
    (data/federated.ClientDataSource): nothing is held, client k is called when its round batches are built
    (data too large for memory; the host path trains it);
  - a FederatedDataset or any ClientDataSource, used as is.
Every client's x shares one per-example shape and dtype (the test split's); labels are integers in
[0, num_classes) of one shape (() = one class per example; token or pixel labels with the dataset's `task=`).
float64 arrays are stored float32 (what the models compute in). What is wrong with the output is one
BadInputError line naming the dataset, the client and the array, raised when the data are loaded, before
anything compiles; a streamed client is checked when it is read.

`register_dataset(name, fn, *, task=, rules=, limits=, check=, replace=)` takes data/registry.register's
declarations; `config.data` fields the fn does not take are refused by validation (config/data_fields.py), and
those of the default config it does not take (the digits' alpha, ...) are not passed to it.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence, Tuple

import numpy as np

from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.federated import ClientDataSource, FederatedDataset
from fedjax_flat.errors import BadInputError

_KEYS = ('clients', 'test', 'num_classes', 'client_test', 'name', 'sizes')


def register_dataset(name: str, fn: Callable, *, task=None, rules=None, limits=None, check=None,
                     replace: bool = False) -> Callable:
  """Registers `fn(**config.data)` (module docstring) as dataset `name`; returns `fn`. A name taken by another
  definition is refused (registry.DuplicateName) unless replace=True; re-running the same definition replaces it."""
  if not isinstance(name, str) or not name:
    raise BadInputError(f'register_dataset(name={name!r}): the name is a non-empty string (config.dataset)')
  if not callable(fn):
    raise BadInputError(f'register_dataset({name!r}, fn={fn!r}): fn is a function of the config.data fields '
                        "returning {'clients': ..., 'test': (x, y)} or a FederatedDataset")
  params = inspect.signature(fn).parameters.values()
  takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
  takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

  @functools.wraps(fn)      # its signature (the config.data fields) and its origin (a re-run replaces) are fn's
  def build(**kwargs):
    # the default config's fields fn does not take (validation refused the others): not passed
    out = fn(**(kwargs if takes_any else {k: v for k, v in kwargs.items() if k in takes}))
    return as_source(name, out)

  meta = {'task': task} if task is not None else {}
  data_registry.register(name, rules=rules, limits=limits, check=check, replace=replace, **meta)(build)
  return fn


def _bad(name: str, what: str) -> BadInputError:
  return BadInputError(f'dataset {name!r}: {what}')


def _pair(name: str, where: str, xy) -> Tuple[np.ndarray, np.ndarray]:
  """(x, y) as arrays with as many examples each; float64 -> float32."""
  if not isinstance(xy, (tuple, list)) or len(xy) != 2:
    raise _bad(name, f'{where} must be a pair (x, y) of arrays, got {type(xy).__name__}')
  try:
    x, y = np.asarray(xy[0]), np.asarray(xy[1])
  except (ValueError, TypeError) as e:
    raise _bad(name, f'{where} is not a pair of arrays ({e})') from None
  if x.dtype == object or y.dtype == object:
    raise _bad(name, f'{where}: x and y must be numeric arrays of one shape per example, got dtypes '
                     f'{x.dtype} and {y.dtype} (ragged lists?)')
  if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
    raise _bad(name, f'{where}: x has {x.shape[0] if x.ndim else "no"} examples but y has '
                     f'{y.shape[0] if y.ndim else "no"} (x {x.shape}, y {y.shape})')
  if x.dtype == np.float64:
    x = x.astype(np.float32)
  if not np.issubdtype(y.dtype, np.integer):
    if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
      y = y.astype(np.int32)
    else:
      raise _bad(name, f'{where}: labels y must be integers (class ids), got {y.dtype}')
  return x, y.astype(np.int32) if y.dtype != np.int32 else y


class _Spec:
  """The element spec every client's arrays must match: the first pair seen sets it."""

  def __init__(self, name: str):
    self.name, self.x, self.y = name, None, None

  def check(self, where: str, x: np.ndarray, y: np.ndarray) -> None:
    xs, ys = (x.shape[1:], x.dtype), y.shape[1:]
    if self.x is None:
      self.x, self.y, self.first = xs, ys, where
    elif xs != self.x or ys != self.y:
      raise _bad(self.name, f'{where} has x of shape [n, {", ".join(map(str, xs[0]))}] {xs[1]} and y [n'
                            f'{"".join(", " + str(d) for d in ys)}] but {self.first} has x [n, '
                            f'{", ".join(map(str, self.x[0]))}] {self.x[1]} and y [n'
                            f'{"".join(", " + str(d) for d in self.y)}]: every client shares one element spec')


def _check_labels(name: str, where: str, y: np.ndarray, num_classes: int) -> None:
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise _bad(name, f'{where} holds labels in [{y.min()}, {y.max()}], outside [0, num_classes={num_classes})')


def as_source(name: str, out) -> ClientDataSource:
  """A registered function's output (module docstring) as the source the round batcher reads."""
  if isinstance(out, ClientDataSource):
    return out
  if not isinstance(out, dict):
    raise _bad(name, f"fn returned {type(out).__name__}: return {{'clients': [(x, y), ...], 'test': (x, y)}} "
                     'or a FederatedDataset')
  unknown = sorted(set(out) - set(_KEYS))
  missing = [k for k in ('clients', 'test') if k not in out]
  if unknown or missing:
    raise _bad(name, f'fn returned a dict with keys {sorted(out)}: ' +
               (f'missing {missing}' if missing else f'unknown {unknown}') + f'; allowed: {list(_KEYS)}')
  spec = _Spec(name)
  test_x, test_y = _pair(name, "'test'", out['test'])
  if callable(out['clients']):
    return _streamed(name, out, spec, test_x, test_y)
  if 'sizes' in out:
    raise _bad(name, "'sizes' goes with 'clients' as a function k -> (x_k, y_k); a list of clients has its sizes")
  clients = out['clients']
  if isinstance(clients, (str, bytes, dict)) or not hasattr(clients, '__iter__'):
    raise _bad(name, f"'clients' must be a list or generator of (x, y) pairs, or a function k -> (x, y); got "
                     f'{type(clients).__name__}')
  pairs = []
  for k, xy in enumerate(clients):
    x, y = _pair(name, f'client {k}', xy)
    spec.check(f'client {k}', x, y)
    pairs.append((x, y))
  if not pairs:
    raise _bad(name, "'clients' is empty: at least one client")
  spec.check("'test'", test_x, test_y)
  if all(len(x) == 0 for x, _ in pairs):
    raise _bad(name, 'every client has 0 examples')
  num_classes = _num_classes(name, out, [y for _, y in pairs] + [test_y])
  for k, (_, y) in enumerate(pairs):
    _check_labels(name, f'client {k}', y, num_classes)
  _check_labels(name, "'test'", test_y, num_classes)
  if test_x.dtype != pairs[0][0].dtype:
    raise _bad(name, f"'test' x is {test_x.dtype} but the clients' x is {pairs[0][0].dtype}")
  sizes = [len(x) for x, _ in pairs]
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  x = np.concatenate([x for x, _ in pairs])
  y = np.concatenate([y for _, y in pairs])
  client_test = None
  if out.get('client_test') is not None:
    tests = list(out['client_test'])
    if len(tests) != len(pairs):
      raise _bad(name, f"'client_test' has {len(tests)} splits for {len(pairs)} clients: one (x, y) per client")
    tx, ty, client_test = [test_x], [test_y], []
    n = len(test_x)
    for k, xy in enumerate(tests):
      cx, cy = _pair(name, f'client_test {k}', xy)
      spec.check(f'client_test {k}', cx, cy)
      _check_labels(name, f'client_test {k}', cy, num_classes)
      tx.append(cx), ty.append(cy), client_test.append(np.arange(n, n + len(cx)))
      n += len(cx)
    test_x, test_y = np.concatenate(tx), np.concatenate(ty)
  return FederatedDataset.from_client_indices(
      x, y, [np.arange(offsets[k], offsets[k + 1]) for k in range(len(pairs))], test_x, test_y, num_classes,
      name=str(out.get('name') or name), client_test_indices=client_test)


def _num_classes(name: str, out, labels: Sequence[np.ndarray]) -> int:
  n = out.get('num_classes')
  if n is None:
    return int(max((int(y.max()) for y in labels if y.size), default=0)) + 1
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise _bad(name, f"'num_classes'={n!r} must be an integer >= 1")
  return int(n)


class StreamedSource(ClientDataSource):
  """A registered function's clients read one at a time (`'clients'`: k -> (x_k, y_k), with `'sizes'`): each
  read is checked against the declared size and the element spec of the test split."""

  def __init__(self, name: str, client_fn: Callable, sizes: np.ndarray, test: Tuple[np.ndarray, np.ndarray],
               num_classes: int, spec: _Spec):
    self.name, self._fn, self._sizes, self._test, self._spec = name, client_fn, sizes, test, spec
    self.num_classes = num_classes
    self.input_shape = tuple(test[0].shape[1:])
    self.label_shape = tuple(test[1].shape[1:])
    self.input_dtype = test[0].dtype
    self.label_dtype = np.dtype(np.int32)

  @property
  def num_clients(self) -> int:
    return len(self._sizes)

  def client_sizes(self) -> np.ndarray:
    return self._sizes

  def client_examples(self, k: int):
    x, y = _pair(self.name, f'client {k}', self._fn(int(k)))
    self._spec.check(f'client {k}', x, y)
    if len(x) != self._sizes[k]:
      raise _bad(self.name, f"client {k} returned {len(x)} examples but 'sizes'[{k}] = {self._sizes[k]}")
    _check_labels(self.name, f'client {k}', y, self.num_classes)
    return x, y

  def test_examples(self):
    return self._test


def _streamed(name, out, spec, test_x, test_y) -> StreamedSource:
  if 'sizes' not in out:
    raise _bad(name, "'clients' is a function k -> (x_k, y_k): give 'sizes', the number of examples of each client")
  if out.get('client_test') is not None:
    raise _bad(name, "'client_test' needs 'clients' as a list (a streamed source has the global test split only)")
  sizes = np.asarray(out['sizes'])
  if sizes.ndim != 1 or not len(sizes) or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 0).any():
    raise _bad(name, f"'sizes'={out['sizes']!r} must be a non-empty list of integers >= 0, one per client")
  if not sizes.any():
    raise _bad(name, 'every client has 0 examples')
  if out.get('num_classes') is None:
    raise _bad(name, "'clients' is a function k -> (x_k, y_k): give 'num_classes' (its clients are read only when "
                     'their round batches are built)')
  spec.check("'test'", test_x, test_y)
  num_classes = _num_classes(name, out, [test_y])
  _check_labels(name, "'test'", test_y, num_classes)
  return StreamedSource(str(out.get('name') or name), out['clients'], sizes.astype(np.int64), (test_x, test_y),
                        num_classes, spec)
