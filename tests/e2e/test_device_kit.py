"""benchmarks/speed/device/run.sh --smoke: the device kit's code path end to end on a CPU, without wheels.

Fast: two groups (paper100: the paper CNN through the trainer + the torch peer when torch is importable; runs: one
run alone vs R=2 in one program), the other groups listed as skipped with the reason; the hard budget (a group
process stopped at its deadline, a group left out when no time is left). Slow: every group.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
from tests.fixtures.paths import REPO

from benchmarks.speed.device import kit

HAS_TORCH = importlib.util.find_spec('torch') is not None
RUN_SH = os.path.join(REPO, 'benchmarks', 'speed', 'device', 'run.sh')


def _run(out, *extra, timeout=600):
  wheels = out.parent / 'no_wheels'
  wheels.mkdir(exist_ok=True)
  env = dict(os.environ, TMPDIR=str(out.parent), PYTHON=sys.executable, KIT_WHEELS=str(wheels))
  env.pop('OUT', None)
  t = time.time()
  proc = subprocess.run(['bash', RUN_SH, '--smoke', f'--out={out}', *extra], capture_output=True, text=True,
                        cwd=REPO, env=env, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  doc = json.loads((out / 'kit.json').read_text())
  md = (out / 'kit.md').read_text()
  return doc, md, time.time() - t, proc.stdout


def _rows(doc):
  return {r['id']: r for r in doc['rows']}


def _check_common(doc, md):
  rows = _rows(doc)
  assert doc['smoke'] and doc['device']['backend'] == 'cpu' and doc['device']['jax']
  for g in kit.GROUPS:                       # every group's every row: measured, or not with the reason
    for p in doc['plans'][g]:
      r = rows[p['id']]
      assert r['status'] in ('ok', 'skipped', 'unavailable'), r
      if r['status'] != 'ok':
        assert r['reason'], r
  for r in rows.values():
    if r['status'] == 'ok':
      assert r['s_per_round'] > 0 and r['first_call_s'] > 0 and abs(r['rounds_per_s'] * r['s_per_round'] - 1) < 1e-9
      assert r['examples_per_s'] > 0
      if r['id'].split('/')[1] != 'torch':
        assert r['compile_s'] >= 0 and r['peak_device_bytes'] is None   # the CPU backend has no device peak
        assert 'peak_bytes_in_use' in r['peak_device_note']
  assert 'SMOKE RUN' in md and '## Targets (issue 34)' in md and '## Rows' in md
  assert '| regime | command | ours (best) | torch peer | target | status | machine |' in md
  for p in sum(doc['plans'].values(), []):
    assert f"| {p['id']} |" in md
  return rows


def test_device_kit_smoke_two_groups(tmp_path):
  out = tmp_path / 'kit'
  doc, md, wall, stdout = _run(out, '--groups=paper100,runs', '--budget_s=170')
  rows = _check_common(doc, md)
  jsonl = [json.loads(l) for l in (out / 'rows.jsonl').read_text().splitlines()]
  assert {r['id'] for r in jsonl if r.get('kind') == 'row'} == set(rows)
  assert '# Device kit: cpu (cpu)' in stdout               # run.sh prints the table at the end
  for g in ('pfl', 'paper10', 'resnet'):
    for p in doc['plans'][g]:
      assert rows[p['id']]['status'] == 'skipped' and 'not in --groups' in rows[p['id']]['reason']
  # Under a heavy load a group may stop at its budget; what ran is consistent, and the first row ran.
  vm = rows['paper100/vmap/float32/sgd']
  assert vm['status'] == 'ok' and 'strategy vmap' in vm['note'], vm
  assert vm['examples_per_s'] == pytest.approx(3 * 8 / vm['s_per_round'])
  t = rows['paper100/torch/float32/sgd']
  assert t['status'] == ('ok' if HAS_TORCH else 'skipped'), t
  if not HAS_TORCH:
    assert t['reason'] == 'torch is not importable here'
  one, r2 = rows['runs/one'], rows['runs/R2']
  if one['status'] == 'ok' and r2['status'] == 'ok':
    ratio = next(r for r in doc['ratios'] if r['group'] == 'runs')
    assert ratio['R'] == 2 and ratio['ratio'] == pytest.approx(
        (one['s_per_round'] / 1) / (r2['s_per_round'] / 2))
    assert r2['run_rounds_per_s'] == pytest.approx(2 / r2['s_per_round']) and '2 lanes' in r2['note']
    assert '| runs axis' in md and 'R=2:' in md


def test_device_kit_hard_budget(tmp_path):
  # 16 s: the report's reserve leaves the group 6 s, less than its process needs to import and compile: stopped.
  doc, md, wall, _ = _run(tmp_path / 'a', '--groups=paper100', '--budget_s=16')
  rows = _rows(doc)
  assert wall < 30
  for p in doc['plans']['paper100']:
    r = rows[p['id']]
    assert r['status'] in ('skipped', 'ok'), r
  assert any(r['status'] == 'skipped' and 'group budget' in r['reason'] for r in rows.values()
             if r['group'] == 'paper100')
  # No time for a group: it is not started at all.
  doc, md, wall, _ = _run(tmp_path / 'b', '--groups=pfl', '--budget_s=3')
  assert doc['device'] is None and wall < 20
  assert all(r['status'] == 'skipped' and 'kit budget of 3 s spent' in r['reason'] for r in doc['rows']
             if r['group'] == 'pfl')
  assert 'not measured' in md


def test_device_kit_bad_groups(tmp_path):
  proc = subprocess.run(['bash', RUN_SH, '--smoke', f'--out={tmp_path}', '--groups=paper100,gpu'],
                        capture_output=True, text=True, cwd=REPO, timeout=60,
                        env=dict(os.environ, PYTHON=sys.executable, KIT_WHEELS=str(tmp_path)))
  assert proc.returncode == 2 and "--groups: unknown ['gpu']" in proc.stderr


@pytest.mark.slow
def test_device_kit_smoke_every_group(tmp_path):
  doc, md, wall, _ = _run(tmp_path / 'kit', '--budget_s=400')
  rows = _check_common(doc, md)
  for g in kit.GROUPS:
    p = doc['plans'][g][0]
    assert rows[p['id']]['status'] in ('ok', 'unavailable'), rows[p['id']]
  assert rows['pfl/trainer/float32/sgd']['examples_per_s'] == pytest.approx(
      4 * 20 / rows['pfl/trainer/float32/sgd']['s_per_round'])
