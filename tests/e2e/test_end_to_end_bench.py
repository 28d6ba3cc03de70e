"""benchmarks/speed/end_to_end.py: the peers' whole-run protocol (a stand-in problem: evaluations at the
protocol's rounds, every phase timed), the start-up / per-round fit against a known line, and the report."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.speed import end_to_end
from benchmarks.speed.peers import protocol
from tests.fixtures.paths import REPO


class _Problem:
  """Counts rounds; its 'accuracy' is the round count it was evaluated at."""

  def __init__(self, spec):
    self.rounds, self.evaluated = 0, []

  def round(self):
    self.rounds += 1

  def sync(self):
    pass

  def evaluate(self, x, y, batch_size):
    self.evaluated.append((self.rounds, len(y), batch_size))
    return float(self.rounds), 0.5


def test_whole_run_evaluates_at_the_protocol_rounds_and_times_each_phase(tmp_path, capsys):
  test = str(tmp_path / 'test.npz')
  protocol.write_problem(test, [(np.zeros((7, 2, 2, 1)), np.arange(7) % 3)])
  spec = dict(model='mlp', num_classes=3, data='unused', clients_per_round=1, batch_size=1, epochs=1, lr=0.1,
              weight_decay=0.0, optimizer='sgd', rho=0.0, seed=0, rounds=7, eval_every=3, test=test, eval_batch=4)
  path = tmp_path / 'spec.json'
  path.write_text(json.dumps(spec))
  made = []
  rec = protocol.whole_run(lambda s: made.append(_Problem(s)) or made[-1], str(path))
  assert [e['round'] for e in rec['evals']] == [3, 6, 7]          # every 3 rounds, and the last one
  assert [e['accuracy'] for e in rec['evals']] == [3.0, 6.0, 7.0]
  assert made[0].evaluated == [(3, 7, 4), (6, 7, 4), (7, 7, 4)]
  assert len(rec['round_s']) == 7 and rec['total_s'] >= rec['setup_s'] >= 0
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == rec     # the one line the driver reads
  assert protocol.whole_run_arg(['x', f'--whole_run={path}']) == str(path) and protocol.whole_run_arg(['x']) == ''


def test_fit_recovers_start_up_and_per_round_cost():
  a, b = end_to_end.fit([(10, 12.0 + 10 * 2.5), (30, 12.0 + 30 * 2.5)])
  assert a == pytest.approx(12.0) and b == pytest.approx(2.5)
  a, b = end_to_end.fit([(10, 40.0), (20, 60.0), (30, 80.0)])
  assert (a, b) == (pytest.approx(20.0), pytest.approx(2.0))


def test_markdown_reports_every_part():
  stack = lambda a, b: {'runs': [{'rounds': 10, 'wall_s': a + 10 * b, 'final_test_accuracy': 0.1}],
                        'startup_s': a, 'per_round_s': b, 'whole_run_min': (a + 1500 * b) / 60}
  res = {'command': 'x', 'machine': {'cpu': 'cpu', 'cpus': 2, 'jax': 'j'}, 'gemm_before': 1, 'gemm_after': 1,
         'uptime_before': 'u', 'uptime_after': 'u',
         'pfl': {'rounds_measured': [10, 30], 'rounds_extrapolated': 1500,
                 'stacks': {'ours': {**stack(10, 2), 'x_torch': 1.5}, 'torch': stack(5, 3)}},
         'table': {'rounds': 5, 'cells': 'fedavg', 'modes': {
             m: {'runs': 3, 'wall_s': w, 'sweep_s': w, 'report_s': 0.0, 'x_torch': 30 / w, 'x_parallel2': 20 / w,
                 'final_accuracy': {'a': 0.5}, 'uptime_before': 'load average: 1.0, 1', 'uptime_after':
                 'load average: 2.0, 1'} for m, w in (('batched', 10.0), ('parallel2', 20.0), ('torch', 30.0))}},
         'again': {'quickstart': {'first': {'round1_starts_s': 6.0, 'cpu_round1_starts_s': 6.0},
                                  'second': {'round1_starts_s': 2.0, 'cpu_round1_starts_s': 3.0},
                                  'starts_sooner_x': 3.0, 'cpu_before_round1_x': 2.0, 'floor_s': 1.2,
                                  'floor_x': 5.0, 'metrics_identical': True}}}
  md = end_to_end.markdown(res)
  assert '| ours | 30.0 @ 10 | 10.0 | 2.000 | 50.2 | 1.50 |' in md
  assert '| batched | 3 | 10.0 (10.0 + 0.0) | 3.00 | 2.00 | 0.5000 | 1.0 -> 2.0 |' in md
  assert '| quickstart | 6.00 / 2.00 | 3.00x | 6.00 / 3.00 (2.00x) | 1.20 | 5.00x | True |' in md
  assert '**extrapolated**' in md


@pytest.mark.slow
def test_smoke_runs_every_part(tmp_path):
  """The script end to end at tiny sizes (ours only; the peers where their venvs exist)."""
  stacks = ['ours'] + [s for s in ('torch',) if os.path.exists(os.path.join(REPO, '.venv-torch'))]
  out = tmp_path / 'e2e'
  p = subprocess.run([sys.executable, '-m', 'benchmarks.speed.end_to_end', '--smoke', f'--stacks={",".join(stacks)}',
                      '--again_configs=quickstart', f'--out={out}'], cwd=REPO, capture_output=True, text=True,
                     timeout=1500, env=dict(os.environ, PYTHONPATH=REPO))
  assert p.returncode == 0, p.stderr[-3000:]
  res = json.loads((tmp_path / 'e2e.json').read_text())
  assert set(res['pfl']['stacks']) == set(stacks) and res['table']['modes']['batched']['runs'] == 3
  assert res['again']['quickstart']['metrics_identical'] is True
  assert {'batched_warm', 'parallel2_warm'} <= set(res['table']['modes'])
  assert 0 < res['again']['quickstart']['floor_s'] < res['again']['quickstart']['first']['round1_starts_s']
