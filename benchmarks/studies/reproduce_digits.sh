#!/usr/bin/env bash
# The digits stand-ins of the flat-minima and FL-baselines tables, 3 seeds each, and their report:
#   bash benchmarks/studies/reproduce_digits.sh [RUNS_DIR] [PARALLEL]
# Writes benchmarks/studies/reproduction/{report.md,report.csv,*.png}. Rerunning skips finished runs and resumes
# interrupted ones; the report compares each cell with the earlier checked-in measurement (reference column).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs/reproduction_digits}
PAR=${2:-2}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/studies/reproduction}
status=0
$PY experiments/sweep.py --sweep=configs/sweeps/flat_minima_digits.py --sweep_dir="$RUNS/flat_minima" \
  --parallel="$PAR" || status=1
$PY experiments/sweep.py --sweep=configs/sweeps/baselines_digits.py --sweep_dir="$RUNS/baselines" \
  --parallel="$PAR" || status=1
# The report is written even when some runs failed (their cells say so); exit 1 then.
$PY experiments/report.py --sweep_dir="$RUNS/flat_minima" --sweep_dir="$RUNS/baselines" --out_dir="$OUT" \
  --target=0.9 --title="Digits reproduction of the flat-minima and FL-baselines tables (3 seeds)" \
  --note="Regenerate: \`bash benchmarks/studies/reproduce_digits.sh\` (sweeps: configs/sweeps/flat_minima_digits.py, configs/sweeps/baselines_digits.py; workdirs under $RUNS). Embedded digits, alpha = 0 (one class per client), 20 clients, 5 per round, digits CNN; 2 shared CPU cores." \
  --note="Same round counts as the earlier tables: flat minima 150 rounds (last-K = last 6 evaluations, rounds 125-150), baselines 100 rounds (last-K = last 5, rounds 80-100); evaluation every 5 rounds; seeds 0, 1, 2." \
  --note="**reference** = the earlier measurement checked in at benchmarks/studies/README.flat_minima.md (seeds 0-2, mean ± std) and benchmarks/studies/README.baselines.md (seed 0 only): a check that the code still reproduces its own tables. These are digits stand-ins: the papers' CIFAR numbers are not comparable and are not shown." \
  || status=1
exit $status
