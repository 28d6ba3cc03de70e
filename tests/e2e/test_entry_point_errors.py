"""Every entry point under the one error contract (fedjax_flat/training/cli.py): bad input -> one `error:` line
naming the value and the fix, exit 2; a failed operation -> one line, exit 1; never a traceback.

One case per binary runs in the default suite (a subprocess each: the exit status and stderr of the real
binary); the whole matrix (issue 22's cases and the ones found on the way) is marked slow. The library-level
checks behind them are tested in process next to their modules (tests/training/test_reload.py,
tests/sweeps/, tests/data/sources/, tests/training/test_cli.py).
"""
import os

import pytest

from tests.fixtures.entry_cases import FAST, MATRIX, assert_one_line, make_tiny_run, run_binary


@pytest.mark.parametrize('case', sorted(FAST))
def test_entry_point_bad_input_is_one_line(tmp_path, case):
  binary, args, code, needles = FAST[case]
  res = run_binary(binary, *args(tmp_path, None), cwd=tmp_path)
  assert_one_line(res, code, *needles)
  if case.startswith('train'):
    assert not os.path.exists(tmp_path / '.run.lock')       # nothing written in the current directory
    assert not os.path.exists(tmp_path / 'w')               # a refused run leaves no workdir behind (issue 48)


# ------------------------------------------------------------------------------------------------ the matrix

@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  return make_tiny_run(str(tmp_path_factory.mktemp('tiny') / 'run'))


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(MATRIX))
def test_entry_point_error_matrix(tmp_path, tiny_run, case):
  binary, args, code, needles = MATRIX[case]
  assert_one_line(run_binary(binary, *args(str(tmp_path), tiny_run)), code, *needles)
