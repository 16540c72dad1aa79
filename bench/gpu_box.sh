#!/usr/bin/env bash
# The GPU check on a box whose Python has a CUDA torch and none of llmtui's other packages, without an index
# (the lent H200: torch 2.11): the wheels of `make gpu-wheels BASE=1` (copied into gpu-wheels/) go into a folder
# of their own, put first on the path, and bench/gpu_check.py runs with it. Arguments go to the check.
#   bash bench/gpu_box.sh --stages mfu,attention      WHEELS=DIR SITE=DIR PYTHON=python3 to change the defaults
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-gpu-wheels}
SITE=${SITE:-/tmp/llmtui-site}
PYTHON=${PYTHON:-python3}
if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "error: no wheels in $WHEELS" >&2
  echo "  fix: run \`make gpu-wheels BASE=1\` on a machine with an index and copy gpu-wheels/ here" >&2
  exit 2
fi
"$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PYTHON" bench/gpu_check.py --wheels "$WHEELS" "$@"
