"""configs/flat2024.py: the FedWMSAM paper's and the FedSWA paper's published numbers in their cells, each equal to
the table transcribed here once from its source; the paper's rho and the release switch; one-line errors; every
cell builds and validates without data; the paper_table sweep expands the family and the report puts each
published number beside two fake finished runs."""
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from tests.fixtures.paths import REPO

FAMILY = os.path.join(REPO, 'configs', 'flat2024.py')

# FedWMSAM (Huang et al., NeurIPS 2025, arXiv 2511.22080) Table 1, "after 500 Rounds", as printed (fractions);
# columns Dirichlet beta 0.6, 0.1, pathological gamma 6, 3 (CIFAR-10) / 20, 10 (CIFAR-100). Fashion-MNIST omitted.
TABLE1 = {
    'fedavg': ((0.7886, 0.7005, 0.7873, 0.6426), (0.3917, 0.3815, 0.3968, 0.3631)),
    'fedcm': ((0.8126, 0.7229, 0.8167, 0.7025), (0.4635, 0.4290, 0.4394, 0.3940)),
    'scaffold': ((0.8232, 0.7428, 0.8179, 0.6786), (0.4855, 0.4437, 0.4647, 0.4133)),
    'fedsam': ((0.7963, 0.6963, 0.7908, 0.6503), (0.4083, 0.3790, 0.3933, 0.3553)),
    'mofedsam': ((0.8339, 0.7386, 0.8334, 0.7327), (0.4859, 0.4472, 0.4619, 0.4279)),
    'fedgamma': ((0.8292, 0.7218, 0.8043, 0.6105), (0.4837, 0.4474, 0.1739, 0.0198)),
    'fedsmoo': ((0.8410, 0.7507, 0.8382, 0.7099), (0.3225, 0.2987, 0.4620, 0.3006)),
    'fedlesam': ((0.8165, 0.7284, 0.8127, 0.6381), (0.4260, 0.4114, 0.4298, 0.3914)),   # FedLESAM(-S/-D)
    'fedwmsam': ((0.8356, 0.7664, 0.8443, 0.7446), (0.4908, 0.4646, 0.4786, 0.4383)),
}
SPLITS = {'cifar10': ('alpha=0.6', 'alpha=0.1', 'gamma=6', 'gamma=3'),
          'cifar100': ('alpha=0.6', 'alpha=0.1', 'gamma=20', 'gamma=10')}
# FedSWA (Liu et al., ICML 2025) as the third-party paper note transcribes it (%). Table 2, Dirichlet 0.6, ResNet-18:
TABLE2 = {'fedavg': (86.0, 54.2), 'fedsam': (83.6, 51.9), 'scaffold': (85.9, 54.1), 'mofedsam': (87.0, 60.1),
          'fedswa': (89.5, 59.8), 'fedmoswa': (91.2, 67.9)}
# Table 3, CIFAR-100 ResNet-18, Dirichlet 0.1 / 0.3 / 0.6:
TABLE3 = {'fedsam': (40.1, 49.0, 51.9), 'mofedsam': (51.5, 57.5, 60.1), 'fedswa': (50.3, 55.5, 59.8),
          'fedmoswa': (61.9, 66.2, 67.9)}
FEDAVG_C100_01 = 45.8      # the note's text: "CIFAR-100: FedSAM 40.1% vs. FedAvg 45.8%" at Dirichlet 0.1


def _mod():
  return config_strings.load_module(FAMILY)


def cfg(arg):
  return _mod().get_config(arg)


def test_wmsam_cells_carry_table_1():
  cells = set(_mod().CELLS)
  for algo, rows in TABLE1.items():
    for ds, row in zip(('cifar10', 'cifar100'), rows):
      for split, frac in zip(SPLITS[ds], row):
        cell = f'wmsam,{ds},{algo},{split}'
        assert cell in cells
        pub = cfg(cell).published
        assert pub.accuracy == pytest.approx(100 * frac, abs=1e-9), cell
        assert pub.source.startswith('FedWMSAM (NeurIPS 2025) Table 1, ')
  src = cfg('wmsam,cifar10,fedlesam').published.source
  assert 'the best of FedLESAM, FedLESAM-S and FedLESAM-D' in src
  assert 'pathological gamma=10' in cfg('wmsam,cifar100,fedavg,gamma=10').published.source
  # Table 6, FedWMSAM at rho 0.1 (CIFAR-10, beta 0.1): the release variant's cell.
  pub = cfg('wmsam,cifar10,fedwmsam,alpha=0.1,variant=release').published
  assert pub.accuracy == 72.44 and 'Table 6' in pub.source
  assert cfg('wmsam,cifar10,fedsam,variant=release').published.to_dict() == {}


def test_swa_cells_carry_the_notes_tables_flagged_secondary():
  cells = set(_mod().CELLS)
  want = {}
  for algo, (c10, c100) in TABLE2.items():
    want[('cifar10', 0.6, algo)], want[('cifar100', 0.6, algo)] = c10, c100
  for algo, vals in TABLE3.items():
    for alpha, v in zip((0.1, 0.3, 0.6), vals):
      assert want.get(('cifar100', alpha, algo), v) == v      # Table 3's 0.6 column is Table 2's C100 column
      want[('cifar100', alpha, algo)] = v
  want[('cifar100', 0.1, 'fedavg')] = FEDAVG_C100_01
  for (ds, alpha, algo), acc in want.items():
    cell = f'swa,{ds},{algo},alpha={alpha:g}'
    assert cell in cells
    pub = cfg(cell).published
    assert pub.accuracy == acc, cell
    assert pub.source.startswith('FedSWA (ICML 2025)')
    assert "as transcribed by a third-party paper note; not checked against the paper's PDF" in pub.source
  assert 'not one of its tables' in cfg('swa,cifar100,fedavg,alpha=0.1').published.source
  assert 'Tables 2-3' in cfg('swa,cifar100,fedswa,alpha=0.6').published.source
  # Rows neither source has: nothing published.
  for cell in ('swa,cifar100,scaffold,alpha=0.3', 'swa,cifar100,fednsam', 'lesam,cifar10,fedlesam',
               'gf,cifar10,fedgf,alpha=0,clients=5'):
    assert cfg(cell).published.to_dict() == {}, cell


def test_wmsam_setting_models_splits_and_methods():
  c10, c100 = cfg('wmsam,cifar10,fedavg'), cfg('wmsam,cifar100,fedavg,alpha=0.6')
  assert (c10.model, c10.model_kwargs.stem, c10.dataset, c10.data.alpha) == ('resnet18_gn', 'imagenet', 'cifar10', 0.1)
  assert (c100.model, c100.model_kwargs.stem, c100.data.alpha) == ('resnet34_gn', 'imagenet', 0.6)
  for c in (c10, c100):
    assert (c.rounds, c.clients_per_round, c.data.num_clients, c.client.batch_size, c.client.lr,
            c.client.local_epochs) == (500, 10, 100, 50, 0.1, 5)
  p = cfg('wmsam,cifar100,scaffold,gamma=20')
  assert (p.dataset, p.data.path, p.data.label, p.data.partitioner, p.data.num_classes_per_partition,
          p.data.num_clients) == ('hf', 'uoft-cs/cifar100', 'fine_label', 'pathological', 20, 100)
  assert (p.model, p.normalize, p.augment) == ('resnet34_gn', 'cifar100', 'cifar')
  # MoFedSAM is FedCM around the SAM client; FedGAMMA and FedSMOO take the SAM client too.
  assert [(cfg(f'wmsam,cifar10,{a}').algorithm, cfg(f'wmsam,cifar10,{a}').client.optimizer)
          for a in ('mofedsam', 'fedcm', 'fedgamma', 'fedsmoo', 'fedsam', 'fedwmsam')] == \
      [('fedcm', 'sam'), ('fedcm', 'sgd'), ('fedgamma', 'sam'), ('fedsmoo', 'sam'), ('fedavg', 'sam'),
       ('fedwmsam', 'sgd')]
  s = cfg('swa,cifar10,mofedsam')
  assert (s.data.alpha, s.algorithm, s.client.optimizer, s.client.rho) == (0.6, 'fedcm', 'sam', 0.01)


def test_rho_is_the_papers_by_default_and_the_releases_under_variant_release():
  # MoFedSAM: Table 6's 0.01, the radius of the number its cell carries (section 5.1 says 0.1).
  paper = {'fedsam': 0.01, 'fedgamma': 0.01, 'fedlesam': 0.01, 'fedwmsam': 0.01, 'fedsmoo': 0.1, 'mofedsam': 0.01}
  for algo, rho in paper.items():
    assert cfg(f'wmsam,cifar10,{algo}').client.rho == rho, algo
    assert cfg(f'wmsam,cifar10,{algo},variant=paper').client.rho == rho, algo
    assert cfg(f'wmsam,cifar100,{algo},variant=release').client.rho == 0.1, algo
  # The switch changes the radius and nothing else.
  a, b = cfg('wmsam,cifar10,fedwmsam').to_dict(), cfg('wmsam,cifar10,fedwmsam,variant=release').to_dict()
  for d in (a, b):
    d.pop('published')
  assert a['client'].pop('rho') == 0.01 and b['client'].pop('rho') == 0.1 and a == b


@pytest.mark.parametrize('arg,needle', [
    ('wmsam,cifar10,fedavg,alpha=0.3', 'allowed alpha: 0.6 | 0.1'),
    ('wmsam,cifar10,fedavg,gamma=20', 'allowed gamma: 6 | 3'),
    ('wmsam,cifar10,fedavg,alpha=0.1,gamma=3', 'give one split'),
    ('swa,cifar10,fedavg,alpha=0.1', 'allowed alpha: 0.6'),
    ('swa,cifar100,fedwmsam', 'allowed algo'),
    ('wmsam,cifar10,fedswa', 'allowed algo'),
    ('lesam,cifar10,fedavg,alpha=0.6', 'does not take alpha='),
    ('swa,cifar100,fedavg,variant=release', 'does not take variant='),
    ('wmsam,imagenet,fedavg', 'unknown token'),
    ('wmsam,cifar10,fedavg,variant=torch', 'variant must be one of paper | release'),
])
def test_bad_string_is_one_line(arg, needle):
  with pytest.raises(config_strings.ConfigStringError) as e:
    cfg(arg)
  msg = str(e.value)
  assert needle in msg and '\n' not in msg, msg


def test_every_cell_builds_and_validates_without_data():
  mod = _mod()
  assert len(mod.CELLS) == len(set(mod.CELLS))
  published = 0
  for cell in mod.CELLS:
    c = mod.get_config(cell)
    validate_config(c)
    published += 'accuracy' in c.published
  # Table 1's 72 cells, Table 6's one; FedSWA: Table 2's 12, Table 3's 8 more (its 0.6 column is Table 2's), 1 text
  assert published == 72 + 1 + 12 + 8 + 1


def test_paper_table_sweep_expands_the_published_cells():
  from fedjax_flat.sweeps import grid as grid_lib
  path = os.path.join(REPO, 'configs', 'sweeps', 'paper_table.py')
  grid = grid_lib.load_sweep_file(path + ':flat2024')['grid']
  assert [g['name'] for g in grid] == _mod().CELLS
  wm = grid_lib.load_sweep_file(path + ':flat2024,only=wmsam+cifar100+gamma=10')['grid']
  assert [g['name'] for g in wm] == [f'wmsam,cifar100,{a},gamma=10' for a in TABLE1]


def _write(path, obj=None, lines=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(x) + '\n' for x in lines) if lines is not None else json.dumps(obj))


def test_report_puts_the_published_numbers_beside_two_finished_runs(tmp_path):
  from fedjax_flat.sweeps import report as report_lib
  d = str(tmp_path / 'sweep')
  runs = []
  for cell, acc in (('wmsam,cifar10,fedwmsam,alpha=0.1', 0.75), ('swa,cifar100,fedmoswa,alpha=0.3', 0.60)):
    wd = f'{cell}/seed=0'
    _write(os.path.join(d, wd, 'config.json'), cfg(cell).to_dict())
    _write(os.path.join(d, wd, 'metrics.jsonl'), lines=[{'round': 500, 'test_accuracy': acc}])
    _write(os.path.join(d, wd, 'summary.json'), {
        'rounds_completed': 500, 'rounds_planned': 500, 'reported_model': 'global', 'summary_last_k': 10,
        'mean_last_10_test_accuracy': acc, 'final_test_accuracy': acc, 'comm_total_bytes': 1e6})
    runs.append(dict(cell=cell, seed=0, workdir=wd))
  _write(os.path.join(d, 'sweep.json'), {'name': 'flat2024', 'description': 'two cells', 'runs': runs})
  rows = {r['cell']: r for r in report_lib.aggregate(report_lib.collect([d]), ['cell'])}
  assert rows['wmsam,cifar10,fedwmsam,alpha=0.1']['published_acc'] == 76.64
  assert rows['wmsam,cifar10,fedwmsam,alpha=0.1']['diff_published'] == pytest.approx(75.0 - 76.64)
  assert rows['swa,cifar100,fedmoswa,alpha=0.3']['published_acc'] == 66.2
  out = tmp_path / 'rep'
  p = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'report.py'), f'--sweep_dir={d}',
                      f'--out_dir={out}', '--noplots'], capture_output=True, text=True, timeout=120, cwd=REPO)
  assert p.returncode == 0, p.stdout + p.stderr
  md = (out / 'report.md').read_text()
  assert '| wmsam,cifar10,fedwmsam,alpha=0.1 | global | 75.00 ± 0.00 |' in md and '| 76.64 | -1.64 |' in md
  assert '| swa,cifar100,fedmoswa,alpha=0.3 | global | 60.00 ± 0.00 |' in md and '| 66.20 | -6.20 |' in md


def test_paper_table_data_dir_skips_the_hub_cells():
  from fedjax_flat.sweeps import grid as grid_lib
  path = os.path.join(REPO, 'configs', 'sweeps', 'paper_table.py')
  sweep = grid_lib.load_sweep_file(path + ':flat2024,only=wmsam+cifar10+fedavg,data_dir=D')
  assert 'fixed' not in sweep
  assert {g['name']: g.get('data.data_dir') for g in sweep['grid']} == {
      'wmsam,cifar10,fedavg,alpha=0.6': 'D', 'wmsam,cifar10,fedavg,alpha=0.1': 'D',
      'wmsam,cifar10,fedavg,gamma=6': None, 'wmsam,cifar10,fedavg,gamma=3': None}
  runs = grid_lib.expand(sweep, 'S')
  assert len(runs) == 12
  # A family whose every cell reads data_dir keeps the one fixed override.
  assert grid_lib.load_sweep_file(path + ':flat2024,only=swa,data_dir=D')['fixed'] == {'data.data_dir': 'D'}
