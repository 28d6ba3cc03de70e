#!/usr/bin/env bash
# The one command to run on the accelerator machine (README.md in this folder): installs the carried wheels
# (fetch_wheels.sh, run here beforehand) into a temporary folder, puts it and this checkout on PYTHONPATH, prints
# the device, then measures issue 34's table within a hard wall budget (kit.py: each group time-boxed, rows written
# as they finish).
#   bash benchmarks/speed/device/run.sh [--out=DIR] [--budget_s=450] [--groups=...] [--repeats=3]
#   bash benchmarks/speed/device/run.sh --smoke [--out=DIR]    # tiny sizes on a CPU (the test suite runs this)
# Results: DIR (default $OUT) / kit.json, kit.md, rows.jsonl. Works with .whl/ empty or absent (installs nothing).
# Env: PYTHON (default .venv/bin/python, else python3), KIT_WHEELS (the wheels' folder, default .whl/ here).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3 || command -v python)"; fi
fi
SITE="$(mktemp -d "${TMPDIR:-/tmp}/kit_site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT

# Wheels whose module this Python already imports are left out (the machine's own copy wins).
shopt -s nullglob
wheels=()
for w in "${KIT_WHEELS:-$HERE/.whl}"/*.whl; do
  dist="$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z')"
  case "$dist" in
    pyyaml) mod=yaml ;; protobuf) mod=google.protobuf ;; tensorboardx) mod=tensorboardX ;; *) mod="$dist" ;;
  esac
  if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null; then
    echo "[run.sh] $mod is installed here: $(basename "$w") not needed"
  else
    wheels+=("$w")
  fi
done
if [ ${#wheels[@]} -gt 0 ]; then
  "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "${wheels[@]}"
  echo "[run.sh] installed into $SITE: ${wheels[*]##*/}"
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

SMOKE=0
for arg in "$@"; do [ "$arg" = "--smoke" ] && SMOKE=1; done
echo "[run.sh] $("$PY" --version 2>&1), checkout $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
if [ $SMOKE = 0 ]; then   # the smoke run's groups record the device themselves; on a GPU this is worth a line early
  "$PY" -c "import jax; print('[run.sh] jax', jax.__version__, jax.default_backend(), jax.devices())" || true
fi
# A rerun on the same warm machine (skipped groups) reuses the first run's compiled programs: its compile_s are
# then cache hits (the device record names the cache).
[ $SMOKE = 1 ] || export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HERE/.jax_cache}"
cd "$ROOT"
exec "$PY" -m benchmarks.speed.device.kit "$@"
