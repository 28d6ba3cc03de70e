"""benchmarks/speed/accelerator.py --smoke runs end to end on a CPU and writes its JSON + Markdown table.

The fast cases use the MLP (every variant, the torch peer when torch is installed) and pfl-research's CIFAR10
protocol at smoke sizes; the slow one the real models of the table (paper CNN, ResNet18-GN) and the protocol.
"""
import json
import subprocess
import sys

import pytest
from benchmarks.speed import bench_util
from tests.fixtures.paths import REPO

HAS_TORCH = 'torch' in bench_util.available_peers()     # the peer's own venv (.venv-torch) or torch here


def _run(tmp_path, *extra):
  out = tmp_path / 'acc'
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.speed.accelerator', '--smoke', f'--out={out}', *extra],
                        capture_output=True, text=True, cwd=REPO, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads((tmp_path / 'acc.json').read_text())
  md = (tmp_path / 'acc.md').read_text()
  return res, md


def _check(res, md, models, clients):
  assert res['smoke'] and res['backend'] == 'cpu' and 'uptime' in res and res['cpu'] is not None
  assert [(g['model'], g['clients']) for g in res['groups']] == [(m, c) for m in models for c in clients]
  want = ['vmap', 'chunked', 'sequential', 'loop'] + (['torch'] if HAS_TORCH else [])
  for g in res['groups']:
    assert list(g['rows']) == want
    for v, r in g['rows'].items():
      assert 'error' not in r, (g['model'], v, r)
      assert r['examples_per_s'] > 0 and r['s_per_round'] > 0 and len(r['s_per_round_all']) == res['repeats']
      if v in ('vmap', 'chunked', 'sequential'):
        assert r['program_peak_bytes'] > 0 and r['temp_bytes'] >= 0
    # vmap keeps every client's activations live at once: its program needs more memory than sequential.
    assert g['rows']['vmap']['program_peak_bytes'] > g['rows']['sequential']['program_peak_bytes']
    if HAS_TORCH:
      assert g['rows']['torch']['device'] == 'cpu' and g['rows']['torch']['peak_mem_bytes'] > 0
  for m in models:
    assert f'| {m} | {clients[0]} | sequential |' in md
  assert 'SMOKE RUN' in md


def _check_pfl(res, md, g):
  assert (g['model'], g['protocol'], g['clients'], g['batch']) == ('pfl_cnn', 'pfl', 4, 4)
  assert list(g['rows']) == ['vmap', 'chunked', 'sequential', 'trainer'] + (['torch'] if HAS_TORCH else [])
  for v, r in g['rows'].items():
    assert 'error' not in r, (v, r)
    assert r['s_per_round'] > 0 and abs(r['rounds_per_s'] * r['s_per_round'] - 1) < 1e-9
    assert abs(r['examples_per_s'] - 4 * 20 / r['s_per_round']) < 1e-6 * r['examples_per_s']
    if v in ('vmap', 'chunked', 'sequential'):
      assert r['program_peak_bytes'] > 0
  assert 'strategy sequential' in g['rows']['trainer']['note']
  assert '| pfl_cnn | 4 | trainer |' in md and 'SMOKE RUN' in md
  if HAS_TORCH:
    assert 'x torch' in md


@pytest.mark.slow    # ~16 s: the benchmark's smoke run (as the device kit's smoke tests)
def test_accelerator_smoke_mlp(tmp_path):
  res, md = _run(tmp_path, '--models=mlp', '--clients=3', '--protocols=paper')
  _check(res, md, ['mlp'], [3])


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_accelerator_smoke_pfl_protocol(tmp_path):
  res, md = _run(tmp_path, '--protocols=pfl')
  assert len(res['groups']) == 1
  _check_pfl(res, md, res['groups'][0])


@pytest.mark.slow
def test_accelerator_smoke_table_models(tmp_path):
  res, md = _run(tmp_path)
  paper = {**res, 'groups': res['groups'][:-1]}
  _check(paper, md, ['cifar_cnn', 'resnet18_gn'], [2, 3])
  _check_pfl(res, md, res['groups'][-1])
