r"""Membership inference as a measurement: the loss-threshold attack (Yeom et al. 2018), LiRA (Carlini et al.
2022, the online variant) and the empirical epsilon lower bound a (TPR, FPR) pair implies.

Scores: higher means "member". The loss attack scores an example by -loss; LiRA by the log likelihood ratio
of the target model's logit-scaled confidence phi = log p_y - log(1 - p_y) (computed from the logits as
z_y - logsumexp_{j != y} z_j, stable) under Gaussians fitted to shadow models trained with the example (in)
and without it (out). With few shadows the two variances are pooled over all examples (Carlini et al.'s
"fixed variance", `fixed_variance=True`).

Epsilon lower bound (Jagielski et al. 2020, "Auditing differentially private machine learning"; Nasr et al.
2021): an (eps, delta)-DP mechanism admits no test with TPR > e^eps FPR + delta, nor with
1 - FPR > e^eps (1 - TPR) + delta. So, for a threshold fixed in advance,

  eps >= max( log((TPR_lo - delta) / FPR_hi), log((1 - delta - FPR_hi) / (1 - TPR_lo)) ),

TPR_lo the one-sided Clopper-Pearson lower bound of the true-positive rate and FPR_hi the upper bound of the
false-positive rate, each at 1 - alpha/2 (Bonferroni: the pair holds at 1 - alpha, 95% by default); below 0 it
is 0. The threshold is chosen on one random half of the members and non-members and the bound is computed on
the other half: a threshold picked on the same counts would make the bound optimistic.

What the bound assumes: each scored example is one trial of the membership test. A fixed train/test split is
the usual audit's approximation; a bound that holds for one training run without it needs canaries inserted
at random (Steinke et al. 2023), which this module does not do. A client-level DP guarantee covers an example's
membership (changing one example changes one client's data), so the bound is comparable with the accountant's
epsilon, and is typically far below it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import special

from fedjax_flat.tasks import base as tasks_lib


@functools.partial(jax.jit, static_argnames=('apply',))
def _batch_stats(apply, params, x, y):
  logits = apply(params, x, train=False).astype(jnp.float32)
  loss = tasks_lib.cross_entropy(logits, y)
  z_y = jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0]
  others = jnp.where(jax.nn.one_hot(y, logits.shape[-1], dtype=bool), -jnp.inf, logits)
  return loss, z_y - jax.nn.logsumexp(others, axis=-1), jnp.argmax(logits, -1) == y


def example_stats(apply: Callable, params, x, y, batch_size: int = 256) -> Dict[str, np.ndarray]:
  """Per-example cross-entropy 'loss', logit-scaled confidence 'phi' and 'correct' of a classifier on
  (x [N, ...], y [N])."""
  n = len(y)
  pad = (-n) % batch_size
  xp = np.concatenate([np.asarray(x), np.repeat(np.asarray(x)[:1], pad, 0)])   # one compiled batch shape
  yp = np.concatenate([np.asarray(y, np.int32), np.repeat(np.asarray(y, np.int32)[:1], pad, 0)])
  parts = [_batch_stats(apply, params, xp[i:i + batch_size], yp[i:i + batch_size])
           for i in range(0, len(yp), batch_size)]
  return {k: np.concatenate([np.asarray(p[j]) for p in parts])[:n] for j, k in enumerate(('loss', 'phi', 'correct'))}


def roc(member_scores, nonmember_scores) -> Dict[str, np.ndarray]:
  """The ROC of the test 'score >= t' over every threshold t: 'fpr', 'tpr', 'thresholds' (descending; the first
  threshold is +inf: nothing flagged), and 'auc' (trapezoid; ties count one half)."""
  m, o = np.asarray(member_scores, np.float64), np.asarray(nonmember_scores, np.float64)
  t = np.unique(np.concatenate([m, o]))[::-1]
  thresholds = np.concatenate([[np.inf], t])
  ms, os_ = np.sort(m), np.sort(o)
  tpr = (len(ms) - np.searchsorted(ms, thresholds, side='left')) / len(ms)
  fpr = (len(os_) - np.searchsorted(os_, thresholds, side='left')) / len(os_)
  auc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
  return {'fpr': fpr, 'tpr': tpr, 'thresholds': thresholds, 'auc': auc}


def clopper_pearson(k, n, alpha: float = 0.05):
  """The exact (Clopper-Pearson) two-sided 1 - alpha interval (lo, hi) of a binomial rate from k successes of n;
  with alpha = 2a, lo alone is the one-sided 1 - a lower bound (and hi the upper)."""
  k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
  lo = np.where(k > 0, special.betaincinv(np.maximum(k, 1e-300), n - k + 1, alpha / 2), 0.0)
  hi = np.where(k < n, special.betaincinv(k + 1, np.maximum(n - k, 1e-300), 1 - alpha / 2), 1.0)
  return lo, hi


def epsilon_bound(tp, n_members, fp, n_nonmembers, delta: float = 0.0, alpha: float = 0.05) -> np.ndarray:
  """The empirical epsilon lower bound at confidence 1 - alpha of a test that flagged tp of n_members members and
  fp of n_nonmembers non-members (module docstring); arrays broadcast (one entry per threshold)."""
  tpr_lo, _ = clopper_pearson(tp, n_members, alpha)   # alpha/2 per side: each one-sided bound at 1 - alpha/2
  _, fpr_hi = clopper_pearson(fp, n_nonmembers, alpha)
  with np.errstate(divide='ignore'):
    a = np.log(np.maximum(tpr_lo - delta, 0.0) / fpr_hi)          # fpr_hi > 0 and tpr_lo < 1 for any n
    b = np.log(np.maximum(1.0 - delta - fpr_hi, 0.0) / (1.0 - tpr_lo))
  return np.maximum(np.maximum(a, b), 0.0)


def _counts(scores, thresholds):
  s = np.sort(np.asarray(scores, np.float64))
  return len(s) - np.searchsorted(s, thresholds, side='left')


def empirical_epsilon(member_scores, nonmember_scores, delta: float = 0.0, alpha: float = 0.05,
                      seed: int = 0) -> Dict[str, Any]:
  """eps lower bound at confidence 1 - alpha: the threshold with the largest bound on one random half of each
  set, its Clopper-Pearson bound on the other half (module docstring). 'epsilon_all_thresholds' is the largest
  bound over every threshold on all examples: optimistic (the threshold is fitted to the counts), for reference."""
  rng = np.random.default_rng(seed)
  m, o = rng.permutation(np.asarray(member_scores)), rng.permutation(np.asarray(nonmember_scores))
  m_sel, m_ev = m[:len(m) // 2], m[len(m) // 2:]
  o_sel, o_ev = o[:len(o) // 2], o[len(o) // 2:]
  cand = np.unique(np.concatenate([m_sel, o_sel]))
  sel = epsilon_bound(_counts(m_sel, cand), len(m_sel), _counts(o_sel, cand), len(o_sel), delta, alpha)
  t = float(cand[int(np.argmax(sel))])
  tp, fp = int(_counts(m_ev, t)), int(_counts(o_ev, t))
  eps = float(epsilon_bound(tp, len(m_ev), fp, len(o_ev), delta, alpha))
  all_t = np.unique(np.concatenate([m, o]))
  every = float(np.max(epsilon_bound(_counts(m, all_t), len(m), _counts(o, all_t), len(o), delta, alpha)))
  return {'epsilon_lower_bound': eps, 'confidence': 1.0 - alpha, 'delta': float(delta), 'threshold': t,
          'tpr': tp / len(m_ev), 'fpr': fp / len(o_ev), 'n_members_eval': len(m_ev),
          'n_nonmembers_eval': len(o_ev), 'epsilon_all_thresholds': every}


def attack_report(member_scores, nonmember_scores, delta: float = 0.0, alpha: float = 0.05,
                  seed: int = 0) -> Dict[str, Any]:
  """AUC, the best balanced accuracy, TPR at FPR 1% and 0.1%, and `empirical_epsilon`, of one attack's scores."""
  r = roc(member_scores, nonmember_scores)
  acc = 0.5 * (r['tpr'] + 1.0 - r['fpr'])

  def tpr_at(f):
    ok = r['fpr'] <= f
    return float(np.max(r['tpr'][ok])) if np.any(ok) else 0.0
  return {'auc': r['auc'], 'balanced_accuracy': float(np.max(acc)), 'tpr_at_fpr_0.01': tpr_at(0.01),
          'tpr_at_fpr_0.001': tpr_at(0.001), 'n_members': int(len(member_scores)),
          'n_nonmembers': int(len(nonmember_scores)),
          **empirical_epsilon(member_scores, nonmember_scores, delta, alpha, seed)}


def lira_scores(target_phi, shadow_phi, shadow_in, fixed_variance: bool = False) -> np.ndarray:
  """Online LiRA: per example i, log N(target_phi_i; mu_in_i, s_in_i) - log N(target_phi_i; mu_out_i, s_out_i)
  from shadow_phi [S, N] split by shadow_in [S, N] (True: the shadow trained on i). An example no shadow saw in
  (or out) gets the pooled mean of the in (out) values."""
  phi, inn = np.asarray(shadow_phi, np.float64), np.asarray(shadow_in, bool)
  out = ~inn

  def fit(mask):
    cnt = mask.sum(0)
    pooled = phi[mask].mean() if mask.any() else 0.0
    mu = np.where(cnt > 0, (phi * mask).sum(0) / np.maximum(cnt, 1), pooled)
    dev = (phi - mu) ** 2 * mask
    if fixed_variance or not mask.any():
      var = np.full(phi.shape[1], dev.sum() / max(mask.sum(), 1))
    else:
      var = np.where(cnt > 1, dev.sum(0) / np.maximum(cnt - 1, 1), dev.sum() / max(mask.sum(), 1))
    return mu, np.maximum(var, 1e-6)
  mu_in, v_in = fit(inn)
  mu_out, v_out = fit(out)
  t = np.asarray(target_phi, np.float64)
  log_in = -0.5 * ((t - mu_in) ** 2 / v_in + np.log(v_in))
  log_out = -0.5 * ((t - mu_out) ** 2 / v_out + np.log(v_out))
  return log_in - log_out


def shadow_masks(num_shadows: int, num_examples: int, seed: int = 0) -> np.ndarray:
  """[S, N] membership of the shadows: each example in exactly half of them (Carlini et al.'s balanced split;
  S even), each shadow on about half the examples."""
  rng = np.random.default_rng(seed)
  order = np.argsort(rng.random((num_shadows, num_examples)), axis=0)
  return order < num_shadows // 2


@functools.partial(jax.jit, static_argnames=('init', 'apply', 'epochs', 'batch_size', 'weight_decay'))
def _train(init, apply, x, y, masks, keys_init, keys_order, lr, *, epochs, batch_size, weight_decay):
  n = masks.shape[1]
  steps = n // batch_size
  opt = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(lr)) if weight_decay else optax.sgd(lr)

  def one(k_i, k_o, mask):
    params = init(k_i, x[:1])
    orders = jax.vmap(lambda k: jax.random.permutation(k, n)[:steps * batch_size])(
        jax.random.split(k_o, epochs)).reshape(epochs * steps, batch_size)

    def step(carry, idx):
      p, st = carry
      w = mask[idx]

      def loss(q):
        ce = tasks_lib.cross_entropy(apply(q, x[idx], train=False), y[idx])
        return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
      upd, st = opt.update(jax.grad(loss)(p), st, p)
      return (optax.apply_updates(p, upd), st), None
    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), orders)
    return params
  return jax.vmap(one)(keys_init, keys_order, masks)


def train_shadows(init: Callable, apply: Callable, x, y, masks, key: jax.Array, *, epochs: int = 20,
                  batch_size: int = 32, lr: float = 0.05, weight_decay: float = 0.0) -> Any:
  """S models [S, ...params] trained centrally with SGD in one program, vmapped over them: model s sees only the
  examples with masks[s] (masks: S x N; each epoch a permutation of all N examples; the others' mask is 0 in its
  batches, so a batch holds about batch_size * (its share) of its examples). Not a federated run: the usual LiRA
  approximation of the target's training."""
  masks = jnp.asarray(masks, jnp.float32)
  k_init, k_order = jax.random.split(key)
  s = masks.shape[0]
  return _train(init, apply, jnp.asarray(x), jnp.asarray(y, jnp.int32), masks, jax.random.split(k_init, s),
                jax.random.split(k_order, s), jnp.float32(lr), epochs=int(epochs), batch_size=int(batch_size),
                weight_decay=float(weight_decay))


def lira_from_shadows(apply: Callable, params, x, y, member, shadows, masks, *,
                      fixed_variance: Optional[bool] = None) -> Dict[str, Any]:
  """Online LiRA against the target `params` on the candidates (x, y) with given shadows [S, ...params] whose
  in-masks are masks [S, N] (the central ones of `train_shadows`, or federated runs trained as lanes of one runs
  program: training/shadows.py). Returns the scores, the masks and the shadows' held-out accuracy;
  fixed_variance defaults to True below 64 shadows (Carlini et al.)."""
  masks = np.asarray(masks, bool)
  num_shadows = masks.shape[0]
  stats = [example_stats(apply, jax.tree_util.tree_map(lambda a, i=i: a[i], shadows), x, y)
           for i in range(num_shadows)]
  shadow_phi = np.stack([st['phi'] for st in stats])
  target_phi = example_stats(apply, params, x, y)['phi']
  fv = num_shadows < 64 if fixed_variance is None else bool(fixed_variance)
  scores = lira_scores(target_phi, shadow_phi, masks, fixed_variance=fv)
  held_out = np.mean([st['correct'][~masks[i]].mean() for i, st in enumerate(stats)])
  return {'scores': scores, 'member': np.asarray(member, bool), 'masks': masks, 'fixed_variance': fv,
          'shadow_heldout_accuracy': float(held_out)}


def lira(init: Callable, apply: Callable, params, x, y, member, key: jax.Array, *, num_shadows: int = 16,
         epochs: int = 20, batch_size: int = 32, lr: float = 0.05, weight_decay: float = 0.0,
         fixed_variance: Optional[bool] = None, seed: int = 0) -> Dict[str, Any]:
  """Online LiRA with central shadows: `train_shadows` on balanced random halves (`shadow_masks`), then
  `lira_from_shadows`."""
  masks = shadow_masks(num_shadows, len(y), seed)
  shadows = train_shadows(init, apply, x, y, masks, key, epochs=epochs, batch_size=batch_size, lr=lr,
                          weight_decay=weight_decay)
  return lira_from_shadows(apply, params, x, y, member, shadows, masks, fixed_variance=fixed_variance)
