#!/usr/bin/env bash
# Issue 51 item 5: flatness (FedSAM / FedASAM) x model-poisoning attacks x defences (robust aggregators and central
# DP), backdoor persistence, and leakage (inversion PSNR, membership epsilon) of SGD vs SAM clients with and without
# DP, on the digits; the grid's core on the CIFAR stand-in (digits32, the paper's CIFAR CNN).
# Usage (repo root):  bash benchmarks/studies/security.sh [ROOT]     (default runs/security; finished runs skipped)
# Write-up: benchmarks/studies/README.security.md; tables: benchmarks/studies/security/
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${1:-runs/security}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=${PYTHONPATH:-$PWD}
SW=configs/sweeps/security_digits.py

# 1. The grids (one process, seeds of a cell packed as lanes where the runs allow it).
$PY experiments/sweep.py --sweep=$SW:part=main,seeds=0+1+2 --sweep_dir="$ROOT/main" --parallel=1 --batch_runs=auto
# 10% and FedASAM: sign flip diverges on some seeds (FedASAM with the mean: NaN at rounds 12-15); a diverged run is
# listed as failed and the sweep goes on (with --batch_runs too), hence `|| true`.
$PY experiments/sweep.py --sweep=$SW:part=ten,seeds=0+1+2 --sweep_dir="$ROOT/ten" --parallel=1 || true
$PY experiments/sweep.py --sweep=$SW:part=asam,seeds=0+1+2 --sweep_dir="$ROOT/asam" --parallel=1 || true
$PY experiments/sweep.py --sweep=$SW:part=asam_ten,seeds=0+1+2 --sweep_dir="$ROOT/asam_ten" --parallel=1 || true
# The CIFAR stand-in: FedAvg / FedSAM x {none, ALIE, backdoor} x the five defences, and sign flip with centered
# clipping and DP (the cells that survive it on the digits), 80 rounds.
$PY experiments/sweep.py --sweep=$SW:part=standin,seeds=0+1+2,attacks=none+alie+backdoor --sweep_dir="$ROOT/standin" \
  --parallel=1 --batch_runs=auto
$PY experiments/sweep.py --sweep=$SW:part=standin,seeds=0+1+2,attacks=sign_flip,defences=cc+dp \
  --sweep_dir="$ROOT/standin.sf" --parallel=1 --batch_runs=auto
$PY experiments/sweep.py --sweep=$SW:part=standin,seeds=0+1+2,attacks=sign_flip,defences=mean \
  --sweep_dir="$ROOT/standin.sf2" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin,seeds=0+1+2,attacks=sign_flip,defences=median+krum \
  --sweep_dir="$ROOT/standin.sf3" --parallel=1 --batch_runs=auto || true
# FedASAM on the stand-in (rho 0.5, eta 0.2), the same grid at 30 %.
$PY experiments/sweep.py --sweep=$SW:part=standin_asam,seeds=0+1+2,attacks=none+alie+backdoor,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_asam" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_asam,seeds=0+1+2,attacks=none+alie+backdoor,defences=median+krum \
  --sweep_dir="$ROOT/standin_asam.mk" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_asam,seeds=0+1+2,attacks=sign_flip,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_asam.sf" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_asam,seeds=0+1+2,attacks=sign_flip,defences=median+krum \
  --sweep_dir="$ROOT/standin_asam.sf3" --parallel=1 --batch_runs=auto || true
# 10 % attackers on the stand-in: the three methods x {sign flip, ALIE, backdoor} x {mean, centered clipping, DP}
# (the median and Krum do not train the stand-in without an attacker: 10-15 %; they follow below).
$PY experiments/sweep.py --sweep=$SW:part=standin_ten,seeds=0+1+2,methods=fedavg+fedsam,attacks=backdoor,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_ten.b" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_ten,seeds=0+1+2,methods=fedavg+fedsam,attacks=alie,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_ten.as" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_ten,seeds=0+1+2,methods=fedavg+fedsam,attacks=sign_flip,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_ten.s" --parallel=1 --batch_runs=auto || true
$PY experiments/sweep.py --sweep=$SW:part=standin_ten,seeds=0+1+2,methods=fedasam,defences=mean+cc+dp \
  --sweep_dir="$ROOT/standin_ten.asam" --parallel=1 --batch_runs=auto || true
# ... and the median and Krum at 10 % (untrained models, as without an attacker; run for the complete grid).
$PY experiments/sweep.py --sweep=$SW:part=standin_ten,seeds=0+1+2,defences=median+krum \
  --sweep_dir="$ROOT/standin_ten.mk" --parallel=1 --batch_runs=auto || true
# The control for DP's gain on the stand-in: the clip alone (norm bounding at DP's clip, no noise), no attack.
$PY experiments/sweep.py --config=configs/cifar_standin.py --grid=client.optimizer=sgd,sam --set=client.rho=0.05 \
  --set=rounds=80 --set=eval_every=10 --set=summary_last_k=2 --set=server.aggregator=norm_bounding \
  --set=server.norm_bound=0.5 --seeds=0,1,2 --sweep_dir="$ROOT/clip" --parallel=1 --batch_runs=auto

# 2. Backdoor persistence: 20 clean rounds from each backdoored final model (attack.fraction=0 keeps the trigger
#    evaluation, no attackers), same aggregator. persist SRC_PART OUT_PART CONFIG SAM_RHO TRIGGER_SIZE TRIGGER_AT
persist() {
  local src_part=$1 out_part=$2 config=$3 rho=$4 size=$5 at=$6
  for opt in fedavg fedsam; do
    for agg in mean median; do
      for seed in 0 1 2; do
        local src="$ROOT/$src_part/$opt-backdoor-$agg-f0.3/seed=$seed" wd="$ROOT/$out_part/$opt-$agg/seed=$seed"
        mkdir -p "$(dirname "$wd")"
        [[ -f "$wd/summary.json" ]] && continue
        local OPT=(--config.client.optimizer=sgd)
        [[ $opt == fedsam ]] && OPT=(--config.client.optimizer=sam --config.client.rho=$rho)
        $PY experiments/train.py --config=$config "${OPT[@]}" --config.rounds=20 --config.eval_every=2 \
          --config.summary_last_k=2 --config.server.aggregator=$agg --config.attack.kind=backdoor \
          --config.attack.fraction=0.0 --config.attack.scale=5 --config.attack.target_label=0 \
          --config.attack.trigger_size=$size --config.attack.trigger_row=$at --config.attack.trigger_col=$at \
          --config.attack.poison_fraction=0.5 --config.init.checkpoint="$src" --config.seed=$seed \
          --workdir="$wd" 2>"$wd.log" | tail -n 1 || true
      done
    done
  done
}
persist main persist configs/quickstart.py 0.1 3 1                    # the digits, from the round-40 model
persist standin persist_standin configs/cifar_standin.py 0.05 4 2     # the stand-in, from the round-80 model

# 3. lambda_max of every run that trained (the leakage runs' lambda_max: step 4): the digits, seed 0 first
#    (about 10-15 s a run) ...
for s in 0 1 2; do
  for wd in "$ROOT"/main*/*/seed=$s "$ROOT"/ten*/*/seed=$s "$ROOT"/asam*/*/seed=$s; do
    [[ -f "$wd/summary.json" && ! -f "$wd/hessian/hessian_global.json" ]] || continue
    $PY experiments/hessian.py --workdir="$wd" --top_k=1 2>/dev/null | tail -n 1
  done
done
# ... and every stand-in run (20-40 s a run; a run that diverged has no checkpoint to measure).
for s in 0 1 2; do
  for wd in "$ROOT"/standin*/*/seed=$s; do
    [[ -f "$wd/summary.json" && ! -f "$wd/hessian/hessian_global.json" ]] || continue
    $PY experiments/hessian.py --workdir="$wd" --top_k=1 --num_examples=359 --lanczos_steps=20 2>/dev/null | tail -n 1
  done
done

# 4. Leakage: SGD vs SAM clients, without and with DP (configs/dp.py's digits cells: central DP, clip 0.5, eps 8,
#    uniform weights, 100 rounds), then gradient inversion + the loss-threshold membership attack (no LiRA).
for cell in fedavg fedsam fedavg,eps=8 fedsam,eps=8; do
  wd="$ROOT/leak/${cell/,eps=/_eps}"
  [[ -f "$wd/summary.json" ]] || $PY experiments/train.py --config=configs/dp.py:$cell --workdir="$wd" 2>/dev/null | tail -n 1
  [[ -f "$wd/privacy_attacks/membership.json" ]] || $PY experiments/attack.py --workdir="$wd" --attack=all --dp_noise=none 2>/dev/null | tail -n 3
  [[ -f "$wd/hessian/hessian_global.json" ]] || $PY experiments/hessian.py --workdir="$wd" --top_k=1 2>/dev/null | tail -n 1
done
# Inversion of clients 1-3's uploads too (client 0's is in privacy_attacks/): 4 clients x 2 images per run.
for k in 1 2 3; do for cell in fedavg fedsam fedavg_eps8 fedsam_eps8; do
  wd="$ROOT/leak/$cell"
  [[ -f "$wd/privacy_attacks_c$k/inversion.json" ]] || $PY experiments/attack.py --workdir="$wd" --attack=inversion \
    --client=$k --dp_noise=none --out_dir="$wd/privacy_attacks_c$k" 2>/dev/null | grep inversion
done; done

# ... and on the stand-in: the grid's own unattacked runs (mean / DP), every seed, clients 0-3; LiRA (16 shadows
# trained centrally) on seed 0.
for s in 0 1 2; do for cell in standin/fedavg-none-mean standin/fedsam-none-mean standin.kd/fedavg-none-dp \
    standin.kd/fedsam-none-dp; do
  wd="$ROOT/$cell/seed=$s"
  [[ -f "$wd/privacy_attacks/membership.json" ]] || $PY experiments/attack.py --workdir="$wd" --attack=all --dp_noise=none 2>/dev/null | tail -n 3
  for k in 1 2 3; do
    [[ -f "$wd/privacy_attacks_c$k/inversion.json" ]] || $PY experiments/attack.py --workdir="$wd" --attack=inversion \
      --client=$k --dp_noise=none --out_dir="$wd/privacy_attacks_c$k" 2>/dev/null | grep inversion
  done
  [[ $s != 0 || -f "$wd/privacy_attacks_lira/membership.json" ]] || $PY experiments/attack.py --workdir="$wd" \
    --attack=membership --lira_shadows=16 --out_dir="$wd/privacy_attacks_lira" 2>/dev/null | grep lira
  # ... and with 16 federated shadows (runs of the target's own config as lanes of one program: 8-16 min a run)
  [[ $s != 0 || -f "$wd/lira_federated/membership.json" ]] || $PY experiments/attack.py --workdir="$wd" \
    --attack=membership --lira_shadows=16 --shadow_trainer=federated --out_dir="$wd/lira_federated" 2>/dev/null \
    | grep lira
done; done

# What a client really sends: 2 local steps of its own optimizer (SAM for FedSAM) on its 2 images, inverted
# through the unrolled steps, every seed, client 0; for the DP runs as the server receives it (clipped) and as
# the DP adversary sees it (plus the release's noise).
for s in 0 1 2; do for cell in standin/fedavg-none-mean standin/fedsam-none-mean standin.kd/fedavg-none-dp \
    standin.kd/fedsam-none-dp; do
  wd="$ROOT/$cell/seed=$s"
  views=none; [[ $cell == *-dp ]] && views="upload release"
  for v in $views; do
    o="$wd/inversion_local"; [[ $v == release ]] && o="$wd/inversion_local_release"
    [[ -f "$o/inversion.json" ]] || $PY experiments/attack.py --workdir="$wd" --attack=inversion --upload=local \
      --local_steps=2 --dp_noise=$v --out_dir="$o" 2>/dev/null | grep inversion
  done
done; done

$PY -m benchmarks.studies.security_table --root="$ROOT" --out=benchmarks/studies/security
