"""Mixed precision on the deep networks, the two checks the random-init tests leave open
(benchmarks/studies/README.bf16.md, "Deep networks: Flax's native policy and trained networks"):

1. **Flax's native policy.** The library's bfloat16 (models/base.with_compute_dtype: the trainable parameters and
   the input cast once, every layer computing in its input's dtype) against Flax's own convention, every layer
   given `dtype=bfloat16` with float32 parameters (param_dtype) -- set here on every module that has a `dtype`
   field (Flax's Conv / Dense / norms and the package's Conv / Dense) by a method interceptor, the model code
   untouched. If the two agree far more closely than either agrees with float32, the random-init errors are the
   networks' sensitivity, not the library's policy.
2. **Trained networks.** A deep network trained in float32 (SGD with momentum on the embedded digits, upsampled
   to 16x16x3) and compared in both precisions at its trained parameters, train and evaluation mode, beside the
   same comparison at its initial parameters.

  .venv/bin/python -m benchmarks.studies.bf16_deep --out=benchmarks/studies/bf16_deep [--models=...] [--steps=300]

Writes OUT.json and OUT.md. Errors: relative L2 of the outputs (logits of the main head) and 1 - cosine of the
flattened gradients of loss = mean(out * r), r a fixed random projection (tests/models/test_mixed_precision.py).
"""
from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.speed import bench_util
from fedjax_flat.data.sources.builtin import load_digits
from fedjax_flat.models import base, registry

# name -> (num_classes, per-example input shape, model kwargs): the deep networks of the mixed-precision tests.
DEEP = {
    'resnet18_bn': (10, (16, 16, 3), {}),
    'resnet18_gn': (10, (16, 16, 3), {}),
    'resnet20_gn': (10, (16, 16, 3), {}),
    'mobilenet_v2_gn': (10, (32, 32, 3), {'width_mult': 0.25}),
    'deeplabv3_mobilenetv2': (4, (32, 32, 3), {'width_mult': 0.25}),
    'bisenetv2': (4, (32, 32, 3), {}),
    'vpr_resnet18': (1, (3, 32, 32, 3), {'base_width': 8}),
}
# Classifiers that train on the digits (16x16x3 inputs, 10 classes) for the trained-network check.
TRAINABLE = ('resnet18_bn', 'resnet18_gn', 'resnet20_gn')


def native_bf16(fn):
  """fn(params, x, ...) with Flax's native policy: every module with a `dtype` field computes in bfloat16 (its
  parameters stay float32 and are cast by the layer); the outputs come back float32."""
  def interceptor(next_fun, args, kwargs, context):
    m = context.module
    if context.method_name == '__call__' and 'dtype' in getattr(m, '__dataclass_fields__', {}):
      object.__setattr__(m, 'dtype', jnp.bfloat16)   # Flax modules are frozen dataclasses: set before the call
    return next_fun(*args, **kwargs)

  def apply(params, x, *args, **kwargs):
    with nn.intercept_methods(interceptor):
      out = fn(params, x, *args, **kwargs)
    return jax.tree.map(lambda a: a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a, out)
  return apply


def _round(tree):
  return jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
                      if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _flat(g):
  return jnp.concatenate([v.ravel() for v in jax.tree.leaves(g)])


def errors(a, b):
  """(relative L2 of outputs, 1 - cosine of gradients) of a = (out, grad) against b."""
  rel = float(jnp.linalg.norm(a[0] - b[0]) / jnp.linalg.norm(b[0]))
  ga, gb = _flat(a[1]), _flat(b[1])
  return rel, float(1.0 - ga @ gb / (jnp.linalg.norm(ga) * jnp.linalg.norm(gb)))


def compare(name, params=None, x=None, train=True):
  """{'bf16': ..., 'native': ..., 'bf16_vs_native': ..., 'floor': ...}: (rel, 1 - cos) each, at `params`."""
  nc, shape, kw = DEEP[name]
  m32 = registry.get_model(name, nc, shape, **kw)
  m16 = base.with_compute_dtype(m32, 'bfloat16')
  if x is None:
    x = jax.random.normal(jax.random.key(0), (4,) + shape)
  if params is None:
    params = m32.init(jax.random.key(1), x)
  out_shape = jax.eval_shape(lambda: jax.tree.leaves(m32.apply(params, x, train=train, rng=jax.random.key(2)))[0])
  r = jax.random.normal(jax.random.key(3), out_shape.shape)

  def run(apply, q, xx):
    def f(q):
      out = jax.tree.leaves(apply(q, xx, train=train, rng=jax.random.key(2)))[0].astype(jnp.float32)
      return jnp.mean(out * r), out
    (_, out), g = jax.jit(jax.value_and_grad(f, has_aux=True))(q)
    return out, g

  ref = run(m32.apply, params, x)
  ours = run(m16.apply, params, x)
  native = run(native_bf16(m32.apply), params, x)
  low = {**params, 'params': _round(params['params'])} if m32.batch_stats else _round(params)
  floor = run(m32.apply, low, _round(x))
  return {'bf16': errors(ours, ref), 'native': errors(native, ref), 'bf16_vs_native': errors(ours, native),
          'floor': errors(floor, ref)}


def digits16(n=None):
  """The embedded digits as 16x16x3 images (each pixel repeated 2x2, the gray level in 3 channels), standardised."""
  d = load_digits(1, 0.0, test_fraction=0.2, seed=0)
  x = np.asarray(d.x, np.float32)[..., 0]
  x = np.repeat(np.repeat(x, 2, axis=1), 2, axis=2)[..., None].repeat(3, axis=-1)
  x = (x - x.mean()) / x.std()
  return (x[:n], np.asarray(d.y)[:n]) if n else (x, np.asarray(d.y))


def train_float32(name, steps, batch=32, lr=0.05, seed=0):
  """SGD with momentum 0.9 on the digits in float32; (params, train accuracy of the last 100 examples seen)."""
  nc, shape, kw = DEEP[name]
  m = registry.get_model(name, nc, shape, **kw)
  x, y = digits16()
  params = m.init(jax.random.key(seed), jnp.asarray(x[:batch]))
  tx = optax.sgd(lr, momentum=0.9)
  trainable = params['params'] if m.batch_stats else params

  @jax.jit
  def step(params, opt, xb, yb, key):
    def loss(p):
      if m.batch_stats:
        logits, stats = m.apply({**params, 'params': p}, xb, train=True, rng=key, with_batch_stats=True)
      else:
        logits, stats = m.apply(p, xb, train=True, rng=key), None
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), (logits, stats)
    p = params['params'] if m.batch_stats else params
    (_, (logits, stats)), g = jax.value_and_grad(loss, has_aux=True)(p)
    upd, opt = tx.update(g, opt, p)
    p = optax.apply_updates(p, upd)
    params = {'params': p, 'batch_stats': stats} if m.batch_stats else p
    return params, opt, jnp.mean(jnp.argmax(logits, -1) == yb)

  opt = tx.init(trainable)
  rng = np.random.default_rng(seed)
  accs = []
  for t in range(steps):
    idx = rng.choice(len(x), batch, replace=False)
    params, opt, acc = step(params, opt, jnp.asarray(x[idx]), jnp.asarray(y[idx]), jax.random.key(t))
    accs.append(float(acc))
  return params, float(np.mean(accs[-max(1, 100 // batch):]))


def _pct(v):
  return f'{100 * v:.2f}%'


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--out', default='benchmarks/studies/bf16_deep')
  ap.add_argument('--models', default=','.join(DEEP))
  ap.add_argument('--trained', default=','.join(TRAINABLE))
  ap.add_argument('--steps', type=int, default=300)
  args = ap.parse_args(argv)
  t0 = time.time()
  res = {'native': {}, 'trained': {}, 'steps': args.steps}
  for name in [n for n in args.models.split(',') if n]:
    res['native'][name] = compare(name)
    print(name, {k: tuple(round(x, 5) for x in v) for k, v in res['native'][name].items()}, flush=True)
  xb, _ = digits16(8)
  for name in [n for n in args.trained.split(',') if n]:
    params, acc = train_float32(name, args.steps)
    init = DEEP[name]
    p0 = registry.get_model(name, init[0], init[1], **init[2]).init(jax.random.key(0), jnp.asarray(xb))
    row = {'train_accuracy': acc}
    for mode, train in (('train', True), ('eval', False)):
      row[f'init_{mode}'] = compare(name, p0, jnp.asarray(xb), train)
      row[f'trained_{mode}'] = compare(name, params, jnp.asarray(xb), train)
    res['trained'][name] = row
    print(name, 'trained acc', round(acc, 3), {k: v['bf16'] for k, v in row.items() if k != 'train_accuracy'},
          flush=True)
  res['wall_s'] = time.time() - t0
  lines = ['# Deep networks in bfloat16: the library\'s policy against Flax\'s native one, and trained networks', '',
           f'`python -m benchmarks.studies.bf16_deep --steps={args.steps}` (train mode unless said; errors: '
           'relative L2 of the outputs / 1 - cosine of the gradients, against float32).', '',
           '| model | library bf16 | Flax native bf16 | library vs native | float32 floor |', '|---|---|---|---|---|']
  for name, v in res['native'].items():
    lines.append(f'| {name} | ' + ' | '.join(f'{_pct(v[k][0])} / {v[k][1]:.2e}'
                                              for k in ('bf16', 'native', 'bf16_vs_native', 'floor')) + ' |')
  lines += ['', '| model (train acc.) | mode | bf16 at init | bf16 trained | floor at init | floor trained |',
            '|---|---|---|---|---|---|']
  for name, row in res['trained'].items():
    for mode in ('train', 'eval'):
      i, t = row[f'init_{mode}'], row[f'trained_{mode}']
      lines.append(f"| {name} ({100 * row['train_accuracy']:.0f}%) | {mode} | {_pct(i['bf16'][0])} / "
                   f"{i['bf16'][1]:.2e} | {_pct(t['bf16'][0])} / {t['bf16'][1]:.2e} | {_pct(i['floor'][0])} | "
                   f"{_pct(t['floor'][0])} |")
  bench_util.write_report(args.out, res, lambda _: '\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
