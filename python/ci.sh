#!/usr/bin/env bash
# The Python package in CI: install the build and test requirements from PyPI, build and install finegemm with
# pip (scikit-build-core + nanobind; the C++ library compiles again, into the extension), then run the CPU suite.
# CUDA is left out here: the C++ build of .ci/run already compiles the CUDA code. Needs the apt packages that
# .ci/run installs (g++, cmake, ninja, OpenMP, nlohmann-json, OpenBLAS).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

echo "== python: installing build and test requirements"
"$PYTHON" -m pip install --quiet --disable-pip-version-check scikit-build-core nanobind numpy ml_dtypes pytest

echo "== python: pip install . (FINEGEMM_CUDA=OFF)"
start=$(date +%s)
# --no-build-isolation: the requirements above are the build's; pip then needs no second download.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation . \
  -C cmake.define.FINEGEMM_CUDA=OFF
echo "   built and installed in $(( $(date +%s) - start )) s"

echo "== python: pytest tests/python"
# Run from outside the source tree so that `import finegemm` finds the installed package, not python/finegemm.
cd tests/python
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider .
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "python: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
