#!/usr/bin/env bash
# The CIFAR stand-in study (benchmarks/studies/README.standin.md), regenerated:
#   bash benchmarks/studies/standin.sh [RUNS_DIR]
# configs/cifar_standin.py (digits32, the paper's CIFAR CNN), 80 rounds, 3 seeds, every client evaluated at the end
# (configs/sweeps/standin_flat.py): issue 52's five methods (FedAvg, FedSAM, FedASAM, FedGloSS, FedLESAM) at alpha 0
# and 0.5 with lambda_max + trace (experiments/hessian.py, 20 Lanczos steps, 10 Hutchinson probes, the 359 test
# images) and the landscape lab on the final checkpoint (drift, feature rank, barriers); then issue 50's 2024-25
# methods at alpha 0.5 with lambda_max + trace; then the tables. Resumes what is there.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs/standin}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/studies/standin}
export PYTHONPATH=${PYTHONPATH:-$PWD}
SW=configs/sweeps/standin_flat.py
FIVE=fedavg+fedsam+fedlesam+fedasam+fedgloss
FIFTY=fedlesam_s+fedlesam_d+fednsam+fedgf+fedswa+fedmoswa+fedwmsam
status=0
measure() {   # $1 run dir, $2 = 1: also the lab
  [ -f "$1/hessian/hessian_global.json" ] && grep -q '"trace": [0-9]' "$1/hessian/hessian_global.json" || \
    $PY experiments/hessian.py --workdir="$1" --num_examples=359 --top_k=1 --lanczos_steps=20 --trace_probes=10 \
      > "$1/hessian.log" 2>&1 || { echo "hessian failed: $1"; status=1; }
  if [ "$2" = 1 ] && [ ! -f "$1/lab/lab_global_round80.json" ]; then
    $PY experiments/hessian.py --workdir="$1" --lab --lab_measures=drift,rank,barrier --lab_examples=359 \
      --lab_barrier_points=11 --out_dir="$1/lab" > "$1/lab.log" 2>&1 || { echo "lab failed: $1"; status=1; }
  fi
}
$PY experiments/sweep.py --sweep=$SW:seeds=3,alphas=0+0.5,cells=$FIVE --sweep_dir="$RUNS" --parallel=1 || status=1
for m in ${FIVE//+/ }; do for wd in "$RUNS/${m}_a0"/seed=* "$RUNS/${m}_a0.5"/seed=*; do measure "$wd" 1; done; done
$PY experiments/sweep.py --sweep=$SW:seeds=3,alphas=0.5,cells=$FIFTY --sweep_dir="$RUNS" --parallel=1 || status=1
for m in ${FIFTY//+/ }; do for wd in "$RUNS/${m}_a0.5"/seed=*; do measure "$wd" 0; done; done
$PY benchmarks/studies/standin_table.py --runs="$RUNS" --out="$OUT" || status=1
exit $status
