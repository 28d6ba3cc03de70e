"""docs/tutorial_data_and_models.py runs as written: a registered dataset and NNX model, FedAvg with the mean and
the median aggregator, and an ff.sweep of two learning rates in one program."""
import re
import subprocess
import sys

from tests.fixtures.paths import REPO

TUTORIAL = 'docs/tutorial_data_and_models.py'


def test_the_second_tutorial_runs_end_to_end():
  p = subprocess.run([sys.executable, TUTORIAL, '--rounds=3'], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  accs = re.findall(r'FedAvg, (mean|median) aggregation: test accuracy ([0-9.]+) after 3 rounds', p.stdout)
  assert [a[0] for a in accs] == ['mean', 'median'] and all(0.0 <= float(a[1]) <= 1.0 for a in accs)
  swept = re.findall(r'sweep client.lr=([0-9.]+) seed=0: done in a program of (\d) lanes, test accuracy ([0-9.]+)',
                     p.stdout)
  assert [(s[0], s[1]) for s in swept] == [('0.05', '2'), ('0.2', '2')], p.stdout
