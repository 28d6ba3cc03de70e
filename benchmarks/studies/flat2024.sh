#!/usr/bin/env bash
# The flat2024 study (benchmarks/studies/README.flat2024.md): FedAvg, FedSAM and the newer flat-minima methods on the
# digits, usual and cross-device protocols, 3 seeds, on a homogeneous virtual clock; Hessian lambda_max / trace of
# every run's final model; the table.
#   bash benchmarks/studies/flat2024.sh [RUNS_DIR] [USUAL_ROUNDS]
# Rerunning skips finished runs (and Hessian outputs already written).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs/flat2024}
ROUNDS=${2:-100}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/studies/flat2024}
status=0
$PY experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=xdev --sweep_dir="$RUNS/xdev" \
  --batch_runs=3 --parallel=1 || status=1
$PY experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=usual,rounds=$ROUNDS --sweep_dir="$RUNS/usual" \
  --batch_runs=3 --parallel=1 || status=1
# FedGF with T_D = 0 (its global ascent point in use; the default T_D never fires here), in its own sweep dirs.
$PY experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=xdev,cells=fedgf_t0 --sweep_dir="$RUNS/xdev_extra" \
  --batch_runs=3 --parallel=1 || status=1
# FedSWA / FedMoSWA with the full in-round cycle (cycle_steps = the 5 steps of a client's epoch).
$PY experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=usual,rounds=$ROUNDS,cells=fedgf_t0+fedswa_c5+fedmoswa_c5 \
  --sweep_dir="$RUNS/usual_extra" --batch_runs=3 --parallel=1 || status=1
# Controls: SCAFFOLD, FedDyn, FedAvgM alone (the corrections / server momentum the newer methods carry).
$PY experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=usual,rounds=$ROUNDS,cells=scaffold+feddyn+fedavgm \
  --sweep_dir="$RUNS/usual_ctl" --batch_runs=3 --parallel=1 || status=1
# lambda_max (Lanczos, 20 steps, grown while not converged) and the Hutchinson trace (10 probes) of the final
# global model on the first 500 training examples; seed 0 of every cell first.
for wd in "$RUNS"/{usual,xdev,usual_extra,xdev_extra,usual_ctl}/*/seed=0 "$RUNS"/{usual,xdev,usual_extra,xdev_extra,usual_ctl}/*/seed=[12]; do
  [ -f "$wd/summary.json" ] || continue
  ls "$wd"/hessian/hessian*.json >/dev/null 2>&1 && continue
  $PY experiments/hessian.py --workdir="$wd" --num_examples=500 --top_k=1 --lanczos_steps=20 --trace_probes=10 \
    || status=1
done
$PY -m benchmarks.studies.flat2024_table "$RUNS" "$OUT" || status=1
exit $status
