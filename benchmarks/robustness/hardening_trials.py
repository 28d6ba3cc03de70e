"""The hostile-user trials of issue 13 against experiments/train.py: what each does now.

Each trial runs the binary (quickstart config, MLP, a few rounds) in a fresh temporary workdir and records the
exit status, the wall seconds of the process and its `error:` line (or the line that matters). Faults that
root cannot produce with chmod come from tests/fixtures/fault_inject.py. Prints a Markdown table.

  .venv/bin/python -m benchmarks.robustness.hardening_trials [--only=SUBSTRING]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.paths import REPO

QUICK = ['--config.model=mlp', '--config.eval_every=2', '--config.progress_every_s=0']
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1'}


def cmd(wd, *flags, config='configs/quickstart.py', inject=()):
  pre = ['-m', 'tests.fixtures.fault_inject', *inject, '--'] if inject else []
  return [sys.executable, *pre, os.path.join(REPO, 'experiments', 'train.py'), f'--config={config}',
          f'--workdir={wd}', *flags]


def run(wd, *flags, timeout=600, **kw):
  t = time.time()
  try:
    r = subprocess.run(cmd(wd, *flags, **kw), capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)
  except subprocess.TimeoutExpired:
    return None, time.time() - t, f'still running after {timeout} s'
  return r, time.time() - t, None


def summary(r, secs, extra=''):
  if r is None:
    return ('timeout', secs, extra)
  err = [ln for ln in r.stderr.splitlines() if ln.startswith(('error: ', 'FATAL'))]
  line = err[0] if err else ([ln for ln in r.stdout.splitlines() if ln.startswith(('done:', 'stopped'))] or [''])[0]
  tb = ' [TRACEBACK]' if 'Traceback' in r.stderr else ''
  return (r.returncode, secs, (line[:230] + tb + (' ' + extra if extra else '')).strip())


def cifar_root(d, *, batch1=None, labels=None):
  from tests.fixtures.data_files import make_cifar10, py2_pickle
  make_cifar10(d, per_batch=10, n_test=10, as_tar=False)
  p = os.path.join(d, 'cifar-10-batches-py', 'data_batch_1')
  if labels is not None:
    with open(p, 'rb') as f:
      b = pickle.loads(f.read(), encoding='bytes')
    b[b'labels'] = labels
    batch1 = py2_pickle(b)
  if batch1 is not None:
    with open(p, 'wb') as f:
      f.write(batch1)
  return d


CIFAR = ['--config.data.check_official_sizes=False', '--config.data.num_clients=2',
         '--config.data.examples_per_client=5', '--config.rounds=1']


class _Evil:
  def __reduce__(self):
    return os.system, ('true',)


def trials(tmp):
  wd = lambda name: os.path.join(tmp, name)  # noqa: E731
  out = []

  def add(name, res):
    out.append((name,) + res)
    print(f'{name}: {res}', file=sys.stderr, flush=True)

  # 1. bit rot
  w = wd('bitrot')
  run(w, *QUICK, '--config.rounds=4', '--config.checkpoint_every=1')
  d = os.path.join(w, 'checkpoints', '4', 'server')
  files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if os.path.basename(r) == 'd']
  big = max(files, key=os.path.getsize)
  raw = bytearray(open(big, 'rb').read())
  raw[len(raw) // 2] ^= 0x5A
  open(big, 'wb').write(bytes(raw))
  r, s, _ = run(w, *QUICK, '--config.rounds=5', '--config.checkpoint_every=1')
  warn = [ln[ln.index('checkpoint '):][:150] for ln in r.stderr.splitlines() if 'is corrupt' in ln]
  add('1 one flipped byte in the newest checkpoint array data',
      summary(r, s, '| ' + (warn[0] if warn else 'no warning')))
  # 2. two runs together
  w = wd('together')
  flags = [*QUICK, '--config.rounds=8', '--config.checkpoint_every=1']
  t = time.time()
  ps = [subprocess.Popen(cmd(w, *flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
        for _ in range(2)]
  res = [(p.pid, p.wait(timeout=600), p.stderr.read(), time.time() - t) for p in ps]
  rounds = [json.loads(ln)['round'] for ln in open(os.path.join(w, 'metrics.jsonl'))]
  refused = [x for x in res if x[1] != 0]
  msg = ([ln for ln in refused[0][2].splitlines() if ln.startswith('error:')] or [''])[0] if refused else ''
  add('2 two runs started together on one workdir',
      (f'{res[0][1]} / {res[1][1]}', max(x[3] for x in res),
       f'{msg} | pids {[x[0] for x in res]}; metrics rounds {rounds}'))
  # 3. checkpoints/ not writable (from the start; and after the first save)
  w = wd('ro')
  add('3 checkpoints/ not writable',
      summary(*run(w, *QUICK, '--config.rounds=2', inject=[f'--deny={w}/checkpoints'])[:2]))
  w = wd('ro2')
  add('3 checkpoints/ turns read-only after the first save',
      summary(*run(w, *QUICK, '--config.rounds=4', '--config.checkpoint_every=2',
                   inject=[f'--deny={w}/checkpoints', '--deny_after=1'])[:2]))
  # 4. NaN / inf
  for f in ('--config.client.lr=nan', '--config.client.lr=inf', '--config.client.lr=1e400', '--config.data.alpha=nan'):
    add(f'4 {f}', summary(*run(wd('nan'), *QUICK, '--config.rounds=2', f)[:2]))
  add('4 --config.data.alpha=inf (IID, allowed)', summary(*run(wd('inf'), *QUICK, '--config.rounds=2',
                                                                '--config.data.alpha=inf')[:2]))
  # 5. one line and exit 2
  for f in ('--config.clent.lr=0.1', '--config.data.alpha=-1', '--config.data.num_clients=0',
            '--config.client.lr=abc'):
    add(f'5 {f}', summary(*run(wd('bad'), *QUICK, f)[:2]))
  add('5 missing config file', summary(*run(wd('bad'), config='configs/nope.py')[:2]))
  bad = os.path.join(tmp, 'syntax.py')
  open(bad, 'w').write('def get_config(:\n')
  add('5 config file with a syntax error', summary(*run(wd('bad'), config=bad)[:2]))
  add('5 --config.algo.mu (no value) --config.rounds=2',
      summary(*run(wd('bad'), '--config.algorithm=fedprox', '--config.algo.mu', '--config.rounds=2')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_unsafe'), batch1=pickle.dumps({b'data': _Evil()}, protocol=2))
  add('5 UnsafePickleError (CIFAR batch calls os.system)',
      summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR, config='configs/fedsam_cifar.py')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_trunc'))
  p = os.path.join(root, 'cifar-10-batches-py', 'data_batch_1')
  raw = open(p, 'rb').read()
  open(p, 'wb').write(raw[:len(raw) - 100])
  add('5 CifarFormatError (truncated batch)',
      summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR, config='configs/fedsam_cifar.py')[:2]))
  add('5 --config.data.split_json=/nonexistent.json (CIFAR config)',
      summary(*run(wd('c'), '--config.data.split_json=/nonexistent.json', config='configs/fedsam_cifar.py')[:2]))
  add('5 divergence (client.lr=1e30)',
      summary(*run(wd('div'), *QUICK, '--config.rounds=3', '--config.client.lr=1e30')[:2]))
  add('5 ENOSPC in the metrics writer', summary(*run(wd('full'), *QUICK, '--config.rounds=3',
                                                      inject=['--enospc=metrics.jsonl'])[:2]))
  # 7. smaller ones
  w = wd('fresh')
  run(w, *QUICK, '--config.rounds=2')
  r, s, _ = run(w, *QUICK, '--config.rounds=2', '--config.clients_per_round=50', '--fresh')
  add('7 --fresh with a config rejected against the data',
      summary(r, s, f'| checkpoints kept: {sorted(os.listdir(os.path.join(w, "checkpoints")))}, metrics kept: '
                    f'{os.path.getsize(os.path.join(w, "metrics.jsonl")) > 0}'))
  w = wd('term')
  t = time.time()
  p = subprocess.Popen(cmd(w, *QUICK, '--config.rounds=2'), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=ENV, cwd=REPO)
  for line in p.stdout:
    if line.startswith('done:'):
      p.send_signal(signal.SIGTERM)
      break
  p.communicate(timeout=120)
  add('7 SIGTERM right after done:', (p.returncode, time.time() - t, ''))
  w = wd('int')
  t = time.time()
  p = subprocess.Popen(cmd(w, *QUICK, '--config.rounds=100000', inject=['--slow_rename=60']),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
  while not (os.path.exists(os.path.join(w, 'metrics.jsonl')) and open(os.path.join(w, 'metrics.jsonl')).read()):
    time.sleep(0.05)
  p.send_signal(signal.SIGINT)
  while 'slow rename' not in p.stderr.readline():
    pass
  t2 = time.time()
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=120)
  add('7 second Ctrl-C while the final checkpoint is written',
      (p.returncode, time.time() - t, f'{time.time() - t2:.1f} s after the 2nd SIGINT; '
                                      + ([ln for ln in err.splitlines() if 'second SIGINT' in ln] or [''])[0]))
  root = cifar_root(os.path.join(tmp, 'c_float'), labels=[i % 10 + 0.7 for i in range(10)])
  add('7 float CIFAR labels', summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR,
                                           config='configs/fedsam_cifar.py')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_big'), batch1=b'c__builtin__\nbytes\n(I4000000000\ntR.')
  add('7 pickle asking for bytes(4e9)', summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR,
                                                     config='configs/fedsam_cifar.py')[:2]))
  w = wd('fallback')
  run(w, *QUICK, '--config.rounds=3', '--config.checkpoint_every=1')
  for r_, _, fs in os.walk(os.path.join(w, 'checkpoints', '3', 'server')):
    for f in fs:
      if os.path.basename(r_) == 'd':
        open(os.path.join(r_, f), 'wb').close()
  r, s, _ = run(w, *QUICK, '--config.rounds=3', '--config.checkpoint_every=1')
  add('7 checkpoint fallback (truncated array files)',
      summary(r, s, f'| "Event loop is closed" in stderr: {"Event loop is closed" in r.stderr}'))
  r, s, _ = run(wd('quiet'), *QUICK, '--config.rounds=2')
  r2, s2, _ = run(wd('verbose'), *QUICK, '--config.rounds=2', '--verbosity=0')
  add('7 terminal log lines (default / --verbosity=0)',
      (f'{r.returncode} / {r2.returncode}', s + s2,
       f'{len(r.stderr.splitlines())} / {len(r2.stderr.splitlines())} stderr lines'))
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--keep', action='store_true', help='keep the temporary workdirs')
  args = ap.parse_args()
  tmp = tempfile.mkdtemp(prefix='hardening_trials_')
  try:
    rows = trials(tmp)
  finally:
    if not args.keep:
      shutil.rmtree(tmp, ignore_errors=True)
  print('| trial | exit | s | what it prints |\n|---|---|---|---|')
  for name, code, secs, msg in rows:
    print(f'| {name} | {code} | {secs:.1f} | {msg.replace("|", "/")} |')


if __name__ == '__main__':
  main()
