#!/usr/bin/env bash
# The GPU check: one device call of at most 7.5 minutes that checks and times the CUDA
# backend on a GPU machine and returns the figures first.
#
#   scripts/gpu_check.sh --prepare [--jobs N]   here: build trident, the CUDA plugin
#       (libtrident_cuda.so, when the tree has the target trident_cuda), kernels_cuda_tests,
#       comm_nccl_tests and kernels_tests for sm_90 in build-gpu/, and pack stripped copies with the Debian
#       libraries they load into .gpu-carry/ (with the tree <= 64 MiB), plus Debian's
#       -dev packages for a build there should the binaries not start
#   scripts/gpu_check.sh --dry-run [--out D]    here, no GPU: every step that can run
#       without one, with the carried binaries run in a mount namespace where Debian's
#       library folders hold only glibc, libstdc++, libgcc and libgomp; prints the
#       planned step times against the budget
#   scripts/gpu_check.sh [--out D]              on the GPU machine ($OUT is the default)
#
# Options: --out DIR (results; default $OUT, else runs/gpu-check), --work DIR (scratch;
# default /tmp/trident-gpu-check), --build-dir DIR (--prepare: default build-gpu; the
# build there: default WORK/build), --budget S (whole-run deadline in seconds; default
# 450 on the GPU machine, 3600 for --dry-run), --steps LIST (comma list of env, binaries,
# smoke, plans, bench, parity, ops, nccl, sanitizer; default all, run in that order),
# --parity-steps N (default 30), --jobs N, --no-build-deps (--prepare: carry no -dev
# packages, so no build is possible there), --force-build (build there even when the
# carried binaries start; TRIDENT_GPU_CHECK_BUILD_CAP=S gives that build S seconds).
#
# The device tool call: run(command="scripts/gpu_check.sh", carry=[".gpu-carry"],
# timeout_s=480). The GPU machine runs the carried binaries; their CUDA libraries
# (cudart, cuBLASLt, cuDNN, NCCL) come from its PyTorch pip wheels (site-packages
# nvidia/*/lib, the toolkit's lib folder after them), and the env step says which files
# and versions were loaded.
#
# Steps, by value: env (GPU, driver, the CUDA libraries loaded, cores, memory); binaries
# (the carried ones start, else a build there); smoke (5 CUDA steps of configs/tiny.yaml:
# exit code, time to first step, steady step); plans (kernels_cuda_tests' cuDNN attention tests);
# bench (GPT-2 124M plain and cuDNN attention, Llama ~1B and GPT-2 350M with cuDNN, each
# beside PyTorch eager bf16; MFU against the datasheet and against a bf16 GEMM measured
# here); parity (tiny gpt2: CUDA vs CPU in fp32 and bf16, bf16 twice and a resume
# bitwise); ops (the op table's cuda rows, the other CUDA unit tests); nccl; sanitizer
# (compute-sanitizer memcheck of the GPU unit tests, API return codes not counted).
# A step runs only when binaries passed; after a failed smoke run, or a later CUDA
# training run that crashed or hung, the later ones are skipped with its log tail as the
# reason (a quick refusal with exit 2, a configuration error, blocks nothing).
#
# Results are written as they come: <out>/summary.md (rewritten after every step) and
# <out>/results.tgz (every log, metrics file and gtest XML, repacked after every step),
# so a run stopped at its limit still returns what it found. Statuses: PASS, FAIL,
# SKIPPED (not possible here, with the reason), NOT RUN (out of time). Exit 0 unless a
# check FAILed (a run cut short by the budget is NOT RUN, not a failure), 2 bad usage.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY="$ROOT/.gpu-carry"
MODE=check
OUT_DIR=${OUT:-}
WORK=${TMPDIR:-/tmp}/trident-gpu-check
BUILD=""
BUDGET=""
ALL_STEPS="env,binaries,smoke,plans,bench,parity,ops,nccl,sanitizer"
STEPS=$ALL_STEPS
PARITY_STEPS=30
JOBS=$(nproc)
BUILD_DEPS=1
FORCE_BUILD=0
CARRY_LIMIT=$((64 * 1024 * 1024))
RESERVE=8   # seconds kept at the end for the last summary and pack
MIN_RUN=8   # a run gets at least this many seconds, else it is NOT RUN

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --prepare) MODE=prepare ;;
    --dry-run) MODE=dry ;;
    --out) OUT_DIR=$2; shift ;;
    --work) WORK=$2; shift ;;
    --build-dir) BUILD=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --parity-steps) PARITY_STEPS=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --no-build-deps) BUILD_DEPS=0 ;;
    --force-build) FORCE_BUILD=1 ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
[[ $PARITY_STEPS =~ ^[0-9]+$ && $PARITY_STEPS -ge 2 && $((PARITY_STEPS % 2)) -eq 0 ]] ||
  { echo "gpu_check.sh: --parity-steps $PARITY_STEPS: expected an even integer >= 2" >&2; exit 2; }
[[ $JOBS =~ ^[0-9]+$ && $JOBS -ge 1 ]] || { echo "gpu_check.sh: --jobs $JOBS: expected an integer >= 1" >&2; exit 2; }
[[ -z $BUDGET ]] && { [[ $MODE == dry ]] && BUDGET=3600 || BUDGET=450; }
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget $BUDGET: expected seconds" >&2; exit 2; }
for s in ${STEPS//,/ }; do
  [[ ",$ALL_STEPS," == *",$s,"* ]] || { echo "gpu_check.sh: --steps: unknown step '$s' (known: $ALL_STEPS)" >&2; exit 2; }
done

# What the GPU machine is planned to spend per step: "step estimate cap" in seconds. The
# estimates are guesses from the model sizes and one H200 (nothing has run there yet);
# a cap bounds its step, the budget bounds them all, and the steps last in the list are
# the ones the deadline cuts.
PLAN=("env 15 40" "binaries 5 30" "smoke 20 60" "plans 25 90" "bench 130 300"
      "parity 60 150" "ops 30 90" "nccl 25 60" "sanitizer 60 150")
# The build there, only when the carried binaries do not start (TRIDENT_GPU_CHECK_BUILD_CAP:
# another limit, for trying that build on a slower machine).
BUILD_THERE_CAP=${TRIDENT_GPU_CHECK_BUILD_CAP:-240}

# Libraries: glibc's own and the CUDA ones are never carried (the GPU machine has newer
# ones, and the CUDA libraries come from its wheels). BOX_FIRST: carried, but the GPU
# machine's copy is used when it has one that defines every symbol version the carried
# binaries need (a newer libstdc++ or libgomp is what its other programs use too).
GLIBC_RE='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libnss_[a-z]+\.so\.2|libthread_db\.so\.1|linux-vdso\.so\.1)$'
CUDA_RE='^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z-]*|nvJitLink|cupti|nvToolsExt)\.so'
BOX_FIRST=(libstdc++.so.6 libgcc_s.so.1 libgomp.so.1 libz.so.1 libudev.so.1 libgfortran.so.5 libquadmath.so.0)
# The mount namespace of the dry run keeps only these in Debian's library folders.
NS_KEEP=(ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libmvec.so.1 libpthread.so.0 libdl.so.2
         librt.so.1 libresolv.so.2 libutil.so.1 libstdc++.so.6 libgcc_s.so.1 libgomp.so.1)
BINARIES=(trident kernels_cuda_tests comm_nccl_tests kernels_tests)
PLUGIN=libtrident_cuda.so
ARCH_LIB=usr/lib/x86_64-linux-gnu

now() { date +%s; }
human() { numfmt --to=iec-i --suffix=B "$1" 2>/dev/null || echo "$1 B"; }
LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)

# The compiled sources of the carried binaries, hashed the same way here and there.
src_hash() {
  (cd "$ROOT" && find CMakeLists.txt core kernels comm parallel model checkpoint data config plan trainer cli tests/kernels tests/comm/nccl \
     -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name CMakeLists.txt \) 2>/dev/null |
   LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
}
# Bytes of what a device call sends from this checkout: tracked and untracked-not-ignored.
tree_size() {
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
      xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  else
    du -sb "$ROOT" | cut -f1
  fi
}
header_version_cudnn() {  # cudnn_version.h -> 91900
  awk '/#define CUDNN_MAJOR /{a=$3} /#define CUDNN_MINOR /{b=$3} /#define CUDNN_PATCHLEVEL /{c=$3}
       END {if (a != "") printf "%d%02d%02d\n", a, b, c}' "$1"
}
header_version_nccl() { awk '/#define NCCL_VERSION_CODE /{print $3; exit}' "$1"; }
# ldd_pairs FILE...: "soname path" for every library the loader resolves ("not found"
# as the path when it cannot).
ldd_pairs() {
  local f
  for f in "$@"; do ldd "$f" 2>/dev/null; done | awk '
    $2 == "=>" && $3 == "not" {print $1, "not found"; next}
    $2 == "=>" && $3 ~ /^\// {print $1, $3; next}
    $1 ~ /^\// {n = split($1, p, "/"); print p[n], $1}' | sort -u
}
# Symbol versions the ELF files need from library LIB (objdump's "required from LIB:").
required_versions() {
  local lib=$1; shift
  objdump -p "$@" 2>/dev/null | awk -v lib="$lib" '
    /^  required from / {inside = ($3 == lib ":"); next}
    /^  required from|^[^ ]/ {inside = 0}
    inside && NF >= 4 {print $4}' | sort -u | paste -sd' '
}

# ======================================================================================
# --prepare: build here, pack .gpu-carry/
# ======================================================================================
# Debian 12 -dev packages for a build on the GPU machine (its fallback when the carried
# binaries do not start): every find_package / find_library of CMakeLists.txt it lacks.
DEBS=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0 libssl-dev libssl3
      libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
      libopenmpi-dev libopenmpi3 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libudev1 libgtest-dev)

prepare_build_deps() {  # prepare_build_deps STAGE: STAGE/deps.tar.gz, or return 1
  local stage=$1 deb
  mkdir -p "$stage/debs" "$stage/deps/prefix" "$stage/deps/cuda-headers"
  (cd "$stage/debs" && apt-get download "${DEBS[@]}") >"$stage/download.log" 2>&1 ||
    { tail -3 "$stage/download.log"; echo "prepare: apt-get download failed (is Debian's archive reachable? try apt-get update)" >&2; return 1; }
  for deb in "$stage"/debs/*.deb; do dpkg -x "$deb" "$stage/deps/prefix" || return 1; done
  local P="$stage/deps/prefix" L="$stage/deps/prefix/$ARCH_LIB"
  [[ -n $stage && -d $P ]] || return 1
  # What a build needs neither at build nor at run time: docs, static archives (GTest is
  # only static), Fortran/Java/SHMEM bindings, Open MPI's plugins (one process never calls
  # MPI_Init), LAPACK, executables.
  rm -rf "${P:?}/usr/share/doc" "$P/usr/share/man" "$P/usr/share/lintian" "${P:?}/usr/bin" "$P/usr/sbin" \
         "${P:?}/etc" "${P:?}/lib" "$L/fortran" "$L/openmpi/lib/openmpi3" "$L/pkgconfig" \
         "$L/openmpi/include/openshmem" "$L/openmpi/include/"*shmem* "$L/openblas-openmp/cmake"
  find "$P" \( -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' \) -delete
  rm -f "$L"/liboshmem* "$L"/libmpi_mpifh* "$L"/libmpi_usempi* "$L"/libmpi_java* "$L"/libompitrace* \
        "$L"/libmca_common_* "$L"/openmpi/lib/libmca_common_* "$L"/openmpi/lib/liboshmem* \
        "$L"/openmpi/lib/libmpi_mpifh* "$L"/openmpi/lib/libmpi_usempi* "$L"/openmpi/lib/libmpi_java* \
        "$L"/libpcre2-16* "$L"/libpcre2-32* "$L"/libpcre2-posix* "$L"/openblas-openmp/liblapack*
  find "$P" -xtype l -delete  # symlinks the pruning left dangling
  # cuDNN / NCCL headers of this toolkit, for a machine whose wheels come without them.
  cp /usr/local/cuda/include/cudnn*.h /usr/local/cuda/include/nccl.h "$stage/deps/cuda-headers/" 2>/dev/null ||
    echo "prepare: warning: no cuDNN/NCCL headers in /usr/local/cuda/include; none carried"
  tar -czf "$stage/deps.tar.gz" -C "$stage/deps" . || return 1
}

prepare() {
  local t0; t0=$(now)
  local B=${BUILD:-$ROOT/build-gpu}
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "prepare: FAILED: no nvcc (the CUDA toolkit builds the backend)" >&2; return 1; }
  command -v nvcc >/dev/null || PATH="/usr/local/cuda/bin:$PATH"
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # No RPATH: the binaries find every library on the library path, as they will there.
  # PRE_TEST discovery: building the tests does not run them (this machine has no GPU).
  echo "== configure $B (Release, sm_90)"
  mkdir -p "$B" || return 1
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_SKIP_RPATH=ON \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST "${launcher[@]}" >"$B/prepare-configure.log" 2>&1 ||
    { tail -20 "$B/prepare-configure.log"; echo "prepare: FAILED: cmake configure (log: $B/prepare-configure.log)" >&2; return 1; }
  local targets=("${BINARIES[@]}") plugin=0
  if grep -q '^trident_cuda:' < <(cmake --build "$B" --target help 2>/dev/null); then targets+=(trident_cuda); plugin=1; fi
  echo "== build ${targets[*]} with -j$JOBS"
  local tb; tb=$(now)
  if ! nice cmake --build "$B" -j "$JOBS" --target "${targets[@]}" >"$B/prepare-build.log" 2>&1; then
    grep -m3 -B2 -A6 'error' "$B/prepare-build.log" | head -40
    echo "prepare: FAILED: build (log: $B/prepare-build.log)" >&2; return 1
  fi
  echo "   built in $(( $(now) - tb )) s"
  local stage; stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu-carry.XXXXXX")
  trap 'rm -rf "$stage"' RETURN
  local rt="$stage/rt"; mkdir -p "$rt/bin" "$rt/lib" "$rt/fallback"
  local b
  for b in "${BINARIES[@]}"; do
    cp "$B/$b" "$rt/bin/" && strip --strip-unneeded "$rt/bin/$b" || { echo "prepare: FAILED: copy/strip $B/$b" >&2; return 1; }
  done
  if (( plugin )); then
    [[ -f $B/$PLUGIN ]] || { echo "prepare: FAILED: target trident_cuda built, but no $B/$PLUGIN" >&2; return 1; }
    cp "$B/$PLUGIN" "$rt/bin/" && strip --strip-unneeded "$rt/bin/$PLUGIN"
  fi
  # The Debian libraries they load, as this machine resolves them (OpenBLAS from the
  # folder CMake linked, as the build's RUNPATH would have it; the plugin from bin/,
  # which is on the library path there too).
  local blas_dir; blas_dir=$(dirname "$(sed -n 's/^TRIDENT_OPENBLAS:FILEPATH=//p' "$B/CMakeCache.txt")")
  local pairs; pairs=$(LD_LIBRARY_PATH="$rt/bin:$blas_dir" ldd_pairs "$rt"/bin/*)
  local missing; missing=$(awk '$2 == "not" {print $1}' <<<"$pairs" | paste -sd' ')
  [[ -z $missing ]] || { echo "prepare: FAILED: here the binaries cannot find $missing" >&2; return 1; }
  local soname path carried=() first=() skipped=()
  while read -r soname path; do
    [[ -z $soname || -e $rt/bin/$soname ]] && continue  # the plugin: carried in bin/
    if [[ $soname =~ $GLIBC_RE ]] || [[ $soname =~ $CUDA_RE ]]; then skipped+=("$soname"); continue; fi
    if [[ " ${BOX_FIRST[*]} " == *" $soname "* ]]; then
      cp -L "$path" "$rt/fallback/$soname"; first+=("$soname")
    else
      cp -L "$path" "$rt/lib/$soname"; carried+=("$soname")
    fi
  done <<<"$pairs"
  # Every carried file must find the others: what it needs beyond them is glibc's or CUDA's.
  local extra; extra=$(ldd_pairs "$rt"/lib/* "$rt"/fallback/* | awk '{print $1}' | grep -vE "$GLIBC_RE" | grep -vE "$CUDA_RE" |
                       while read -r s; do [[ -e $rt/lib/$s || -e $rt/fallback/$s || -e $rt/bin/$s ]] || echo "$s"; done | paste -sd' ')
  [[ -z $extra ]] || { echo "prepare: FAILED: the carried libraries need $extra, which no binary resolved" >&2; return 1; }
  # What the GPU machine's own copies must define for the BOX_FIRST libraries to be used.
  for soname in "${first[@]}"; do
    echo "$soname $(required_versions "$soname" "$rt"/bin/* "$rt"/lib/* "$rt"/fallback/*)"
  done >"$rt/fallback/REQUIRES"
  local glibc_min; glibc_min=$(objdump -p "$rt"/bin/* "$rt"/lib/* "$rt"/fallback/* 2>/dev/null |
                               grep -o 'GLIBC_2\.[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  rm -rf "$CARRY"; mkdir -p "$CARRY"
  tar -czf "$CARRY/runtime.tar.gz" -C "$rt" . || { echo "prepare: FAILED: tar" >&2; return 1; }
  local deps_note="none (--no-build-deps)" cudnn_v="" nccl_v=""
  if (( BUILD_DEPS )); then
    echo "== Debian -dev packages for a build there (${#DEBS[@]} packages)"
    if prepare_build_deps "$stage"; then
      mv "$stage/deps.tar.gz" "$CARRY/deps.tar.gz"
      [[ -f $stage/deps/cuda-headers/cudnn_version.h ]] && cudnn_v=$(header_version_cudnn "$stage/deps/cuda-headers/cudnn_version.h")
      [[ -f $stage/deps/cuda-headers/nccl.h ]] && nccl_v=$(header_version_nccl "$stage/deps/cuda-headers/nccl.h")
      deps_note="deps.tar.gz: ${#DEBS[@]} Debian 12 packages (dpkg -x, pruned), cuDNN $cudnn_v / NCCL $nccl_v headers"
    else
      deps_note="none: the download failed (no build possible there)"
      echo "prepare: warning: no deps.tar.gz; the GPU machine cannot build if the carried binaries do not start" >&2
    fi
  fi
  local commit; commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || commit="$commit+changes"
  {
    echo "CARRY_SRC_HASH=$(src_hash)"
    echo "CARRY_COMMIT=$commit"
    echo "CARRY_SOURCE_DIR=$ROOT"
    echo "CARRY_PLUGIN=$plugin"
    echo "CARRY_GLIBC_MIN=$glibc_min"
    echo "CARRY_CUDNN_HEADERS=$cudnn_v"
    echo "CARRY_NCCL_HEADERS=$nccl_v"
    echo "CARRY_RUNTIME_SHA256=$(sha256sum "$CARRY/runtime.tar.gz" | cut -d' ' -f1)"
    [[ -f $CARRY/deps.tar.gz ]] && echo "CARRY_DEPS_SHA256=$(sha256sum "$CARRY/deps.tar.gz" | cut -d' ' -f1)"
  } >"$CARRY/manifest.env"
  {
    echo "# .gpu-carry: made by scripts/gpu_check.sh --prepare on $(hostname), $(date -u +%FT%TZ), commit $commit"
    echo "# host: $(. /etc/os-release; echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION), $(nvcc --version | grep -o 'release [0-9.]*'), $(g++ --version | head -1)"
    echo "# runtime.tar.gz: bin/ (stripped ${BINARIES[*]}$( ((plugin)) && echo " $PLUGIN")), lib/ (first on the library path),"
    echo "#   fallback/ (used only where the GPU machine lacks a copy defining fallback/REQUIRES); needs glibc >= $glibc_min"
    echo "# $deps_note"
    echo "# not carried (glibc's own or CUDA's): ${skipped[*]}"
    for soname in "${carried[@]}" "${first[@]}"; do
      local f; f=$(awk -v s="$soname" '$1 == s {print $2}' <<<"$pairs")
      local pkg; pkg=$(dpkg -S "$f" 2>/dev/null || dpkg -S "$(readlink -f "$f")" 2>/dev/null); pkg=${pkg%%:*}
      printf '%-26s %9s  %s %s\n' "$soname" "$(stat -Lc %s "$f")" "${pkg:-?}" "$( [[ -n $pkg ]] && dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)"
    done
  } >"$CARRY/MANIFEST.txt"
  local carry_bytes tree_bytes total rt_bytes
  carry_bytes=$(du -sb "$CARRY" | cut -f1); tree_bytes=$(tree_size); total=$((carry_bytes + tree_bytes))
  rt_bytes=$(du -sb "$rt" | cut -f1)
  echo "== .gpu-carry:"
  (cd "$CARRY" && for f in *; do printf '   %-16s %10s\n' "$f" "$(human "$(stat -c %s "$f")")"; done)
  echo "   runtime.tar.gz unpacks to $(human "$rt_bytes"): bin/ $(ls "$rt/bin" | paste -sd' ')"
  echo "   lib/ ${carried[*]}"
  echo "   fallback/ ${first[*]}"
  echo "   needs glibc >= $glibc_min there; not carried: ${skipped[*]}"
  echo "   .gpu-carry $(human "$carry_bytes") + working tree $(human "$tree_bytes") = $(human "$total") of the $(human $CARRY_LIMIT) a device call carries"
  echo "   prepare took $(( $(now) - t0 )) s"
  if (( total > CARRY_LIMIT )); then
    echo "prepare: FAILED: the tree and .gpu-carry together are $(human "$total"), over $(human $CARRY_LIMIT)" >&2
    return 1
  fi
  git -C "$ROOT" check-ignore -q "$CARRY" 2>/dev/null ||
    echo "prepare: warning: $CARRY is not ignored by git; it must be (.gitignore: /.gpu-carry/), or it travels twice" >&2
  echo "prepare: OK; scripts/gpu_check.sh --dry-run checks the carried binaries here, run(..., carry=[\".gpu-carry\"]) takes them there"
}

if [[ $MODE == prepare ]]; then
  prepare; exit $?
fi

# ======================================================================================
# The check (on the GPU machine) and the dry run (here)
# ======================================================================================
START=$(now)
DEADLINE=$((START + BUDGET))
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [[ -x $d/nvcc ]] && { PATH="$d:$PATH"; break; }; done
fi
if ! command -v compute-sanitizer >/dev/null; then
  for d in "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")" /usr/local/cuda/compute-sanitizer; do
    [[ -x $d/compute-sanitizer ]] && { PATH="$PATH:$d"; break; }
  done
fi
export PATH
[[ -n $OUT_DIR ]] || OUT_DIR="$ROOT/runs/gpu-check"
[[ -n $BUILD ]] || BUILD="$WORK/build"
mkdir -p "$OUT_DIR" "$WORK" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RES="$WORK/results"          # everything that comes back, packed into $OUT_DIR/results.tgz
rm -rf "$RES"; mkdir -p "$RES"
: >"$RES/steps.tsv"; : >"$RES/checks.tsv"; : >"$RES/bench.tsv"
RT="$WORK/rt"                # the unpacked runtime.tar.gz
BIN=""                       # the folder of the binaries the steps run
TRI=()                       # command prefix for them: env LD_LIBRARY_PATH=... (or the namespace)
TRI_LD=""
CUDA_DIRS=()                 # the CUDA libraries' folders, wheels first
HAVE_GPU=0
CUDA_BLOCKED=""              # why later CUDA training runs are skipped
declare -A STEP_STATUS=()
STEP_END=$DEADLINE
HPY=$(command -v python3 || command -v /usr/bin/python3)  # stdlib helpers
PY=$HPY                      # the python with torch, when there is one (the env step)
for c in python3 /usr/bin/python3; do
  command -v $c >/dev/null && $c -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null &&
    { PY=$(command -v $c); break; }
done
G="$ROOT/scripts/gpu"

log() { echo "[$(date -u +%T) +$(( $(now) - START ))s] $*" | tee -a "$RES/check.log"; }
left() { echo $(( DEADLINE - $(now) )); }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
# limit OWN: LIMIT = OWN seconds, or what is left of the step's cap and the budget when
# that is less (LIMIT_CUT=1); 0 when under MIN_RUN seconds would remain.
limit() {
  local own=$1 end=$STEP_END avail
  (( end > DEADLINE - RESERVE )) && end=$((DEADLINE - RESERVE))
  avail=$(( end - $(now) ))
  LIMIT=$own; LIMIT_CUT=0
  if (( avail < own )); then LIMIT=$avail; LIMIT_CUT=1; fi
  (( LIMIT < MIN_RUN )) && LIMIT=0
  return 0
}
check() {  # check STEP NAME STATUS DETAIL (one line in the table whatever DETAIL holds)
  local d=${4//$'\n'/ }; d=${d//$'\t'/ }
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$d" >>"$RES/checks.tsv"
  log "  $3 $2: $d"
}
# The step's status from its checks: FAIL if any failed, PASS if any passed, NOT RUN if
# any ran out of time, else SKIPPED.
checks_status() {
  local s; s=$(awk -F'\t' -v st="$1" '$1 == st {print $3}' "$RES/checks.tsv")
  if grep -qx FAIL <<<"$s"; then echo FAIL; elif grep -qx PASS <<<"$s"; then echo PASS
  elif grep -qx 'NOT RUN' <<<"$s"; then echo 'NOT RUN'; else echo SKIPPED; fi
}
checks_detail() {
  awk -F'\t' -v st="$1" '$1 == st {n[$3]++} END {for (k in n) {printf "%s%d %s", sep, n[k], k; sep = ", "}}' "$RES/checks.tsv"
}
step_done() {  # step_done NAME T0 [DETAIL]: status from its checks
  local status; status=$(checks_status "$1")
  STEP_STATUS[$1]=$status
  printf '%s\t%s\t%s\t%s\n' "$1" "$status" "$(( $(now) - $2 ))" "${3:-$(checks_detail "$1")}" >>"$RES/steps.tsv"
  log "== step $1: $status ($(( $(now) - $2 )) s)"
  write_summary; pack
}
tail_of() { grep -v '^\[ *[0-9.]*\] \$ ' "$1" 2>/dev/null | sed 's/^\[ *[0-9.]*\] //' | grep -v '^timed_run: exit' | tail -"${2:-2}" | paste -sd' ' | cut -c1-300; }
# fig SECTION TEXT: a line of the summary's figures (sections smoke, plans, parity; the
# benchmark table has its own file).
fig() { local sec=$1; shift; echo "$*" >>"$RES/fig_$sec.md"; }
figures() {  # the figures, most valuable first
  [[ -s $RES/fig_smoke.md ]] && { echo; cat "$RES/fig_smoke.md"; }
  [[ -s $RES/fig_plans.md ]] && { echo; cat "$RES/fig_plans.md"; }
  if [[ -s $RES/bench.tsv ]]; then
    echo
    echo "## Benchmark: one GPU, bf16, one micro-batch per step, mean of the timed steps"
    echo
    [[ -f $RES/bench/gemm_peak.txt ]] && { cat "$RES/bench/gemm_peak.txt"; echo; }
    "$HPY" "$G/bench_report.py" --header
    cat "$RES/bench.tsv"
  fi
  [[ -s $RES/fig_parity.md ]] && { echo; cat "$RES/fig_parity.md"; }
}

write_summary() {
  local f="$RES/summary.md"
  {
    echo "# Trident GPU check ($([[ $MODE == dry ]] && echo 'dry run, no GPU' || echo 'GPU run')), $(date -u +%FT%TZ)"
    echo
    [[ -f $RES/env/brief.txt ]] && { sed 's/^/    /' "$RES/env/brief.txt"; echo; }
    echo "Elapsed $(( $(now) - START )) s of a $BUDGET s budget. Everything else: results.tgz (logs, metrics, gtest XML)."
    echo
    echo "| step | status | s | detail |"
    echo "|---|---|---|---|"
    awk -F'\t' '{printf "| %s | **%s** | %s | %s |\n", $1, $2, $3, $4}' "$RES/steps.tsv"
    figures
    echo
    echo "## Checks"
    echo
    echo "| step | check | status | detail |"
    echo "|---|---|---|---|"
    awk -F'\t' '{d = $4; gsub(/\|/, "\\|", d); printf "| %s | %s | %s | %s |\n", $1, $2, $3, d}' "$RES/checks.tsv"
    if [[ -f $RES/plan.txt ]]; then echo; echo '```'; cat "$RES/plan.txt"; echo '```'; fi
  } >"$f.tmp" && mv "$f.tmp" "$f"
  cp "$f" "$OUT_DIR/summary.md"
}
# Everything into one tarball (a device call returns at most 8 files of 16 MiB); a log
# over 2 MiB keeps its first and last MiB.
pack() {
  local f
  while IFS= read -r -d '' f; do
    { head -c 1048576 "$f"; printf '\n[... %s bytes cut by gpu_check.sh ...]\n' "$(stat -c %s "$f")"; tail -c 1048576 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
  done < <(find "$RES" -type f -size +2M -print0)
  tar -czf "$OUT_DIR/results.tgz.tmp" -C "$WORK" results 2>/dev/null && mv "$OUT_DIR/results.tgz.tmp" "$OUT_DIR/results.tgz"
  # A file comes back only under 16 MiB: past 15, the logs keep their last 256 KiB.
  if (( $(stat -c %s "$OUT_DIR/results.tgz" 2>/dev/null || echo 0) > 15 * 1024 * 1024 )); then
    while IFS= read -r -d '' f; do tail -c 262144 "$f" >"$f.cut" && mv "$f.cut" "$f"; done < <(find "$RES" -type f -size +256k -print0)
    tar -czf "$OUT_DIR/results.tgz.tmp" -C "$WORK" results 2>/dev/null && mv "$OUT_DIR/results.tgz.tmp" "$OUT_DIR/results.tgz"
  fi
}
print_plan() {
  local e c n s est=0 caps=0
  {
    echo "Planned on the GPU machine (seconds; estimates are guesses until a GPU run measures them):"
    printf '  %-10s %8s %6s %12s\n' step estimate cap "cumulative"
    for e in "${PLAN[@]}"; do
      read -r n s c <<<"$e"
      est=$((est + s)); caps=$((caps + c))
      printf '  %-10s %8s %6s %12s\n' "$n" "$s" "$c" "$est"
    done
    echo "  total: estimate $est s of the ${1:-450} s budget ($(( ${1:-450} - est )) s to spare); the caps add up to $caps s, so the deadline"
    echo "  cuts the last steps first (sanitizer, nccl, ops), reported NOT RUN. A build there (only when the carried"
    echo "  binaries do not start) adds up to $BUILD_THERE_CAP s and leaves the later steps to the deadline."
  } >"$RES/plan.txt"
  cat "$RES/plan.txt"
}

# ---- running things ----------------------------------------------------------------
# trun LOG LIMIT JSON [timed_run options] -- CMD...: CMD under timed_run.py (timestamped log).
trun() {
  local logf=$1 t=$2 json=$3; shift 3
  "$HPY" "$G/timed_run.py" --log "$logf" --timeout "$t" --json "$json" "$@"
}
# outcome RC: PASS, FAIL (exit status, or a hang: no exit within its own limit) or NOT RUN
# (cut short by the step's cap or the budget).
outcome() {
  if (( $1 == 0 )); then echo PASS
  elif (( $1 == 124 && LIMIT_CUT )); then echo 'NOT RUN'
  else echo FAIL; fi
}
why() {  # why RC LOG: one line for a run's failure
  if (( $1 == 124 && LIMIT_CUT )); then echo "cut at $LIMIT s by the budget; $(tail_of "$2" 1)"
  elif (( $1 == 124 )); then echo "no exit within its $LIMIT s (hung, or slower than planned): $(tail_of "$2" 2)"
  else echo "exit $1: $(tail_of "$2" 2)"; fi
}
json_field() { "$HPY" -c 'import json,sys
try: v = json.load(open(sys.argv[1]))
except Exception: v = {}
for k in sys.argv[2].split("."): v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v)' "$1" "$2"; }

# train NAME OWN_LIMIT CONFIG [--cuda] [--resume DIR] [--env K=V]... [--set K=V]...: one
# `trident train` under WORK/runs/NAME (metrics, checkpoints); sets RUN_RC, RUN_STATUS,
# RUN_WHY, RUN_DIR. A CUDA run is skipped after the first one that crashed or hung. No
# checkpoint unless the sets ask for one (a final save of a benchmark's model would be
# timed with it): parity's checkpoint.interval is half its even step count, so its last
# step is still saved.
train() {
  local name=$1 own=$2 cfg=$3; shift 3
  local cuda=0 resume=none envs=() sets=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --cuda) cuda=1 ;;
      --resume) resume=$2; shift ;;
      --env) envs+=("$2"); shift ;;
      --set) sets+=(--set "$2"); shift ;;
    esac
    shift
  done
  RUN_DIR="$WORK/runs/$name"; rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR/ckpt" "$RES/runs"
  RUN_RC=0; RUN_WHY=""
  if (( cuda )) && [[ -n $CUDA_BLOCKED ]]; then RUN_STATUS=SKIPPED; RUN_WHY=$CUDA_BLOCKED; return; fi
  if [[ $resume != none ]]; then
    [[ -d $resume ]] || { RUN_STATUS=FAIL; RUN_WHY="no checkpoint $resume to resume from"; return; }
    cp -r "$resume" "$RUN_DIR/ckpt/"; resume="$RUN_DIR/ckpt/$(basename "$resume")"
  fi
  limit "$own"
  if (( LIMIT == 0 )); then RUN_STATUS='NOT RUN'; RUN_WHY="out of time ($(left) s left)"; return; fi
  local logf="$RES/runs/$name.log"
  trun "$logf" "$LIMIT" "$RES/runs/$name.json" --mark "backend=^info: backend:" \
    --mark "first_step=\bstep 1/" --mark "done=^info: done:" --maps "$RES/runs/$name.maps" --maps-at '\bstep 2/' -- \
    "${TRI[@]}" env NCCL_DEBUG=WARN "${envs[@]}" "$BIN/trident" train --config "$ROOT/$cfg" --resume "$resume" \
    --set "data.train=$WORK/data/train_*.bin" --set data.val= --set training.eval_interval=0 \
    --set checkpoint.dir="$RUN_DIR/ckpt" --set checkpoint.interval=0 --set checkpoint.save_final=false \
    --set logging.metrics="$RUN_DIR/metrics.jsonl" --set logging.log_interval=1 "${sets[@]}"
  RUN_RC=$?
  cp "$RUN_DIR/metrics.jsonl" "$RES/runs/$name.metrics.jsonl" 2>/dev/null
  RUN_STATUS=$(outcome "$RUN_RC")
  [[ $RUN_STATUS == PASS ]] || RUN_WHY=$(why "$RUN_RC" "$logf")
  # A refusal with exit 2 (a configuration error, such as the memory plan's) is quick and
  # says nothing about the next run; a crash or a hang does.
  if (( cuda )) && [[ $RUN_STATUS == FAIL ]] && (( RUN_RC != 2 )) && [[ -z $CUDA_BLOCKED ]]; then
    CUDA_BLOCKED="skipped after the first failed CUDA training run ($name: $RUN_WHY)"
  fi
}
ran() { [[ -s $WORK/runs/$1/metrics.jsonl && -f $WORK/runs/$1/.ok ]]; }
train_check() {  # train_check STEP NAME ARGS...: train, record a check unless it passed
  local st=$1 name=$2; shift
  train "$@"
  if [[ $RUN_STATUS == PASS ]]; then touch "$RUN_DIR/.ok"; else check "$st" "run $name" "$RUN_STATUS" "$RUN_WHY"; fi
}
# steps_mean NAME FIRST LAST: mean step_ms of the run's steps FIRST..LAST
steps_mean() {
  "$HPY" -c 'import json,sys
v = []
for line in open(sys.argv[1]):
    try: r = json.loads(line)
    except Exception: continue
    if isinstance(r, dict) and "step_ms" in r and int(sys.argv[2]) <= r["step"] <= int(sys.argv[3]): v.append(r["step_ms"])
print(f"{sum(v)/len(v):.1f}" if v else "")' "$WORK/runs/$1/metrics.jsonl" "$2" "$3" 2>/dev/null
}

gtest_counts() {  # gtest_counts XML -> "tests failures skipped"
  "$HPY" - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
n = f = s = 0
for c in root.iter("testcase"):
    n += 1
    if c.find("failure") is not None or c.find("error") is not None: f += 1
    elif c.get("result") == "skipped" or c.find("skipped") is not None: s += 1
print(n, f, s)
EOF
}
# gtest_run STEP NAME BINARY OWN_LIMIT [ENV...] -- GTEST_ARGS...: one gtest binary, one check.
gtest_run() {
  local st=$1 name=$2 bin=$3 own=$4; shift 4
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  mkdir -p "$RES/$st"
  if [[ ! -x $BIN/$bin ]]; then check "$st" "$name" SKIPPED "$bin not carried or built"; return; fi
  limit "$own"
  if (( LIMIT == 0 )); then check "$st" "$name" 'NOT RUN' "out of time ($(left) s left)"; return; fi
  local xml="$RES/$st/$name.xml" logf="$RES/$st/$name.log"
  trun "$logf" "$LIMIT" "$RES/$st/$name.json" -- "${TRI[@]}" env "${envs[@]}" "$BIN/$bin" "$@" --gtest_output="xml:$xml"
  local rc=$?
  local n f s; read -r n f s <<<"$(gtest_counts "$xml")"
  local what="$n tests, $f failed, $s skipped${envs[*]:+ (${envs[*]})}"
  local skipped; skipped=$(grep -o '\[  SKIPPED \] [A-Za-z][A-Za-z0-9_]*\.[A-Za-z0-9_./]*' "$logf" | cut -c14- | sort -u | head -4 | paste -sd' ')
  if (( rc == 124 )); then check "$st" "$name" "$(outcome 124)" "$(why 124 "$logf"); $what"
  elif (( rc != 0 || f > 0 )); then check "$st" "$name" FAIL "$what, exit $rc: $(grep -m3 '^\[ *[0-9.]*\] \[  FAILED  \]' "$logf" | sed 's/^\[ *[0-9.]*\] //' | paste -sd' ' | cut -c1-300)"
  elif (( n == 0 )); then check "$st" "$name" FAIL "no tests matched $*"
  elif (( s == n && HAVE_GPU == 1 )); then check "$st" "$name" FAIL "$what: every test skipped on a GPU machine: $(grep -m1 -A1 'SKIPPED\|Skipped' "$logf" | tail -1 | cut -c1-200)"
  elif (( s == n )); then check "$st" "$name" SKIPPED "$what: every test skipped (no GPU)"
  else check "$st" "$name" PASS "$what${skipped:+; skipped: $skipped}"
  fi
}

# ======================================================================================
# step env: the machine, the GPU, PyTorch, the CUDA libraries, the carried binaries
# ======================================================================================
# Carried BOX_FIRST libraries the machine lacks (or has without a symbol version the
# binaries need) are linked into DIR; HAVE is a command answering "is SONAME here, good".
fallback_links() {  # fallback_links DIR HAVE_CMD
  local dir=$1 have=$2 soname vers; rm -rf "$dir"; mkdir -p "$dir"
  while read -r soname vers; do
    [[ -z $soname ]] && continue
    if ! $have "$soname" "$vers"; then ln -s "$RT/fallback/$soname" "$dir/$soname"; echo "$soname"; fi
  done <"$RT/fallback/REQUIRES"
}
box_has() {  # box_has SONAME "VERSION...": the machine's copy defines every version
  local path v; path=$("$LDCONFIG" -p 2>/dev/null | awk -v n="$1" '$1 == n && /x86-64/ {print $NF; exit}')
  [[ -n $path && -f $path ]] || return 1
  local defined; defined=$(tr '\0' '\n' <"$path" | grep -E '^[A-Z_]+_[0-9][0-9.]*$' | sort -u)
  for v in $2; do grep -qxF "$v" <<<"$defined" || return 1; done
}
ns_has() { [[ " ${NS_KEEP[*]} " == *" $1 "* ]]; }

step_env() {
  local t0; t0=$(now); local E="$RES/env"; mkdir -p "$E"
  {
    echo "## host"; uname -a; (. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}")
    lscpu 2>/dev/null | grep -m1 'Model name'; echo "cores: $(nproc)"; free -g 2>/dev/null | head -2
    getconf GNU_LIBC_VERSION
    echo "## tools"
    for t in gcc g++ nvcc cmake ninja compute-sanitizer nvidia-smi python3; do printf '%-18s %s\n' "$t" "$(command -v $t || echo 'NOT FOUND')"; done
    nvcc --version 2>&1 | tail -2; g++ --version 2>&1 | head -1
  } >"$E/report.txt" 2>&1
  local brief="$E/brief.txt"
  echo "host: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(getconf GNU_LIBC_VERSION), $(nproc) cores ($(lscpu 2>/dev/null | grep -m1 'Model name' | sed 's/.*: *//')), memory $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB, " $7 " GiB available"}')" >"$brief"
  # The GPU
  if [[ $MODE == check ]]; then
    if nvidia-smi >"$E/nvidia-smi.txt" 2>&1; then
      HAVE_GPU=1
      local g; g=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)
      echo "GPU: $g (name, driver, memory, compute capability, max SM clock)" >>"$brief"
      check env gpu PASS "$g"
    else
      check env gpu FAIL "nvidia-smi failed: $(tail -1 "$E/nvidia-smi.txt")"
    fi
  else
    check env gpu SKIPPED "no GPU (dry run)"
  fi
  # PyTorch and its wheels
  timeout 90 "$PY" "$G/gpu_env.py" probe --json "$E/probe.json" >"$E/probe.log" 2>&1
  local torch_v; torch_v=$(json_field "$E/probe.json" torch.version)
  if [[ -n $torch_v ]]; then
    local tc tn tl; tc=$(json_field "$E/probe.json" torch.cuda); tn=$(json_field "$E/probe.json" torch.cudnn); tl=$(json_field "$E/probe.json" torch.nccl)
    local tline="torch $torch_v (CUDA ${tc:-none}, cuDNN ${tn:-none}, NCCL ${tl:-none}), python $(json_field "$E/probe.json" python)"
    local w; w=$("$HPY" -c 'import json,sys
try: print(", ".join(w["name"] + " " + w["version"] for w in json.load(open(sys.argv[1]))["wheels"]))
except Exception: pass' "$E/probe.json")
    tline="$tline; wheels: ${w:-none}"
    echo "$tline" >>"$brief"
    if [[ $MODE == check && $(json_field "$E/probe.json" torch.cuda_available) != True ]]; then
      check env torch FAIL "$tline, but torch.cuda.is_available() is false: no PyTorch baseline or GEMM peak"
    else
      check env torch PASS "$tline"
    fi
  else
    check env torch "$([[ $MODE == check ]] && echo FAIL || echo SKIPPED)" "no python3 with torch: $(json_field "$E/probe.json" torch.error)"
  fi
  # The CUDA libraries: the wheels' folders first, then the toolkit's.
  CUDA_DIRS=()
  local d
  while read -r d; do [[ -n $d ]] && CUDA_DIRS+=("$d"); done < <("$HPY" -c 'import json,sys
try: print("\n".join(json.load(open(sys.argv[1])).get("libdirs", [])))
except Exception: pass' "$E/probe.json")
  local cuda_home; cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
  for d in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib"; do
    compgen -G "$d/libcudart.so*" >/dev/null && CUDA_DIRS+=("$(readlink -f "$d")")
  done
  mapfile -t CUDA_DIRS < <(printf '%s\n' "${CUDA_DIRS[@]}" | awk 'NF && !seen[$0]++')
  echo "CUDA library folders, in search order: ${CUDA_DIRS[*]:-none}" >>"$E/report.txt"
  # The carried runtime
  if [[ -f $CARRY/runtime.tar.gz && -f $CARRY/manifest.env ]]; then
    # shellcheck disable=SC1091
    . "$CARRY/manifest.env"
    if [[ ! -f $RT/.sha256 || $(cat "$RT/.sha256") != "$CARRY_RUNTIME_SHA256" ]]; then
      rm -rf "$RT"; mkdir -p "$RT"
      tar -xzf "$CARRY/runtime.tar.gz" -C "$RT" && echo "$CARRY_RUNTIME_SHA256" >"$RT/.sha256"
    fi
    local here; here=$(src_hash)
    local carried_line="carried: commit $CARRY_COMMIT, sources $CARRY_SRC_HASH, $(ls "$RT/bin" | paste -sd' '); needs glibc >= $CARRY_GLIBC_MIN"
    echo "$carried_line" >>"$brief"
    if [[ $here == "$CARRY_SRC_HASH" ]]; then
      check env carried PASS "$carried_line; built from this tree's sources"
    else
      check env carried FAIL "$carried_line; this tree's sources hash to $here: the carried binaries are of other code (rerun --prepare); the figures below are theirs"
    fi
    local box_glibc; box_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
    if [[ $(printf '%s\n%s\n' "$CARRY_GLIBC_MIN" "$box_glibc" | sort -V | head -1) != "$CARRY_GLIBC_MIN" ]]; then
      check env glibc FAIL "glibc $box_glibc here, the carried binaries need $CARRY_GLIBC_MIN"
    fi
    # The golden-trace test reads its data from the source folder compiled in.
    if [[ $MODE == check && ${CARRY_SOURCE_DIR:-} != "$ROOT" && ! -e ${CARRY_SOURCE_DIR:-/} ]]; then
      mkdir -p "$(dirname "$CARRY_SOURCE_DIR")" && ln -s "$ROOT" "$CARRY_SOURCE_DIR" &&
        echo "linked $CARRY_SOURCE_DIR -> $ROOT (the source folder compiled into kernels_cuda_tests)" >>"$E/report.txt"
    fi
    local used
    if [[ $MODE == dry ]]; then used=$(fallback_links "$RT/fallback-used" ns_has | paste -sd' ')
    else used=$(fallback_links "$RT/fallback-used" box_has | paste -sd' '); fi
    echo "carried libraries used because $([[ $MODE == dry ]] && echo 'the namespace' || echo 'this machine') has no good copy: ${used:-none}" >>"$E/report.txt"
    TRI_LD="$RT/bin:$RT/lib:$RT/fallback-used"
    local d2; for d2 in "${CUDA_DIRS[@]}"; do TRI_LD="$TRI_LD:$d2"; done
    # Which CUDA library files the carried binaries resolve, and their versions.
    local files=("$RT"/bin/*)
    LD_LIBRARY_PATH="$TRI_LD" ldd_pairs "${files[@]}" >"$E/ldd_carried.txt"
    "$HPY" "$G/gpu_env.py" resolve "$E/ldd_carried.txt" --probe "$E/probe.json" >"$E/cuda_libs.txt" 2>&1
    sed 's/^/loads /' "$E/cuda_libs.txt" >>"$brief"
    local nf; nf=$(awk '$2 == "not" {print $1}' "$E/ldd_carried.txt" | sort -u | paste -sd' ')
    local need=(libcudart libcublasLt libcudnn) lib absent=()
    [[ -f $RT/bin/$PLUGIN ]] || grep -q '^libnccl' "$E/ldd_carried.txt" && need+=(libnccl)
    for lib in "${need[@]}"; do grep -q "^$lib\.so[^ ]* /" "$E/ldd_carried.txt" || absent+=("$lib"); done
    if [[ -n $nf || ${#absent[@]} -gt 0 ]]; then
      check env libraries FAIL "the carried binaries find no ${nf:-}${absent[*]:+ ${absent[*]}} (CUDA folders: ${CUDA_DIRS[*]:-none})"
    else
      check env libraries PASS "$(paste -sd';' "$E/cuda_libs.txt" | sed 's/;/; /g' | cut -c1-500)"
    fi
  else
    check env carried FAIL "no $CARRY/runtime.tar.gz: run scripts/gpu_check.sh --prepare here and carry .gpu-carry"
  fi
  step_done env "$t0"
}

# ======================================================================================
# step binaries: the carried binaries start (dry run: in a namespace without Debian's
# libraries), else a build there
# ======================================================================================
NS=""
ns_setup() {  # the dry run's mount namespace; sets TRI, or returns 1 with NS_WHY
  command -v unshare >/dev/null || { NS_WHY="no unshare"; return 1; }
  unshare -m true 2>/dev/null || { NS_WHY="unshare -m is not permitted here (needs root or CAP_SYS_ADMIN)"; return 1; }
  NS="$WORK/ns"; rm -rf "$NS"; mkdir -p "$NS/usrlib/x86_64-linux-gnu" "$NS/cuda"
  local f
  for f in "${NS_KEEP[@]}"; do
    [[ -e /usr/lib/x86_64-linux-gnu/$f ]] && cp -L "/usr/lib/x86_64-linux-gnu/$f" "$NS/usrlib/x86_64-linux-gnu/"
  done
  local cuda=${CUDA_DIRS[0]:-}
  [[ -n $cuda ]] || { NS_WHY="no CUDA library folder found"; return 1; }
  local ld="$RT/bin:$RT/lib:$RT/fallback-used:$NS/cuda"
  # Mounted before the last bind replaces /usr/lib: everything after it (env, the
  # binaries) loads from the kept set, the carried folders and the CUDA folder only.
  cat >"$NS/enter.sh" <<EOF
#!/bin/bash
set -e
mount --bind '$cuda' '$NS/cuda'
mount -t tmpfs tmpfs /usr/local
mount --bind /dev/null /etc/ld.so.cache
mount --bind '$NS/usrlib' /usr/lib
set +e
exec /usr/bin/env LD_LIBRARY_PATH='$ld' "\$@"
EOF
  chmod +x "$NS/enter.sh"
  NS_LD=$ld
  TRI=(unshare -m "$NS/enter.sh")
}
# ns_list BINARY: what the loader resolves inside the namespace; prints "soname path".
ns_list() { "${TRI[@]}" /lib64/ld-linux-x86-64.so.2 --list "$1" 2>&1 | awk '
  $2 == "=>" && $3 == "not" {print $1, "NOT-FOUND"; next}
  $2 == "=>" {print $1, $3; next}
  $1 ~ /^\// {n = split($1, p, "/"); print p[n], $1}'; }

build_there() {  # the fallback: configure and build against the carried -dev packages
  local B="$RES/build"; mkdir -p "$B"
  if [[ ! -f $CARRY/deps.tar.gz ]]; then check binaries build FAIL "no $CARRY/deps.tar.gz (prepare ran with --no-build-deps or its download failed)"; return 1; fi
  command -v nvcc >/dev/null && command -v cmake >/dev/null || { check binaries build FAIL "no nvcc or cmake here"; return 1; }
  local DEPS="$WORK/deps"
  if [[ ! -f $DEPS/.sha256 || $(cat "$DEPS/.sha256") != "${CARRY_DEPS_SHA256:-}" ]]; then
    rm -rf "$DEPS"; mkdir -p "$DEPS"
    tar -xzf "$CARRY/deps.tar.gz" -C "$DEPS" && echo "${CARRY_DEPS_SHA256:-}" >"$DEPS/.sha256"
  fi
  local P="$DEPS/prefix" L="$DEPS/prefix/$ARCH_LIB"
  # cuDNN, NCCL, cuBLASLt from the CUDA folders; headers beside them, else the carried ones.
  local cudnn="" nccl="" lt="" d
  for d in "${CUDA_DIRS[@]}"; do
    [[ -z $cudnn ]] && cudnn=$(ls "$d"/libcudnn.so.9 "$d"/libcudnn.so 2>/dev/null | head -1)
    [[ -z $nccl ]] && nccl=$(ls "$d"/libnccl.so.2 "$d"/libnccl.so 2>/dev/null | head -1)
    [[ -z $lt ]] && lt=$(ls "$d"/libcublasLt.so.1* "$d"/libcublasLt.so 2>/dev/null | head -1)
  done
  inc_of() { local x; for x in "$(dirname "$1")/../include" "$(dirname "$1")/../../include"; do [[ -f $x/$2 ]] && { (cd "$x" && pwd); return; }; done; echo "$DEPS/cuda-headers"; }
  local args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_SKIP_RPATH=ON
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST -DCMAKE_PREFIX_PATH="$P/usr"
    -Dspdlog_DIR="$L/cmake/spdlog" -Dfmt_DIR="$L/cmake/fmt" -Dyaml-cpp_DIR="$L/cmake/yaml-cpp"
    -Dnlohmann_json_DIR="$P/usr/share/cmake/nlohmann_json" -DGTest_DIR="$L/cmake/GTest"
    -DTRIDENT_OPENBLAS="$L/openblas-openmp/libopenblas.so.0"
    -DTRIDENT_CBLAS_INCLUDE="$P/usr/include/x86_64-linux-gnu/openblas-openmp"
    -DTRIDENT_XXHASH_INCLUDE="$P/usr/include" -DTRIDENT_XXHASH="$L/libxxhash.so"
    -DTRIDENT_PCRE2_INCLUDE="$P/usr/include" -DTRIDENT_PCRE2="$L/libpcre2-8.so"
    -DOPENSSL_ROOT_DIR="$P/usr" -DOPENSSL_INCLUDE_DIR="$P/usr/include"
    -DOPENSSL_CRYPTO_LIBRARY="$L/libcrypto.so" -DOPENSSL_SSL_LIBRARY="$L/libssl.so"
    # FindMPI: LIB_NAMES + COMPILER_INCLUDE_DIRS given = no wrapper, pkg-config or guessing.
    -DMPI_CXX_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$L/openmpi/lib/libmpi.so"
    -DMPI_CXX_HEADER_DIR="$L/openmpi/include" -DMPI_CXX_COMPILER_INCLUDE_DIRS="$L/openmpi/include"
    -DMPI_CXX_SKIP_MPICXX=ON -DMPIEXEC_EXECUTABLE=/bin/false -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  [[ -n $cudnn ]] && args+=(-DTRIDENT_CUDNN="$cudnn" -DTRIDENT_CUDNN_INCLUDE="$(inc_of "$cudnn" cudnn.h)")
  [[ -n $nccl ]] && args+=(-DTRIDENT_NCCL="$nccl" -DTRIDENT_NCCL_INCLUDE="$(inc_of "$nccl" nccl.h)")
  [[ -n $lt ]] && args+=(-DCUDA_cublasLt_LIBRARY="$lt")
  local dep_ld="$L:$L/openblas-openmp:$L/openmpi/lib"
  limit 60
  if (( LIMIT == 0 )) || ! LD_LIBRARY_PATH="$dep_ld" timeout -k 5 "$LIMIT" cmake "${args[@]}" >"$B/configure.log" 2>&1; then
    check binaries build FAIL "cmake configure failed: $(grep -m1 -A2 'CMake Error' "$B/configure.log" | tr '\n' ' ' | cut -c1-300)"; return 1
  fi
  # Nothing from the system where a carried package exists (on a machine that has them
  # all, this is what shows that one without them will find everything).
  local leaked; leaked=$(grep -oE '(-I|-isystem |^| )/usr(/local)?/(lib|include)[^ ]*(yaml-cpp|spdlog|fmt|mpi|xxhash|pcre2|openblas|gtest|nlohmann)[^ ]*' "$BUILD/build.ninja" |
                         sed 's/^ *//' | sort -u | head -5 | paste -sd' ')
  if [[ -n $leaked ]]; then check binaries build FAIL "the configure found these outside the carried packages: $leaked"; return 1; fi
  local targets=("${BINARIES[@]}")
  grep -q '^trident_cuda:' < <(cmake --build "$BUILD" --target help 2>/dev/null) && targets+=(trident_cuda)
  local tb; tb=$(now)
  limit "$BUILD_THERE_CAP"
  if (( LIMIT > 0 )) && LD_LIBRARY_PATH="$dep_ld" timeout -k 5 "$LIMIT" cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$B/build.log" 2>&1; then
    check binaries build PASS "${targets[*]} built here in $(( $(now) - tb )) s with -j$JOBS"
  else
    check binaries build FAIL "$(grep -m1 -B2 -A3 'error' "$B/build.log" | tr '\n' ' ' | cut -c1-400)"; return 1
  fi
  BIN=$BUILD
  TRI_LD="$BUILD:$dep_ld"; for d in "${CUDA_DIRS[@]}"; do TRI_LD="$TRI_LD:$d"; done
  TRI=(env LD_LIBRARY_PATH="$TRI_LD")
}

starts() {  # starts STEP LABEL: the binaries in BIN start under TRI; one check
  local st=$1 label=$2 bad=() b
  local logf="$RES/binaries/start_${label//[^a-z]/_}.log"
  : >"$logf"
  "${TRI[@]}" "$BIN/trident" --help >>"$logf" 2>&1 || bad+=("trident --help: exit $?")
  for b in kernels_cuda_tests comm_nccl_tests kernels_tests; do
    [[ -x $BIN/$b ]] || continue
    "${TRI[@]}" "$BIN/$b" --gtest_list_tests >"$RES/binaries/${b}_list.txt" 2>&1 || bad+=("$b --gtest_list_tests: exit $?")
  done
  if [[ -f $BIN/$PLUGIN ]]; then
    local nf; nf=$(env LD_LIBRARY_PATH="$TRI_LD" ldd "$BIN/$PLUGIN" 2>&1 | awk '/not found/ {print $1}' | paste -sd' ')
    [[ -z $nf ]] || bad+=("$PLUGIN needs $nf")
  fi
  if [[ ${#bad[@]} -eq 0 ]]; then
    local counts=""
    for b in kernels_cuda_tests comm_nccl_tests kernels_tests; do
      [[ -x $BIN/$b ]] && counts+=", $b ($(grep -c '^  ' "$RES/binaries/${b}_list.txt") tests)"
    done
    check "$st" "start ($label)" PASS "trident --help$counts$( [[ -f $BIN/$PLUGIN ]] && echo ", $PLUGIN resolves") start"
    return 0
  fi
  check "$st" "start ($label)" FAIL "$(printf '%s; ' "${bad[@]}")$(grep -m2 'error while loading\|not found\|cannot open' "$logf" "$RES"/binaries/*_list.txt 2>/dev/null | cut -c1-200 | paste -sd' ')"
  return 1
}

make_data() {
  [[ -f $WORK/data/train_000000.bin ]] && return 0
  # The project's own text as byte tokens: fixed by the tree, valid for every vocabulary
  # >= 256 (the benchmark models' too).
  local files; mapfile -t files < <(cd "$ROOT" && find . \( -path './build*' -o -path './.gpu-carry' -o -path './runs' -o -path './.git' \) -prune -o \
                                     \( -name '*.md' -o -name '*.h' -o -name '*.cpp' \) -type f -print | LC_ALL=C sort)
  (cd "$ROOT" && "${TRI[@]}" "$BIN/trident" prepare --input "${files[@]}" --out "$WORK/data" --tokenizer byte --val-fraction 0) >"$RES/binaries/prepare_data.log" 2>&1
}

step_binaries() {
  local t0; t0=$(now); mkdir -p "$RES/binaries"
  local ok=0
  if [[ -x $RT/bin/trident && $FORCE_BUILD == 0 ]]; then
    BIN="$RT/bin"
    if [[ $MODE == dry ]]; then
      if ns_setup; then
        # What the loader resolves there: only the kept set, the carried and the CUDA folder.
        local b bad=() pairs
        for b in "$BIN"/*; do
          pairs=$(ns_list "$b")
          echo "== $b" >>"$RES/binaries/ns_resolution.txt"; echo "$pairs" >>"$RES/binaries/ns_resolution.txt"
          local s p
          while read -r s p; do
            [[ -z $s ]] && continue
            case $p in
              NOT-FOUND) bad+=("$(basename "$b"): $s not found") ;;
              "$RT"/bin/*|"$RT"/lib/*|"$RT"/fallback-used/*|"$NS"/cuda/*) ;;
              /lib/x86_64-linux-gnu/*|/usr/lib/x86_64-linux-gnu/*|/lib64/*) ns_has "$s" || bad+=("$(basename "$b"): $s from $p") ;;
              *) bad+=("$(basename "$b"): $s from $p") ;;
            esac
          done <<<"$pairs"
        done
        if [[ ${#bad[@]} -eq 0 ]]; then
          check binaries "namespace: Debian's libraries hidden" PASS "/usr/lib holds only ${NS_KEEP[*]}; /usr/local (the CUDA toolkit) and /etc/ld.so.cache hidden; every library of $(ls "$BIN" | paste -sd' ') resolves to the carried folders or the CUDA folder (LD_LIBRARY_PATH=$NS_LD); list: results.tgz binaries/ns_resolution.txt"
        else
          check binaries "namespace: Debian's libraries hidden" FAIL "$(printf '%s; ' "${bad[@]}" | cut -c1-400)"
        fi
      else
        check binaries "namespace: Debian's libraries hidden" SKIPPED "$NS_WHY; the carried binaries run with the system's libraries after the carried ones"
        TRI=(env LD_LIBRARY_PATH="$TRI_LD")
      fi
    else
      TRI=(env LD_LIBRARY_PATH="$TRI_LD")
    fi
    starts binaries "carried$([[ -n $NS ]] && echo ', namespace')" && ok=1
  fi
  if (( ! ok )) && [[ $MODE == check ]]; then
    build_there && starts binaries "built here" && ok=1
  elif (( ! ok )); then
    check binaries build SKIPPED "dry run: the build there is not tried here (--force-build on the GPU machine)"
  fi
  if (( ok )); then
    [[ -f $BIN/$PLUGIN ]] && export TRIDENT_CUDA_PLUGIN="$BIN/$PLUGIN"
    if make_data; then check binaries data PASS "byte tokens of the tree's text: $(du -sh "$WORK/data" | cut -f1) in $WORK/data"
    else check binaries data FAIL "trident prepare: $(tail -2 "$RES/binaries/prepare_data.log" | paste -sd' ' | cut -c1-300)"; fi
  fi
  step_done binaries "$t0"
}

# ======================================================================================
# step smoke: 5 CUDA steps of the tiny config (dry run: on the CPU, and CUDA must fail cleanly)
# ======================================================================================
step_smoke() {
  local t0; t0=$(now)
  local dev=cuda; [[ $MODE == dry ]] && dev=cpu
  train smoke 60 configs/tiny.yaml $([[ $dev == cuda ]] && echo --cuda) --set training.max_steps=5 --set runtime.device=$dev
  local j="$RES/runs/smoke.json"
  local first backend steady
  first=$(json_field "$j" marks.first_step); backend=$(json_field "$j" marks.backend); steady=$(steps_mean smoke 3 5)
  local line="exit $RUN_RC in $(json_field "$j" wall_s) s; backend ready at ${backend:-?} s, first step logged at ${first:-?} s, steady step ${steady:-?} ms (mean of steps 3-5)"
  if [[ $RUN_STATUS == PASS ]]; then
    check smoke "tiny 5 steps on $dev" PASS "$line"
  else
    check smoke "tiny 5 steps on $dev" "$RUN_STATUS" "$RUN_WHY"
    [[ $dev == cuda && -z $CUDA_BLOCKED ]] && CUDA_BLOCKED="skipped: the smoke run failed ($RUN_WHY)"
  fi
  fig smoke "## Smoke run: configs/tiny.yaml, 5 steps, runtime.device=$dev"
  fig smoke
  fig smoke "- $line"
  local v; v=$(grep -m1 'info: backend:' "$RES/runs/smoke.log" | sed 's/^\[ *[0-9.]*\] info: //')
  [[ -n $v ]] && { fig smoke "- $v"; echo "trident $v" >>"$RES/env/brief.txt"; }
  v=$(grep -m1 'info: communication:' "$RES/runs/smoke.log" | sed 's/^\[ *[0-9.]*\] info: //')
  [[ -n $v ]] && { fig smoke "- $v"; echo "trident $v" >>"$RES/env/brief.txt"; }
  if [[ -s $RES/runs/smoke.maps ]]; then
    "$HPY" "$G/gpu_env.py" resolve "$RES/runs/smoke.maps" --probe "$RES/env/probe.json" >"$RES/runs/smoke_cuda_libs.txt" 2>&1
    [[ -s $RES/runs/smoke_cuda_libs.txt ]] && fig smoke "- mapped by the run (/proc/PID/maps at step 2): $(paste -sd';' "$RES/runs/smoke_cuda_libs.txt" | sed 's/;/; /g')"
  fi
  fig smoke
  if [[ $MODE == dry ]]; then
    # Without a GPU a CUDA run must end cleanly with the config error (exit 2), the
    # plugin and its CUDA libraries loaded (not a missing library).
    train smoke_cuda 60 configs/tiny.yaml --set training.max_steps=1 --set runtime.device=cuda
    local msg; msg=$(tail_of "$RES/runs/smoke_cuda.log" 2)
    if (( RUN_RC == 2 )) && ! grep -q 'cannot open shared object\|No such file' "$RES/runs/smoke_cuda.log"; then
      check smoke "runtime.device=cuda without a GPU" PASS "exit 2: $msg"
    else
      check smoke "runtime.device=cuda without a GPU" FAIL "exit $RUN_RC (expected 2, the CUDA libraries found): $msg"
    fi
  fi
  step_done smoke "$t0"
}

# ======================================================================================
# step plans: cuDNN's plans for the attention tests (kernels_cuda_tests' cuDNN and attention
# GPU tests, and a benchmark-shape test where the tree has one)
# ======================================================================================
PLAN_FILTER='AttentionGpu.*:Cudnn*:MakeCudnnAttention.*:*BenchmarkShape*'
step_plans() {
  local t0; t0=$(now)
  gtest_run plans cudnn_attention kernels_cuda_tests 90 -- --gtest_filter="$PLAN_FILTER"
  if [[ -f $RES/binaries/kernels_cuda_tests_list.txt ]] && ! grep -qi 'BenchmarkShape' "$RES/binaries/kernels_cuda_tests_list.txt"; then
    check plans "benchmark shapes" SKIPPED "kernels_cuda_tests has no test at the benchmark shapes (a *BenchmarkShape* test: B16 T1024 H12 HD64, B16 T1024 H16 HD64, B8 T2048 H32 KV8 HD64); the bench's cudnn rows build those plans first"
  fi
  fig plans "## cuDNN attention: kernels_cuda_tests --gtest_filter='$PLAN_FILTER'"
  fig plans
  fig plans "- $(awk -F'\t' '$1 == "plans" {print $3 " " $2 ": " $4}' "$RES/checks.tsv" | paste -sd';' | sed 's/;/; /g')"
  step_done plans "$t0"
}

# ======================================================================================
# step bench: GPT-2 124M (plain, cudnn), Llama ~1B (cudnn), GPT-2 350M (cudnn); each
# beside PyTorch eager bf16 with its fused attention; a bf16 GEMM peak
# ======================================================================================
# name config micro-batch attention: B x seq_len tokens per step, one micro-batch per
# optimizer step, BENCH_WARMUP + BENCH_STEPS steps, the last BENCH_STEPS timed.
BENCH=("gpt2-124m configs/gpt2-124m.yaml 16 plain" "gpt2-124m configs/gpt2-124m.yaml 16 cudnn"
       "gpt2-124m configs/gpt2-124m.yaml 16 torch"
       "llama-1b configs/llama-1b.yaml 8 cudnn" "llama-1b configs/llama-1b.yaml 8 torch"
       "gpt2-350m configs/gpt2-350m.yaml 16 cudnn" "gpt2-350m configs/gpt2-350m.yaml 16 torch")
BENCH_WARMUP=3
BENCH_STEPS=10
mem_sampler_start() {  # nvidia-smi every 200 ms into FILE; prints the sampler's pid
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
  echo $!
}
step_bench() {
  local t0; t0=$(now); local Bd="$RES/bench"; mkdir -p "$Bd"
  local gemm=""
  if [[ $MODE == dry ]]; then
    # The pieces that need no GPU: the GEMM timing and the PyTorch baseline's models on
    # the CPU (tiny sizes), the table's self-test.
    if "$PY" -c 'import torch' 2>/dev/null; then
      if timeout 120 "$PY" "$G/gemm_peak.py" --device cpu --dtype fp32 --n 256 --iters 3 --json "$Bd/gemm_peak.json" >"$Bd/gemm_peak.log" 2>&1; then
        check bench "gemm peak (cpu, fp32 256^3)" PASS "$(tail -1 "$Bd/gemm_peak.log")"
      else check bench "gemm peak (cpu)" FAIL "$(tail -2 "$Bd/gemm_peak.log" | paste -sd' ')"; fi
      local c
      for c in configs/tiny.yaml configs/tiny_llama.yaml; do
        local n; n=$(basename "$c" .yaml)
        if timeout 120 "$PY" "$ROOT/bench/torch_model.py" --device cpu --config "$ROOT/$c" --batch 2 --steps 1 --warmup 1 --json "$Bd/torch_cpu_$n.json" >"$Bd/torch_cpu_$n.log" 2>&1; then
          check bench "pytorch baseline on cpu: $c" PASS "$(tail -1 "$Bd/torch_cpu_$n.log")"
        else
          check bench "pytorch baseline on cpu: $c" FAIL "$(tail -2 "$Bd/torch_cpu_$n.log" | paste -sd' ')"
        fi
      done
    else
      check bench "pytorch pieces" SKIPPED "no python3 with torch here"
    fi
    "$HPY" "$G/bench_report.py" --self-test >"$Bd/bench_report_selftest.log" 2>&1 &&
      check bench "bench_report self-test" PASS "$(tail -1 "$Bd/bench_report_selftest.log")" ||
      check bench "bench_report self-test" FAIL "$(tail -2 "$Bd/bench_report_selftest.log" | paste -sd' ')"
    local e; for e in "${BENCH[@]}"; do read -r n _ _ a <<<"$e"; check bench "$n $a" SKIPPED "no GPU (dry run)"; done
    step_done bench "$t0"; return
  fi
  # The bf16 GEMM peak of this machine, the second MFU denominator.
  limit 60
  if (( LIMIT > 0 )) && trun "$Bd/gemm_peak.log" "$LIMIT" "$Bd/gemm_peak_run.json" -- "$PY" "$G/gemm_peak.py" --device cuda --dtype bf16 --n 8192 --iters 20 --json "$Bd/gemm_peak.json"; then
    gemm=$(json_field "$Bd/gemm_peak.json" tflops)
    check bench "gemm peak" PASS "$(tail_of "$Bd/gemm_peak.log" 1)"
    printf 'Measured bf16 GEMM peak (PyTorch, 8192^3, this call): %.1f TFLOP/s; datasheet 989 TFLOP/s.\n' "$gemm" >"$Bd/gemm_peak.txt"
  else
    check bench "gemm peak" "$( ((LIMIT == 0)) && echo 'NOT RUN' || echo FAIL)" "$(tail_of "$Bd/gemm_peak.log" 2)"
  fi
  write_summary
  local entry name cfg mb att
  for entry in "${BENCH[@]}"; do
    read -r name cfg mb att <<<"$entry"
    local steps=$((BENCH_WARMUP + BENCH_STEPS)) pid rc
    if [[ $att == torch ]]; then
      limit 90
      if (( LIMIT == 0 )); then check bench "$name pytorch" 'NOT RUN' "out of time ($(left) s left)"; continue; fi
      pid=$(mem_sampler_start "$Bd/${name}_torch_mem.txt")
      trun "$Bd/${name}_torch.log" "$LIMIT" "$Bd/${name}_torch_run.json" -- env PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/torch_model.py" \
        --device cuda --dtype bf16 --config "$ROOT/$cfg" --batch "$mb" --steps "$BENCH_STEPS" --warmup "$BENCH_WARMUP" \
        --json "$Bd/${name}_torch.json"
      rc=$?
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      "$HPY" "$G/bench_report.py" torch --json "$Bd/${name}_torch.json" --mem "$Bd/${name}_torch_mem.txt" \
        --rc "$rc" --name "$name" --config "$ROOT/$cfg" --batch "$mb" ${gemm:+--gemm-peak "$gemm"} >>"$RES/bench.tsv" 2>>"$Bd/report.log"
      local st; st=$(outcome "$rc")
      check bench "$name pytorch" "$st" "$([[ $st == PASS ]] && tail_of "$Bd/${name}_torch.log" 1 || why "$rc" "$Bd/${name}_torch.log")"
    else
      local label="$name-$att"
      pid=$(mem_sampler_start "$Bd/${label}_mem.txt")
      train "bench_$label" 90 "$cfg" --cuda --env TRIDENT_ATTENTION="$att" \
        --set parallel.dp=1 --set parallel.zero_stage=0 --set parallel.micro_batch_size="$mb" \
        --set training.global_batch_size="$mb" --set training.max_steps="$steps" \
        --set runtime.device=cuda --set training.precision=bf16
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      if [[ $RUN_STATUS == SKIPPED || $RUN_STATUS == 'NOT RUN' ]] && [[ ! -s $RUN_DIR/metrics.jsonl ]]; then
        check bench "$name trident $att" "$RUN_STATUS" "$RUN_WHY"
        "$HPY" "$G/bench_report.py" trident --config "$ROOT/$cfg" --batch "$mb" --label "trident $att" --metrics /dev/null \
          --name "$name" --status "$RUN_STATUS: $(cut -c1-100 <<<"$RUN_WHY")" >>"$RES/bench.tsv" 2>>"$Bd/report.log"
        write_summary; continue
      fi
      # The path the backend says it took (a shape cuDNN rejects falls back to plain).
      local path; path=$(grep -m1 -o 'attention [a-z][a-z]*' "$RES/runs/bench_$label.log" | cut -d' ' -f2)
      "$HPY" "$G/bench_report.py" trident --config "$ROOT/$cfg" --batch "$mb" --label "trident $att${path:+ (backend: $path)}" \
        --metrics "$RUN_DIR/metrics.jsonl" --skip "$BENCH_WARMUP" --mem "$Bd/${label}_mem.txt" \
        --rc "$RUN_RC" --name "$name" ${gemm:+--gemm-peak "$gemm"} >>"$RES/bench.tsv" 2>>"$Bd/report.log"
      check bench "$name trident $att" "$RUN_STATUS" "$([[ $RUN_STATUS == PASS ]] && grep -m1 'info: done:' "$RES/runs/bench_$label.log" | sed 's/^\[ *[0-9.]*\] info: //' || echo "$RUN_WHY")"
    fi
    write_summary; pack
  done
  step_done bench "$t0"
}

# ======================================================================================
# step parity: the tiny gpt2 config, CUDA against the CPU, determinism, resume
# ======================================================================================
# Tolerances, first guesses to set from the differences this step prints (every
# comparison also writes its per-step table into results.tgz, runs/*.diff.tsv).
# fp32: cuBLASLt fp32 vs OpenBLAS differ only in summation order, ~1e-6 per op at step 1.
FP32_TOL=(--first-rel 1e-5 --max-rel 1e-3)
# bf16 vs the CPU's bf16 emulation: the same rounding points, different fp32 sums, so
# a rounding flip moves a value by 2^-8 and the losses drift apart over the steps; the
# CPU's own bf16 is up to 2e-2 from its fp32 over 30 steps. Gated on the first step and
# the mean; the maximum is printed.
BF16_TOL=(--first-rel 2e-3 --mean-rel 1e-2)
cmp_runs() {  # cmp_runs CHECK A B STEPS ARGS...: compare_runs.py on two runs' metrics
  local name=$1 a=$2 b=$3 steps=$4; shift 4
  if ! ran "$a" || ! ran "$b"; then
    local r; r=$( ran "$a" && echo "$b" || echo "$a")
    check parity "$name" SKIPPED "$r did not run"
    fig parity "| $name | SKIPPED | $r did not run (see its check) |"
    return
  fi
  local out; out=$("$HPY" "$G/compare_runs.py" compare "$WORK/runs/$a/metrics.jsonl" "$WORK/runs/$b/metrics.jsonl" \
                   --steps "$steps" --name "$a vs $b" --table "$RES/runs/$a.vs.$b.diff.tsv" "$@" 2>&1)
  local rc=$?
  echo "$out" >>"$RES/runs/compare.log"
  check parity "$name" "$( ((rc == 0)) && echo PASS || echo FAIL)" "$out"
  fig parity "| $name | $( ((rc == 0)) && echo PASS || echo FAIL) | ${out#* $a vs $b: } |"
}
cmp_ckpt() {  # cmp_ckpt CHECK A B STEP: the checkpoints' tensors, bitwise
  local name=$1 a=$2 b=$3 s=$4
  if ! ran "$a" || ! ran "$b"; then check parity "$name" SKIPPED "a run did not run"; return; fi
  local out; out=$("$HPY" "$G/compare_runs.py" ckpt "$WORK/runs/$a/ckpt/step_$s" "$WORK/runs/$b/ckpt/step_$s" --name "$a vs $b" 2>&1)
  local rc=$?
  check parity "$name" "$( ((rc == 0)) && echo PASS || echo FAIL)" "$out"
}
step_parity() {
  local t0; t0=$(now)
  local n=$PARITY_STEPS half=$((PARITY_STEPS / 2)) cfg=configs/tiny.yaml
  local all="1-$n" rest="$((half + 1))-$n"
  local cpu_t=90; [[ $MODE == dry ]] && cpu_t=600  # 2 shared cores here
  fig parity "## Parity: configs/tiny.yaml, $n steps, byte tokens of the tree's text"
  fig parity
  fig parity "| comparison | status | figures |"
  fig parity "|---|---|---|"
  local common=(--set training.max_steps="$n" --set checkpoint.interval="$half")
  if [[ $MODE == check ]]; then
    # The CPU references run beside the CUDA runs (half the cores each).
    ( train_check parity cpu_fp32 "$cpu_t" "$cfg" --env OMP_NUM_THREADS=$(( $(nproc) / 2 )) "${common[@]}" --set runtime.device=cpu --set training.precision=fp32 ) &
    local p1=$!
    ( train_check parity cpu_bf16 "$cpu_t" "$cfg" --env OMP_NUM_THREADS=$(( $(nproc) / 2 )) "${common[@]}" --set runtime.device=cpu --set training.precision=bf16 ) &
    local p2=$!
    local r
    for r in "cuda_fp32 fp32 plain" "cuda_bf16 bf16 plain" "cuda_bf16_again bf16 plain" "cuda_bf16_cudnn bf16 cudnn"; do
      local rn prec att; read -r rn prec att <<<"$r"
      train_check parity "$rn" 45 "$cfg" --cuda --env TRIDENT_ATTENTION="$att" "${common[@]}" --set runtime.device=cuda --set training.precision="$prec"
    done
    train_check parity cuda_bf16_resume 45 "$cfg" --cuda --resume "$WORK/runs/cuda_bf16/ckpt/step_$half" \
      --env TRIDENT_ATTENTION=plain "${common[@]}" --set runtime.device=cuda --set training.precision=bf16
    wait "$p1" "$p2"
    # The background runs' checks went to the shared file from their subshells.
    cmp_runs "cuda fp32 vs cpu fp32" cpu_fp32 cuda_fp32 "$all" "${FP32_TOL[@]}"
    cmp_runs "cuda bf16 vs cpu bf16" cpu_bf16 cuda_bf16 "$all" "${BF16_TOL[@]}"
    cmp_runs "cuda bf16 twice (bitwise)" cuda_bf16 cuda_bf16_again "$all" --bitwise
    cmp_ckpt "cuda bf16 twice, checkpoint (bitwise)" cuda_bf16 cuda_bf16_again "$n"
    cmp_runs "cuda bf16 stop and resume (bitwise)" cuda_bf16 cuda_bf16_resume "$rest" --bitwise
    cmp_ckpt "cuda bf16 stop and resume, checkpoint (bitwise)" cuda_bf16 cuda_bf16_resume "$n"
    cmp_runs "cuda bf16 cudnn vs cpu bf16" cpu_bf16 cuda_bf16_cudnn "$all" "${BF16_TOL[@]}"
  else
    # What the GPU run does with CUDA runs, done with CPU ones: the comparator passes on
    # equal runs and fails on a perturbed copy, and a resume is bitwise.
    train_check parity cpu_fp32 "$cpu_t" "$cfg" "${common[@]}" --set runtime.device=cpu --set training.precision=fp32
    train_check parity cpu_bf16 "$cpu_t" "$cfg" "${common[@]}" --set runtime.device=cpu --set training.precision=bf16
    train_check parity cpu_fp32_resume "$cpu_t" "$cfg" --resume "$WORK/runs/cpu_fp32/ckpt/step_$half" "${common[@]}" --set runtime.device=cpu --set training.precision=fp32
    cmp_runs "cpu fp32 stop and resume (bitwise)" cpu_fp32 cpu_fp32_resume "$rest" --bitwise
    cmp_ckpt "cpu fp32 stop and resume, checkpoint (bitwise)" cpu_fp32 cpu_fp32_resume "$n"
    cmp_runs "comparator on equal runs (bitwise)" cpu_fp32 cpu_fp32 "$all" --bitwise
    if ran cpu_fp32; then
      local p="$WORK/runs/cpu_fp32_perturbed" out rc; mkdir -p "$p"; touch "$p/.ok"
      "$HPY" "$G/compare_runs.py" perturb "$WORK/runs/cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --step "$((half + 2))" --rel 1e-7
      out=$("$HPY" "$G/compare_runs.py" compare "$WORK/runs/cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --steps "$all" --bitwise --name perturbed 2>&1); rc=$?
      check parity "comparator fails on a 1e-7 perturbation (bitwise)" "$( ((rc == 1)) && echo PASS || echo FAIL)" "expected FAIL, got: $out"
      "$HPY" "$G/compare_runs.py" perturb "$WORK/runs/cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --step 1 --rel 5e-3
      out=$("$HPY" "$G/compare_runs.py" compare "$WORK/runs/cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --steps "$all" "${BF16_TOL[@]}" --name perturbed 2>&1); rc=$?
      check parity "comparator fails on a 5e-3 perturbation of step 1 (bf16 tolerance)" "$( ((rc == 1)) && echo PASS || echo FAIL)" "expected FAIL, got: $out"
    fi
    # Information, not a gate: how far the CPU's bf16 is from its fp32.
    cmp_runs "cpu bf16 vs cpu fp32 (information)" cpu_fp32 cpu_bf16 "$all" --max-rel 1
    local c
    for c in "cuda fp32 vs cpu fp32" "cuda bf16 vs cpu bf16" "cuda bf16 twice (bitwise)" "cuda bf16 stop and resume (bitwise)" "cuda bf16 cudnn vs cpu bf16"; do
      check parity "$c" SKIPPED "no GPU (dry run)"
    done
  fi
  fig parity
  step_done parity "$t0"
}

# ======================================================================================
# step ops: the op table's cuda rows once, and kernels_cuda_tests' other tests
# ======================================================================================
step_ops() {
  local t0; t0=$(now)
  gtest_run ops optable_cuda kernels_tests 60 -- --gtest_filter='OpTable.cuda*'
  gtest_run ops cuda_unit kernels_cuda_tests 60 -- --gtest_filter="-$PLAN_FILTER"
  step_done ops "$t0"
}

# ======================================================================================
# step nccl: the NCCL communicator on one GPU (comm_nccl_tests Nccl*): the bootstrap, a world
# of one, device and host splits, every collective against host references, the abort
# path. Send/recv need two GPUs.
# ======================================================================================
step_nccl() {
  local t0; t0=$(now)
  gtest_run nccl nccl_tests comm_nccl_tests 60 NCCL_DEBUG=WARN -- --gtest_filter='Nccl*'
  step_done nccl "$t0"
}

# ======================================================================================
# step sanitizer: compute-sanitizer memcheck on kernels_cuda_tests' GPU tests; kernel faults
# count, API return codes do not (--report-api-errors no)
# ======================================================================================
SAN_FILTER='CudaOpsGpu.*:AttentionGpu.*:GemmEngineGpu.*'
step_sanitizer() {
  local t0; t0=$(now); local S="$RES/sanitizer"; mkdir -p "$S"
  if [[ $MODE == dry ]]; then check sanitizer memcheck SKIPPED "no GPU (dry run)"; step_done sanitizer "$t0"; return; fi
  if ! command -v compute-sanitizer >/dev/null; then check sanitizer memcheck FAIL "compute-sanitizer not found"; step_done sanitizer "$t0"; return; fi
  limit 150
  if (( LIMIT == 0 )); then check sanitizer memcheck 'NOT RUN' "out of time ($(left) s left)"; step_done sanitizer "$t0"; return; fi
  trun "$S/memcheck.log" "$LIMIT" "$S/memcheck_run.json" -- env LD_LIBRARY_PATH="$TRI_LD" compute-sanitizer --tool memcheck \
    --report-api-errors no --error-exitcode 97 --log-file "$S/memcheck.txt" "$BIN/kernels_cuda_tests" --gtest_filter="$SAN_FILTER"
  local rc=$?
  local summary errors; summary=$(grep -m1 'ERROR SUMMARY' "$S/memcheck.txt" 2>/dev/null)
  errors=$(grep -cE '^=+ (Invalid|Program hit|Error|Uninitialized|Leaked)' "$S/memcheck.txt" 2>/dev/null)
  if (( rc == 0 )) && [[ $summary == *" 0 errors"* ]]; then
    check sanitizer memcheck PASS "$SAN_FILTER: $summary"
  elif (( rc == 124 && ${errors:-0} == 0 )); then
    check sanitizer memcheck "$(outcome 124)" "incomplete after $LIMIT s, no error reported before the cut"
  else
    check sanitizer memcheck FAIL "exit $rc; ${summary:-no summary}; $(grep -m2 -E '^=+ (Invalid|Program hit|Error)' "$S/memcheck.txt" | paste -sd' ' | cut -c1-300)"
  fi
  step_done sanitizer "$t0"
}

# --------------------------------------------------------------------------------------
log "gpu_check.sh: mode $MODE, out $OUT_DIR, work $WORK, budget $BUDGET s, steps $STEPS"
print_plan "$([[ $MODE == dry ]] && echo 450 || echo "$BUDGET")" >>"$RES/check.log"
[[ $MODE == dry ]] && cat "$RES/plan.txt"
write_summary
# env first (the others use what it found), then binaries; every later step needs
# binaries that start. The smoke run gates the CUDA training runs (CUDA_BLOCKED).
for s in ${ALL_STEPS//,/ }; do
  want "$s" || continue
  if [[ $s != env && -z ${STEP_STATUS[env]:-} ]]; then STEP_END=$DEADLINE; step_env; fi
  if [[ $s != env && $s != binaries && -z ${STEP_STATUS[binaries]:-} ]]; then STEP_END=$DEADLINE; step_binaries; fi
  if [[ $s != env && $s != binaries && ${STEP_STATUS[binaries]} != PASS ]]; then
    printf '%s\tSKIPPED\t0\tno binaries that start (step binaries: %s)\n' "$s" "${STEP_STATUS[binaries]}" >>"$RES/steps.tsv"
    STEP_STATUS[$s]=SKIPPED; write_summary; continue
  fi
  if (( $(left) < RESERVE + MIN_RUN )); then
    printf '%s\tNOT RUN\t0\tout of time (budget %s s)\n' "$s" "$BUDGET" >>"$RES/steps.tsv"
    STEP_STATUS[$s]='NOT RUN'; write_summary; continue
  fi
  cap=0; for e in "${PLAN[@]}"; do read -r n _ c <<<"$e"; [[ $n == "$s" ]] && cap=$c; done
  [[ $s == binaries ]] && { [[ $FORCE_BUILD == 1 || ! -x $RT/bin/trident ]] && cap=$((cap + BUILD_THERE_CAP)); }
  # The caps are the GPU machine's plan; the dry run's CPU-only steps have the budget.
  [[ $MODE == dry ]] && STEP_END=$DEADLINE || STEP_END=$(( $(now) + cap ))
  "step_$s"
done
STEP_END=$DEADLINE
write_summary; pack
log "done in $(( $(now) - START )) s; summary: $OUT_DIR/summary.md, everything: $OUT_DIR/results.tgz"
cat "$RES/summary.md"
# The figures once more at the very end, for a reader that sees only the output's tail.
echo
echo "== figures"
figures
echo
awk -F'\t' '{printf "step %-10s %-8s %4s s  %s\n", $1, $2, $3, $4}' "$RES/steps.tsv"
if [[ $MODE == dry ]]; then
  echo
  echo "== this dry run: $(( $(now) - START )) s here (CPU only); the plan for the GPU machine:"
  cat "$RES/plan.txt"
fi
if grep -qx FAIL < <(cut -f2 "$RES/steps.tsv") || grep -qx FAIL < <(cut -f3 "$RES/checks.tsv"); then exit 1; fi
exit 0
