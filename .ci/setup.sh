#!/usr/bin/env bash
# Creates .venv in the repo (Python 3.11) and installs fedjax_flat with its test and docs extras, once: a stamp of
# setup.cfg + pyproject.toml + the extras makes a second call a no-op until the dependencies change.
set -euo pipefail
cd "$(dirname "$0")/.."
# PYTHON picks the interpreter of a new .venv: on Python 3.11 setup.cfg's ranges resolve to jax 0.10.2, on 3.12 to
# the newest jax (0.11 and newer need 3.12). It is run, not just looked up: a pyenv shim may exist and not run.
PY="${PYTHON:-python3.11}"
if ! "$PY" --version >/dev/null 2>&1; then
  if [ -n "${PYTHON:-}" ]; then echo "[setup] PYTHON=$PYTHON does not run" >&2; exit 2; fi
  PY=python3
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version 2>&1)" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.fedjax_flat-installed
# docs: the suite builds the documentation site (tests/test_docs.py); tracking: the suite tracks runs to a real
# MLflow server and to W&B offline (tests/training/test_tracking.py); hf, tfds: the column datasets' tests
# (tests/data/sources/test_hf.py, test_tfds.py). The extras are part of the stamp, so a venv
# installed before an extra was added installs again.
extras=test,docs,tracking,hf,tfds
want="$( (cat setup.cfg pyproject.toml; echo "extras=$extras") | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing fedjax_flat and its dependencies into .venv (about a minute)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  # An installed jax/flax/... inside setup.cfg's ranges is kept (no --upgrade); one outside them is replaced.
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
  echo "$want" > "$stamp"
fi
