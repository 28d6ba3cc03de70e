"""benchmarks/speed/device/run.sh --smoke: the device kit's code path end to end on a CPU, without wheels.

Fast: two groups (paper100: the paper CNN through the trainer + the torch peer when torch is importable; runs: one
run alone vs R=2 in one program), the other groups listed as skipped with the reason; the hard budget (a group
process stopped at its deadline, a group left out when no time is left). Slow: every group.
"""
import json
import os
import subprocess
import sys
import time

import pytest
from tests.fixtures.paths import REPO

from benchmarks.speed import bench_util
from benchmarks.speed.device import kit

HAS_TORCH = 'torch' in bench_util.available_peers()     # the kit's own test: torch here or the peer's venv
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


@pytest.mark.slow   # ~30 s; the default suite runs run.sh end to end in the hard-budget and bad-groups tests
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
  # 16 s: the report's reserve leaves the group 6 s, and 100000 timed calls a row take longer (with a warm
  # compilation cache the rows themselves may finish in 6 s): the group is stopped at its deadline.
  doc, md, wall, _ = _run(tmp_path / 'a', '--groups=paper100', '--budget_s=16', '--repeats=100000')
  rows = _rows(doc)
  assert wall < 40
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


def test_device_kit_ratios_formula():
  """The target ratios from rows with known times: best float32 SGD strategy / torch; R runs vs one alone."""
  plans = {g: kit.plan(g, False) for g in kit.GROUPS}
  ok = lambda s, **kw: {'status': 'ok', 's_per_round': s, 'rounds_per_s': 1 / s, 'compile_s': 0.0, **kw}  # noqa: E731
  rows = [{'id': 'paper100/vmap/float32/sgd', **ok(0.2)}, {'id': 'paper100/sequential/float32/sgd', **ok(0.5)},
          {'id': 'paper100/vmap/bfloat16/sgd', **ok(0.1)}, {'id': 'paper100/torch/float32/sgd', **ok(2.0)},
          {'id': 'paper100/vmap/float32/sam', **ok(0.01)},                   # SAM: not the SGD target's row
          {'id': 'pfl/trainer/float32/sgd', **ok(0.4)},                      # pfl: no torch row -> not measured
          {'id': 'runs/one', **ok(0.1, compile_s=10.0)}, {'id': 'runs/R32', **ok(0.8, compile_s=30.0)},
          {'id': 'runs/R8', 'status': 'skipped', 'reason': 'x'}]
  r = {x['group']: x for x in kit.ratios(plans, rows)}
  assert r['paper100']['ours'] == 'paper100/vmap/float32/sgd' and r['paper100']['ratio'] == pytest.approx(10.0)
  assert r['paper100']['ours_any_dtype'] == 'paper100/vmap/bfloat16/sgd'
  assert r['paper100']['ratio_any_dtype'] == pytest.approx(20.0)
  assert r['pfl']['ratio'] is None and r['pfl']['ours'] == 'pfl/trainer/float32/sgd'
  # one alone: 1000 rounds x 0.1 s a run; R=32: 1000 x 0.8 / 32 = 25 s a run -> 4x; with compilation:
  # (10 + 100) / ((30 + 800) / 32) = 110 / 25.9375.
  assert r['runs']['R'] == 32 and r['runs']['ratio'] == pytest.approx(4.0)
  assert r['runs']['ratio_with_compile'] == pytest.approx(110 / 25.9375)
  assert r['runs']['ours_runs_per_hour'] == pytest.approx(3600 / 25.0)
