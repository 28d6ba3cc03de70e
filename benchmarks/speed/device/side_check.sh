#!/usr/bin/env bash
# Side check: the suite's fast subset on another jax release, on the CPU, in a venv of its own outside the
# repo (the repo's .venv keeps the version CI tests). Default: jax/jaxlib 0.11.2, the accelerator machine's
# version, on Python 3.12 (jax 0.11 and newer need it); flax / optax / orbax-checkpoint are the newest that
# setup.cfg's ranges and that jax allow.
#   bash benchmarks/speed/device/side_check.sh [JAX_VERSION] [extra pytest args]
# Environment: SIDE_JAX (version, if no argument), SIDE_PYTHON (interpreter, python3.12), SIDE_VENV (the venv;
# default ../venv-jax<digits> beside the checkout), SIDE_PINS (more requirements, e.g. 'flax==0.12.8').
set -euo pipefail
cd "$(dirname "$0")/../../.."
# The suite compiles without XLA's backend optimizations (tests/conftest.py); this check compiles with them, as
# users run, unless the caller says otherwise.
export JAX_DISABLE_MOST_OPTIMIZATIONS="${JAX_DISABLE_MOST_OPTIMIZATIONS:-0}"
JAX="${1:-${SIDE_JAX:-0.11.2}}"
shift || true
PY="${SIDE_PYTHON:-python3.12}"
if ! "$PY" --version >/dev/null 2>&1; then   # a pyenv shim with no 3.12 selected: its install itself
  for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do [ -x "$cand" ] && PY="$cand"; done
fi
VENV="${SIDE_VENV:-$(dirname "$PWD")/venv-jax${JAX//./}}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[side_check] creating $VENV with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv "$VENV"
fi
have="$("$VENV/bin/python" -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
if [ "$have" != "$JAX" ]; then
  echo "[side_check] installing jax/jaxlib $JAX and setup.cfg's requirements into $VENV" >&2
  # setup.cfg's install_requires + the test extra, read here so the package itself is not installed (the
  # checkout goes on PYTHONPATH).
  mapfile -t reqs < <("$VENV/bin/python" - <<'PYEOF'
import configparser
c = configparser.ConfigParser()
c.read('setup.cfg')
for block in (c['options']['install_requires'], c['options.extras_require']['test']):
  for line in block.splitlines():
    line = line.split('#')[0].strip()
    if line and not line.startswith(('jax>', 'jaxlib>', 'jax=', 'jaxlib=')):
      print(line)
PYEOF
  )
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "jax==$JAX" "jaxlib==$JAX" "${reqs[@]}" \
    ${SIDE_PINS:-}
fi
"$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -i -E '^(jax|jaxlib|flax|optax|orbax-checkpoint|chex|numpy) ' | tr -s ' ' | paste -sd, - \
  | sed 's/^/[side_check] versions: /'
# The fast subset: core (engine, client state), algorithms (the SAM family, FedGloSS, SWA), optimizers, models
# (CNN shapes, RNN, parameter partition), training (checkpoint, resume, loop, writers), tasks, and the layer
# rule. 129 tests, 4.2 min of CPU (14.4 min wall under load 13-15 on 2 shared cores, 2026-11-28).
SUBSET=(
  tests/test_architecture.py
  tests/core/test_engine.py tests/core/test_client_state.py
  tests/algorithms/test_baselines_sam.py tests/algorithms/test_fedgloss.py tests/algorithms/wrappers/test_swa.py
  tests/optimizers
  tests/models/test_rnn.py tests/models/test_partition.py
  tests/training/test_checkpoint.py tests/training/test_resume.py tests/training/test_writers.py
  tests/tasks/test_base.py
)
JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${SUBSET[@]}" "$@"
