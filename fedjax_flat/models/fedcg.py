"""FedCG's network (thesis section 5.4, eqs. 5.12-5.13): domain-agnostic layers, residual domain-specific layers
whose parameters come out of a GCN over the domains, and the (student) domain classifier g.

One model, `fedcg_net`, registered for `config.model`:

  body      `channels` conv3x3 (SAME) + ReLU + maxpool2 blocks, then `hidden` dense + ReLU layers, then the
            classifier dense layer (channels=() gives an MLP). The convolutions are im2col matmuls (same
            lowering as models/layers.Conv on CPU).
  domain-specific layers (`domain_layers`: 'last' = the classifier layer only, the thesis' final setting;
            'all' = every conv and dense layer; 'none' = no domain-specific layer and no student: the plain
            network of the same body, the baselines' model in configs/fedcg*.py), eq. 5.12:
                z' = f_{w_a}(z) + lambda_l * sum_d w_d f_{V_hat_d}(z)      (residual=True: FedCG)
                z' = sum_d w_d f_{V_hat_d}(z)                              (residual=False: Table 5.9's "GCN"
                                                                            rows, no domain-agnostic part)
            lambda_l is a learnable scalar per layer (init `lambda_init`, default 1.0: a choice, the thesis
            gives no value). w [B, D] are per-example domain weights.
  GCN       (eq. 5.13) the layer's domain-specific parameters are the nodes V [D, q] (domain axis leading; one
            row = one domain's flattened kernel and bias, q = fan_in * fan_out + fan_out), and the layer uses
                V_hat = relu(A V W)            (`gcn_relu`; False: A V W)
            A [D, D] is the adjacency the server sends (`params['adjacency'][layer]`, computed in
            algorithms/fedcg.py, never trained: stop_gradient); W [q, q] is learned and FedAvg-ed like every
            other parameter, initialised to the identity (a choice: the thesis does not say; then V_hat starts
            as relu(A V)). `gcn_w=False` drops W (Table 5.9's "W" column). For large q, `gcn_bottleneck=r > 0`
            makes W = I + W1 W2 with W1 [q, r] (LeCun normal) and W2 [r, q] (zeros): the thesis' "multi-layer
            bottleneck", here as a low-rank update of the identity so that it starts where the full W does.
            A and W are per layer (graph G^l of the thesis).
  student   the domain classifier g_phi: `classifier_channels` conv blocks + a `classifier_hidden` dense layer
            -> D logits (`params['net']['student']`), on each image standardised over its pixels
            (`classifier_standardize=True`, a choice: on raw non-negative pixels a randomly initialised
            classifier tends to put nearly every image in one domain, and that partition is a fixed point of
            the teacher / student iterations: measured on the planted digits, benchmarks/studies/README.fedcg.md;
            False gives the raw-pixel classifier). The teacher has the same architecture; its params live in
            the server state of algorithms/fedcg.py (`classifier_apply`).

Params (what `init` returns and the server holds): {'net': the Flax params, 'adjacency': {layer: A [D, D]},
'soft': scalar}. `apply(params, x)` without domain weights (evaluation: evaluator, analysis tools) takes
w from the student: its softmax probabilities when params['soft'] = 1, the one-hot of its argmax when 0
(the test-time `soft` switch of algorithms/fedcg.py, Table 5.10's "Soft domains"). Training passes w
explicitly (`apply_train`: the teacher's or the oracle's one-hot domain) and gets the student's logits too.
Run with another algorithm than fedcg this network still trains (A and 'soft' get zero gradients), with w
from the untrained student.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar, Sequence, Tuple

import jax
import jax.numpy as jnp
import flax.linen as nn

from fedjax_flat.models import base
from fedjax_flat.models.layers import max_pool
from fedjax_flat.models.registry import register

DOMAIN_LAYERS = ('last', 'all', 'none')


def im2col_same(x, k: int = 3):
  """[B, H, W, C] -> [B, H, W, k*k*C] patches of a stride-1 SAME convolution (row-major over the window)."""
  p = k // 2
  xp = jnp.pad(x, ((0, 0), (p, k - 1 - p), (p, k - 1 - p), (0, 0)))
  h, w = x.shape[1], x.shape[2]
  return jnp.concatenate([xp[:, i:i + h, j:j + w, :] for i in range(k) for j in range(k)], axis=-1)


def gcn(adjacency, nodes, w=None, relu=True):
  """Eq. 5.13: V_hat = sigma(A V W) for A [D, D], V [D, q], W [q, q'] (None: A V). W given as a pair (W1 [q, r],
  W2 [r, q]) is the bottleneck W = I + W1 W2, applied as A V + (A V W1) W2: O(D q r), never the [q, q] matrix
  (q = 4,160 for a 64 -> 64 dense layer, 9,248 for a conv3x3 32 -> 32: a q x q product per step dominated the
  'all'-layers runs)."""
  out = adjacency @ nodes
  if isinstance(w, tuple):
    w1, w2 = w
    out = out + (out @ w1) @ w2
  elif w is not None:
    out = out @ w
  return jax.nn.relu(out) if relu else out


def mix_outputs(per_domain, weights):
  """sum_d w_d f_d: per_domain [B, ..., D, out], weights [B, D] -> [B, ..., out]."""
  w = weights.reshape((weights.shape[0],) + (1,) * (per_domain.ndim - 3) + (weights.shape[1], 1))
  return jnp.sum(per_domain * w.astype(per_domain.dtype), axis=-2)


class DomainSpecific(nn.Module):
  """A dense layer (on [B, fan_in] or on im2col patches [B, H, W, fan_in]) with domain-specific parameters
  from the GCN, optionally residual to a domain-agnostic one (eq. 5.12 with eq. 5.13's parameters)."""
  features: int
  num_domains: int
  residual: bool = True
  gcn_w: bool = True
  gcn_bottleneck: int = 0
  gcn_relu: bool = True
  lambda_init: float = 1.0

  @nn.compact
  def __call__(self, z, weights, adjacency):
    fan_in, out, d = z.shape[-1], self.features, self.num_domains
    q = fan_in * out + out
    kinit = nn.initializers.lecun_normal()

    def node_init(key, shape):
      keys = jax.random.split(key, d)
      kern = jax.vmap(lambda k: kinit(k, (fan_in, out)).reshape(-1))(keys)
      return jnp.concatenate([kern, jnp.zeros((d, out), kern.dtype)], axis=1)

    nodes = self.param('nodes', node_init, (d, q))
    w = None
    if self.gcn_w:
      if self.gcn_bottleneck:
        w1 = self.param('gcn_w1', kinit, (q, self.gcn_bottleneck))
        w2 = self.param('gcn_w2', nn.initializers.zeros_init(), (self.gcn_bottleneck, q))
        w = (w1, w2)                                   # W = I + W1 W2, never formed (gcn)
      else:
        w = self.param('gcn_w', lambda key, shape: jnp.eye(q, dtype=jnp.float32), (q, q))
    refined = gcn(jax.lax.stop_gradient(adjacency), nodes, w, self.gcn_relu)
    kernels = refined[:, :fan_in * out].reshape(d, fan_in, out)
    biases = refined[:, fan_in * out:]
    spec = jnp.einsum('...i,dio->...do', z, kernels) + biases           # [B, ..., D, out]
    mixed = mix_outputs(spec, weights)
    if not self.residual:
      return mixed
    agnostic = nn.Dense(out, kernel_init=kinit, name='agnostic')(z)
    lam = self.param('lam', lambda key, shape: jnp.full(shape, self.lambda_init, jnp.float32), ())
    return agnostic + lam * mixed


class DomainClassifier(nn.Module):
  """g: images -> D domain logits (the student; the teacher has the same architecture). `standardize`: each
  image is first standardised over its pixels and channels ((x - mean) / std)."""
  num_domains: int
  channels: Sequence[int] = (8,)
  hidden: int = 32
  standardize: bool = True

  @nn.compact
  def __call__(self, x):
    # Standardised in float32 whatever the compute dtype (a mixed-precision model's input is bfloat16), then
    # computed in that dtype.
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    x = x.astype(jnp.float32)
    if self.standardize:
      axes = tuple(range(1, x.ndim))
      x = (x - jnp.mean(x, axis=axes, keepdims=True)) / (jnp.std(x, axis=axes, keepdims=True) + 1e-6)
    x = x.astype(dtype)
    for c in self.channels:
      x = nn.Dense(c, name=None)(im2col_same(x))
      x = max_pool(nn.relu(x), (2, 2)) if min(x.shape[1:3]) >= 2 else nn.relu(x)
    x = x.reshape(x.shape[0], -1)
    if self.hidden:
      x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_domains)(x)


class FedCGNet(nn.Module):
  num_classes: int
  num_domains: int = 4
  channels: Sequence[int] = ()
  hidden: Sequence[int] = (64,)
  domain_layers: str = 'last'
  residual: bool = True
  gcn_w: bool = True
  gcn_bottleneck: int = 0
  gcn_relu: bool = True
  lambda_init: float = 1.0
  classifier_channels: Sequence[int] = (8,)
  classifier_hidden: int = 32
  classifier_standardize: bool = True

  def layer_names(self) -> Tuple[str, ...]:
    """The domain-specific layers, in order (the keys of params['adjacency'])."""
    n = len(self.channels) + len(self.hidden) + 1
    if self.domain_layers == 'none':
      return ()
    return tuple(f'ds_{i}' for i in range(n)) if self.domain_layers == 'all' else (f'ds_{n - 1}',)

  @nn.compact
  def __call__(self, x, weights, adjacency, train: bool = False):
    """logits, student domain logits; weights [B, D] (the w_d of eq. 5.12), adjacency {layer: [D, D]}."""
    del train
    if self.domain_layers == 'none':
      domain_logits = jnp.zeros((x.shape[0], self.num_domains), jnp.float32)
    else:
      domain_logits = DomainClassifier(self.num_domains, tuple(self.classifier_channels), self.classifier_hidden,
                                       self.classifier_standardize, name='student')(x)
    n = len(self.channels) + len(self.hidden) + 1
    ds = set(self.layer_names())
    kw = dict(num_domains=self.num_domains, residual=self.residual, gcn_w=self.gcn_w,
              gcn_bottleneck=self.gcn_bottleneck, gcn_relu=self.gcn_relu, lambda_init=self.lambda_init)
    widths = list(self.channels) + list(self.hidden) + [self.num_classes]
    z = x
    for i, width in enumerate(widths):
      name = f'ds_{i}' if f'ds_{i}' in ds else f'layer_{i}'
      if i < len(self.channels):
        z = im2col_same(z)
      elif z.ndim > 2:
        z = z.reshape(z.shape[0], -1)
      if name in ds:
        z = DomainSpecific(width, name=name, **kw)(z, weights, adjacency[name])
      else:
        z = nn.Dense(width, kernel_init=nn.initializers.lecun_normal(), name=name)(z)
      if i < n - 1:
        z = nn.relu(z)
        self.sow('intermediates', 'act', z)
        if i < len(self.channels) and min(z.shape[1:3]) >= 2:
          z = max_pool(z, (2, 2))
    return z, domain_logits


def domain_weights(domain_logits, soft):
  """w from the student: softmax probabilities (soft = 1) or the one-hot of the argmax (soft = 0)."""
  probs = jax.nn.softmax(domain_logits.astype(jnp.float32), axis=-1)
  hard = jax.nn.one_hot(jnp.argmax(domain_logits, axis=-1), domain_logits.shape[-1], dtype=jnp.float32)
  s = jnp.asarray(soft, jnp.float32)
  return s * probs + (1.0 - s) * hard


@dataclasses.dataclass(frozen=True)
class DomainModel(base.Model):
  """A `Model` with FedCG's extra entry points (algorithms/fedcg.py):

    apply_train(params, x, weights, *, rng=None) -> (logits, student domain logits)
    classifier_apply(classifier_params, x) -> domain logits      (teacher or student)
    nodes(params) -> {layer: V [D, q]}                            the GCN nodes of each domain-specific layer
    refined(params) -> {layer: V_hat [D, q]}                      what the layer uses: sigma(A V W)
  """
  APPLY_FIELDS: ClassVar[tuple] = ('apply', 'apply_train', 'classifier_apply')   # mixed precision wraps these

  num_domains: int = 0
  layer_names: Tuple[str, ...] = ()
  apply_train: Callable = None
  classifier_apply: Callable = None
  nodes: Callable = None
  refined: Callable = None


def make_fedcg_net(module: FedCGNet, name: str, num_classes: int, input_shape: tuple) -> DomainModel:
  d = module.num_domains
  layers = module.layer_names()
  classifier = DomainClassifier(d, tuple(module.classifier_channels), module.classifier_hidden,
                                module.classifier_standardize)

  def init(rng, sample_x):
    eye = {k: jnp.eye(d, dtype=jnp.float32) for k in layers}
    w = jnp.full((sample_x.shape[0], d), 1.0 / d, jnp.float32)
    net = module.init({'params': rng}, sample_x, w, eye)['params']
    return {'net': net, 'adjacency': eye, 'soft': jnp.ones((), jnp.float32)}

  def apply_train(params, x, weights, *, rng=None, with_activations=False):
    del rng
    if with_activations:
      (logits, dl), state = module.apply({'params': params['net']}, x, weights, params['adjacency'],
                                         mutable=['intermediates'])
      return (logits, dl), base._collect_acts(state.get('intermediates', {}))
    return module.apply({'params': params['net']}, x, weights, params['adjacency'])

  def classifier_apply(classifier_params, x):
    return classifier.apply({'params': classifier_params}, x)

  def apply(params, x, *, train=False, rng=None, with_activations=False):
    del train
    if not layers:     # domain_layers='none': the plain network
      w = jnp.zeros((x.shape[0], d), jnp.float32)
      out = apply_train(params, x, w, rng=rng, with_activations=with_activations)
      return (out[0][0], out[1]) if with_activations else out[0]
    w = domain_weights(classifier_apply(params['net']['student'], x), jax.lax.stop_gradient(params['soft']))
    w = jax.lax.stop_gradient(w)
    out = apply_train(params, x, w, rng=rng, with_activations=with_activations)
    if with_activations:
      (logits, _), acts = out
      return logits, acts
    return out[0]

  def nodes(params):
    return {k: params['net'][k]['nodes'] for k in layers}

  def projection(p):
    if not module.gcn_w:
      return None
    if module.gcn_bottleneck:
      return (p['gcn_w1'], p['gcn_w2'])             # I + W1 W2 (gcn)
    return p['gcn_w']

  def refined(params):
    return {k: gcn(params['adjacency'][k], params['net'][k]['nodes'], projection(params['net'][k]),
                   module.gcn_relu) for k in layers}

  return DomainModel(name=name, init=init, apply=apply, num_classes=num_classes, input_shape=tuple(input_shape),
                     num_domains=d, layer_names=layers, apply_train=apply_train,
                     classifier_apply=classifier_apply, nodes=nodes, refined=refined)


def _tuple(v) -> tuple:
  return tuple(int(a) for a in (v or ()))


@register('fedcg_net')
def _fedcg_net(num_classes, input_shape, num_domains=4, channels=(), hidden=(64,), domain_layers='last',
               residual=True, gcn_w=True, gcn_bottleneck=0, gcn_relu=True, lambda_init=1.0,
               classifier_channels=(8,), classifier_hidden=32, classifier_standardize=True, conv_impl='auto'):
  del conv_impl   # the convolutions are im2col matmuls (the per-domain kernels are GCN outputs)
  if domain_layers not in DOMAIN_LAYERS:
    raise ValueError(f'model_kwargs.domain_layers={domain_layers!r}; allowed: {list(DOMAIN_LAYERS)}')
  if int(num_domains) < 1 or not math.isfinite(float(lambda_init)):
    raise ValueError(f'model_kwargs.num_domains={num_domains!r} must be >= 1 and lambda_init finite')
  module = FedCGNet(num_classes, int(num_domains), _tuple(channels), _tuple(hidden), domain_layers,
                    bool(residual), bool(gcn_w), int(gcn_bottleneck), bool(gcn_relu), float(lambda_init),
                    _tuple(classifier_channels), int(classifier_hidden), bool(classifier_standardize))
  return make_fedcg_net(module, 'fedcg_net', num_classes, input_shape)

