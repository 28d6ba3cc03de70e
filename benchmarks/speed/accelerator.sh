#!/usr/bin/env bash
# One command for the accelerator table (benchmarks/speed/accelerator.py): vmap / chunked / sequential / loop /
# torch peer for the paper CNN and ResNet18-GN at 10 and 100 clients per round, with peak memory.
#   bash benchmarks/speed/accelerator.sh              # the full table (on a GPU: jax[cuda] and, for a GPU torch row,
#                                               # a CUDA torch installed in the venv)
#   bash benchmarks/speed/accelerator.sh --smoke      # tiny sizes, end to end on a CPU (the test suite runs this)
# Writes benchmarks/speed/accelerator_<backend>[_smoke].{json,md} (or --out=PREFIX).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
cd "$ROOT"     # the benchmarks run as modules from the repository root
exec "$PY" -m benchmarks.speed.accelerator "$@"
