#!/usr/bin/env bash
# Creates the side venv of the torch peer (benchmarks/speed/peers/torch_peer.py): the PyTorch reference pattern
# runs in its own interpreter, so that torch is not installed beside our stack (tensorboardX imports torch when
# it finds it, which would slow every start of ours, and the suite would run the torch tests). The venv is
# gitignored and never needed by the tests; benchmarks/speed/bench_util.torch_python() finds it.
#
#   bash benchmarks/speed/peers/make_torch_venv.sh [VENV_DIR]      (default: .venv-torch at the repo root)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
VENV="${1:-$ROOT/.venv-torch}"
PY="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# A CPU build where the index has one (torch==2.13.0 is a CPU wheel on this project's machines); numpy for the
# problem files (peers/protocol.py).
"$VENV/bin/pip" install --disable-pip-version-check -q "torch==${TORCH_VERSION:-2.13.0}" numpy
(cd "$ROOT" && "$VENV/bin/python" -m benchmarks.speed.peers.torch_peer --check)
echo "torch peer venv ready: $VENV"
