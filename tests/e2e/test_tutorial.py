"""docs/tutorial_custom_algorithm.py runs as written (a new algorithm, trained, swept with --batch_runs=2,
its Hessian spectrum), and works as the config file and the sweep file its docstring says it is."""
import json
import os
import re
import subprocess
import sys

from tests.fixtures.paths import REPO

TUTORIAL = 'docs/tutorial_custom_algorithm.py'


def test_the_tutorial_runs_end_to_end(tmp_path):
  out = tmp_path / 'tut'
  p = subprocess.run([sys.executable, TUTORIAL, '--rounds=2', '--lanczos_steps=8', '--probes=2', f'--out={out}'],
                     cwd=REPO, capture_output=True,
                     text=True, timeout=900)
  assert p.returncode == 0, p.stderr[-3000:]
  text = p.stdout + p.stderr
  accs = re.findall(r'clipped FedAvg, (sgd|sam) clients: test accuracy ([0-9.]+) after 2 rounds', text)
  assert [a[0] for a in accs] == ['sgd', 'sam'] and all(0.0 <= float(a[1]) <= 1.0 for a in accs)
  for arg in ('sgd', 'sam'):
    with open(out / arg / 'config.json') as f:
      cfg = json.load(f)
    assert cfg['algorithm'] == 'clipped_fedavg' and cfg['algo'] == {'clip': 0.5}
    assert cfg['client']['optimizer'] == arg
  # the features its upload='delta' declaration admits: DP (an epsilon) and top-k uploads (a compression error)
  dp = re.findall(r'clipped FedAvg \+ dp \(dp\): test accuracy ([0-9.]+) after 2 rounds; epsilon ([0-9.e+]+) at '
                  r'delta 0.001', text)
  topk = re.findall(r'clipped FedAvg \+ topk \(compress\): test accuracy ([0-9.]+) after 2 rounds; relative '
                    r'compression error ([0-9.]+)', text)
  assert len(dp) == 1 and float(dp[0][1]) > 0, text[-3000:]
  assert len(topk) == 1 and 0 < float(topk[0][1]) < 1, text[-3000:]
  # the sweep: two radii in ONE program, each run finished in its own workdir, and the report's two rows
  assert '[sweep] program 1/1: 2 runs (2 lanes)' in text
  with open(out / 'sweep' / 'sweep.json') as f:
    runs = json.load(f)['runs']
  assert len(runs) == 2 and all(r['status'] == 'done' for r in runs), runs
  assert '| client.rho=0.05 |' in text and '| client.rho=0.1 |' in text
  eig = re.findall(r'(sgd|sam) clients: top eigenvalues \[([-0-9., e]+)\], trace', text)
  assert [e[0] for e in eig] == ['sgd', 'sam']
  for _, values in eig:
    v = [float(x) for x in values.split(',')]
    assert len(v) == 2 and v[0] >= v[1] and v[0] > 0


def test_the_tutorial_is_a_config_file_for_train_py_and_refuses_a_bad_clip(tmp_path):
  p = subprocess.run([sys.executable, 'experiments/train.py', f'--config={TUTORIAL}:sam', '--config.algo.clip=-1',
                      f'--workdir={tmp_path}'], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  assert 'algo.clip' in p.stderr and 'Traceback' not in p.stderr
  assert not os.path.exists(tmp_path / 'checkpoints')
