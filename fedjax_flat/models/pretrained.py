"""Saving and loading parameter pytrees, with strict shape checks and classifier re-initialization.

The use case is fine-tuning a pretrained backbone (MobileNetV2-GN pretrained on ImageNet, 1000 classes) on a
task with another number of classes (Landmarks-User-160k, 2,028 classes): every backbone leaf must match the
freshly initialized model exactly, and the classifier is taken from the fresh initialization.

File formats (chosen by the file name):
  *.npz      one array per leaf, keys are '/'-joined paths ('features_01/dw_conv/kernel');
  otherwise  flax.serialization msgpack of the nested dict (`flax.serialization.msgpack_serialize`).
No pretrained weights ship with the project (no downloads); convert them offline to either format.
"""
from __future__ import annotations

import io
import os
import re
from typing import Any, Dict, Optional

import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import errors
from fedjax_flat.schema import Choice, Field, Section, String
from fedjax_flat.errors import ConfigError
from fedjax_flat.run_dir import is_run_dir

Params = Any
SEP = '/'


def _is_npz(path: str) -> bool:
  return os.fspath(path).endswith('.npz')


def flatten(params: Params) -> Dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf}."""
  params = flax.serialization.to_state_dict(params)
  return flax.traverse_util.flatten_dict(params, sep=SEP)


def unflatten(flat: Dict[str, Any]) -> Dict[str, Any]:
  return flax.traverse_util.unflatten_dict(dict(flat), sep=SEP)


def save_params(path: str, params: Params) -> None:
  """Writes `params` (a nested dict of arrays) to `path` (.npz or msgpack)."""
  flat = {k: np.asarray(jax.device_get(v)) for k, v in flatten(params).items()}
  d = os.path.dirname(os.fspath(path))
  if d:
    os.makedirs(d, exist_ok=True)
  if _is_npz(path):
    with open(path, 'wb') as f:
      np.savez(f, **flat)
  else:
    with open(path, 'wb') as f:
      f.write(flax.serialization.msgpack_serialize(unflatten(flat)))


def read_params(path: str) -> Dict[str, Any]:
  """Reads a params file written by `save_params` (or any compatible .npz / msgpack); a nested dict."""
  with open(path, 'rb') as f:     # a missing file: the OSError it is
    raw = f.read()
  with errors.reading(path, 'a params file (.npz of \'/\'-joined keys, or flax msgpack)'):
    if _is_npz(path):
      with np.load(io.BytesIO(raw), allow_pickle=False) as z:    # object arrays are refused (no pickle)
        return unflatten({k: np.asarray(z[k]) for k in z.files})
    try:
      tree = flax.serialization.msgpack_restore(raw)
    except Exception as e:  # noqa: BLE001 -- msgpack's OutOfData etc. are no ValueErrors; the input is the file
      raise errors.DataFormatError(f'{path}: not a params file (.npz or flax msgpack) ({type(e).__name__}: '
                                   f'{str(e)[:200]}); the file is truncated, corrupted or in another format') from e
    if not isinstance(tree, dict):
      raise errors.DataFormatError(f'{path}: a msgpack params file holds a dict of arrays, not a '
                                   f'{type(tree).__name__}')
    return tree


def find_classifier_key(params_init: Params, num_classes: Optional[int] = None) -> str:
  """The classifier's path prefix.

  'classifier' if the model has a top-level submodule of that name (ResNets and MobileNetV2 name it so);
  otherwise, among the top-level submodules holding a leaf whose last dimension is `num_classes`, the last
  in natural order of Flax's automatic names ('Dense_10' after 'Dense_2'; dict order is not reliable, since
  jax transformations return dicts with sorted keys). Pass `classifier_key` when this guess is ambiguous.
  """
  params_init = flax.serialization.to_state_dict(params_init)
  if 'classifier' in params_init:
    return 'classifier'
  candidates = []
  for k, sub in params_init.items():
    leaves = jax.tree_util.tree_leaves(sub)
    if num_classes is not None and any(l.shape and l.shape[-1] == num_classes for l in leaves):
      candidates.append(k)
  if not candidates:
    raise errors.BadInputError('cannot find the classifier: pass classifier_key= (a path prefix such as '
                     f"'Dense_2'); top-level keys are {list(params_init)}")
  return max(candidates, key=_natural_key)


def _natural_key(name: str):
  return [(0, int(t), '') if t.isdigit() else (1, 0, t) for t in re.split(r'(\d+)', name)]


def _under(path: str, prefix: str) -> bool:
  return path == prefix or path.startswith(prefix + SEP)


def load_pretrained(model, params_init: Params, path: str, *, reinit_classifier: bool = True,
                    classifier_key: Optional[str] = None) -> Params:
  """Loads pretrained params for `model`, checked leaf by leaf against `params_init`.

  Args:
    model: the `base.Model` (its name and num_classes are used for messages and classifier detection).
    params_init: freshly initialized params of `model` for the target task (e.g. `model.init(rng, x)`);
      they define the expected tree, the shapes and dtypes, and supply the re-initialized classifier.
    path: a file written by `save_params` (.npz of '/'-joined keys, or msgpack).
    reinit_classifier: if True (default), every leaf under `classifier_key` comes from `params_init`, whatever
      the file holds there (absent, or another class count); if False the classifier is checked like the rest.
    classifier_key: '/'-joined path prefix of the classifier; default `find_classifier_key`.

  Returns:
    A params tree with the structure of `params_init`: file values (cast to the dtypes of `params_init`),
    except the classifier when `reinit_classifier`.

  Raises:
    ValueError listing every missing key, unexpected key and shape mismatch (path: file shape vs expected).
  """
  return fit_params(model, params_init, read_params(path), source=path, reinit_classifier=reinit_classifier,
                    classifier_key=classifier_key)


def fit_params(model, params_init: Params, source_params: Params, *, source: str = 'params',
               reinit_classifier=True, classifier_key: Optional[str] = None) -> Params:
  """`load_pretrained` on an in-memory tree (e.g. another run's checkpoint); `source` names it in errors.

  reinit_classifier: True / False as in `load_pretrained`, or 'auto': keep the source's classifier when every
  one of its leaves has the model's shape (same number of classes), else re-initialize it.
  """
  path = source
  name = getattr(model, 'name', type(model).__name__)
  expected = flatten(params_init)
  loaded = flatten(source_params)
  skip = None
  if reinit_classifier:
    skip = classifier_key or find_classifier_key(params_init, getattr(model, 'num_classes', None))
    if not any(_under(k, skip) for k in expected):
      raise errors.BadInputError(f'classifier_key={skip!r} matches no parameter of {name}')
    if reinit_classifier == 'auto' and all(
        k in loaded and tuple(np.shape(loaded[k])) == tuple(v.shape) for k, v in expected.items() if _under(k, skip)):
      skip = None        # same classes: the source's classifier is kept (and checked like the rest)

  def checked(k):
    return skip is None or not _under(k, skip)

  missing = sorted(k for k in expected if checked(k) and k not in loaded)
  unexpected = sorted(k for k in loaded if checked(k) and k not in expected)
  mismatched = sorted(k for k in expected if checked(k) and k in loaded
                      and tuple(np.shape(loaded[k])) != tuple(expected[k].shape))
  if missing or unexpected or mismatched:
    lines = [f'{path}: pretrained params do not fit model {name!r}'
             + (f' (classifier {skip!r} excluded from the check)' if skip else '') + ':']
    lines += [f'  shape mismatch {k}: file {tuple(np.shape(loaded[k]))} vs model {tuple(expected[k].shape)}'
              for k in mismatched]
    lines += [f'  missing in file {k}: model {tuple(expected[k].shape)}' for k in missing]
    lines += [f'  unexpected in file {k}: file {tuple(np.shape(loaded[k]))}' for k in unexpected]
    raise errors.BadInputError('\n'.join(lines))
  for k in expected:
    if checked(k):
      a = np.asarray(loaded[k])
      if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise errors.DataFormatError(f'{path}: parameter {k} holds {a.dtype} values, not numbers')
      if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
        raise errors.DataFormatError(f'{path}: parameter {k} holds {int(np.sum(~np.isfinite(a)))} non-finite '
                                     'values (NaN / inf): the params are diverged or corrupted')

  out = {k: (v if not checked(k) else jnp.asarray(loaded[k], dtype=v.dtype)) for k, v in expected.items()}
  return flax.serialization.from_state_dict(params_init, unflatten(out))


# config.init: declared with the code that reads it (config/schema.py collects it)
def _init_check(cfg) -> None:
  init = cfg.init
  ckpt, pre = init.get('checkpoint', ''), init.get('pretrained', '')
  if ckpt and pre:
    raise ConfigError('init.pretrained', pre, f'init.checkpoint={ckpt!r} is set too: use one of the two')
  if ckpt and not is_run_dir(ckpt):
    raise ConfigError('init.checkpoint', ckpt, 'must be a fedjax_flat run directory (config.json + checkpoints/)')


_PATH = 'must be a string (a path; empty = off)'


SECTION = Section('init', (
    Field('checkpoint', String('', _PATH), 'a fedjax_flat run directory (or its checkpoints/) to start from'),
    Field('model', Choice('global', ('global', 'swa', 'wima')), "which of that run's models"),
    Field('pretrained', String('', _PATH), 'or a .npz / msgpack params file (models/pretrained.py)'),
    Field('reinit_classifier', Choice('auto', ('auto', 'always', 'never')),
          "'auto': re-init when the class count differs"),
    Field('classifier_key', String('', _PATH), "'' = models/pretrained.find_classifier_key"),
), check=_init_check, doc='initial params (training/init.py; before round 0, never on resume); one source at most')
