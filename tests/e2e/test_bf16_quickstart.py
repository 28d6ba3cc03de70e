"""The bfloat16 quickstart (configs/quickstart.py with engine.compute_dtype='bfloat16') within one accuracy point
of float32 over 3 seeds: benchmarks/studies/bf16_quickstart.py's runs (the table: README.bf16.md)."""
import pytest

from benchmarks.studies import bf16_quickstart


@pytest.mark.slow
def test_bf16_quickstart_within_one_point_of_float32_over_3_seeds():
  runs, summary = bf16_quickstart.study([0, 1, 2], rounds=100)
  assert len(runs) == 6 and summary['float32']['final_test_accuracy'] > 0.85   # the quickstart did learn
  assert abs(summary['difference_points']) <= 1.0, summary
