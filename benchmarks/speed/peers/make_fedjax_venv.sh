#!/usr/bin/env bash
# Creates the side venv of the FedJAX peer (benchmarks/speed/peers/fedjax_peer.py): FedJAX 0.0.17, the last
# release, works completely only on jax 0.4.23 with these pins (../shared/reference/ecosystem_measurements.md
# section 2.2: newer numpy/scipy/haiku break it). The venv is gitignored and never needed by the tests.
#
#   bash benchmarks/speed/peers/make_fedjax_venv.sh [VENV_DIR]      (default: .venv-fedjax at the repo root)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
VENV="${1:-$ROOT/.venv-fedjax}"
PY="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r "$ROOT/benchmarks/speed/peers/fedjax_requirements.txt"
(cd "$ROOT" && "$VENV/bin/python" -m benchmarks.speed.peers.fedjax_peer --check)
echo "FedJAX peer venv ready: $VENV"
