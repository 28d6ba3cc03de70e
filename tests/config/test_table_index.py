"""configs/README.md (fedjax_flat/config/table_index.py): every family cell is listed under the tables its
published source names; the source parser on hand-written sources."""
import os

from fedjax_flat.config import table_index
from tests.fixtures.paths import REPO

CONFIGS = os.path.join(REPO, 'configs')


def test_tables_of_a_published_source():
  assert table_index.tables_of('thesis Table 4.3 / Table 4.5 (FedSAM paper, CNN), C100 FedAvg') == \
      [('thesis', '4.3'), ('thesis', '4.5')]
  assert table_index.tables_of("thesis Table 4.15, C10 fedavg; Table 4.19: rounds / bits; Table 4.13: local") == \
      [('thesis', '4.15'), ('thesis', '4.19'), ('thesis', '4.13')]
  assert table_index.tables_of('MAN (WACV 2024) Tables 1-2, FedAvg') == [('MAN', '1'), ('MAN', '2')]
  assert table_index.tables_of('FedSoup (MICCAI 2023) Table 1, retina fedbabu') == [('FedSoup', '1')]
  assert table_index.tables_of('thesis Table 4.3 ..., on CIFAR-C (Fig. 4.13: a plot)') == \
      [('thesis', '4.3'), ('thesis', 'Fig. 4.13')]
  assert table_index.tables_of('FedWMSAM (NeurIPS 2025) Table 1, FedAvg, CIFAR-10') == [('FedWMSAM', '1')]
  assert table_index.tables_of('FedSWA (ICML 2025) Tables 2-3, FedSAM') == [('FedSWA', '2'), ('FedSWA', '3')]
  assert table_index.tables_of("FedSWA (ICML 2025) text (the note's text), FedAvg") == [('FedSWA', 'text')]
  assert table_index.tables_of('thesis text') == []
  assert table_index.tables_of('') == []


def test_readme_lists_every_cell_of_every_family():
  """Regenerate with `python -m fedjax_flat.config.table_index > configs/README.md` when this fails."""
  readme = open(os.path.join(CONFIGS, 'README.md')).read()
  lines = set(readme.splitlines())
  missing = [f'{fam}:{cell}' for fam, cells in table_index.family_cells(CONFIGS).items() for cell in cells
             if f'{fam}:{cell}' not in lines]
  assert not missing, f'{len(missing)} cells missing from configs/README.md, e.g. {missing[:3]}'
  for key in table_index.NO_CELL:
    assert table_index.NO_CELL[key] in readme


def test_docs_family_table_is_generated_from_the_families():
  """Regenerate with `python experiments/family_table.py` when this fails (a family or a cell was added)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location('family_table', os.path.join(REPO, 'experiments', 'family_table.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  assert mod.main(['--check']) == 0
  table = mod.table()
  for fam, cells in table_index.family_cells(CONFIGS).items():
    assert f'| `{fam}.py` |' in table and table.split(f'| `{fam}.py` |')[1].split('\n')[0].endswith(
        f'| {len(cells)} |'), fam


def test_algorithms_page_names_every_registered_algorithm():
  from fedjax_flat.algorithms import registry
  text = open(os.path.join(REPO, 'docs', 'algorithms.md')).read()
  missing = [n for n in registry.names() if f'`{n}`' not in text and f"'{n}'" not in text]
  assert not missing, f'docs/algorithms.md does not name {missing} (as `algorithm=` values)'
