"""The index of the seeds' tables: which config family cells reproduce each published table.

`python -m fedjax_flat.config.table_index > configs/README.md` regenerates configs/README.md from the families
themselves: every `configs/<family>.py` with `CELLS` is loaded, every cell built, and the tables named in its
`config.published.source` ("thesis Table 4.3", "... / Table 4.5", "; Table 4.19: ...", "MAN (WACV 2024) Tables
1-2", "FedSoup ... Table 1", "FedWMSAM ... Table 1", "FedSWA ... Tables 2-3", "Fig. 4.13"; a FedSWA number from
the text, not a table, is listed under "text") list the cell's `family:cell` string. Tables without a cell are listed
with why (NO_CELL), notes on rows that are other tables' cells (NOTES), and the FedSAM paper's tables (seeds
000 / 002) with the thesis table they reprint.
It ends with the field reference of every config field, generated from the sections' declarations
(config/schema.py). tests/config/test_table_index.py checks that configs/README.md lists every cell of every family;
tests/config/test_schema.py that its field reference is the schema's.
"""
from __future__ import annotations

import collections
import os
import re
import sys
from typing import Dict, List, Tuple

from fedjax_flat.config import data_fields
from fedjax_flat.config import families
from fedjax_flat.config import schema
from fedjax_flat.schema import Section

# What a table's cells do not say themselves: rows that are another table's cells, columns that are missing.
NOTES = {
    ('thesis', '4.5'): "federated columns: Table 4.3 / 4.7's C100 5-client cells; the centralized column is their "
                       'config.published.centralized_accuracy, run by experiments/centralized.py on the same cell '
                       '(SGD / MixUp / Cutout; SAM / ASAM with the cell\'s client optimizer; SWA over epochs: '
                       'add --config.swa.cycle=1)',
    ('thesis', '4.6'): "the \"no momentum\" column is Table 4.3's 20-client cells (configs/fedsam_cifar.py)",
    ('thesis', '4.11'): "also Table 4.3's cells: its +SWA cells are the \"Avg, c = 20 | 10\" rows, its plain cells "
                        'the "no Avg, c = 1" rows',
    ('thesis', '4.12'): "the start 7500 (C10) / 15000 (C100) row is Table 4.3's fedavg,swa 5-client cells",
    ('thesis', '4.13'): 'measured with experiments/hessian.py --per_client --per_client_global=train on the last '
                        'round: the local model on its own data and on the whole training set of all clients (the '
                        "thesis' global value; =test: on the test set, =both: side by side)",
    ('thesis', '4.20'): "its FedGloSS rows are Table 4.15's configs/fedgloss_cifar.py cells",
    ('thesis', '4.22'): 'C10 and FEMNIST FedDyn are N/A in the table; PAM / FEMNIST cells: the PAM model is not '
                        'stated for WiMA (the FedSAM PAM ResNet18-GN used), "20% participation" read as 100 of 500 '
                        'clients, FEMNIST W not stated (100 used); configs/wima.py says each choice',
    ('thesis', 'Fig. 4.13'): 'CIFAR-C at severity 5 (config.corruption_eval): a plot in the thesis, no number',
    ('thesis', '4.21'): "Table 4.15's cells: its FedSAM / FedDyn / FedAvg rows are configs/baselines_cifar_cnn.py "
                        "table=4.15 cells at alpha=0 (FedDyn+SAM: client=sam), its FedGloSS rows "
                        "configs/fedgloss_cifar.py:cifar10|cifar100,fedgloss,sam|sgd,alpha=0",
    ('thesis', '5.6'): 'source_only: experiments/pretrain_source.py (its summary.json final_test_miou); '
                       'central_oracle / central_ftda: experiments/centralized.py (central_ftda from the source_only '
                       'model: --config.init.pretrained=WORKDIR/source_model.npz); LADD, FedAvg + ST and ftda: '
                       'experiments/train.py from the source_fda model (configs/ladd.py docstring)',
    ('thesis', '5.7'): 'source_only: experiments/pretrain_source.py; the others experiments/train.py from the '
                       'source_fda model (configs/ladd.py docstring)',
    ('thesis', '5.8'): 'source_only: experiments/pretrain_source.py; central_oracle: experiments/centralized.py; the '
                       'others experiments/train.py from the source_fda model (configs/ladd.py docstring)',
    ('MAN', '1'): 'CIFAR-10 (supplementary Sec. 5.2) is not in the seeds: configs/man_cifar100.py:cifar10,... '
                  'builds the setting without a number',
}
# Tables that are not a training setting (or not reproducible), with why.
NO_CELL = {
    ('thesis', '2.1'): 'BN / GN formulas (models/resnet.py, models/base.py implement both)',
    ('thesis', '3.1'): 'cross-silo vs cross-device vs distributed learning: descriptive',
    ('thesis', '3.2'): 'dataset statistics: the readers in fedjax_flat/data/sources/ (data/partition.py for CIFAR)',
    ('thesis', '4.14'): 'overview of the SAM-based FL methods (communication / compute multipliers): descriptive; '
                        'summary.json comm_total_bytes measures the communication',
    ('thesis', '5.2'): "communication exchanges per round (S2C / C2S / C2C): summary.json's fedseq section counts "
                       'them (training/chain_loop.py)',
    ('thesis', '6.1'): 'summary of the FedDrive settings: configs/feddrive.py docstring',
    ('thesis', '6.4'): 'FFREEDA federated splits (classes, clients, images): data/sources (cityscapes, crosscity, '
                       'mapillary readers)',
    ('thesis', '6.5'): 'FedVPR splits with FedAvg R@1: configs/fedvpr.py (MSLS, a manual download); '
                       'configs/quickstart_vpr.py runs the proximity / random splits on the synthetic stand-in',
    ('thesis', '6.6'): 'FedVPR server optimizers, matched FedAvg budgets and H-FL (city / continent): '
                       'configs/fedvpr.py',
    ('thesis', '6.7'): "FedVPR clients' quantity heterogeneity (fixed local iterations, FedVC): configs/fedvpr.py",
    ('thesis', 'A.1'): 'training hyperparameters: fedjax_flat/config/paper_hparams.TRAINING, used by the families',
    ('thesis', 'A.2'): 'SAM / ASAM radii: paper_hparams.RHO',
    ('thesis', 'A.3'): 'SWA hyperparameters: paper_hparams.SWA',
    ('thesis', 'A.4'): 'FedGloSS general setup: configs/fedgloss_cifar.py, configs/fedgloss_sota.py',
    ('thesis', 'A.5'): 'FedGloSS search grids (chosen values): the FedGloSS families and '
                       'configs/baselines_cifar_cnn.py',
    ('thesis', 'A.6'): 'FedSeq training hyperparameters: configs/fedseq.py',
    ('thesis', 'A.7'): 'LADD training hyperparameters: configs/ladd.py',
    ('MAN', '3'): 'forward-pass cost with and without the regularizer: a formula, not a run',
}
# The FedSAM paper (seed 000, main text; seed 002, supplementary) reprints thesis tables.
FEDSAM_PAPER = [
    ('main Table 1', '4.1'), ('main Table 2', '4.3'), ('main Table 3', '4.4'), ('main Table 4', '4.7'),
    ('main Table 5', '4.5'), ('main Table 6', '4.8'), ('main Table 7', '4.9'), ('main Table 8', '4.10'),
    ('suppl. Table 1', '3.2'), ('suppl. Table 2', 'A.1'), ('suppl. Table 3', 'A.2'), ('suppl. Table 4', 'A.3'),
    ('suppl. Table 5', '4.2'), ('suppl. Table 6', '4.11'), ('suppl. Table 7', '4.12'), ('suppl. Table 8', '4.5'),
    ('suppl. Table 9', '4.7'),
]
_TABLE = re.compile(r'(Tables?|Fig\.) (\d+(?:\.\d+)?)(?:-(\d+))?')


# The papers other than the thesis that a published source may start with (configs/flat2024.py: FedWMSAM, FedSWA).
PAPERS = ('FedSoup', 'MAN', 'FedWMSAM', 'FedSWA')


def _paper(source: str) -> str:
  for paper in PAPERS:
    if source.startswith(paper):
      return paper
  return 'thesis'        # the thesis and its chapters' papers (FedDrive = thesis chapter 6)


def tables_of(source: str) -> List[Tuple[str, str]]:
  """('thesis' | 'MAN' | 'FedSoup', '4.3' | 'Fig. 4.13') for every table or figure a published source names."""
  out = []
  for kind, first, last in _TABLE.findall(source):
    nums = [first] if not last else [str(i) for i in range(int(first), int(last) + 1)]
    out += [(_paper(source), n if kind != 'Fig.' else f'Fig. {n}') for n in nums]
  if not out and _paper(source) != 'thesis' and ' text ' in f' {source} ':
    out = [(_paper(source), 'text')]       # a number the paper states in its text
  return list(dict.fromkeys(out))


def _family_modules(configs_dir: str):
  for fn in sorted(os.listdir(configs_dir)):
    if fn.endswith('.py'):
      mod = families.load_module(os.path.join(configs_dir, fn))
      if hasattr(mod, 'CELLS'):
        yield fn[:-3], mod


def family_cells(configs_dir: str) -> Dict[str, List[str]]:
  """{family: CELLS} of every configs/<family>.py that declares CELLS."""
  return {fam: list(mod.CELLS) for fam, mod in _family_modules(configs_dir)}


def _first_sentence(doc: str) -> str:
  text = ' '.join((doc or '').strip().split('\n\n')[0].split())
  m = re.search(r'\.(\s+(?=[A-Z])|$)', text)      # 'Fig. 4.13', 'ch. 5.2' do not end it
  return (text[:m.start()] if m else text).replace('|', '/')


def family_table(configs_dir: str) -> List[str]:
  """docs/configs.md's table of the families: file, the first sentence of its docstring, its number of cells."""
  lines = ['| family | what it reproduces | cells |', '|---|---|---|']
  return lines + [f'| `{fam}.py` | {_first_sentence(mod.__doc__)} | {len(mod.CELLS)} |'
                  for fam, mod in _family_modules(configs_dir)]


def index(configs_dir: str):
  """({(paper, table): [family:cell]}, [family:cell of cells with no published table (stand-ins)])."""
  tables, unpublished = collections.defaultdict(list), []
  for fam, cells in family_cells(configs_dir).items():
    mod = families.load_module(os.path.join(configs_dir, f'{fam}.py'))
    for cell in cells:
      source = str(mod.get_config(cell).published.get('source', ''))
      found = tables_of(source)
      for key in found:
        tables[key].append(f'{fam}:{cell}')
      if not found:
        unpublished.append(f'{fam}:{cell}')
  return tables, unpublished


def _order(key):
  paper, t = key
  num = t.replace('Fig. ', '')
  head, _, tail = num.partition('.')
  rank = {'thesis': 0, 'FedSoup': 1, 'MAN': 2, 'FedWMSAM': 3, 'FedSWA': 4}[paper]
  return (rank, t.startswith('Fig.'), not head.isdigit(),
          int(head) if head.isdigit() else 0, head, int(tail) if tail.isdigit() else 0)


def _title(t: str) -> str:
  return t if t.startswith('Fig.') or t == 'text' else f'Table {t}'


def markdown(configs_dir: str) -> str:
  tables, unpublished = index(configs_dir)
  keys = sorted(set(tables) | set(NO_CELL) | set(NOTES), key=_order)
  name = {'thesis': 'Thesis (seed 004)', 'FedSoup': 'FedSoup (seed 001)', 'MAN': 'MAN (seed 003)',
          'FedWMSAM': 'FedWMSAM (NeurIPS 2025)', 'FedSWA': 'FedSWA (ICML 2025, via a paper note)'}
  lines = ['# Every published table of the seeds and its config cells', '',
           'Generated by `python -m fedjax_flat.config.table_index > configs/README.md` from the families\' '
           '`CELLS` and each cell\'s `config.published.source` (do not edit by hand; regenerate after adding cells).',
           '', 'Run one cell: `python experiments/train.py --config=configs/<family>.py:<cell> --workdir=...`; a '
           'whole table x 3 seeds: `python experiments/sweep.py --sweep=configs/sweeps/paper_table.py:<family>'
           '[,only=<token>]`, then `python experiments/report.py --sweep_dir=...` (measured vs `config.published`).',
           '', '## Index', '', '| seed | table | cells | families | notes |', '|---|---|---|---|---|']
  for k in keys:
    cells = tables.get(k, [])
    fams = sorted({c.split(':')[0] for c in cells})
    why = (NO_CELL.get(k) or NOTES.get(k) or '').replace('|', '\\|')   # a table cell
    lines.append(f'| {name[k[0]]} | {_title(k[1])} | {len(cells)} | '
                 f'{", ".join(f"`{f}`" for f in fams)} | {why} |')
  lines += ['', 'The FedSAM paper (seed 000, with its supplementary as seed 002) reprints thesis tables: '
            + '; '.join(f'{p} = thesis Table {t}' for p, t in FEDSAM_PAPER) + '.', '']
  for k in keys:
    if k not in tables:
      continue
    title = _title(k[1])
    lines += [f'## {name[k[0]]}, {title} ({len(tables[k])} cells)', '', '```']
    lines += tables[k]
    lines += ['```', '']
  lines += ['## Stand-ins (digits-scale, no published number)', '', '```'] + unpublished + ['```', '']
  lines += ['## Field reference', '', 'Every config field (`--config.<field>=...`) as its section declares it '
            '(fedjax_flat/config/schema.py collects the sections; tags: fedjax_flat/schema.py). `config.data` '
            "is the dataset's (config/data_fields.py, data/registry.py).", '']
  lines += schema.field_reference()
  lines += ['', '### config.data', '', 'The common rule of each dataset builder argument (a dataset whose field means '
            "something else declares its own: data/registry.py `rules=`; the segmentation datasets declare their "
            'whole section: `fields=`).', '']
  lines += schema.field_reference([Section('data', data_fields.FIELDS)])
  lines += ['', '### config.algo', '', "Each algorithm's hyperparameters (its module's `hparams=` rules).", '']
  lines += schema.algo_reference() + ['']
  return '\n'.join(lines)


if __name__ == '__main__':
  sys.stdout.write(markdown(sys.argv[1] if len(sys.argv) > 1 else 'configs'))
