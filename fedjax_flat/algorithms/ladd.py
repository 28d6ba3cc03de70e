"""LADD (Shenaj et al., WACV 2023; thesis §5.3, Algorithms 7-8): clustered federated self-training (FFREEDA).

Setting: the server pre-trained the model on a labelled source domain (training/source_pretrain.py); the
clients hold unlabelled target images. Their styles (data/transforms/fda.py) were clustered once
(grouping/style_clusters.py): client k belongs to cluster c(k). One round:

  server sends   Phi (global leaves), {theta_c} (cluster leaves of every cluster), the teachers {g_c}, and the
                 frozen pre-trained model w_pre (for KD); client k starts from w_c(k) = Phi U theta_c(k)
  client k       E local epochs of the client optimizer on   L = L_pseudo + lambda_kd * L_kd   (eq. 5.10)
  server         Phi     <- ServerOpt(Phi, sum_k N_k/N (Phi - Phi_k))              over every sampled client
                 theta_c <- sum_{k in c} N_k theta_k / sum_{k in c} N_k          within each sampled cluster
                            (a cluster with no sampled client keeps its theta_c; algo.unsampled_clusters='global':
                            the release's PartialClusterAvg, which overwrites it with the previous global model's
                            leaves, the clusters' mean)
                 teachers, every omega rounds (Algorithm 8, eq. 5.9): g_c <- w_c before t_start, after it the
                 running mean g_c <- (n g_c + w_c) / (n + 1), n = number of SWA updates so far; g_c = w_pre
                 at round 0
  Two teacher behaviours of the release (src/federated/trainers/ladd_trainer.py, set_client_teacher), switches
  with the paper's rule as the default:
    algo.teacher_sharing='release'   every client gets the same teacher: the release loads each client's cluster
                                     model into ONE teacher object that every client's loss keeps a reference to,
                                     so after its loop all of them hold the last training client's cluster model
                                     (here: the cluster of client K-1); 'paper': client k's own cluster's g_c(k)
    algo.swa_teacher_model='release' the SWA teacher averages the GLOBAL model w (Phi with the clusters' mean):
                                     g_c <- (n g_c + w) / (n + 1) for every c (the release updates each cluster's
                                     SWA teacher with the round's global model); 'paper': each cluster's w_c

Which leaves are cluster-specific (`cluster_layers`, the release's `cluster_layers` of `PartialClusterAvg`):
  'cls'      the classifier: the leaves of the modules named head / aux / classifier themselves (seg_cnn's and
             DeepLabV3's last 1x1 convolutions)
  'decoder'  the decoder's convolutions: kernels and biases under modules whose name starts with dec / head / aux /
             classifier, no normalization layer; the release's 'decoder' (LADD(cls) in its configs) = every Conv2d
             of DeepLabV3's head (ASPP + classifier), not its BatchNorms (models/deeplabv3.py names it 'classifier')
  'bn'       normalization params and BatchNorm statistics (algorithms/wrappers/local_norm.is_norm_path)
  'all'      every leaf (LADD(all): one model per cluster, nothing shared)
FedAvg + self-training (the FFREEDA baseline) is this algorithm with one cluster.

Client loss (the release's `SelfTrainingLoss` + `KnowledgeDistillationLoss`, `fda_loss=selftrain_div`):
  pseudo-labels   y_hat = argmax of the cluster teacher's softmax p_t (evaluation mode), kept where
                  max p_t > conf_th (0.9) OR the pixel is among the top floor(fraction * n_c) pixels of its
                  predicted class c by max p_t within the image (fraction 0.66), else ignored
                  (`pseudo_labels`; ties broken by pixel order)
  L_pseudo        sum over kept pixels of CE(student, y_hat) / number of pixels (ignored pixels count as 0 in
                  the mean, as torch's reduction='none' then .mean())
  L_kd            -sum_pixels m_p (1/C) sum_c log softmax(z_s)_c softmax(alpha z_pre)_c / number of pixels, with
                  alpha = 0.5 and m_p = 1 on the pixels the pre-trained model's own pseudo-labels keep (same rule)
  Pixels of padding examples count nowhere. The student's main head only (auxiliary heads are not trained by
  the target loss: the release's DeepLabV3 has none).
  No hard-negative mining, as the release: its LADD configs set `hnm`, but src/clients/fda_client.py gives the
  `selftrain_div` criterion (SelfTrainingLoss, whose class attribute requires_reduction = False) an identity
  reduction, and SelfTrainingLoss.forward already returns the mean over all pixels; `HardNegativeMining` (each
  image's top 25% pixel losses) reaches only the labelled losses: the source pre-training's CE
  (training/source_pretrain.py) and the test loss.
  Release detail left out: its KD call passes the batch's labels as `pred_labels` and multiplies the per-pixel KD
  loss by them (class ids: 0 for the first class, 255 for void). For Cityscapes and Mapillary (ds_type
  'supervised': the training loader returns the target label maps) that reads the annotations FFREEDA forbids;
  for CrossCity (ds_type 'unsupervised': no labels loaded, pred_labels=None) the release's KD is the one here.
  The target labels `batch['y']` are never read.

Registered as 'ladd' (`experiments/train.py`): the trainer clusters the clients' FDA styles before building it
(need 'style_clusters': grouping/style_clusters.cluster_clients over k = k_min..k_max, or force_k; force_k=1 is
FedAvg + self-training), w_0 (config.init: the source pre-trained checkpoint) is the pre-trained model, and every
client starts with its cluster as its client state (core/contract.py `initial_client_states`).

Client identity: the client state is {'cluster': int32} (`initial_client_states(labels)` gives the store's
contents). Everything cluster-indexed is stacked on a leading axis of size G (clusters) in the server state and
the broadcast, and each client picks its slice inside the compiled round: one program whatever the clusters,
no Python loop over clusters. The per-client upload of cluster leaves is one-hot over G ({'cluster_sum'}, with
'cluster_w' the one-hot weights) so that the engine's example-weighted mean gives every cluster's sum.
Memory: the broadcast holds G copies of the cluster leaves and G teachers (full models).

Communication (`comm_down`, `comm_up`: models per client per round): down = the client's model + its
teacher + the pre-trained model when lambda_kd > 0 (3, or 2), up = 1; the style upload happens once
(data/transforms/fda.style_bytes).
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.hparams import Choice, Flag, Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.algorithms.wrappers.local_norm import _key_name, is_norm_path
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.data.registry import task_name
from fedjax_flat.errors import ConfigError
from fedjax_flat.tasks.base import _main_head, cross_entropy

tmap = jax.tree_util.tree_map

CLUSTER_LAYERS = ('cls', 'decoder', 'bn', 'all', 'none')
_CLS = ('head', 'aux', 'classifier')


def _names(path):
  return [_key_name(k) for k in path]


def cluster_layer_select(which: str) -> Callable:
  """path -> bool: the leaves that are cluster-specific under `cluster_layers=which`."""
  if which not in CLUSTER_LAYERS:
    raise ValueError(f'cluster_layers={which!r}; allowed: {CLUSTER_LAYERS}')
  if which == 'all':
    return lambda path: True
  if which == 'none':
    return lambda path: False
  if which == 'bn':
    return is_norm_path
  if which == 'cls':      # the leaves of the modules named head / aux / classifier themselves
    return lambda path: _names(path)[0] != 'batch_stats' and len(path) >= 2 and _names(path)[-2].lower() in _CLS

  def decoder(path):
    names = [n.lower() for n in _names(path)]
    if names[0] == 'batch_stats' or names[-1] not in ('kernel', 'bias'):
      return False
    if any('norm' in n or n.startswith(('bn', 'gn', 'ln')) for n in names[:-1]):
      return False
    return any(n.startswith(('dec',) + _CLS) for n in names)
  return decoder


def leaf_flags(params, select) -> list:
  return [bool(select(p)) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


# ------------------------------------------------------------------------------------- the client loss

def pseudo_labels(probs, conf_th: float = 0.9, fraction: float = 0.66):
  """One image: probs [..., C] (softmax) -> (labels [...] int32, keep [...] bool).

  keep = (max prob > conf_th) | (rank of the pixel within its predicted class by max prob < floor(fraction n_c)),
  rank 0 = most confident. conf_th outside (0, 1) disables the first test, fraction outside (0, 1) the second."""
  shape = probs.shape[:-1]
  c = probs.shape[-1]
  p = probs.reshape(-1, c)
  maxp, lab = jnp.max(p, -1), jnp.argmax(p, -1).astype(jnp.int32)
  keep = (maxp > conf_th) if 0.0 < conf_th < 1.0 else jnp.zeros(maxp.shape, bool)
  if 0.0 < fraction < 1.0:
    n = lab.shape[0]
    order = jnp.lexsort((-maxp, lab))                      # by class, then most confident first (stable)
    counts = jnp.bincount(lab, length=c)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32) - starts[lab[order]])
    k = jnp.floor(counts.astype(jnp.float32) * fraction).astype(jnp.int32)
    keep = keep | (rank < k[lab])
  return lab.reshape(shape), keep.reshape(shape)


def self_training_sums(student_logits, teacher_logits, pre_logits, mask, *, conf_th=0.9, fraction=0.66,
                       lambda_kd=0.0, alpha_kd=0.5, lambda_st=1.0):
  """(loss_sum, pixel count) of L = lambda_st L_pseudo + lambda_kd L_kd over the valid examples' pixels
  (see the module docstring). logits [B, H, W, C]; pre_logits may be None when lambda_kd == 0."""
  b = student_logits.shape[0]
  w = jnp.broadcast_to(mask.astype(jnp.float32).reshape((b,) + (1,) * (student_logits.ndim - 2)),
                       student_logits.shape[:-1])
  sel = jax.vmap(lambda q: pseudo_labels(q, conf_th, fraction))
  y_hat, keep = sel(jax.nn.softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32), -1))
  st = jnp.sum(cross_entropy(student_logits, y_hat) * keep * w)
  total = lambda_st * st
  if lambda_kd:
    pre = jax.lax.stop_gradient(pre_logits).astype(jnp.float32)
    _, keep_pre = sel(jax.nn.softmax(pre, -1))
    logp = jax.nn.log_softmax(student_logits.astype(jnp.float32), -1)
    kd = -jnp.mean(logp * jax.nn.softmax(alpha_kd * pre, -1), -1)
    total = total + lambda_kd * jnp.sum(kd * keep_pre * w)
  return total, jnp.sum(w)


def make_self_training_loss(model, *, conf_th=0.9, fraction=0.66, lambda_kd=0.0, alpha_kd=0.5, lambda_st=1.0):
  """loss(params, teacher, pretrained, batch, rng) -> (mean, aux) in algorithms/local.make_loss's convention
  (BatchNorm models: aux carries the updated running statistics)."""
  bn = getattr(model, 'batch_stats', False)

  def loss(params, teacher, pretrained, batch, rng=None):
    x, mask = batch['x'], batch['mask'].astype(jnp.float32)
    t_logits = _main_head(model.apply(teacher, x, train=False))
    pre = _main_head(model.apply(pretrained, x, train=False)) if lambda_kd else None
    kw = {'mask': mask, 'with_batch_stats': True} if bn else {}
    out = model.apply(params, x, train=True, rng=rng, **kw)
    out, stats = out if bn else (out, None)
    s, n = self_training_sums(_main_head(out), t_logits, pre, mask, conf_th=conf_th, fraction=fraction,
                              lambda_kd=lambda_kd, alpha_kd=alpha_kd, lambda_st=lambda_st)
    total = s / jnp.maximum(n, 1.0)
    return total, ((s, n, stats) if bn else (s, n))
  return loss


# ------------------------------------------------------------------------------------- the algorithm

def initial_client_states(labels) -> dict:
  """The client-state store's contents: every client's cluster, {'cluster': int32 [K]}."""
  return {'cluster': jnp.asarray(np.asarray(labels), jnp.int32)}


def cluster_models(params, cluster_leaves, flags):
  """The G cluster models, stacked [G, ...] leaf by leaf: Phi broadcast, theta_c stacked."""
  g = cluster_leaves[0].shape[0] if cluster_leaves else 1
  flat, treedef = jax.tree_util.tree_flatten(params)
  it = iter(cluster_leaves)
  return jax.tree_util.tree_unflatten(
      treedef, [next(it) if f else jnp.broadcast_to(x, (g,) + x.shape) for x, f in zip(flat, flags)])


# A cluster no sampled client updated: keeps its leaves, or takes the previous global model's (the release).
UNSAMPLED = ('keep', 'global')
TEACHER_RULES = ('paper', 'release')


def ladd(model, client_tx: optax.GradientTransformation, hparams_fn, server_tx: optax.GradientTransformation, *,
         num_clusters: int, pretrained=None, cluster_layers: str = 'cls', conf_th: float = 0.9, fraction: float = 0.66,
         lambda_kd: float = 0.0, alpha_kd: float = 0.5, teacher_step: int = 1,
         swa_teacher_start: int = -1, unsampled_clusters: str = 'keep', shared_teacher=None,
         swa_teacher_model: str = 'paper') -> FederatedAlgorithm:
  """LADD with G = num_clusters clusters (G = 1: FedAvg + self-training). `pretrained`: the source model
  (teachers start from it; the KD target); None: the params the server starts from (server_init's: the run's
  w_0, i.e. config.init's source checkpoint). swa_teacher_start < 0: no SWA teacher. unsampled_clusters: 'keep'
  (default) | 'global' (the release, module docstring). shared_teacher: None (each client its cluster's teacher) or
  the cluster whose teacher every client uses (the release). swa_teacher_model: 'paper' (the SWA teacher of cluster
  c averages w_c) | 'release' (it averages the global model)."""
  if swa_teacher_model not in TEACHER_RULES:
    raise ValueError(f'swa_teacher_model={swa_teacher_model!r}; allowed: {TEACHER_RULES}')
  if shared_teacher is not None and not 0 <= int(shared_teacher) < num_clusters:
    raise ValueError(f'shared_teacher={shared_teacher} is not a cluster of 0..{num_clusters - 1}')
  if unsampled_clusters not in UNSAMPLED:
    raise ValueError(f'unsampled_clusters={unsampled_clusters!r}; allowed: {UNSAMPLED}')
  if num_clusters < 1:
    raise ValueError(f'num_clusters={num_clusters} must be >= 1')
  if teacher_step < 1:
    raise ValueError(f'teacher_step={teacher_step} must be >= 1')
  g = int(num_clusters)
  select = cluster_layer_select(cluster_layers)      # validates the name; one cluster shares everything
  select = select if g > 1 else cluster_layer_select('none')
  tx = client_tx
  loss = make_self_training_loss(model, conf_th=conf_th, fraction=fraction, lambda_kd=lambda_kd,
                                 alpha_kd=alpha_kd)

  # Which leaves are cluster leaves follows from the tree paths alone (static while tracing).
  def split(params):
    leaves = jax.tree_util.tree_leaves(params)
    return [x for x, f in zip(leaves, leaf_flags(params, select)) if f]

  def merge(params, cl):
    flat, treedef = jax.tree_util.tree_flatten(params)
    it = iter(cl)
    return jax.tree_util.tree_unflatten(treedef, [next(it) if f else x
                                                  for x, f in zip(flat, leaf_flags(params, select))])

  def server_extra(params):     # FedAvg's server state plus these
    pre = params if pretrained is None else pretrained
    stacked = lambda t: tmap(lambda x: jnp.broadcast_to(x, (g,) + x.shape), t)  # noqa: E731
    return {'cluster': [jnp.broadcast_to(x, (g,) + x.shape) for x in split(params)],
            'teacher': stacked(pre), 'pretrained': tmap(jnp.copy, pre),   # own buffers (donation)
            'swa_n': jnp.zeros((), jnp.float32)}

  server_init = fedavg_server_init(server_tx, server_extra)
  broadcast = fedavg_broadcast(hparams_fn, shared=('cluster', 'teacher', 'pretrained'))

  def client_init(bcast, cs, rng):
    del rng
    c = cs['cluster']
    p = merge(bcast['params'], [x[c] for x in bcast['cluster']])
    tc = c if shared_teacher is None else int(shared_teacher)
    teacher = tmap(lambda t: t[tc], bcast['teacher'])
    return local_lib.LocalState(p, tx.init(p), p, teacher)

  def client_step(bcast, local, batch, rng):
    teacher, pre = local.extra, bcast['pretrained']
    step_loss = lambda p, b, r: loss(p, teacher, pre, b, r)  # noqa: E731
    return local_lib.local_step(local, batch, rng, loss_fn=step_loss, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, cs):
    del bcast
    onehot = jax.nn.one_hot(cs['cluster'], g, dtype=jnp.float32)
    delta = tmap(lambda a, b: a - b, local.init_params, local.params)
    flat, treedef = jax.tree_util.tree_flatten(delta)
    delta_global = jax.tree_util.tree_unflatten(
        treedef, [jnp.zeros_like(x) if f else x for x, f in zip(flat, leaf_flags(delta, select))])
    csum = [onehot.reshape((g,) + (1,) * x.ndim).astype(x.dtype) * x[None] for x in split(local.params)]
    return {'weighted': {'delta': delta_global, 'cluster_sum': csum, 'cluster_w': onehot},
            'uniform': {}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del phase
    wmean = agg['weighted']
    updates, opt_state = server_tx.update(wmean['delta'], state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    wc = wmean['cluster_w']
    cluster = []
    previous_global = split(state['params'])       # the clusters' mean of the previous round (the release)
    for old, s, prev in zip(state['cluster'], wmean['cluster_sum'], previous_global):
      wb = wc.reshape((g,) + (1,) * (old.ndim - 1)).astype(old.dtype)
      unsampled = old if unsampled_clusters == 'keep' else jnp.broadcast_to(prev[None], old.shape)
      cluster.append(jnp.where(wb > 0, s / jnp.maximum(wb, 1e-12), unsampled))
    # The 'global' model: Phi with the clusters' mean of every cluster leaf.
    params = merge(params, [jnp.mean(x, 0) for x in cluster])
    # Teachers for the next round r = round_idx + 1 (Algorithm 8).
    r = jnp.asarray(round_idx) + 1
    due = (r % teacher_step) == 0
    swa = (swa_teacher_start >= 0) & (r >= swa_teacher_start)
    models = cluster_models(params, cluster, leaf_flags(params, select))
    averaged = models if swa_teacher_model == 'paper' else tmap(lambda x: jnp.broadcast_to(x, (g,) + x.shape), params)
    n = state['swa_n']
    teacher = tmap(lambda t, w, a: jnp.where(due, jnp.where(swa, (t * n + a) / (n + 1.0), w), t),
                   state['teacher'], models, averaged)
    return {**state, 'params': params, 'opt_state': opt_state, 'cluster': cluster, 'teacher': teacher,
            'swa_n': n + jnp.where(due & swa, 1.0, 0.0)}

  def eval_models(state):
    out = {'global': (state['params'], jnp.bool_(True))}
    if g > 1:
      for c in range(g):
        out[f'cluster{c}'] = (merge(state['params'], [x[c] for x in state['cluster']]), jnp.bool_(True))
    return out

  def client_state_init(params):
    del params
    return {'cluster': jnp.zeros((), jnp.int32)}

  return FederatedAlgorithm('', server_init, broadcast, client_init, client_step, client_final, server_update,
                            eval_models, client_state_init=client_state_init,
                            comm_down=3.0 if lambda_kd else 2.0, comm_up=1.0)


def cluster_params(state, c: int, flags: Sequence[bool]):
  """Cluster c's model w_c = Phi U theta_c from a LADD server state."""
  flat, treedef = jax.tree_util.tree_flatten(state['params'])
  it = iter([x[c] for x in state['cluster']])
  return jax.tree_util.tree_unflatten(treedef, [next(it) if f else x for x, f in zip(flat, flags)])


# ------------------------------------------------------------------------------------- registration

HPARAMS = {
    'cluster_layers': Choice('cls', allowed=CLUSTER_LAYERS),
    'unsampled_clusters': Choice('keep', allowed=UNSAMPLED),
    # the release's teachers (module docstring): one teacher for every client; the SWA teacher of the global model
    'teacher_sharing': Choice('paper', allowed=TEACHER_RULES),
    'swa_teacher_model': Choice('paper', allowed=TEACHER_RULES),
    'force_k': Integer(0, lo=0, note=' (0: k chosen by the silhouette over k_min..k_max; 1: FedAvg + self-training)'),
    'k_min': Integer(4, lo=2, note=' (the release: 4)'),
    'k_max': Integer(19, lo=2, note=' (the release: 19; capped at the number of clients - 1)'),
    'fda_b': Integer(1, lo=0, note=' (style window (2b+1)^2)'),
    'conf_th': Number(0.9, lo=0, hi=1),
    'fraction': Number(0.66, lo=0, hi=1),
    'lambda_kd': Number(0.0, lo=0),
    'alpha_kd': Number(0.5, lo=0),
    'teacher_step': Integer(1, lo=1, note=' (omega: rounds between teacher refreshes)'),
    'swa_teacher_start': Integer(-1, lo=-1, note=' (t_start of the SWA teacher; -1: none)'),
    # LADD adapts a source model (w_0, thesis 5.3); from random weights only when asked for (a test, an ablation)
    'random_init': Flag(False),
}


def _check(cfg, hp):
  if not (cfg.init.pretrained or cfg.init.checkpoint or hp['random_init']):
    raise ConfigError('init.pretrained', cfg.init.pretrained, 'LADD adapts a source model: pre-train it with '
                      'experiments/pretrain_source.py (configs/ladd.py:<target>,source_fda) and pass '
                      '--config.init.pretrained=<its workdir>/source_model.npz, or set --config.algo.random_init=True '
                      'to train from random weights')
  if hp['k_min'] > hp['k_max']:
    raise ConfigError('algo.k_min', hp['k_min'], f'must be <= algo.k_max={hp["k_max"]}')
  task = task_name(cfg.dataset, cfg.data)
  if task != 'segmentation':
    raise ConfigError('algorithm', cfg.algorithm, f'self-trains on label maps: needs a segmentation dataset, '
                      f'dataset={cfg.dataset!r} has task {task!r}')


def _check_data(cfg, hp, data):
  k = int(data.num_clients)
  if hp['force_k'] > k:
    raise ConfigError('algo.force_k', hp['force_k'], f'at most the {k} clients of the data')
  if not hp['force_k'] and (k < 3 or hp['k_min'] > k - 1):
    raise ConfigError('algo.k_min', hp['k_min'], f'the silhouette needs 2 <= k <= {k - 1} for {k} clients: '
                      'lower algo.k_min or set algo.force_k')


@register('ladd', hparams=HPARAMS, needs=('client_state', 'batch_stats', 'style_clusters'), check=_check,
          check_data=_check_data)
def ladd_algorithm(ctx) -> FederatedAlgorithm:
  """LADD from a config: the trainer's style clusters, w_0 as the pre-trained model, the client optimizer of
  config.client (SGD / SAM / ASAM)."""
  hp = ctx.hp
  clusters = ctx.client_clusters
  if clusters is None:
    raise ConfigError('algorithm', ctx.name, "needs the clients' style clusters, which the trainer computes from "
                      "the run's data and seed (training/plan.py); a program shared by several runs is built without "
                      'them')
  labels = np.asarray(clusters.labels, np.int32)
  alg = ladd(ctx.model, ctx.client_tx, ctx.hparams_fn, ctx.server_tx, num_clusters=int(clusters.k),
             cluster_layers=hp['cluster_layers'], conf_th=float(hp['conf_th']), fraction=float(hp['fraction']),
             lambda_kd=float(hp['lambda_kd']), alpha_kd=float(hp['alpha_kd']), teacher_step=int(hp['teacher_step']),
             swa_teacher_start=int(hp['swa_teacher_start']), unsampled_clusters=hp['unsampled_clusters'],
             shared_teacher=int(labels[-1]) if hp['teacher_sharing'] == 'release' else None,
             swa_teacher_model=hp['swa_teacher_model'])
  return alg.replace(initial_client_states=lambda params: initial_client_states(labels))
