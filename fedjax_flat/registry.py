"""One registry mechanism for algorithms, models, datasets and tasks.

A `Registry` maps a config name to an entry (a builder function or a class) plus the metadata its module
declares with it (an algorithm's hyperparameter rules, a dataset's config fields and task, ...). Entries
register themselves where they are defined:

    MODELS = Registry('model', package='fedjax_flat.models')
    @MODELS.register('cifar_cnn')
    def cifar_cnn(num_classes, input_shape, ...): ...

and every module of `package` is imported on the first lookup, so adding one is writing its module: no
central list to edit. Lookups of an unknown name raise `ConfigError`-style `KeyError`s listing the names.

A name is taken once: registering another definition under a taken name raises `DuplicateName` (two modules
silently overwriting each other is a bug that changes results), unless `replace=True` says it is on purpose.
Running the same definition again (a notebook cell re-run, a config file loaded twice: the same qualified name
in the same source file) replaces it quietly. An entry defined outside `package` (a user's own algorithm) first
loads the package, so that it meets the built-in names whichever is imported first. A wrapper made with
`functools.wraps` has the origin of the function it wraps (a user's dataset function registered through
data/user.py is that function's definition).

`scoped(fn)`: entries registered for `fn` inside the block are withdrawn at its end, from every registry (the
front door's `ff.train(builder, ...)` runs an unregistered builder without leaving it registered).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import pkgutil
import weakref
from typing import Any, Callable, Dict, Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  fn: Any                                   # the builder (or class)
  meta: Dict[str, Any]                      # what the module declared with it


class UnknownName(KeyError):
  def __init__(self, kind: str, name: str, known: Iterable[str]):
    self.kind, self.name, self.known = kind, name, sorted(known)
    super().__init__(f'{kind}={name!r} is unknown; allowed: {self.known}')

  def __str__(self):
    return self.args[0]


class DuplicateName(ValueError):
  """A second, different definition registered under a taken name without replace=True."""


def _origin(fn) -> tuple:
  """(source file, qualified name) of a function or class: the same definition loaded twice has one origin."""
  fn = inspect.unwrap(fn) if callable(fn) else fn
  code = getattr(fn, '__code__', None)
  path = code.co_filename if code is not None else getattr(inspect.getmodule(fn), '__file__', None)
  return (os.path.realpath(path) if path else None, getattr(fn, '__qualname__', repr(fn)))


_REGISTRIES = weakref.WeakSet()     # every Registry, for `scoped`


class Registry:
  """name -> Entry; `package`: the package whose modules register entries on import (loaded lazily)."""

  def __init__(self, kind: str, package: Optional[str] = None, skip: Iterable[str] = ()):
    self.kind, self.package, self.skip = kind, package, set(skip)
    self._entries: Dict[str, Entry] = {}
    self._loaded = package is None
    _REGISTRIES.add(self)

  def register(self, name: str, *, replace: bool = False, **meta) -> Callable:
    """Registers `fn` as `name` with `meta`; see the module docstring for a name that is taken."""
    def deco(fn):
      if self.package and not str(getattr(fn, '__module__', '')).startswith(self.package):
        self._load()                       # a user's entry meets the built-in names now, not at the first lookup
      old = self._entries.get(name)
      if old is not None and not replace and _origin(old.fn) != _origin(fn):
        where = getattr(old.fn, '__module__', '?')
        raise DuplicateName(f'{self.kind} {name!r} is already registered (by {where}); choose another name, or '
                            f'pass replace=True to replace it on purpose')
      self._entries[name] = Entry(name, fn, dict(meta))
      return fn
    return deco

  def _load(self) -> None:
    # Import every module of the package once (recursively): they register themselves.
    if self._loaded:
      return
    self._loaded = True
    pkg = importlib.import_module(self.package)
    for m in pkgutil.walk_packages(pkg.__path__, self.package + '.'):
      if m.name.rsplit('.', 1)[-1] not in self.skip and not m.name.rsplit('.', 1)[-1].startswith('_'):
        importlib.import_module(m.name)

  def names(self):
    self._load()
    return sorted(self._entries)

  def __contains__(self, name) -> bool:
    self._load()
    return name in self._entries

  def entry(self, name: str) -> Entry:
    self._load()
    if name not in self._entries:
      raise UnknownName(self.kind, name, self._entries)
    return self._entries[name]

  def get(self, name: str):
    return self.entry(name).fn

  def meta(self, name: str, key: str, default=None):
    return self.entry(name).meta.get(key, default)

  def _withdraw(self, fn) -> None:
    for name in [n for n, e in self._entries.items() if e.fn is fn]:
      del self._entries[name]


@contextlib.contextmanager
def scoped(fn):
  """Entries registered for `fn` inside the block are withdrawn at its end (whatever the block raised), so the
  registries are left as they were; entries of other functions are kept."""
  try:
    yield
  finally:
    for r in list(_REGISTRIES):
      r._withdraw(fn)
