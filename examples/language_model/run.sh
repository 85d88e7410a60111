#!/bin/sh
# Trains the language model (train.py, evaluated by evaluate.py) with
# Meridian, end to end (docs/language-model.md):
#
#   examples/language_model/run.sh [JOB] [meridian run options, e.g. --out DIR]
#
# JOB: deploy/configs/three-regions-lm.pbtxt (default), or a job file
# (single-site.pbtxt, in this directory). Runs `meridian run JOB` (report
# in runs/ here), which first writes initial.safetensors from train.py's
# model when it is missing (the jobs' model.weights_command). The job's
# programs start as `python3`: the repository's .venv (docs/python.md) when
# there is one, else Debian's /usr/bin/python3 with the package from the
# source tree (build/python and python/, after a build). The binary:
# $MERIDIAN, else `meridian` on PATH, else the repository's
# build/bin/meridian. The corpus: tools/install-deps fetches it.
set -eu
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
job=$repo/deploy/configs/three-regions-lm.pbtxt
case "${1:-}" in
  *.pbtxt) job=$1; shift ;;
esac
if [ -x "$repo/.venv/bin/python3" ]; then
  PATH="$repo/.venv/bin:$PATH"
else
  PATH="/usr/bin:$PATH"
  PYTHONPATH="$repo/build/python:$repo/python${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi
export PATH
meridian=${MERIDIAN:-$(command -v meridian || echo "$repo/build/bin/meridian")}
exec "$meridian" run "$job" "$@"
