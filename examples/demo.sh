#!/usr/bin/env bash
# The README's demo: set up, build the example handler into a component, call it under budgets.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs: mighty itself (the test suite's .ci/setup adds the dev extras, 1.8 GB
# with torch, into the same .venv when you run it).
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet -e .
MTY=.venv/bin/mty
OUT=.mty-cache/demo
mkdir -p "$OUT"

step() { printf '\n\033[1m$ %s\033[0m\n' "$(printf '%q ' "$@")"; "$@"; }

step "$MTY" build examples/hello/handler.py -o "$OUT/hello.wasm"
step "$MTY" call "$OUT/hello.wasm" greet '"world"'
step "$MTY" call "$OUT/hello.wasm" word-stats '"the cat and the hat\nsat on the mat"'
step "$MTY" call "$OUT/hello.wasm" divide 1 0 --json
step "$MTY" call "$OUT/hello.wasm" checksum '{"base64": "aGVsbG8="}' --json
# A budget in action: far too little fuel for fib(90000) stops the guest with a typed error.
step "$MTY" call "$OUT/hello.wasm" fib 90000 --fuel 1000000 --json || echo "(exit status $? as expected: the guest ran out of fuel)"
