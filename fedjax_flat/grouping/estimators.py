"""Estimators psi of a client's data distribution (thesis 5.2.2), as pure functions.

  psi_clf   the classifier weights of the client's pre-trained model (w_{k,clf}^0: the kernels of the
            classifier module, biases excluded, as the reference's `classifierLast`), reduced over the
            population by PCA keeping `pca_variance` (90%) of the explained variance (`pca_reduce`).
  psi_conf  the confidence vector of eq. 5.1 on a server-side public set D_pub of J examples per class:
                p_{k,c} = (1/J) sum_{x in D_c} softmax(f_k(x))_c,     p_k = softmax(p_{k,1}, ..., p_{k,N_C}).
            (The ICPR code normalizes by the sum instead of the softmax of eq. 5.1; we follow the equation.)
  psi_t2v   Task2Vec (Achille et al. 2019): the diagonal Fisher (eq. 5.2)
                F = E_{x ~ D_k} E_{y ~ p_w(y|x)} [ (d/dw log p_w(y|x))^2 ]
            of a probe network whose classifier was fine-tuned on D_k, on the feature-extractor parameters
            only, averaged per filter (over every axis but the output one) for each kernel and
            normalization scale, as Task2Vec's `extract_embedding`. `fisher='montecarlo'` samples one y per
            example (Task2Vec's default); 'exact' sums over the classes (N_C backward passes per example).
            Task2Vec's Monte-Carlo code squares the gradient of each *batch mean*; here each example's
            gradient is squared, which is the Fisher of eq. 5.2.

Each function works on one client; `pretrain.py` runs them for every client inside the engine's client
program (vmapped or scanned over clients, like training).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models import pretrained

ESTIMATORS = ('clf', 'conf', 't2v')
FISHER_MODES = ('montecarlo', 'exact')
# Leaves of the feature extractor that Task2Vec embeds (weights of convolutions, dense layers, norm scales).
T2V_LEAVES = ('kernel', 'scale')


def split_paths(params, classifier_key: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
  """Sorted '/'-joined leaf paths of (feature extractor, classifier)."""
  flat = pretrained.flatten(params)
  under = lambda k: k == classifier_key or k.startswith(classifier_key + pretrained.SEP)
  clf = tuple(sorted(k for k in flat if under(k)))
  if not clf:
    raise ValueError(f'classifier_key={classifier_key!r} matches no parameter; top-level keys: '
                     f'{sorted({k.split(pretrained.SEP)[0] for k in flat})}')
  return tuple(sorted(k for k in flat if not under(k))), clf


def _flat(params) -> Dict[str, jnp.ndarray]:
  return flax.traverse_util.flatten_dict(params, sep=pretrained.SEP)


def _unflat(flat):
  return flax.traverse_util.unflatten_dict(dict(flat), sep=pretrained.SEP)


def subtree(params, paths):
  """{path: leaf} restricted to `paths` (a flat dict; keeps jit-friendly static structure)."""
  f = _flat(params)
  return {k: f[k] for k in paths}


def merge(params, flat_part):
  """`params` with the leaves of `flat_part` ({path: leaf}) replaced."""
  f = _flat(params)
  f.update(flat_part)
  return _unflat(f)


# psi_clf.
def classifier_vector(params, classifier_key: str):
  """The classifier's kernels, flattened and concatenated in path order ([d])."""
  _, clf = split_paths(params, classifier_key)
  f = _flat(params)
  kernels = [k for k in clf if k.split(pretrained.SEP)[-1] == 'kernel'] or list(clf)
  return jnp.concatenate([jnp.ravel(f[k]).astype(jnp.float32) for k in kernels])


def pca_reduce(x, variance: float, *, standardize: bool = True):
  """Rows of x [K, d] projected on the fewest principal components whose explained variance ratio sums to
  more than `variance` (scikit-learn's rule for a float n_components, which the reference code uses).

  standardize: scale every column to unit variance first (the reference's StandardScaler; constant columns
  are left unscaled). variance <= 0 or >= 1: no reduction (the standardized / raw rows).
  Returns (reduced [K, k], info {'components', 'dims', 'explained'}).
  """
  x = np.asarray(x, np.float64)
  if standardize:
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
  dims = x.shape[1]
  if variance <= 0 or variance >= 1 or min(x.shape) < 2:
    return x, {'components': dims, 'dims': dims, 'explained': 1.0}
  from sklearn.decomposition import PCA
  pca = PCA(n_components=float(variance), svd_solver='full')
  z = pca.fit_transform(x)
  return z, {'components': int(pca.n_components_), 'dims': dims,
             'explained': float(np.sum(pca.explained_variance_ratio_))}


# psi_conf.
def confidence_vector(logits, labels, num_classes: int, mask=None):
  """Eq. 5.1 from the logits [N, C] of the public set, its labels [N] (and an optional validity mask).

  A class without public examples gets p_{k,c} = 0 before the softmax.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  m = jnp.ones(labels.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
  onehot = jax.nn.one_hot(labels, num_classes) * m[:, None]              # [N, C]
  per_class = jnp.sum(onehot * probs, axis=0) / jnp.maximum(jnp.sum(onehot, axis=0), 1.0)
  return jax.nn.softmax(per_class)


def public_set(test_y, num_classes: int, per_class: int, seed: int) -> np.ndarray:
  """Indices into the test split of D_pub: `per_class` examples of every class, drawn with `seed` (fewer
  when the test split has fewer; eq. 5.1 averages over what there is)."""
  rng = np.random.default_rng([int(seed), 0x9B1C])
  y = np.asarray(test_y)
  idx = [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in range(num_classes)]
  return np.sort(np.concatenate(idx)).astype(np.int64)


# psi_t2v.
def _largest_divisor(n: int, at_most: int) -> int:
  return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def fisher_sums(apply_fn: Callable, params, batch, rng, *, feature_paths, mode: str = 'montecarlo',
                examples_per_pass: int = 8):
  """Sum over the batch's valid examples of the per-example diagonal Fisher term, on `feature_paths`.

  apply_fn(params, x [b, ...]) -> logits [b, C]. Returns ({path: sum of squared gradients}, valid count).
  montecarlo: y_e ~ softmax(f(x_e)) with key fold_in(rng, e); term = (d log p(y_e|x_e) / dw)^2.
  exact:      term = sum_c p(c|x_e) (d log p(c|x_e) / dw)^2.
  Examples are processed `examples_per_pass` at a time (vmapped), so memory is that many gradients.
  """
  if mode not in FISHER_MODES:
    raise ValueError(f'fisher mode={mode!r}; allowed: {FISHER_MODES}')
  feats = subtree(params, feature_paths)

  def log_probs(feat, x):
    return jax.nn.log_softmax(apply_fn(merge(params, feat), x[None])[0].astype(jnp.float32))

  def one(x, key, valid):
    if mode == 'exact':                 # one class at a time: memory of one gradient, not N_C
      p = jnp.exp(log_probs(feats, x))

      def add_class(acc, c):
        g = jax.grad(lambda f: log_probs(f, x)[c])(feats)
        return jax.tree_util.tree_map(lambda a, t: a + p[c] * jnp.square(t), acc, g), None
      zeros = jax.tree_util.tree_map(lambda v: jnp.zeros(v.shape, jnp.float32), feats)
      term, _ = jax.lax.scan(add_class, zeros, jnp.arange(p.shape[0]))
    else:
      y = jax.random.categorical(key, log_probs(feats, x))
      g = jax.grad(lambda f: log_probs(f, x)[y])(feats)
      term = jax.tree_util.tree_map(jnp.square, g)
    return jax.tree_util.tree_map(lambda t: t * valid, term)

  x, mask = batch['x'], batch['mask'].astype(jnp.float32)
  b = x.shape[0]
  keys = jax.vmap(lambda e: jax.random.fold_in(rng, e))(jnp.arange(b))
  per = _largest_divisor(b, examples_per_pass)
  group = lambda a: a.reshape((b // per, per) + a.shape[1:])

  def body(acc, xs):
    terms = jax.vmap(one)(*xs)
    return jax.tree_util.tree_map(lambda a, t: a + jnp.sum(t, axis=0), acc, terms), None

  zeros = jax.tree_util.tree_map(lambda v: jnp.zeros(v.shape, jnp.float32), feats)
  sums, _ = jax.lax.scan(body, zeros, (group(x), group(keys), group(mask)))
  return sums, jnp.sum(mask)



def task2vec_vector(fisher: Dict[str, jnp.ndarray]):
  """Task2Vec's per-filter embedding of a diagonal Fisher {path: array}: for every kernel / scale leaf (in
  path order), the mean over all axes but the last (Flax's output axis); concatenated ([d])."""
  parts = []
  for k in sorted(fisher):
    if k.split(pretrained.SEP)[-1] not in T2V_LEAVES:
      continue
    f = fisher[k]
    parts.append(f.reshape(-1, f.shape[-1]).mean(axis=0) if f.ndim > 1 else f)
  if not parts:
    raise ValueError(f'no kernel/scale leaf among the feature-extractor parameters {sorted(fisher)}')
  return jnp.concatenate(parts)
