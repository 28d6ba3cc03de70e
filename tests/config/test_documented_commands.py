"""Every command a config family's docstring documents runs as written, in a dry form: a train / pretrain /
centralized command's --config (with its --config.* overrides) loads and validates; a sweep command expands
and every run of it validates; any other binary's documented flags exist. Placeholders (`D`, `<data_dir>`) stand
for the user's paths."""
import ast
import glob
import os
import re
import shlex

import pytest

from fedjax_flat.config.validate import validate_config
from fedjax_flat.sweeps import grid as grid_lib
from tests.fixtures.paths import REPO

CONFIG_BINARIES = ('experiments/train.py', 'experiments/pretrain_source.py', 'experiments/centralized.py')


def _commands():
  out = []
  for path in sorted(glob.glob(os.path.join(REPO, 'configs', '*.py')) + glob.glob(os.path.join(REPO, 'configs',
                                                                                            'sweeps', '*.py'))):
    with open(path) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ''
    for line in doc.replace('\\\n', ' ').splitlines():
      line = line.split('#')[0].strip()
      if re.match(r'^(\.venv/bin/)?python ', line):
        out.append(pytest.param(line, id=f'{os.path.relpath(path, REPO)}:{len(out)}'))
  return out


COMMANDS = _commands()


def _args(line):
  return [a for a in shlex.split(line)[1:] if a != '...']


def _defined_flags(script):
  with open(os.path.join(REPO, script)) as f:
    src = f.read()
  if 'study_util.argument_parser(' in src:      # the studies' shared flags (benchmarks/studies/study_util.py)
    with open(os.path.join(REPO, 'benchmarks', 'studies', 'study_util.py')) as f:
      src += f.read()
  return set(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", src)) | set(re.findall(r"add_argument\('--(\w+)'", src))


def test_the_families_document_commands():
  assert len(COMMANDS) >= 50


@pytest.mark.parametrize('line', COMMANDS)
def test_documented_command_runs_as_written(line, tmp_path):
  args = _args(line)
  # a file an earlier step of the documented pipeline writes (the source model): here, a stand-in file
  stand_in = tmp_path / 'source_model.npz'
  stand_in.write_bytes(b'')
  args = [f'--config.init.pretrained={stand_in}' if a.startswith('--config.init.pretrained=') else a for a in args]
  if args[0] == '-m':
    script, args = args[1].replace('.', '/') + '.py', args[2:]
  else:
    script, args = args[0], args[1:]
  assert os.path.isfile(os.path.join(REPO, script)), script
  if script in CONFIG_BINARIES:
    grid_lib.config_from_argv([script] + args, line)     # as the binary builds it, validated
  elif script == 'experiments/sweep.py':
    spec = next(a.split('=', 1)[1] for a in args if a.startswith('--sweep='))
    runs = grid_lib.expand(grid_lib.load_sweep_file(os.path.join(REPO, spec) if ':' not in spec else
                                                      os.path.join(REPO, spec.split(':')[0]) + ':' +
                                                      spec.split(':', 1)[1]), 'D')
    assert runs
    # a big table (hundreds of runs): its first and last run and a spread between them (each of a cell's seeds
    # loads the same config but the seed)
    step = max(1, len(runs) // 12)
    some = runs[::step] + runs[-1:]
    for r, cfg in zip(some, grid_lib.run_configs(some)):
      validate_config(cfg, tuple(r.inputs))       # a pipeline's later stage: its inputs are declared, not there yet
  else:
    names = _defined_flags(script)
    for a in args:
      assert a.startswith('--') and a[2:].split('=')[0] in names, (script, a, sorted(names))
