"""Planted domains on the embedded digits (`digits_domains`): the machine-sized stand-in for FedCG's multi-domain
data (thesis section 5.4), with the true domain of every image known, so that discovered domains can be scored.

The 1,797 scikit-learn digits (8x8, [0, 1]) are shuffled once (seed) and dealt to `num_domains` domains in
equal, class-stratified shares; domain d sees its images through DOMAIN_TRANSFORMS[d], exact array operations
that keep the label (inversion, quarter turns, transposition, their combinations; no interpolation):

  0 identity   1 invert   2 rot90   3 rot90+invert   4 transpose   5 transpose+invert   6 rot270   7 rot270+invert

A stratified `test_fraction` of every domain is held out: the global test set holds all domains in equal shares.
Clients: client k holds the domains {(k + j) mod D : j < domains_per_client} (1 = one domain per client, as a
celebrity of CelebA mostly photographed in one setting); every training image of domain d goes to one of the
clients holding d (uniformly at random, seeded), so the clients of a domain share its images IID.

Labels y [N, 2] = [digit, domain] under the `domain_labelled` task (tasks/domains.py): the loss and accuracy are
the digit's; FedCG's oracle mode and the domain purity read the domain column.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.sources import builtin
from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.schema import DataValue


def _rot(k: int) -> Callable[[np.ndarray], np.ndarray]:
  return lambda x: np.rot90(x, k, axes=(1, 2))


def _inv(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
  return lambda x: 1.0 - f(x)


_ID = lambda x: x  # noqa: E731
_T = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731

DOMAIN_TRANSFORMS: List[Tuple[str, Callable[[np.ndarray], np.ndarray]]] = [
    ('identity', _ID), ('invert', _inv(_ID)), ('rot90', _rot(1)), ('rot90+invert', _inv(_rot(1))),
    ('transpose', _T), ('transpose+invert', _inv(_T)), ('rot270', _rot(3)), ('rot270+invert', _inv(_rot(3))),
]
MAX_DOMAINS = len(DOMAIN_TRANSFORMS)


def transform(domain: int, x: np.ndarray) -> np.ndarray:
  """Images [n, 8, 8, 1] seen through domain `domain`'s transform."""
  return np.ascontiguousarray(DOMAIN_TRANSFORMS[domain][1](x.astype(np.float32))).astype(np.float32)


def planted_domains(images: np.ndarray, labels: np.ndarray, *, num_clients: int, num_domains: int,
                    domains_per_client: int = 1, test_fraction: float = 0.2, seed: int = 0) -> FederatedDataset:
  """The planted-domain federated dataset from images [N, H, W, 1] in [0, 1] and labels [N] (module doc)."""
  rng = np.random.default_rng([int(seed), 0xD0A])
  n = len(labels)
  domain = np.zeros(n, np.int64)
  is_test = np.zeros(n, bool)
  for c in np.unique(labels):                       # class-stratified domains and test split
    idx = rng.permutation(np.flatnonzero(labels == c))
    domain[idx] = np.arange(len(idx)) % num_domains
    for d in range(num_domains):
      mine = idx[domain[idx] == d]
      is_test[mine[:int(round(len(mine) * test_fraction))]] = True
  x = np.zeros(images.shape, np.float32)
  for d in range(num_domains):
    x[domain == d] = transform(d, images[domain == d])
  y = np.stack([labels.astype(np.int32), domain.astype(np.int32)], axis=1)
  train, test = np.flatnonzero(~is_test), np.flatnonzero(is_test)
  holders = [[k for k in range(num_clients) if any((k + j) % num_domains == d for j in range(domains_per_client))]
             for d in range(num_domains)]
  owner = np.array([holders[domain[i]][rng.integers(len(holders[domain[i]]))] for i in train], np.int64)
  splits = [np.flatnonzero(owner == k) for k in range(num_clients)]
  return FederatedDataset.from_client_indices(
      x[train], y[train], splits, x[test], y[test], num_classes=int(labels.max()) + 1,
      name=f'digits_domains(D={num_domains}, per_client={domains_per_client})', task='domain_labelled')


def load_digits_domains(num_clients: int = 20, num_domains: int = 4, domains_per_client: int = 1, *,
                        test_fraction: float = 0.2, seed: int = 0) -> FederatedDataset:
  raw, target = builtin.digits_arrays()         # the embedded digits, read as data/sources/builtin.py reads them
  images = (raw.astype(np.float32) / 16.0)[..., None]
  return planted_domains(images, target.astype(np.int32), num_clients=num_clients, num_domains=num_domains,
                         domains_per_client=domains_per_client, test_fraction=test_fraction, seed=seed)


def _check(data: dict) -> None:
  d, k = data.get('num_domains') or 4, data.get('num_clients') or 20
  per = data.get('domains_per_client') or 1
  check_arg('domains_per_client', per, isinstance(per, int) and 1 <= per <= d,
            f'an integer in [1, num_domains={d}]')
  check_arg('num_clients', k, k * per >= d, f'every domain needs a client: num_clients * domains_per_client >= '
            f'num_domains = {d}')


@register('digits_domains', task='domain_labelled', check=_check,
          rules={'num_domains': DataValue(None, 'int', lo=1, hi=MAX_DOMAINS,
                                          what='planted domains (transforms of the digits)'),
                 'domains_per_client': DataValue(None, 'int', lo=1, hi=MAX_DOMAINS,
                                                 what='domains held by each client')},
          limits={'num_domains': (1, MAX_DOMAINS, 'one distinct transform per domain')})
def _digits_domains(num_clients=20, num_domains=4, domains_per_client=1, test_fraction=0.2, seed=0, **unused):
  del unused
  return load_digits_domains(int(num_clients), int(num_domains), int(domains_per_client),
                             test_fraction=float(test_fraction), seed=int(seed))
