#!/usr/bin/env bash
# Make bench/gpu/wheels (ignored by git, carried to the GPU machine with the working tree): CPython 3.12 wheels of
# bench/gpu/requirements.txt and of the project. Run where pip reaches PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
rm -rf bench/gpu/wheels && mkdir -p bench/gpu/wheels
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d bench/gpu/wheels -r bench/gpu/requirements.txt
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w bench/gpu/wheels .
du -sh bench/gpu/wheels
