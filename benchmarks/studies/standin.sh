#!/usr/bin/env bash
# The CIFAR stand-in pilot (benchmarks/studies/README.standin.md), regenerated:
#   bash benchmarks/studies/standin.sh [RUNS_DIR]
# FedAvg / FedSAM / FedLESAM on configs/cifar_standin.py (digits32, the paper's CIFAR CNN) at alpha 0 and 0.5, two
# seeds, 80 rounds, every client evaluated at the end (configs/sweeps/standin_flat.py); lambda_max of each final
# model (experiments/hessian.py, 20 Lanczos steps on 359 test images); the report. Resumes what is there.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs/standin}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/studies/standin}
export PYTHONPATH=${PYTHONPATH:-$PWD}
status=0
$PY experiments/sweep.py --sweep=configs/sweeps/standin_flat.py --sweep_dir="$RUNS" --parallel=1 || status=1
for wd in "$RUNS"/*/seed=*; do
  [ -f "$wd/hessian/hessian_global.json" ] || $PY experiments/hessian.py --workdir="$wd" --num_examples=359 \
    --top_k=1 --lanczos_steps=20 > "$wd/hessian.log" 2>&1 || { echo "hessian failed: $wd"; status=1; }
done
mkdir -p "$OUT"
$PY experiments/report.py --sweep_dir="$RUNS" --out_dir="$OUT/report" \
  --title="CIFAR stand-in pilot: FedAvg / FedSAM / FedLESAM on digits32 with the paper's CIFAR CNN (2 seeds)" \
  --note="Regenerate: \`bash benchmarks/studies/standin.sh\`; 2 shared CPU cores." || status=1
exit $status
