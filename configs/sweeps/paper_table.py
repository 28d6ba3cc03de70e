r"""Every cell of one config family (a paper table) x 3 seeds, as one sweep; the report compares each cell with
its config.published number.

  python experiments/sweep.py --sweep=configs/sweeps/paper_table.py:fedsam_cifar --sweep_dir=runs/t43
  python experiments/sweep.py --sweep=configs/sweeps/paper_table.py:fedsam_cifar,only=cifar100 ...
  python experiments/report.py --sweep_dir=runs/t43 ...

Argument: the family (a configs/<family>.py with CELLS: fedsam_cifar, fedsam_pam, fedsam_landmarks,
fedgloss_cifar, fedgloss_sota, wima, man_cifar100, baselines_cifar_cnn, baselines_digits, fedsoup_digits, fedseq,
fedseq_digits, ...), then
optionally only=<token> to keep the cells with that token or key value (e.g. only=cifar100, only=swa, only=4.15;
only=a+b: the cells with every one of the tokens, e.g. only=cifar10+fedavg+clients=5).
Cells a family runs with another binary (its ENTRY_POINTS, e.g. configs/ladd.py's centralized cells) are left out
and named in the sweep's description with their binary. A family with a pipeline (`pipeline(cells)` -> stages, e.g.
configs/ladd.py: the source pre-training of each target, then the federated cells from its source_model.npz) is one
sweep of stages run in order (fedjax_flat/sweeps/sweep.py):

  python experiments/sweep.py --sweep=configs/sweeps/paper_table.py:ladd,only=crosscity,data_dir=D --sweep_dir=runs/t57
  python experiments/report.py --sweep_dir=runs/t57 --out_dir=runs/t57/report

Options after the family: only=<token>, data_dir=<D> (data.data_dir of every run whose dataset reads one; a source
stage's source_pretrain.data.data_dir too).
"""
import importlib.util
import os

from fedjax_flat.data import registry as data_registry

_CONFIGS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reads_data_dir(config) -> bool:
  fields = data_registry.declared_fields(config.dataset)
  takes = list(fields) if fields is not None else data_registry.builder_args(config.dataset)
  return takes is None or 'data_dir' in takes


def get_sweep(arg: str = ''):
  family, *rest = [t for t in (arg or '').split(',') if t]
  opts = dict(t.partition('=')[::2] for t in rest)
  only = opts.pop('only', '')
  data_dir = opts.pop('data_dir', '')
  path = os.path.join(_CONFIGS, f'{family}.py') if family else ''
  if opts or not os.path.isfile(path):
    families = sorted(f[:-3] for f in os.listdir(_CONFIGS) if f.endswith('.py'))
    raise ValueError(f'paper_table.py:{arg!r}: give a config family and optionally only=<token>, data_dir=<D>; '
                     f'families: '
                     f'{", ".join(families)}')
  spec = importlib.util.spec_from_file_location('family_' + family, path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  if not hasattr(mod, 'CELLS'):
    raise ValueError(f'configs/{family}.py declares no CELLS (not a config family)')
  # A whole token or a key=value token's value: only=cifar10 must not keep the cifar100 cells.
  # only=a+b: the cells holding every one of the tokens (e.g. only=cifar10+fedavg+clients=5).
  cells = [c for c in mod.CELLS if not only or all(any(o in (t, t.partition('=')[2]) for t in c.split(','))
                                                  for o in only.split('+'))]
  if not cells:
    raise ValueError(f'no cell of configs/{family}.py contains {only!r}')
  # Cells that another binary runs (a family's ENTRY_POINTS: cell -> binary) are not train.py runs: named, not swept,
  # unless the family's pipeline(cells) runs them as a stage.
  others = getattr(mod, 'ENTRY_POINTS', {})
  stages = mod.pipeline(cells) if hasattr(mod, 'pipeline') else None
  staged = {g['config'].split(':', 1)[1] for st in stages or () for g in st['grid']}
  elsewhere = [c for c in cells if c in others and c not in staged]
  if stages is None:
    cells = [c for c in cells if c not in others]
  if not (cells if stages is None else stages):
    raise ValueError(f'every selected cell of configs/{family}.py is run by another binary: '
                     + '; '.join(f'{c}: {others[c]}' for c in elsewhere))
  note = ('; not swept (another binary runs them): ' + '; '.join(f'{c}: {others[c]}' for c in elsewhere)
          if elsewhere else '')
  out = dict(name=family + (f'_{only}' if only else ''),
             description=f'every cell of configs/{family}.py' + (f' containing {only!r}' if only else '') + note,
             seeds=[0, 1, 2])
  if data_dir:       # the target's files, and for a source stage the source's (configs/ladd.py: D/gta5)
    out['fixed'] = {'data.data_dir': data_dir}
    for st in stages or ():
      if st.get('binary') == 'experiments/pretrain_source.py':
        st['fixed'] = {**st.get('fixed', {}), 'source_pretrain.data.data_dir': data_dir}
  if stages is not None:
    out['stages'] = stages
  else:
    # Each run directory and report row is named by its cell, as the family writes it (a one-cell sweep too).
    out['grid'] = [{'name': c, 'config': f'configs/{family}.py:{c}'} for c in cells]
    # A cell whose dataset reads no data_dir (configs/flat2024.py's pathological cells: the Hub's CIFAR through the
    # hf dataset) would refuse data.data_dir: data_dir= then goes to the other cells only.
    reads = {c: _reads_data_dir(mod.get_config(c)) for c in cells} if data_dir else {}
    if not all(reads.values()):
      del out['fixed']
      for g in out['grid']:
        if reads[g['name']]:
          g['data.data_dir'] = data_dir
  return out
