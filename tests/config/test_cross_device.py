"""configs/cross_device.py: every cell validates with the cross-device choices (floyd sampler, the auto store) and
a client takes part about once or twice; two rounds of the digits cell train for a stateful and a stateless
method."""
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from tests.fixtures.paths import REPO

PATH = os.path.join(REPO, 'configs', 'cross_device.py')


def test_every_cell_validates_and_a_client_takes_part_once_or_twice():
  mod = config_strings.load_module(PATH)
  assert len(mod.CELLS) == len(mod.POPULATIONS) * len(mod.ALGOS)
  for cell in mod.CELLS:
    c = mod.get_config(cell)
    validate_config(c)
    k = mod.POPULATIONS[cell.split(',')[0]]
    assert c.data.num_clients == k and c.sampler == 'floyd' and c.client_state_store == 'auto', cell
    assert 1.0 <= c.rounds * c.clients_per_round / k <= 2.0, cell
  assert mod.get_config('1e6,fedlesam').algo.direction == 'server'     # the stateless estimate
  with pytest.raises(config_strings.ConfigStringError, match='1e7'):
    mod.get_config('1e7,fedavg')


@pytest.mark.slow
@pytest.mark.parametrize('algo', ['scaffold', 'fedlesam'])
def test_digits_cell_trains_two_rounds(tmp_path, algo):
  wd = str(tmp_path / algo)
  p = subprocess.run([sys.executable, 'experiments/train.py', f'--config={PATH}:digits,{algo}', f'--workdir={wd}',
                      '--config.rounds=2', '--config.eval_every=1'], cwd=REPO, capture_output=True, text=True,
                     env={**os.environ, 'PYTHONPATH': REPO}, timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  with open(os.path.join(wd, 'summary.json')) as f:
    s = json.load(f)
  assert s['rounds_completed'] == 2 and s['sampling_procedure'].startswith('sampling/jax-threefry-floyd')
  assert 0.0 <= s['final_test_accuracy'] <= 1.0
  # 10 clients a round, 2 rounds: SCAFFOLD sends (w, c) down, the stateless FedLESAM w only.
  per_round = 10 * s['num_params'] * (2 if algo == 'scaffold' else 1)
  assert s['comm_total_params']['down_params'] == 2 * per_round
