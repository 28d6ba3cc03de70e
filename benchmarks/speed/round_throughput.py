r"""Throughput of one FedAvg round of the paper's CIFAR-100 setting: ours per client strategy, and the peers.

The CNN (815,332 params), 10 clients x 500 synthetic 32x32x3 images, E=1, B=64 (8 steps, the last one
partial), lr 0.01, wd 4e-4; SGD and SAM (rho 0.05). Every variant is built, compiled and warmed up first, then
all are timed interleaved (round-robin, `--repeats` times, median) in one invocation, so the machine's speed
drift hits them alike:

  vmap / chunked / sequential   the engine's one-program round (fedjax_flat.core.engine), default conv, batches
                                built beforehand (the round program alone)
  trainer                       ours as a user runs it: `Trainer.train` one round at a time, default path (data on
                                the device; sampling, batch gather and round in one program; engine defaults)
  python_loop (SGD)             a Python loop over clients dispatching one jitted SGD step per batch (the
                                FedJAX backend's pattern, on our stack), native convolution (flax/lax)
  single_step (SGD)             one jitted SGD step of one client alone: the compute floor of this stack
                                (native convolution), and the same with the im2col convolution
  torch                         the PyTorch reference pattern (benchmarks/speed/peers/torch_peer.py, a subprocess)
  fedjax                        FedJAX 0.0.17's fed_avg (benchmarks/speed/peers/fedjax_peer.py in .venv-fedjax)

`ratio_vs_torch` / `ratio_vs_fedjax` (per optimizer) = ours (`trainer`: the whole round a user gets) / peer;
`engine_ratio_vs_*` the same for the default strategy's round program. The JSON also records the CPU, uptime
before/after and the fp32 GEMM rate before/after.

  python -m benchmarks.speed.round_throughput [--json=PATH] [--repeats=3] [--opts=sgd,sam] [--peers=auto]
      [--strategies=vmap,chunked,sequential] [--clients=10] [--examples_per_client=500]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402

from benchmarks.speed import bench_util  # noqa: E402
from fedjax_flat.core import engine  # noqa: E402
from fedjax_flat.data.sources.builtin import synthetic  # noqa: E402
from fedjax_flat.models.registry import get_model  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

FLAGS = flags.DEFINE_string('json', None, 'write results as JSON here')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'timed repetitions per variant (median)')
_CLIENTS = flags.DEFINE_integer('clients', 10, 'clients per round')
_EXAMPLES = flags.DEFINE_integer('examples_per_client', 500, 'examples per client')
_STRATEGIES = flags.DEFINE_list('strategies', ['vmap', 'chunked', 'sequential'], 'engine strategies')
_CHUNK = flags.DEFINE_integer('clients_per_chunk', 5, 'chunk size of the chunked strategy')
_CONV = flags.DEFINE_string('conv_impl', 'auto', 'conv lowering of the engine strategies')
_OPTS = flags.DEFINE_list('opts', ['sgd', 'sam'], 'client optimizers, each a full set of variants')
_OPT = flags.DEFINE_string('optimizer', None, 'one client optimizer (sgd | sam); overrides --opts')
_PEERS = flags.DEFINE_string('peers', 'auto', "torch,fedjax | auto (those installed) | none")
_LOOP = flags.DEFINE_bool('loop', True, 'time the python_loop and single_step variants (SGD)')

NUM_CLASSES = 100


def _config(strategy, conv, opt):
  return bench_util.round_config('cifar_cnn', opt, strategy=strategy, conv=conv, clients=_CLIENTS.value,
                                 chunk=_CHUNK.value)


def _engine_variant(strategy, data, conv, opt):
  return bench_util.engine_round_variant(_config(strategy, conv, opt), data, NUM_CLASSES)[0]


def _trainer_variant(data, opt, rounds):
  """Trainer.train, one round per timed call, everything at its default (engine 'auto')."""
  c = _config('auto', 'auto', opt)
  c.rounds = rounds
  c.eval_every = rounds
  c.progress_every_s = 1e9
  t = trainers.make_trainer(c, None, data=data, write_files=False)
  bench_util.training_only(t)          # training rounds only, as every other variant

  def run():
    t0 = time.perf_counter()
    t.train(num_rounds=1)
    jax.block_until_ready(t.server_state)
    return time.perf_counter() - t0
  return run, t


def _loop_and_single(data, conv):
  """FedJAX-style loop: one jitted step per batch, Python loop over clients and batches."""
  model = get_model('cifar_cnn', NUM_CLASSES, (32, 32, 3), conv_impl=conv)
  return bench_util.python_loop_variant(model, data, _CLIENTS.value)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)     # no per-round progress lines from the trainer variants
  n = _CLIENTS.value
  opts = [_OPT.value] if _OPT.value else list(_OPTS.value)
  peers = bench_util.resolve_peers(_PEERS.value)
  data = synthetic(n, _EXAMPLES.value, input_shape=(32, 32, 3), num_classes=NUM_CLASSES, test_size=1)
  conv = _CONV.value
  round_examples = n * _EXAMPLES.value
  timed_rounds = 1 + 2 * (_REPEATS.value + 2)
  variants, examples, first_s, peer_setup = {}, {}, {}, {}
  trainers = {}
  peer_set = bench_util.PeerSet(peers)
  try:
    data_path = peer_set.write_data('cifar', data) if peers else None
    for opt in opts:
      print(f'building {opt} variants ...', file=sys.stderr, flush=True)
      for s in _STRATEGIES.value:
        variants[(opt, s)] = _engine_variant(s, data, conv, opt)
      variants[(opt, 'trainer')], trainers[opt] = _trainer_variant(data, opt, timed_rounds)
      if opt == 'sgd' and _LOOP.value:
        loop_fn, single = _loop_and_single(data, 'lax')
        variants[(opt, 'python_loop')] = loop_fn
        variants[(opt, 'single_step')] = single
        _, variants[(opt, 'single_step_im2col')] = _loop_and_single(data, 'im2col')
      for peer in peers:
        spec = bench_util.spec_of(_config('auto', 'auto', opt), data_path, num_classes=NUM_CLASSES)
        variants[(opt, peer)], peer_setup[(opt, peer)] = peer_set.variant(peer, f'cifar_{opt}', spec)
        first_s[(opt, peer)] = peer_setup[(opt, peer)]['first_round_s']
    for key, fn in variants.items():
      examples[key] = 64 if key[1].startswith('single_step') else round_examples
      if key not in first_s:   # compile + warm-up (peers did theirs at set-up)
        first_s[key] = fn()
        fn()
    info = bench_util.machine_info()
    gemm = [bench_util.gemm_gflops()]
    up = [bench_util.uptime()]
    times = bench_util.interleave(variants, _REPEATS.value)
    up.append(bench_util.uptime())
    gemm.append(bench_util.gemm_gflops())
  finally:
    peer_set.close()

  eps = {k: examples[k] / statistics.median(v) for k, v in times.items()}
  default = engine.resolve_strategy('auto')
  first = opts[0]
  by_opt = {}
  for opt in opts:
    strategies = {s: eps[(opt, s)] for s in _STRATEGIES.value}
    r = {'strategies': strategies, 'trainer_examples_per_s': eps[(opt, 'trainer')],
         'trainer_rounds_per_call': trainers[opt].rounds_per_call}
    if (opt, 'python_loop') in eps:
      r['python_loop_examples_per_s'] = eps[(opt, 'python_loop')]
      r['single_step_examples_per_s'] = eps[(opt, 'single_step')]
      r['single_step_im2col_examples_per_s'] = eps[(opt, 'single_step_im2col')]
    if strategies:
      best = max(strategies, key=strategies.get)
      r['best_strategy'] = best
      if 'python_loop_examples_per_s' in r:
        r['ratio_best_to_loop'] = strategies[best] / r['python_loop_examples_per_s']
        r['ratio_best_to_single_step'] = strategies[best] / r['single_step_examples_per_s']
        r['ratio_default_to_loop'] = strategies.get(default, float('nan')) / r['python_loop_examples_per_s']
        r['ratio_default_to_single_step'] = (strategies.get(default, float('nan'))
                                             / r['single_step_examples_per_s'])
    by_opt[opt] = r
  res = dict(by_opt[first])       # the keys of the one-optimizer version (its first optimizer)
  res.update({
      'default_strategy': default, 'by_optimizer': by_opt, 'optimizers': opts,
      'peers': {p: {opt: {'examples_per_s': eps[(opt, p)], 'first_round_s': peer_setup[(opt, p)]['first_round_s'],
                          'warmup_s': peer_setup[(opt, p)]['warmup_s']} for opt in opts} for p in peers},
      'peer_info': peer_set.info,
      'ratio_vs_torch': {}, 'ratio_vs_fedjax': {}, 'engine_ratio_vs_torch': {}, 'engine_ratio_vs_fedjax': {},
      'first_call_s': {f'{o}/{v}': s for (o, v), s in first_s.items()},
      's_per_round_all': {f'{o}/{v}': ts for (o, v), ts in times.items()},
      'conv_impl': conv, 'optimizer': first, 'clients': n, 'examples_per_client': _EXAMPLES.value,
      'uptime': up, 'gemm_gflops_2048': gemm, **info})
  for p in peers:
    for opt in opts:
      res[f'ratio_vs_{p}'][opt] = eps[(opt, 'trainer')] / eps[(opt, p)]
      if (opt, default) in eps:
        res[f'engine_ratio_vs_{p}'][opt] = eps[(opt, default)] / eps[(opt, p)]

  print(f"CPU {info['cpu']} x{info['cpus']}, jax {info['jax']} ({info['backend']}), fp32 GEMM 2048^3 "
        f'{gemm[0]:.0f} / {gemm[1]:.0f} GFLOP/s (before / after)')
  print(f'uptime before: {up[0]}\nuptime after:  {up[1]}')
  print(f'{n} clients x {_EXAMPLES.value} examples, B=64, E=1; median of {_REPEATS.value}, interleaved')
  ref = 'trainer'
  print(f"{'opt':<5}{'variant':<22}{'examples/s':>12}{'s/round':>10}{'x torch':>9}{'x fedjax':>10}"
        f"{'first call s':>14}")
  for (opt, v), e in eps.items():
    xt = e / eps[(opt, 'torch')] if (opt, 'torch') in eps else float('nan')
    xf = e / eps[(opt, 'fedjax')] if (opt, 'fedjax') in eps else float('nan')
    mark = ' (default)' if v == default else (' (ours)' if v == ref else '')
    print(f'{opt:<5}{v + mark:<22}{e:>12.1f}{statistics.median(times[(opt, v)]):>10.3f}{xt:>9.2f}{xf:>10.2f}'
          f'{first_s[(opt, v)]:>14.1f}')
  for p in peers:
    print(f'ours (trainer) / {p}: ' + ', '.join(f'{o} {res[f"ratio_vs_{p}"][o]:.2f}x' for o in opts))
  if FLAGS.value:
    with open(FLAGS.value, 'w') as f:
      json.dump(res, f, indent=2)


if __name__ == '__main__':
  app.run(main)
