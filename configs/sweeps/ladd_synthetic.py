r"""The LADD table's pipeline on its synthetic stand-in (configs/ladd.py:synthetic,...), as one sweep of stages:
the source pre-training (source_fda: the model the LADD / FedAvg + ST / ftda cells start from; source_only), then
the federated cells from the source_fda model. No published number (a stand-in); its report has the columns of
the real table's (configs/sweeps/paper_table.py:ladd).

  python experiments/sweep.py --sweep=configs/sweeps/ladd_synthetic.py --sweep_dir=runs/ladd_syn
  python experiments/sweep.py --sweep=configs/sweeps/ladd_synthetic.py:rounds=2,steps=20 --sweep_dir=runs/ladd_tiny \
      --seeds=0
  python experiments/report.py --sweep_dir=runs/ladd_tiny --out_dir=runs/ladd_tiny/report

Argument (optional, comma-separated): rounds=<federated rounds> (default the cells' 30), steps=<source steps>
(default the cells' 300).
"""
import importlib.util
import os

_CONFIGS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLS = ['synthetic,' + m for m in ('source_only', 'fed_oracle', 'ftda', 'fedavg_st', 'ladd_cls', 'ladd_all')]


def get_sweep(arg: str = ''):
  opts = dict(t.partition('=')[::2] for t in (arg or '').split(',') if t)
  if set(opts) - {'rounds', 'steps'} or not all(v.isdigit() and int(v) > 0 for v in opts.values()):
    raise ValueError(f'ladd_synthetic.py:{arg!r}: optional rounds=<int>, steps=<int>, e.g. rounds=2,steps=20')
  spec = importlib.util.spec_from_file_location('ladd_family', os.path.join(_CONFIGS, 'ladd.py'))
  ladd = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(ladd)
  source, fed = ladd.pipeline(CELLS)
  if 'steps' in opts:
    n = int(opts['steps'])
    source['fixed'] = {'source_pretrain.steps': n, 'source_pretrain.checkpoint_every': n,
                       'source_pretrain.log_every': n}
  if 'rounds' in opts:
    r = int(opts['rounds'])
    fed['fixed'] = {'rounds': r, 'eval_every': 1, 'eval_every_last': 1}
  return dict(name='ladd_synthetic', description='configs/ladd.py synthetic stand-in, source pre-training then the '
              'federated cells', stages=[source, fed], seeds=[0, 1, 2])
