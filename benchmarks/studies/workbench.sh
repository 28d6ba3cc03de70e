#!/usr/bin/env bash
# Issue 52 item 4, the workbench study (benchmarks/studies/README.workbench.md), regenerated:
#   bash benchmarks/studies/workbench.sh [RUNS_DIR]
# 1. the digits sweep (configs/sweeps/workbench_digits.py: 5 methods x alpha {0, 0.5} x 3 seeds, 60 rounds,
#    every client evaluated every 10 rounds, the lab (drift, rank, profile) at rounds 20, 40, 60);
# 2. mode connectivity (4 clients of the round after the last) on seed 0 of each method at alpha 0;
# 3. lambda_max of every final global model (experiments/hessian.py, 20 Lanczos steps on the 359 test digits);
# 4. the worst-group sweep (configs/sweeps/workbench_spurious.py: 5 methods x strong / weak colour x 3 seeds, runs
#    batched 4 to a program, --batch_runs=auto);
# 5. the tables (benchmarks/studies/workbench_table.py) and the sweep reports, under benchmarks/studies/workbench/.
# Every step skips what is already there, so a rerun resumes. One process at a time (2 shared CPU cores).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs/workbench}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/studies/workbench}
export PYTHONPATH=${PYTHONPATH:-$PWD}
status=0
$PY experiments/sweep.py --sweep=configs/sweeps/workbench_digits.py --sweep_dir="$RUNS/digits" --parallel=1 || status=1
for m in fedavg fedsam fedasam fedgloss fedlesam; do
  wd="$RUNS/digits/${m}_a0/seed=0"
  [ -f "$wd/hessian/connectivity_global.json" ] || $PY experiments/hessian.py --workdir="$wd" --connectivity \
    --connectivity_clients=4 --connectivity_points=21 --num_examples=359 > "$wd/connectivity.log" 2>&1 \
    || { echo "connectivity failed: $wd"; status=1; }
done
for wd in "$RUNS"/digits/*/seed=*; do
  [ -f "$wd/hessian/hessian_global.json" ] || $PY experiments/hessian.py --workdir="$wd" --num_examples=359 \
    --top_k=1 --lanczos_steps=20 > "$wd/hessian.log" 2>&1 || { echo "hessian failed: $wd"; status=1; }
done
$PY experiments/sweep.py --sweep=configs/sweeps/workbench_spurious.py --sweep_dir="$RUNS/spurious" --batch_runs=auto \
  || status=1
mkdir -p "$OUT"
$PY experiments/report.py --sweep_dir="$RUNS/digits" --out_dir="$OUT/digits_report" \
  --title="Workbench: five methods on the digits, alpha 0 / 0.5, 60 rounds (3 seeds)" \
  --note="Regenerate: \`bash benchmarks/studies/workbench.sh\`; 2 shared CPU cores." || status=1
$PY experiments/report.py --sweep_dir="$RUNS/spurious" --out_dir="$OUT/spurious_report" \
  --title="Workbench: five methods on the coloured digits (3 seeds)" \
  --note="Regenerate: \`bash benchmarks/studies/workbench.sh\`; 2 shared CPU cores." || status=1
$PY benchmarks/studies/workbench_table.py --runs="$RUNS" --out="$OUT" || status=1
exit $status
