#!/usr/bin/env bash
# Flat-minima methods on the embedded digits at alpha=0 (one class per client), 150 rounds each.
# Usage (repo root):  bash benchmarks/studies/flat_minima_digits.sh [OUT_DIR] [SEED]
# Then:               .venv/bin/python -m benchmarks.studies.flat_minima_table OUT_DIR
# Table and discussion: benchmarks/studies/README.flat_minima.md
set -euo pipefail
OUT=${1:-runs/flat_minima_digits}
SEED=${2:-0}
PY=${PY:-.venv/bin/python}
COMMON="--config.data.alpha=0.0 --config.rounds=150 --config.eval_every=5 \
--config.summary_last_k=6 --config.seed=${SEED}"
SAM="--config.client.optimizer=sam --config.client.rho=0.1"
ASAM="--config.client.optimizer=asam --config.client.rho=0.7 --config.client.asam_eta=0.2"
SWA="--config.swa.enabled=True --config.swa.cycle=5 --config.swa.lr1=0.05 --config.swa.lr2=0.0005"
QS="--config=configs/quickstart.py"
GLOSS="--config=configs/quickstart_fedgloss.py --config.client.rho0=0.001 --config.client.rho_warmup_rounds=30"

declare -A RUNS=(
  [fedavg]="$QS"
  [fedsam]="$QS $SAM"
  [fedasam]="$QS $ASAM"
  [fedavg_swa]="$QS $SWA"
  [fedsam_swa]="$QS $SAM $SWA"
  [fedasam_swa]="$QS $ASAM $SWA"
  [fedgloss_sgd]="$GLOSS --config.algo.dual_variant=thesis"
  [fedgloss_sam]="$GLOSS $SAM --config.algo.dual_variant=thesis"
  [fedgloss_sam_release]="$GLOSS $SAM --config.algo.dual_variant=release"
  [fedgloss_sgd_release]="$GLOSS --config.algo.dual_variant=release"
  [naive_fedgloss_sam_release]="$GLOSS $SAM --config.algo.dual_variant=release --config.algorithm=naive_fedgloss"
  [fedgloss_sam_swa]="$GLOSS $SAM $SWA --config.algo.dual_variant=thesis"
  [fedavg_wima]="$QS --config.wima.enabled=True --config.wima.window=10"
  [fedasam_wima]="$QS $ASAM --config.wima.enabled=True --config.wima.window=10"
  [fedavg_man]="$QS --config.man.zeta=0.15"
  [fedasam_man]="$QS $ASAM --config.man.zeta=0.15"
)
for name in fedavg fedsam fedasam fedavg_swa fedsam_swa fedasam_swa fedgloss_sgd fedgloss_sam fedgloss_sam_release \
    fedgloss_sgd_release naive_fedgloss_sam_release fedgloss_sam_swa fedavg_wima fedasam_wima fedavg_man fedasam_man; do
  if [[ -f "$OUT/$name/summary.json" ]]; then continue; fi
  echo "== $name: $PY experiments/train.py ${RUNS[$name]} $COMMON --workdir=$OUT/$name"
  # shellcheck disable=SC2086
  $PY experiments/train.py ${RUNS[$name]} $COMMON --workdir="$OUT/$name" 2>"$OUT.$name.log" | tail -n 3
done
