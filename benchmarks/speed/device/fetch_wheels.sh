#!/usr/bin/env bash
# Run HERE (a machine with a package index), before borrowing the accelerator machine: downloads the wheels that
# machine lacks into benchmarks/speed/device/.whl/ (ignored by git), for its Python 3.12 on x86-64 Linux. The
# device tool carries that folder (carry=[".whl"] is relative to the repo root: pass
# "benchmarks/speed/device/.whl") and run.sh installs it there with --no-index --no-deps.
#
#   bash benchmarks/speed/device/fetch_wheels.sh          # prints each wheel and the total size (must fit 64 MiB)
#
# The list = setup.cfg's install_requires minus what the accelerator machine has preinstalled (PRESENT below),
# plus the requirements of those packages that may be missing there (FALLBACK: installed by run.sh only where
# the import fails).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
DEST="$HERE/.whl"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
[ -x "$PIP" ] || PIP="python3 -m pip"

# The accelerator machine's preinstalled distributions (issue 34's statement of its facts, filed 2026-11-27:
# Python 3.12, jax 0.11.2 (CUDA 13), flax, optax, orbax-checkpoint, absl-py, chex, scikit-learn, matplotlib,
# pillow, torch 2.11 (CUDA); no package index). numpy comes with jax; scipy with scikit-learn.
PRESENT="jax jaxlib flax optax orbax-checkpoint absl-py chex scikit-learn matplotlib pillow torch numpy scipy"
# Requirements of the missing packages, and setup.cfg's msgpack, that flax / orbax / matplotlib normally bring
# along but the machine's facts do not state: fetched as fallbacks (ml_collections -> PyYAML;
# tensorboardX -> protobuf, packaging).
FALLBACK="msgpack PyYAML protobuf packaging"

# setup.cfg's install_requires, one requirement a line (name + specifier), from [options] install_requires.
REQS=$(awk '/^install_requires *=/{on=1; next} on && /^[^ \t]/{on=0} on && NF{print $1}' "$ROOT/setup.cfg")
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
WANT=()
for req in $REQS; do
  name=$(echo "$req" | sed -E 's/[<>=!~;[].*//')
  skip=0
  for p in $PRESENT; do [ "$(norm "$name")" = "$(norm "$p")" ] && skip=1; done
  [ $skip = 1 ] || WANT+=("$req")
done
for p in $FALLBACK; do      # setup.cfg's msgpack is in WANT already (with its specifier)
  have=0
  for w in "${WANT[@]}"; do [ "$(norm "$(echo "$w" | sed -E 's/[<>=!~;[].*//')")" = "$(norm "$p")" ] && have=1; done
  [ $have = 1 ] || WANT+=("$p")
done
echo "missing on the accelerator machine (setup.cfg minus its packages) + fallbacks: ${WANT[*]}"

mkdir -p "$DEST"
# --only-binary with an explicit target: pip accepts pure-Python wheels (py3-none-any) for any --platform, and
# compiled ones (msgpack, PyYAML, protobuf) only for the listed tags.
$PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 \
  --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$DEST" "${WANT[@]}"
ls -l "$DEST"/*.whl
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($((total / 1024)) KiB) in $DEST; the carry limit is 64 MiB"
[ "$total" -lt $((60 * 1024 * 1024)) ] || { echo "too large for the 64 MiB carry" >&2; exit 1; }
