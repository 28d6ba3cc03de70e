"""benchmarks/speed/eval_rate.py at smoke sizes: every variant runs, the sharded evaluator's metrics equal the old
one's bit for bit at the same batch size, and the report names the chosen batch sizes."""
import json
import subprocess
import sys

import pytest

from tests.fixtures.paths import REPO


@pytest.mark.slow
def test_eval_rate_smoke(tmp_path):
  out = tmp_path / 'er'
  p = subprocess.run([sys.executable, '-m', 'benchmarks.speed.eval_rate', '--smoke', f'--out={out}'], cwd=REPO,
                     capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stderr[-3000:]
  md = (tmp_path / 'er.md').read_text()
  assert md.count("same_batch's metrics equal before's bit for bit: True") == 2
  res = json.loads((tmp_path / 'er.json').read_text())
  assert res['smoke'] and set(res['models']) == {'pfl_cnn', 'cifar_cnn'}
  for m in res['models'].values():
    assert {'train', 'before', 'same_batch', 'auto', 'many3'} <= set(m['rows'])
    assert m['rows']['train']['x_train'] == 1.0 and all(r['per_s'] > 0 for r in m['rows'].values())
