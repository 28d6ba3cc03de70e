r"""Our BiSeNetV2 against the reference PyTorch module: parameter count, and outputs with the same weights.

The reference is not shipped; pass the path of FedDrive's `src/modules/bisenetv2.py` (Erosinho13/FedDrive) or
CoinCheung/BiSeNet's `lib/models/bisenetv2.py` (needs torch):

  .venv/bin/python -m benchmarks.reference.bisenetv2_reference --reference=/path/to/bisenetv2.py --variant=feddrive

It builds both models (19 classes, booster heads), copies every torch tensor into our params by name
(`torch_to_flax_name`; conv weights [out, in/g, kh, kw] -> [kh, kw, in/g, out]), randomizes the BatchNorm
affine params and running statistics (so that no layer is the identity), and compares
  eval mode   logits of one random 64x128 image (running statistics),
  train mode  the five heads' logits (batch statistics; dropout off: torch module in train mode with its
              Dropout layers set to eval) and the updated running statistics (torch momentum 0.1 = ours 0.9;
              torch updates running_var with the UNBIASED batch variance, ours with the biased one, so the
              variance is compared after undoing that n / (n - 1) factor; relative to each layer's largest).
Prints max |difference| per output and exits 1 when any exceeds --tol.

Measured (torch 2.13 CPU, float32): FedDrive variant 8,196,416 = 8,196,416 parameters, eval logits 7e-7,
train heads <= 3e-5, running means 1e-6 / variances 7e-4 (relative); CoinCheung variant: see
benchmarks/studies/README.segmentation.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys

import numpy as np


# torch submodule path pieces -> ours (see fedjax_flat/models/bisenetv2.py for our names).
_SEQ = {
    'dwconv.0': 'dw_conv', 'dwconv.1': 'dw_norm', 'dwconv1.0': 'dw1_conv', 'dwconv1.1': 'dw1_norm',
    'dwconv2.0': 'dw2_conv', 'dwconv2.1': 'dw2_norm', 'conv2.0': 'conv2_conv', 'conv2.1': 'conv2_norm',
    'shortcut.0': 'sc_dw_conv', 'shortcut.1': 'sc_dw_norm', 'shortcut.2': 'sc_conv', 'shortcut.3': 'sc_norm',
    'left1.0': 'left1_dw', 'left1.1': 'left1_norm', 'left1.2': 'left1_conv', 'left2.0': 'left2_conv',
    'left2.1': 'left2_norm', 'right1.0': 'right1_conv', 'right1.1': 'right1_norm', 'right2.0': 'right2_dw',
    'right2.1': 'right2_norm', 'right2.2': 'right2_conv', 'conv.0': 'conv_conv', 'conv.1': 'conv_norm',
}


def torch_to_flax_name(name: str):
  """'segment.S3.0.dwconv1.1.weight' -> ('params', ['segment_S3_0', 'dw1_norm'], 'scale'), or None to skip."""
  *mods, leaf = name.split('.')
  if leaf == 'num_batches_tracked':
    return None
  path = '.'.join(mods)
  top = mods[0]
  rest = mods[1:]
  if top == 'segment':
    stage = rest[0]
    if stage in ('S1S2', 'S5_5'):
      top, rest = f'segment_{stage}', rest[1:]
    else:
      top, rest = f'segment_{stage}_{rest[1]}', rest[2:]
  elif top == 'detail':
    top, rest = 'detail', [f'{rest[0]}_{rest[1]}'] + rest[2:]
  sub = '.'.join(rest)
  if sub in ('conv_out.0', 'conv_out.1'):    # FedDrive: conv_out.0; CoinCheung: conv_out.1 (after [up, CBR])
    mod = 'conv_out'
  elif sub in ('conv_out.0.1.conv', 'conv_out.0.1.bn'):   # CoinCheung aux heads: Sequential(Upsample, CBR)
    mod = 'conv_up_conv' if sub.endswith('conv') else 'conv_up_norm'
  elif sub in _SEQ:
    mod = _SEQ[sub]
  elif sub.endswith(('.conv', '.bn')) or sub in ('conv', 'bn'):  # noqa: SIM114
    # ConvBNReLU: '<name>.conv' / '<name>.bn'; the context block's own BN is 'bn' -> 'norm'.
    owner, kind = (sub.rsplit('.', 1) if '.' in sub else ('', sub))
    owner = owner.replace('.', '_')
    if top == 'segment_S5_5' and not owner:
      mod = 'norm' if kind == 'bn' else 'conv'
    else:
      mod = f'{owner}_{"conv" if kind == "conv" else "norm"}' if owner else ('conv' if kind == 'conv' else 'norm')
  else:
    raise KeyError(f'{name}: no mapping for {sub!r} ({path})')
  if top == 'detail' and '_' in rest[0]:
    mod = f'{rest[0]}_{"conv" if mod.endswith("conv") else "norm"}'
  leaf_map = {'weight': 'kernel' if mod.endswith(('conv', '_dw', 'conv_out')) or mod == 'conv_out' else 'scale',
              'bias': 'bias', 'running_mean': 'mean', 'running_var': 'var'}
  coll = 'batch_stats' if leaf.startswith('running') else 'params'
  return coll, [top, mod], leaf_map[leaf]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--reference', required=True)
  ap.add_argument('--variant', default='feddrive', choices=('feddrive', 'coincheung'))
  ap.add_argument('--classes', type=int, default=19)
  ap.add_argument('--tol', type=float, default=2e-3)
  args = ap.parse_args()

  import torch
  import jax
  import jax.numpy as jnp
  from fedjax_flat.models import registry
  from fedjax_flat.models.base import num_trainable_params

  spec = importlib.util.spec_from_file_location('ref_bisenetv2', args.reference)
  ref = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(ref)
  torch.manual_seed(0)
  if args.variant == 'feddrive':
    tm = ref.BiSeNetV2(args.classes, output_aux=True)
  else:
    ref.BiSeNetV2.load_pretrain = lambda self: None      # no download
    tm = ref.BiSeNetV2(args.classes, aux_mode='train')
  torch.manual_seed(0)
  with torch.no_grad():
    for mod in tm.modules():
      if isinstance(mod, torch.nn.BatchNorm2d):
        mod.weight.uniform_(0.5, 1.5)
        mod.bias.uniform_(-0.2, 0.2)
        mod.running_mean.uniform_(-0.2, 0.2)
        mod.running_var.uniform_(0.5, 1.5)
  torch_count = sum(p.numel() for p in tm.parameters())

  h, w = 64, 128
  m = registry.get_model('bisenetv2', args.classes, (h, w, 3), variant=args.variant, conv_impl='lax')
  params = m.init(jax.random.key(0), jnp.zeros((1, h, w, 3)))
  params = jax.tree_util.tree_map(np.asarray, params)
  params = {'params': jax.tree_util.tree_map(np.array, params['params']),
            'batch_stats': jax.tree_util.tree_map(np.array, params['batch_stats'])}
  copied = 0
  for name, t in list(tm.state_dict().items()):
    key = torch_to_flax_name(name)
    if key is None:
      continue
    coll, (top, mod), leaf = key
    v = t.detach().numpy()
    if v.ndim == 4:
      v = v.transpose(2, 3, 1, 0)
    node = params[coll][top][mod]
    if node[leaf].shape != v.shape:
      raise ValueError(f'{name} -> {coll}/{top}/{mod}/{leaf}: shape {v.shape} vs ours {node[leaf].shape}')
    node[leaf] = v.astype(np.float32)
    copied += 1
  ours = num_trainable_params(params)
  leaves = len(jax.tree_util.tree_leaves(params))
  print(f'parameters: reference {torch_count:,}, ours {ours:,}; tensors copied {copied} of our {leaves}')
  if copied != leaves:
    print('FAIL: not every leaf of ours received a reference tensor')
    return 1

  rng = np.random.default_rng(0)
  x = rng.normal(0, 1, (2, 3, h, w)).astype(np.float32)
  xt, xj = torch.from_numpy(x), jnp.asarray(x.transpose(0, 2, 3, 1))
  worst = 0.0
  tm.eval()
  with torch.no_grad():
    out_t = tm(xt, test=True) if args.variant == 'feddrive' else tm(xt)[0]
  out_j = m.apply(params, xj)
  d = float(np.abs(out_t.numpy().transpose(0, 2, 3, 1) - np.asarray(out_j)).max())
  print(f'eval logits: max |diff| {d:.2e} (scale {float(np.abs(out_t.numpy()).max()):.2f})')
  worst = max(worst, d)

  tm.train()
  counts, old = {}, {k: v.clone() for k, v in tm.state_dict().items()}
  for name, mod in tm.named_modules():
    if isinstance(mod, torch.nn.Dropout):
      mod.eval()
    if isinstance(mod, torch.nn.BatchNorm2d):    # pixels per channel of each BN input (for unbiased var)
      mod.register_forward_hook(
          lambda mod_, inp, out, name=name: counts.__setitem__(name, inp[0].numel() // inp[0].shape[1]))
  with torch.no_grad():
    outs_t = tm(xt)
  outs_j, stats = m.apply(params, xj, train=True, with_batch_stats=True)   # no rng: dropout off
  for i, (a, b) in enumerate(zip(outs_t, outs_j)):
    d = float(np.abs(a.numpy().transpose(0, 2, 3, 1) - np.asarray(b)).max())
    print(f'train head {i}: max |diff| {d:.2e} (scale {float(np.abs(a.numpy()).max()):.2f})')
    worst = max(worst, d)
  dm = dv = 0.0
  for name, t in tm.state_dict().items():
    key = torch_to_flax_name(name)
    if key is None or key[0] != 'batch_stats':
      continue
    _, (top, mod), leaf = key
    ours_v = np.asarray(stats[top][mod][leaf])
    scale = max(float(np.abs(t.numpy()).max()), 1e-6)   # relative to the layer's largest statistic
    if leaf == 'mean':
      dm = max(dm, float(np.abs(ours_v - t.numpy()).max()) / scale)
    else:   # ours: 0.9 old + 0.1 biased; torch: 0.9 old + 0.1 biased * n / (n - 1)
      n = counts[name.rsplit('.', 1)[0]]
      o = old[name].numpy()
      dv = max(dv, float(np.abs(0.9 * o + (ours_v - 0.9 * o) * n / (n - 1) - t.numpy()).max()) / scale)
  print(f'updated running statistics, max |diff| / layer max: means {dm:.2e}, variances (unbiased-corrected) '
        f'{dv:.2e}')
  worst = max(worst, dm, dv)
  print('OK' if worst <= args.tol else f'FAIL: {worst:.2e} > tol {args.tol}')
  return 0 if worst <= args.tol else 1


if __name__ == '__main__':
  sys.exit(main())
