#!/usr/bin/env bash
# trident without the CUDA libraries (kernels/cuda_plugin.h: the CUDA backend is a plugin).
#
#   no_cuda_libraries_test.sh ldd BUILD_DIR
#     `ldd BUILD_DIR/trident` lists no CUDA library (cudart, cublas, cudnn, nccl, nvrtc,
#     libcuda). The same pattern must match the plugin's own ldd (when it is built), so the
#     check is known to see CUDA libraries where they are.
#   no_cuda_libraries_test.sh hidden BUILD_DIR
#     In a private mount namespace (unshare -m) every directory holding a CUDA library the
#     plugin loads (ldd, ldconfig -p, a search of /usr /opt /root) is covered by an empty
#     one (a file in a system directory by /dev/null), so the plugin cannot load. There:
#     `trident train` (runtime.device auto) trains on the CPU, saying in one line why the
#     CUDA backend did not load, and runtime.device=cuda exits 2 naming the plugin's path
#     and the missing library. Without unshare or mount rights it exits 77 (ctest: skipped)
#     saying why.
set -euo pipefail
mode=${1:?usage: $0 ldd|hidden BUILD_DIR}
build=$(cd "${2:?usage: $0 ldd|hidden BUILD_DIR}" && pwd)
trident=$build/trident
plugin=$build/libtrident_cuda.so
cuda_re='lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|cuda)\.so'
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# (ldd's output is kept in a variable: `ldd | grep -q` can fail under pipefail when grep
# stops reading early.)
if [[ $mode == ldd ]]; then
  trident_ldd=$(ldd "$trident")
  echo "$trident_ldd"
  if grep -E "$cuda_re" <<< "$trident_ldd"; then
    fail "trident links a CUDA library (above)"
  else
    pass "ldd $trident lists no CUDA library"
  fi
  if [[ -f $plugin ]]; then
    plugin_ldd=$(ldd "$plugin")
    if grep -qE 'libcudart\.so' <<< "$plugin_ldd" && grep -qE 'libnccl\.so' <<< "$plugin_ldd"; then
      pass "the same pattern sees cudart and nccl in ldd $plugin"
    else
      fail "ldd $plugin shows no cudart/nccl: the pattern would miss them"
    fi
  else
    echo "note: no $plugin (a build without nvcc): only trident checked"
  fi
  exit $((fails > 0))
fi

[[ $mode == hidden ]] || { echo "unknown mode $mode" >&2; exit 2; }

# ---- inside the namespace (the script re-runs itself there) ------------------------------
if [[ ${NO_CUDA_INSIDE:-0} == 1 ]]; then
  work=$NO_CUDA_WORK
  mkdir -p "$work/empty"
  # The libraries to hide: what the plugin resolves now, what ld.so.cache lists, and any
  # copy in the usual places (a CUDA toolkit, pip wheels under nvidia/*/lib).
  {
    if [[ -f $plugin ]]; then ldd "$plugin" | awk '$3 ~ /^\// {print $3}'; fi
    ldconfig -p | awk '{print $NF}'
    find /usr /opt /root -xdev \( -name 'libcudart.so*' -o -name 'libcublas*.so*' \
      -o -name 'libcudnn*.so*' -o -name 'libnccl.so*' -o -name 'libnvrtc*.so*' \) \
      2>/dev/null || true
  } | { grep -E "$cuda_re" || true; } | while read -r f; do readlink -f "$f"; done |
    sort -u > "$work/libs"
  hidden=()
  declare -A covered=()
  while read -r lib; do
    [[ -e $lib ]] || continue
    dir=$(dirname "$lib")
    if [[ -e $dir/libc.so.6 || $dir == /usr/lib* && $dir != */cuda* ]]; then
      # A system directory: hide the file only (an empty file does not load either).
      mount --bind /dev/null "$lib"
      hidden+=("$lib")
    elif [[ -z ${covered[$dir]:-} ]]; then
      mount --bind "$work/empty" "$dir"
      covered[$dir]=1
      hidden+=("$dir")
    fi
  done < "$work/libs"
  echo "hidden (${#hidden[@]}): ${hidden[*]:-none}"
  if [[ -f $plugin ]]; then
    plugin_ldd=$(ldd "$plugin" || true)
    if ! grep -q 'libcudart.so.* => not found' <<< "$plugin_ldd"; then
      fail "cudart is still found after hiding: $(grep cudart <<< "$plugin_ldd")"
      exit 1
    fi
    grep 'not found' <<< "$plugin_ldd"
  fi

  cd "$work"
  for i in $(seq 1 300); do
    echo "The people of the land rejoiced, and the fox jumped over the dog $i times."
  done > corpus.txt
  "$trident" prepare --input corpus.txt --out data --tokenizer byte > prepare.log
  cat > tiny.yaml <<'EOF'
model: {arch: gpt2, vocab_size: 256, seq_len: 32, n_layers: 1, n_heads: 2, d_model: 32}
parallel: {micro_batch_size: 2}
data: {train: data/train_*.bin, val: data/val_*.bin}
training: {global_batch_size: 2, max_steps: 3, lr: 1.0e-3, eval_interval: 0}
checkpoint: {dir: ckpt, interval: 0}
logging: {metrics: metrics.jsonl, log_interval: 1}
runtime: {threads: 1}
EOF
  set +e
  "$trident" train --config tiny.yaml > auto.log 2>&1
  rc=$?
  "$trident" train --config tiny.yaml --set runtime.device=cuda > cuda.log 2>&1
  cuda_rc=$?
  set -e
  cat auto.log
  if [[ $rc -eq 0 ]] && grep -q 'backend: cpu' auto.log && grep -q 'done: 3 steps' auto.log; then
    pass "trident train (runtime.device auto) trained 3 steps on the CPU"
  else
    fail "trident train (auto) exit $rc, or no CPU run in its log"
  fi
  if [[ -f $plugin ]]; then
    if [[ $(grep -c 'the CUDA backend did not load' auto.log) -eq 1 ]] &&
       grep -qE "cannot load $plugin: lib.*(cannot open shared object file|file too short)" auto.log; then
      pass "auto says once why the CUDA backend did not load, naming the library"
    else
      fail "auto's log does not say once why the plugin did not load"
    fi
  fi
  cat cuda.log
  if [[ $cuda_rc -eq 2 ]]; then pass "runtime.device=cuda exits 2"; else fail "runtime.device=cuda exit $cuda_rc (want 2)"; fi
  if grep -q "runtime.device: cuda: the CUDA backend (libtrident_cuda.so) could not be loaded: cannot load $plugin: " cuda.log; then
    pass "the message names runtime.device and the path tried"
  else
    fail "the message does not name runtime.device and $plugin"
  fi
  if [[ -f $plugin ]]; then
    if grep -qE "cannot load $plugin: [^ ]*lib(cudart|cublasLt|cudnn|nccl)[^ ]*: (cannot open shared object file|file too short)" cuda.log; then
      pass "the message names the missing CUDA library (dlerror)"
    else
      fail "the message does not name the missing CUDA library"
    fi
  fi
  if grep -q 'step 1/' cuda.log; then fail "runtime.device=cuda ran a step"; fi
  exit $((fails > 0))
fi

# ---- outside: enter a private mount namespace, or skip ------------------------------------
if ! command -v unshare > /dev/null; then
  echo "SKIP: unshare(1) is not installed: cannot hide the CUDA libraries"
  exit 77
fi
if ! unshare -m true 2> /dev/null; then
  echo "SKIP: unshare -m is not permitted here (needs root or CAP_SYS_ADMIN): cannot hide" \
       "the CUDA libraries"
  exit 77
fi
work=$(mktemp -d /tmp/trident-nocuda.XXXXXX)
trap 'rm -rf "$work"' EXIT
# --propagation private: the bind mounts stay inside the namespace.
NO_CUDA_INSIDE=1 NO_CUDA_WORK=$work unshare -m --propagation private "$0" hidden "$build"
