#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The PyTorch reference fixtures are committed; PyTorch is needed only to regenerate them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${TRIDENT_BUILD_DIR:-build}"
ctest --output-on-failure -j 1 "$@"
