#!/bin/sh
# Trains this directory's model (train.py, evaluated by evaluate.py) in three
# emulated regions, end to end (docs/python.md, "The example"):
#
#   examples/fashion_mnist/run.sh [meridian run options, e.g. --out DIR]
#
# Writes initial.safetensors from train.py's model when it is missing, then
# runs `meridian run three-regions.pbtxt` (report in runs/ here). Needs the
# package installed as docs/python.md says: a venv at the repository's root
# (.venv) is put first on PATH, so the job's `python3` is the venv's. The
# binary: $MERIDIAN, else `meridian` on PATH, else the repository's
# build/bin/meridian.
set -eu
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
if [ -x "$repo/.venv/bin/python3" ]; then
  PATH="$repo/.venv/bin:$PATH"
  export PATH
fi
meridian=${MERIDIAN:-$(command -v meridian || echo "$repo/build/bin/meridian")}
if [ ! -f initial.safetensors ]; then
  python3 train.py --write-weights
fi
exec "$meridian" run three-regions.pbtxt "$@"
