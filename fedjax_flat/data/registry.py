"""Dataset registry: `config.dataset` name -> a builder returning a federated dataset.

Builders take the whole `config.data` ConfigDict section (as kwargs) and return an object with the
`FederatedDataset` / `ClientDataSource` interface. Real datasets (CIFAR, PAM, Landmarks) register here from
their loader modules, which raise a clear error naming the download command when files are missing.
"""
from __future__ import annotations

from typing import Callable, Dict

from fedjax_flat.data.sources import builtin

_BUILDERS: Dict[str, Callable] = {}

# config.data fields that every config declares (config/data_fields.py), so that they can be set on the
# command line; None = unset, the builder's own default applies.
OPTIONAL_FIELDS = {'data_dir': str, 'split_json': str, 'split_dir': str, 'examples_per_client': int,
                   'quantity_skew': float, 'seed': int, 'check_official_sizes': bool}


def register(name: str):
  def deco(fn):
    _BUILDERS[name] = fn
    return fn
  return deco


def names():
  _load_optional()
  return sorted(_BUILDERS)


def _load_optional():
  # Loader modules of real datasets register themselves on import.
  import importlib
  for mod in ('fedjax_flat.data.sources.cifar', 'fedjax_flat.data.sources.pam', 'fedjax_flat.data.sources.landmarks',
              'fedjax_flat.data.sources.feature_shift', 'fedjax_flat.data.sources.seg_synthetic', 'fedjax_flat.data.sources.cityscapes',
              'fedjax_flat.data.sources.idda', 'fedjax_flat.data.sources.leaf', 'fedjax_flat.data.sources.stackoverflow'):
    try:
      importlib.import_module(mod)
    except ModuleNotFoundError as e:
      if e.name != mod:
        raise


def get_dataset(name: str, **kwargs):
  _load_optional()
  if name not in _BUILDERS:
    raise ValueError(f'dataset={name!r} is unknown; allowed: {sorted(_BUILDERS)}')
  kwargs.pop('shuffle', None)   # config.data.shuffle is for batching (data/batching.py), not the builders
  kwargs = {k: v for k, v in kwargs.items() if not (v is None and k in OPTIONAL_FIELDS)}  # unset: its default
  return _BUILDERS[name](**kwargs)


@register('digits')
def _digits(num_clients=20, alpha=0.0, test_fraction=0.2, examples_per_client=None, quantity_skew=None,
            seed=0, **unused):
  del unused
  return builtin.load_digits(num_clients, alpha, test_fraction=test_fraction,
                             examples_per_client=examples_per_client, quantity_skew=quantity_skew, seed=seed)


@register('synthetic')
def _synthetic(num_clients=10, examples_per_client=32, input_shape=(8, 8, 1), num_classes=10, test_size=200,
               alpha=None, seed=0, **unused):
  del unused
  return builtin.synthetic(num_clients, examples_per_client, input_shape=tuple(input_shape),
                           num_classes=num_classes, test_size=test_size, alpha=alpha, seed=seed)
