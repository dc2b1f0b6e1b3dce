#!/usr/bin/env bash
# The one command that proves the CUDA backend on a GPU machine (issue 8; CUDA-DESIGN.md §5).
#
#   scripts/gpu_check.sh --prepare            here (network to Debian's archive): fill the
#                                              carried folder .gpu-carry/ (<= 64 MiB)
#   scripts/gpu_check.sh --dry-run [--out D]  here (no GPU): every step that needs no GPU;
#                                              GPU steps are reported SKIPPED
#   scripts/gpu_check.sh [--out D]            on the GPU machine ($OUT is the default --out)
#
# Options: --out DIR (results; default $OUT, else runs/gpu-check), --work DIR (scratch:
# data, checkpoints, the unpacked prefix; default /tmp/trident-gpu-check), --build-dir DIR
# (default build-gpu, or build-gpu-dry for --dry-run; an existing one is reused), --budget S
# (whole-run deadline in seconds, default 530), --steps LIST (comma list of env, build, ops,
# nccl, parity, bench, sanitizer, run in that order; default all), --parity-steps N
# (default 30), --jobs N. The benchmark runs before the sanitizer so that a slow build
# squeezes the memcheck, not the figures. Step nccl: cuda_tests' Nccl* tests (a world of
# one: split, every collective in f32/bf16, both stream modes, the abort path).
#
# The machine it is written for (CUDA-DESIGN.md §5, ENVIRONMENT.md "A GPU, sometimes"):
# nvcc, CMake, ninja, python3 with PyTorch and the pip cuDNN/NCCL/cuBLAS wheels, no apt, no
# network. Everything else the build needs comes from .gpu-carry/deps.tar.gz: Debian 12
# packages unpacked with dpkg -x here and pruned (yaml-cpp, spdlog, fmt, nlohmann-json,
# xxhash, pcre2, OpenBLAS-openmp, Open MPI's libmpi and headers, GTest), plus the cuDNN and
# NCCL headers of this machine's toolkit as a fallback. The device tool call is
#   run(command="scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=600)
#
# Results are written AS THEY COME: each step appends to <out>/summary.md (kept current after
# every step) and <out>/results.tgz (all logs, metrics and XML, repacked after every step),
# so a run killed at its limit still returns what it found. Every step runs under its own
# `timeout`, capped by what is left of --budget. Step and check statuses: PASS, FAIL,
# SKIPPED (with the reason). Exit 0 when no step FAILed (a dry run: and every step that can
# run here passed), 1 otherwise, 2 bad usage.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY="$ROOT/.gpu-carry"
MODE=check
OUT_DIR=${OUT:-}
WORK=${TMPDIR:-/tmp}/trident-gpu-check
BUILD=""
BUDGET=530
STEPS="env,build,ops,nccl,parity,bench,sanitizer"
PARITY_STEPS=30
JOBS=$(nproc)
CARRY_LIMIT=$((64 * 1024 * 1024))

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
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
    -h|--help) usage 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
[[ $PARITY_STEPS =~ ^[0-9]+$ && $PARITY_STEPS -ge 2 ]] ||
  { echo "gpu_check.sh: --parity-steps $PARITY_STEPS: expected an integer >= 2" >&2; exit 2; }

# Debian 12 packages carried to the GPU machine: headers, .so and CMake config files of
# every find_package / find_library of CMakeLists.txt that the GPU image lacks. Not
# carried: libgomp (comes with the machine's gcc, and must match it), zlib (everywhere).
DEBS=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0
      libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
      libopenmpi-dev libopenmpi3 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libudev1 libgtest-dev)
# Runtime libraries a base image usually has in a newer version: carried, but put on the
# library path only when the machine has none (an older copy first on the path could shadow
# a newer one that something else needs).
FALLBACK_LIBS=(libgfortran.so.5 libquadmath.so.0 libudev.so.1)
ARCH_LIB=usr/lib/x86_64-linux-gnu

now() { date +%s; }
human() { numfmt --to=iec-i --suffix=B "$1" 2>/dev/null || echo "$1 B"; }

# ======================================================================================
# --prepare: build .gpu-carry/ here
# ======================================================================================
prepare() {
  local t0; t0=$(now)
  local stage; stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu-carry.XXXXXX")
  trap 'rm -rf "$stage"' RETURN
  echo "== downloading ${#DEBS[@]} Debian packages"
  mkdir -p "$stage/debs" "$stage/root/prefix" "$stage/root/fallback" "$stage/root/cuda-headers"
  (cd "$stage/debs" && apt-get download "${DEBS[@]}") >"$stage/download.log" 2>&1 ||
    { cat "$stage/download.log"; echo "prepare: FAILED: apt-get download (is Debian's archive reachable? try apt-get update)" >&2; return 1; }
  local deb
  for deb in "$stage"/debs/*.deb; do
    dpkg -x "$deb" "$stage/root/prefix" || { echo "prepare: FAILED: dpkg -x $deb" >&2; return 1; }
  done
  local P="$stage/root/prefix" L="$stage/root/prefix/$ARCH_LIB"
  # Prune what neither the build nor the run needs: docs, static archives (GTest is only
  # static), Fortran/Java/SHMEM bindings, Open MPI's plugins (a single process never calls
  # MPI_Init: comm/communicator.cpp), LAPACK, executables.
  rm -rf "$P/usr/share/doc" "$P/usr/share/man" "$P/usr/share/lintian" "$P/usr/bin" "$P/usr/sbin" \
         "$P/etc" "$P/lib" "$L/fortran" "$L/openmpi/lib/openmpi3" "$L/pkgconfig" \
         "$L/openmpi/include/openshmem" "$L/openmpi/include/"*shmem*
  find "$P" \( -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' \) -delete
  rm -f "$L"/liboshmem* "$L"/libmpi_mpifh* "$L"/libmpi_usempi* "$L"/libmpi_java* "$L"/libompitrace* \
        "$L"/libmca_common_* "$L"/openmpi/lib/libmca_common_* "$L"/openmpi/lib/liboshmem* \
        "$L"/openmpi/lib/libmpi_mpifh* "$L"/openmpi/lib/libmpi_usempi* "$L"/openmpi/lib/libmpi_java* \
        "$L"/libpcre2-16* "$L"/libpcre2-32* "$L"/libpcre2-posix* "$L"/openblas-openmp/liblapack*
  rm -rf "$L/openblas-openmp/cmake"
  local lib
  for lib in "${FALLBACK_LIBS[@]}"; do
    # libudev1 unpacks into /usr/lib on Debian 12 (merged /usr), the others into $ARCH_LIB.
    find "$P" -name "${lib}*" -exec mv {} "$stage/root/fallback/" \;
  done
  find "$P" -xtype l -delete  # symlinks the pruning left dangling
  local abs; abs=$(find "$stage/root" -type l -lname '/*' | head -5)
  [[ -z $abs ]] || { echo "prepare: FAILED: absolute symlinks would not relocate: $abs" >&2; return 1; }
  # cuDNN / NCCL headers of this toolkit: used on the GPU machine when its own are missing
  # or older than the ones the backend was written against.
  local inc=/usr/local/cuda/include
  cp "$inc"/cudnn*.h "$inc"/nccl.h "$stage/root/cuda-headers/" 2>/dev/null ||
    echo "prepare: warning: no cuDNN/NCCL headers in $inc; none carried"
  # What the carried .so need from the machine: the newest GLIBC_ / GLIBCXX_ symbol version.
  local need_glibc need_glibcxx
  need_glibc=$(find "$stage/root" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null |
               grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
  need_glibcxx=$(find "$stage/root" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null |
                 grep -o 'GLIBCXX_[0-9.]*' | sed 's/GLIBCXX_//' | sort -V | tail -1)
  local cudnn_v="" nccl_v=""
  if [[ -f $stage/root/cuda-headers/cudnn_version.h ]]; then
    cudnn_v=$(header_version_cudnn "$stage/root/cuda-headers/cudnn_version.h")
  fi
  [[ -f $stage/root/cuda-headers/nccl.h ]] && nccl_v=$(header_version_nccl "$stage/root/cuda-headers/nccl.h")
  rm -rf "$CARRY"; mkdir -p "$CARRY"
  tar -czf "$CARRY/deps.tar.gz" -C "$stage/root" . || { echo "prepare: FAILED: tar" >&2; return 1; }
  {
    echo "CARRY_GLIBC_MIN=$need_glibc"
    echo "CARRY_GLIBCXX_MIN=$need_glibcxx"
    echo "CARRY_CUDNN_HEADERS=$cudnn_v"
    echo "CARRY_NCCL_HEADERS=$nccl_v"
    echo "CARRY_SHA256=$(sha256sum "$CARRY/deps.tar.gz" | cut -d' ' -f1)"
  } >"$CARRY/manifest.env"
  {
    echo "# .gpu-carry: made by scripts/gpu_check.sh --prepare on $(hostname), $(date -u +%FT%TZ)"
    echo "# host: $(. /etc/os-release; echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)"
    echo "# deps.tar.gz: prefix/ (dpkg -x of the packages below, pruned), fallback/ (${FALLBACK_LIBS[*]}),"
    echo "#   cuda-headers/ (cuDNN $cudnn_v, NCCL $nccl_v headers of /usr/local/cuda/include)"
    echo "# needs on the GPU machine: glibc >= $need_glibc, libstdc++ with GLIBCXX_$need_glibcxx"
    echo "# unpacked size: $(du -sh "$stage/root" | cut -f1)"
    for deb in "$stage"/debs/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done
  } >"$CARRY/MANIFEST.txt"
  # The limit is on everything that travels: the tree (tracked + untracked, not ignored)
  # and the carried folder together.
  local carry_bytes tree_bytes total
  carry_bytes=$(du -sb "$CARRY" | cut -f1)
  tree_bytes=$(tree_size)
  total=$((carry_bytes + tree_bytes))
  echo "== .gpu-carry: $(human "$carry_bytes") ($(ls "$CARRY" | paste -sd' ')); working tree $(human "$tree_bytes"); together $(human "$total") of the $(human $CARRY_LIMIT) a device call carries"
  echo "   needs glibc >= $need_glibc, GLIBCXX_$need_glibcxx; carried headers: cuDNN $cudnn_v, NCCL $nccl_v"
  echo "   took $(( $(now) - t0 )) s"
  if (( total > CARRY_LIMIT )); then
    echo "prepare: FAILED: the tree and .gpu-carry together are $(human "$total"), over the $(human $CARRY_LIMIT) a device call carries" >&2
    return 1
  fi
  git -C "$ROOT" check-ignore -q "$CARRY" 2>/dev/null ||
    echo "prepare: warning: $CARRY is not ignored by git; it must be (.gitignore: /.gpu-carry/), or it travels twice" >&2
  echo "prepare: OK; carry it with run(..., carry=[\".gpu-carry\"])"
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
header_version_nccl() {  # nccl.h -> 22809
  awk '/#define NCCL_VERSION_CODE /{print $3; exit}' "$1"
}

if [[ $MODE == prepare ]]; then
  prepare; exit $?
fi

# ======================================================================================
# The check (on the GPU machine) and the dry run (here)
# ======================================================================================
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget $BUDGET: expected seconds" >&2; exit 2; }
START=$(now)
DEADLINE=$((START + BUDGET))
# nvcc and compute-sanitizer may sit in the toolkit's bin/ without it being on PATH.
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [[ -x $d/nvcc ]] && { PATH="$d:$PATH"; break; }; done
fi
command -v compute-sanitizer >/dev/null || { d=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"); [[ -x $d/compute-sanitizer ]] && PATH="$PATH:$d"; }
export PATH
[[ -n $OUT_DIR ]] || OUT_DIR="$ROOT/runs/gpu-check"
[[ -n $BUILD ]] || { [[ $MODE == dry ]] && BUILD="$ROOT/build-gpu-dry" || BUILD="$ROOT/build-gpu"; }
mkdir -p "$OUT_DIR" "$WORK" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RES="$WORK/results"          # everything that comes back, packed into $OUT_DIR/results.tgz
rm -rf "$RES"; mkdir -p "$RES"
: >"$RES/steps.tsv"; : >"$RES/checks.tsv"; : >"$RES/bench.tsv"
PY=python3
DEPS="$WORK/deps"
TRI_LD=""                    # LD_LIBRARY_PATH for trident binaries (never for python/torch)
declare -A CMAKE_ARGS_MAP=() # -D options the build passes, from what the env step found
HAVE_GPU=0
STEP_DEV=""

log() { echo "[$(date -u +%T) +$(( $(now) - START ))s] $*" | tee -a "$RES/check.log"; }
left() { echo $(( DEADLINE - $(now) )); }
# cap T: the step's own limit, or what is left before the deadline minus a margin for
# packing; prints 0 when under 5 s would remain.
cap() {
  local t=$1 l; l=$(( $(left) - 10 ))
  (( l < t )) && t=$l
  (( t < 5 )) && t=0
  echo "$t"
}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
tri() { env LD_LIBRARY_PATH="$TRI_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
# run_to LOG T CMD...: CMD under timeout T (seconds), all output appended to LOG.
run_to() {
  local logf=$1 t=$2; shift 2
  echo "\$ $*" >>"$logf"
  timeout -k 5 "$t" "$@" >>"$logf" 2>&1
  local rc=$?
  (( rc == 124 || rc == 137 )) && echo "[gpu_check: TIMEOUT after $t s]" >>"$logf"
  return $rc
}
check() {  # check STEP NAME STATUS DETAIL (one line in the table whatever DETAIL holds)
  local d=${4//$'\n'/ }; d=${d//$'\t'/ }
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$d" >>"$RES/checks.tsv"
  log "  $3 $2: $d"
}
step_done() {  # step_done NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RES/steps.tsv"
  log "== step $1: $2 ($3 s) $4"
  write_summary; pack
}
# The step's status from its checks: FAIL if any failed, PASS if any passed, else SKIPPED.
checks_status() {
  local s; s=$(awk -F'\t' -v st="$1" '$1 == st {print $3}' "$RES/checks.tsv")
  if grep -q FAIL <<<"$s"; then echo FAIL; elif grep -q PASS <<<"$s"; then echo PASS; else echo SKIPPED; fi
}
checks_detail() {
  awk -F'\t' -v st="$1" '$1 == st {n[$3]++} END {for (k in n) {printf "%s%d %s", sep, n[k], k; sep = ", "}}' "$RES/checks.tsv"
}

write_summary() {
  local f="$RES/summary.md"
  {
    echo "# Trident GPU check ($([[ $MODE == dry ]] && echo 'dry run, no GPU' || echo 'GPU run')), $(date -u +%FT%TZ)"
    echo
    [[ -f $RES/env/brief.txt ]] && { sed 's/^/    /' "$RES/env/brief.txt"; echo; }
    echo "Elapsed $(( $(now) - START )) s of a $BUDGET s budget. Details: results.tgz (logs, metrics, XML)."
    echo
    echo "| step | status | time | detail |"
    echo "|---|---|---|---|"
    awk -F'\t' '{printf "| %s | **%s** | %s s | %s |\n", $1, $2, $3, $4}' "$RES/steps.tsv"
    echo
    echo "## Checks"
    echo
    echo "| step | check | status | detail |"
    echo "|---|---|---|---|"
    awk -F'\t' '{d = $4; gsub(/\|/, "\\|", d); printf "| %s | %s | %s | %s |\n", $1, $2, $3, d}' "$RES/checks.tsv"
    if [[ -s $RES/bench.tsv ]]; then
      echo
      echo "## Benchmark: one GPU, bf16, one micro-batch per step, mean of the timed steps"
      echo
      echo "| model | impl | B x T | ms/step | tokens/s | MFU (989 TF/s) | own MFU | peak GPU mem | loss first -> last | status |"
      echo "|---|---|---|---|---|---|---|---|---|---|"
      cat "$RES/bench.tsv"
    fi
  } >"$f.tmp" && mv "$f.tmp" "$f"
  cp "$f" "$OUT_DIR/summary.md"
}
# Everything into one tarball (the device tool returns at most 8 files); a log over 2 MiB
# keeps its first and last MiB.
pack() {
  local f
  while IFS= read -r -d '' f; do
    { head -c 1048576 "$f"; printf '\n[... %s bytes cut by gpu_check.sh ...]\n' "$(stat -c %s "$f")"; tail -c 1048576 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
  done < <(find "$RES" -type f -size +2M -print0)
  tar -czf "$OUT_DIR/results.tgz.tmp" -C "$WORK" results 2>/dev/null && mv "$OUT_DIR/results.tgz.tmp" "$OUT_DIR/results.tgz"
}

# --------------------------------------------------------------------------------------
# step env: tools, versions, the GPU, cuDNN/NCCL/cuBLASLt, the carried prefix
# --------------------------------------------------------------------------------------
find_lib_dirs() {  # find_lib_dirs GLOB: candidate directories holding GLOB, best first
  local g=$1 d
  local cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
  for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib"; do
    compgen -G "$d/$g" >/dev/null && echo "$d"
  done
  for d in "${SITE_DIRS[@]}"; do
    find "$d/nvidia" -maxdepth 3 -name "$g" -printf '%h\n' 2>/dev/null
  done
  ldconfig -p 2>/dev/null | awk -v g="$g" '{print $NF}' | while read -r p; do
    [[ $(basename "$p") == $g ]] && dirname "$p"
  done
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib; do
    compgen -G "$d/$g" >/dev/null && echo "$d"
  done
}
# The include directory beside a library directory that holds HEADER, or "".
header_beside() {
  local libdir=$1 header=$2 d
  for d in "$libdir/../include" "$libdir/../../include" "$(dirname "$libdir")/include"; do
    [[ -f $d/$header ]] && { (cd "$d" && pwd); return; }
  done
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  case $libdir in "$cuda"*) [[ -f $cuda/include/$header ]] && echo "$cuda/include" ;; esac
}

step_env() {
  local t0; t0=$(now); local E="$RES/env"; mkdir -p "$E"
  local r="$E/report.txt"
  {
    echo "## host"; uname -a; (. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}")
    lscpu 2>/dev/null | grep -m1 'Model name'; echo "cores: $(nproc)"; free -g 2>/dev/null | head -2
    echo "## glibc"; getconf GNU_LIBC_VERSION; ldd --version 2>&1 | head -1
    echo "## compilers and tools"
    for t in gcc g++ nvcc cmake ninja compute-sanitizer python3 dpkg tar; do
      printf '%-18s %s\n' "$t" "$(command -v $t || echo 'NOT FOUND')"
    done
    g++ --version 2>&1 | head -1; nvcc --version 2>&1 | tail -2; cmake --version 2>&1 | head -1
    echo "ninja $(ninja --version 2>&1)"
    command -v compute-sanitizer >/dev/null && compute-sanitizer --version 2>&1 | tail -1
    echo "libstdc++: $(g++ -print-file-name=libstdc++.so.6 2>/dev/null)"
  } >"$r" 2>&1
  local fail=()
  for t in g++ nvcc cmake; do command -v $t >/dev/null || fail+=("$t not found"); done
  # The GPU
  if [[ $MODE == check ]]; then
    if nvidia-smi >"$E/nvidia-smi.txt" 2>&1; then
      HAVE_GPU=1
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap --format=csv >>"$E/nvidia-smi.txt" 2>&1
      check env gpu PASS "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    else
      check env gpu FAIL "nvidia-smi failed: $(tail -1 "$E/nvidia-smi.txt")"
    fi
  else
    check env gpu SKIPPED "no GPU (dry run)"
  fi
  # Python / PyTorch, and the site-packages that hold the nvidia-* wheels
  SITE_DIRS=()
  local py
  for py in python3 /usr/bin/python3; do
    command -v $py >/dev/null || continue
    if $py -c 'import torch' >/dev/null 2>&1; then PY=$py; break; fi
  done
  $PY - >"$E/torch.txt" 2>&1 <<'EOF'
import sys, site
print("python", sys.version.split()[0], sys.executable)
print("site", " ".join(site.getsitepackages()))
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda)
    print("torch cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    try:
        print("torch nccl", ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as e:
        print("torch nccl", None, e)
    print("cuda available", torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("device", p.name, "sm", f"{p.major}{p.minor}", "SMs", p.multi_processor_count,
              "memory GiB", round(p.total_memory / 2**30, 1))
except Exception as e:
    print("torch not importable:", e)
EOF
  read -r -a SITE_DIRS <<<"$(awk '$1 == "site" {$1 = ""; print}' "$E/torch.txt")"
  # cuDNN, NCCL, cuBLASLt: a library directory with its header beside it; the toolkit's
  # first, then the pip wheels', then the system's.
  local lib hdr name glob d cudnn_lib="" cudnn_inc="" nccl_lib="" nccl_inc="" cublaslt=""
  for name in cudnn nccl; do
    [[ $name == cudnn ]] && { glob='libcudnn.so.9*'; hdr=cudnn_version.h; } || { glob='libnccl.so.2*'; hdr=nccl.h; }
    local found_lib="" found_inc=""
    while read -r d; do
      [[ -z $d ]] && continue
      [[ -z $found_lib ]] && found_lib=$d
      local inc; inc=$(header_beside "$d" "$hdr")
      if [[ -n $inc ]]; then found_lib=$d; found_inc=$inc; break; fi
    done < <(find_lib_dirs "$glob" | awk '!seen[$0]++')
    echo "$name: library dir ${found_lib:-NOT FOUND}, headers ${found_inc:-none beside it}" >>"$r"
    if [[ $name == cudnn ]]; then cudnn_lib=$found_lib; cudnn_inc=$found_inc; else nccl_lib=$found_lib; nccl_inc=$found_inc; fi
  done
  cublaslt=$(find_lib_dirs 'libcublasLt.so.1*' | head -1)
  echo "cublasLt: ${cublaslt:-NOT FOUND}" >>"$r"
  [[ -n $cudnn_lib ]] || fail+=("libcudnn.so.9 not found")
  [[ -n $nccl_lib ]] || fail+=("libnccl.so.2 not found")
  [[ -n $cublaslt ]] || fail+=("libcublasLt not found")
  # The carried prefix
  if [[ -f $CARRY/deps.tar.gz ]]; then
    # shellcheck disable=SC1091
    . "$CARRY/manifest.env"
    if [[ ! -f $DEPS/.sha256 || $(cat "$DEPS/.sha256") != "$CARRY_SHA256" ]]; then
      rm -rf "$DEPS"; mkdir -p "$DEPS"
      tar -xzf "$CARRY/deps.tar.gz" -C "$DEPS" && echo "$CARRY_SHA256" >"$DEPS/.sha256" ||
        fail+=("unpacking $CARRY/deps.tar.gz failed")
    fi
    local box_glibc; box_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
    if [[ $(printf '%s\n%s\n' "$CARRY_GLIBC_MIN" "$box_glibc" | sort -V | head -1) != "$CARRY_GLIBC_MIN" ]]; then
      fail+=("glibc $box_glibc is older than the $CARRY_GLIBC_MIN the carried Debian 12 libraries need (build them from source there)")
    fi
    local libstdcxx; libstdcxx=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null)
    if [[ -f $libstdcxx ]] && ! strings "$libstdcxx" | grep -x "GLIBCXX_$CARRY_GLIBCXX_MIN" >/dev/null; then
      fail+=("$libstdcxx has no GLIBCXX_$CARRY_GLIBCXX_MIN (needed by the carried libraries)")
    fi
  else
    fail+=("$CARRY/deps.tar.gz missing: run scripts/gpu_check.sh --prepare here and carry .gpu-carry")
  fi
  local L="$DEPS/prefix/$ARCH_LIB"
  TRI_LD="$L:$L/openblas-openmp"
  local fb
  for fb in "${FALLBACK_LIBS[@]}"; do
    if ! ldconfig -p 2>/dev/null | grep -F "$fb " >/dev/null; then
      TRI_LD="$TRI_LD:$DEPS/fallback"; echo "fallback: $fb not on this machine, using the carried one" >>"$r"
    fi
  done
  TRI_LD=$(echo "$TRI_LD" | tr ':' '\n' | awk 'NF && !seen[$0]++' | paste -sd:)
  for d in "$cudnn_lib" "$nccl_lib" "$cublaslt"; do [[ -n $d ]] && TRI_LD="$TRI_LD:$d"; done
  TRI_LD=$(echo "$TRI_LD" | tr ':' '\n' | awk 'NF && !seen[$0]++' | paste -sd:)
  # Headers: the machine's own unless they are older than the carried ones (the backend
  # is written against those; an older header can lack an enum it uses).
  local H="$DEPS/cuda-headers"
  if [[ -f $H/cudnn_version.h ]]; then
    local mine; mine=$([[ -n $cudnn_inc ]] && header_version_cudnn "$cudnn_inc/cudnn_version.h")
    if [[ -z $mine || $mine -lt ${CARRY_CUDNN_HEADERS:-0} ]]; then
      echo "cudnn headers: the machine's (${mine:-none}) are older than the carried $CARRY_CUDNN_HEADERS: using the carried ones" >>"$r"
      cudnn_inc=$H
    fi
    mine=$([[ -n $nccl_inc ]] && header_version_nccl "$nccl_inc/nccl.h")
    if [[ -z $mine || $mine -lt ${CARRY_NCCL_HEADERS:-0} ]]; then
      echo "nccl headers: the machine's (${mine:-none}) are older than the carried $CARRY_NCCL_HEADERS: using the carried ones" >>"$r"
      nccl_inc=$H
    fi
  fi
  local cudnn_so nccl_so
  cudnn_so=$(ls "$cudnn_lib"/libcudnn.so.9 "$cudnn_lib"/libcudnn.so 2>/dev/null | head -1)
  nccl_so=$(ls "$nccl_lib"/libnccl.so.2 "$nccl_lib"/libnccl.so 2>/dev/null | head -1)
  CMAKE_ARGS_MAP=(
    [TRIDENT_CUDNN]=$cudnn_so [TRIDENT_CUDNN_INCLUDE]=$cudnn_inc
    [TRIDENT_NCCL]=$nccl_so [TRIDENT_NCCL_INCLUDE]=$nccl_inc
  )
  # FindCUDAToolkit looks for cuBLASLt in the toolkit only; point it at the wheel's.
  local cuda_home; cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
  if ! compgen -G "$cuda_home/lib*/libcublasLt.so*" >/dev/null && ! compgen -G "$cuda_home/targets/x86_64-linux/lib/libcublasLt.so*" >/dev/null && [[ -n $cublaslt ]]; then
    CMAKE_ARGS_MAP[CUDA_cublasLt_LIBRARY]=$(ls "$cublaslt"/libcublasLt.so* | head -1)
  fi
  # Carried libraries must load here (nothing "not found").
  local missing=""
  if [[ -d $L ]]; then
    missing=$(find "$L" "$DEPS/fallback" -name '*.so*' -type f -print0 | xargs -0 -n1 env LD_LIBRARY_PATH="$TRI_LD" ldd 2>/dev/null |
              grep 'not found' | sort -u | paste -sd' ')
    [[ -z $missing ]] || fail+=("carried libraries do not load: $missing")
  fi
  {
    echo "## chosen"
    echo "TRI_LD=$TRI_LD"
    for k in "${!CMAKE_ARGS_MAP[@]}"; do echo "-D$k=${CMAKE_ARGS_MAP[$k]}"; done
    echo "## python"; cat "$E/torch.txt"
  } >>"$r"
  # One paragraph for the summary's head.
  {
    echo "$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(getconf GNU_LIBC_VERSION), $(nproc) cores, $(lscpu 2>/dev/null | grep -m1 'Model name' | sed 's/.*: *//')"
    [[ $HAVE_GPU == 1 ]] && echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*'), $(g++ --version 2>/dev/null | head -1), $(cmake --version 2>/dev/null | head -1), ninja $(ninja --version 2>/dev/null)"
    grep -E '^(torch|python|device)' "$E/torch.txt" | paste -sd';' | sed 's/;/; /g'
    echo "cuDNN lib ${cudnn_so:-none} (headers $cudnn_inc); NCCL ${nccl_so:-none} (headers $nccl_inc); cuBLASLt ${cublaslt:-none}"
  } >"$E/brief.txt"
  if [[ ${#fail[@]} -gt 0 ]]; then
    local f; for f in "${fail[@]}"; do check env setup FAIL "$f"; done
  else
    check env setup PASS "tools, cuDNN/NCCL/cuBLASLt and the carried prefix found; carried libraries load"
  fi
  step_done env "$(checks_status env)" $(( $(now) - t0 )) "$(checks_detail env)"
}

# --------------------------------------------------------------------------------------
# step build
# --------------------------------------------------------------------------------------
BUILT=()
step_build() {
  local t0; t0=$(now); local B="$RES/build"; mkdir -p "$B"
  local P="$DEPS/prefix" L="$DEPS/prefix/$ARCH_LIB"
  if [[ ! -d $L ]]; then
    check build configure FAIL "no carried prefix at $P (see step env)"
    step_done build FAIL $(( $(now) - t0 )) "no carried prefix"; return
  fi
  local args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5
    -DCMAKE_PREFIX_PATH="$P/usr"
    -Dspdlog_DIR="$L/cmake/spdlog" -Dfmt_DIR="$L/cmake/fmt" -Dyaml-cpp_DIR="$L/cmake/yaml-cpp"
    -Dnlohmann_json_DIR="$P/usr/share/cmake/nlohmann_json" -DGTest_DIR="$L/cmake/GTest"
    -DTRIDENT_OPENBLAS="$L/openblas-openmp/libopenblas.so.0"
    -DTRIDENT_CBLAS_INCLUDE="$P/usr/include/x86_64-linux-gnu/openblas-openmp"
    -DTRIDENT_XXHASH_INCLUDE="$P/usr/include" -DTRIDENT_XXHASH="$L/libxxhash.so"
    -DTRIDENT_PCRE2_INCLUDE="$P/usr/include" -DTRIDENT_PCRE2="$L/libpcre2-8.so"
    # FindMPI: LIB_NAMES + COMPILER_INCLUDE_DIRS given = no wrapper, pkg-config or guessing
    # (FindMPI.cmake), so a system MPI (or none) makes no difference.
    -DMPI_CXX_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$L/openmpi/lib/libmpi.so"
    -DMPI_CXX_HEADER_DIR="$L/openmpi/include" -DMPI_CXX_COMPILER_INCLUDE_DIRS="$L/openmpi/include"
    -DMPI_CXX_SKIP_MPICXX=ON -DMPIEXEC_EXECUTABLE=/bin/false)
  command -v nvcc >/dev/null && args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  local k
  for k in "${!CMAKE_ARGS_MAP[@]}"; do [[ -n ${CMAKE_ARGS_MAP[$k]} ]] && args+=("-D$k=${CMAKE_ARGS_MAP[$k]}"); done
  command -v ccache >/dev/null && [[ $MODE == dry ]] && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  local t; t=$(cap 90)
  if (( t == 0 )) || ! LD_LIBRARY_PATH="$TRI_LD" run_to "$B/configure.log" "$t" cmake "${args[@]}"; then
    check build configure FAIL "cmake configure failed: $(grep -m1 -A2 'CMake Error' "$B/configure.log" | tr '\n' ' ' | cut -c1-300)"
    step_done build FAIL $(( $(now) - t0 )) "configure"; return
  fi
  # Nothing from the system where a carried copy exists: no include or library path of a
  # carried package outside the prefix in the generated build (here, where the system has
  # them all, this is what shows that the GPU machine's build will find everything).
  local leaked
  leaked=$(grep -oE '(-I|-isystem |^| )/usr(/local)?/(lib|include)[^ ]*(yaml-cpp|spdlog|fmt|mpi|xxhash|pcre2|openblas|gtest|nlohmann)[^ ]*' "$BUILD/build.ninja" |
           sed 's/^ *//' | sort -u | head -5 | paste -sd' ')
  if [[ -n $leaked ]]; then
    check build configure FAIL "found outside the carried prefix: $leaked"
  else
    check build configure PASS "$(grep -m1 'Trident CUDA backend' "$B/configure.log" | sed 's/^-- //'); every dependency from the carried prefix"
  fi
  # The targets that exist in this tree (the CUDA tests come with the backend).
  local targets=() want_t
  local have; have=$(ninja -C "$BUILD" -t targets all 2>/dev/null | cut -d: -f1)
  # A dry run needs no kernels_tests (its cuda rows need a GPU; CI builds and runs the rest).
  local wanted=(trident kernels_tests cuda_tests)
  [[ $MODE == dry ]] && wanted=(trident cuda_tests)
  for want_t in "${wanted[@]}"; do
    grep -qx "$want_t" <<<"$have" && targets+=("$want_t")
  done
  local missing_t; missing_t=$(printf '%s\n' "${wanted[@]}" | grep -vxF -f <(printf '%s\n' "${targets[@]}") | paste -sd' ')
  # 16 cores there: ~1-2 min expected. Here 2 shared cores and no warm cache: far longer.
  t=$(cap "$([[ $MODE == dry ]] && echo 3600 || echo 300)")
  if (( t == 0 )); then check build compile FAIL "no time left"; step_done build FAIL $(( $(now) - t0 )) ""; return; fi
  local tb; tb=$(now)
  if LD_LIBRARY_PATH="$TRI_LD" run_to "$B/build.log" "$t" nice cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"; then
    BUILT=("${targets[@]}")
    check build compile PASS "${targets[*]} in $(( $(now) - tb )) s with -j$JOBS${missing_t:+ (not in this tree: $missing_t)}"
  else
    check build compile FAIL "$(grep -m1 -B2 -A3 'error' "$B/build.log" | tr '\n' ' ' | cut -c1-400)"
    for want_t in "${targets[@]}"; do [[ -x $BUILD/$want_t ]] && BUILT+=("$want_t"); done
  fi
  if [[ -x $BUILD/trident ]]; then
    tri ldd "$BUILD/trident" >"$B/ldd_trident.txt" 2>&1
    if grep -q 'not found' "$B/ldd_trident.txt"; then
      check build ldd FAIL "trident: $(grep 'not found' "$B/ldd_trident.txt" | paste -sd' ')"
    else
      check build ldd PASS "trident loads: $(grep -oE 'lib(cudnn|cublasLt|nccl|cudart|mpi|openblas)[^ ]* => [^ ]*' "$B/ldd_trident.txt" | sed 's/ => /=/' | paste -sd' ')"
    fi
  fi
  step_done build "$(checks_status build)" $(( $(now) - t0 )) "$(checks_detail build)"
}
built() { [[ " ${BUILT[*]} " == *" $1 "* ]]; }

# --------------------------------------------------------------------------------------
# step ops: cuda_tests and the op table's cuda backend, both attention paths
# --------------------------------------------------------------------------------------
gtest_counts() {  # gtest_counts XML -> "tests failures skipped"
  $PY - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
cases = root.iter("testcase")
n = f = s = 0
for c in cases:
    n += 1
    if c.find("failure") is not None or c.find("error") is not None: f += 1
    elif c.get("result") == "skipped" or c.find("skipped") is not None: s += 1
print(n, f, s)
EOF
}
gtest_run() {  # gtest_run NAME BINARY TIMEOUT ENV... -- ARGS...  (GTEST_STEP: the step, default ops)
  local name=$1 bin=$2 t0=$3 st=${GTEST_STEP:-ops}; shift 3
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  local t; t=$(cap "$t0")
  if (( t == 0 )); then check "$st" "$name" SKIPPED "no time left"; return; fi
  local xml="$RES/$st/$name.xml"
  tri env "${envs[@]}" timeout -k 5 "$t" "$BUILD/$bin" "$@" --gtest_output="xml:$xml" >"$RES/$st/$name.log" 2>&1
  local rc=$?
  read -r n f s <<<"$(gtest_counts "$xml")"
  local what="$n tests, $f failed, $s skipped (${envs[*]:-default env}, rc $rc)"
  if (( rc == 124 || rc == 137 )); then check "$st" "$name" FAIL "TIMEOUT after $t s; $what"
  elif (( rc != 0 || f > 0 )); then check "$st" "$name" FAIL "$what: $(grep -m3 '^\[  FAILED  \]' "$RES/$st/$name.log" | paste -sd' ' | cut -c1-300)"
  elif (( n == 0 )); then check "$st" "$name" FAIL "no tests matched $*"
  elif (( s == n && HAVE_GPU == 1 )); then check "$st" "$name" FAIL "$what: every test skipped on a GPU machine (device not seen?)"
  elif (( s == n )); then check "$st" "$name" SKIPPED "$what: every test skipped (no GPU)"
  elif (( s > 0 && HAVE_GPU == 1 )); then
    check "$st" "$name" PASS "$what; skipped on this GPU machine: $(grep -B1 -m3 '^\[  SKIPPED \]' "$RES/$st/$name.log" | grep -o '\[  SKIPPED \] [^ ]*' | cut -c14- | paste -sd' ')"
  else check "$st" "$name" PASS "$what"
  fi
}
step_ops() {
  local t0; t0=$(now); mkdir -p "$RES/ops"
  local att
  for att in plain cudnn; do
    if built cuda_tests; then
      gtest_run "cuda_tests_$att" cuda_tests 90 "TRIDENT_ATTENTION=$att" -- --gtest_filter='-Nccl*'
    else
      check ops "cuda_tests_$att" SKIPPED "cuda_tests not built (tests/cuda not in this tree, or the build failed)"
    fi
    if [[ $MODE == dry ]]; then
      check ops "optable_cuda_$att" SKIPPED "no GPU (the cuda rows of the op table need one)"
    elif built kernels_tests; then
      gtest_run "optable_cuda_$att" kernels_tests 60 "TRIDENT_ATTENTION=$att" -- --gtest_filter='OpTable.cuda*'
    else
      check ops "optable_cuda_$att" SKIPPED "kernels_tests not built"
    fi
  done
  step_done ops "$(checks_status ops)" $(( $(now) - t0 )) "$(checks_detail ops)"
}

# --------------------------------------------------------------------------------------
# step nccl: the NCCL backend on one GPU (tests/cuda/nccl_*_test.cpp, filter Nccl*): the
# bootstrap, the world of one from the factory, device and host splits, all-reduce /
# reduce-scatter / all-gather / broadcast in f32 and bf16 against host references (both
# stream modes), and the abort path (abort in process; abort-and-exit 1 in a child). In a
# dry run the host tests pass and the GPU tests skip. Send/recv need two GPUs.
# --------------------------------------------------------------------------------------
step_nccl() {
  local t0; t0=$(now); mkdir -p "$RES/nccl"
  if built cuda_tests; then
    GTEST_STEP=nccl gtest_run nccl_tests cuda_tests 120 "NCCL_DEBUG=WARN" -- --gtest_filter='Nccl*'
  else
    check nccl nccl_tests SKIPPED "cuda_tests not built (tests/cuda not in this tree, or the build failed)"
  fi
  step_done nccl "$(checks_status nccl)" $(( $(now) - t0 )) "$(checks_detail nccl)"
}

# --------------------------------------------------------------------------------------
# step parity: 30 steps of the tiny gpt2 and llama configs, CUDA vs CPU, determinism, resume
# --------------------------------------------------------------------------------------
# Tolerances (first guesses, to calibrate on the first GPU run: every comparison prints its
# measured max/mean/first relative loss differences into the summary either way).
# fp32: cuBLASLt fp32 vs OpenBLAS differ only in summation order, ~1e-6 per op at step 1.
FP32_TOL=(--first-rel 1e-5 --max-rel 1e-3)
# bf16 vs the CPU's bf16 emulation (same rounding points, different fp32 sums): a rounding
# flip moves a bf16 value by 2^-8 relative, so losses drift apart over the steps.
BF16_TOL=(--first-rel 2e-3 --mean-rel 1e-2 --max-rel 3e-2)

make_data() {
  [[ -f $WORK/data/train_000000.bin ]] && return 0
  # The project's own text as byte tokens: fixed by the tree, ~1.8 MB, valid for every
  # vocabulary >= 256 (the benchmark models' too).
  local files; mapfile -t files < <(cd "$ROOT" && find . -path ./build\* -prune -o \( -name '*.md' -o -name '*.h' -o -name '*.cpp' \) -type f -print | grep -v '^./build' | LC_ALL=C sort)
  (cd "$ROOT" && tri "$BUILD/trident" prepare --input "${files[@]}" --out "$WORK/data" --tokenizer byte --val-fraction 0) >"$RES/parity/prepare.log" 2>&1
}
# train NAME CONFIG DEVICE PRECISION INTERVAL TIMEOUT [RESUME_FROM] [ENV...]: one run under
# $WORK/parity/NAME; its metrics are copied into the results.
train() {
  local name=$1 cfg=$2 dev=$3 prec=$4 interval=$5 t0=$6 from=${7:-}; shift 7 2>/dev/null || shift $#
  local d="$WORK/parity/$name"; rm -rf "$d"; mkdir -p "$d/ckpt"
  local resume=none
  if [[ -n $from ]]; then
    [[ -d $from ]] || { echo "gpu_check: no checkpoint $from to resume from (its run failed)" >"$RES/parity/$name.log"; return 3; }
    cp -r "$from" "$d/ckpt/"; resume="$d/ckpt/$(basename "$from")"
  fi
  local t; t=$(cap "$t0")
  (( t == 0 )) && { echo "no time left" >"$RES/parity/$name.log"; return 1; }
  tri env "$@" timeout -k 5 "$t" "$BUILD/trident" train --config "$ROOT/$cfg" --resume "$resume" \
    --set "data.train=$WORK/data/train_*.bin" --set data.val= \
    --set training.max_steps="$PARITY_STEPS" --set training.eval_interval=0 \
    --set checkpoint.dir="$d/ckpt" --set checkpoint.interval="$interval" \
    --set logging.metrics="$d/metrics.jsonl" --set logging.log_interval=1 \
    --set runtime.device="$dev" --set training.precision="$prec" >"$RES/parity/$name.log" 2>&1
  local rc=$?
  cp "$d/metrics.jsonl" "$RES/parity/$name.metrics.jsonl" 2>/dev/null
  (( rc == 124 || rc == 137 )) && echo "[gpu_check: TIMEOUT after $t s]" >>"$RES/parity/$name.log"
  return $rc
}
ran() { [[ -s $WORK/parity/$1/metrics.jsonl && -f $WORK/parity/$1/.ok ]]; }
train_ok() {  # train_ok NAME ...: train, record a check on failure
  local name=$1
  train "$@"
  local rc=$?
  if (( rc == 0 )); then touch "$WORK/parity/$name/.ok"; return 0; fi
  check parity "run $name" FAIL "exit $rc: $(grep -v '^info' "$RES/parity/$name.log" | tail -2 | paste -sd' ' | cut -c1-300)"
  return 1
}
# cmp_runs CHECK A B STEPS ARGS...: compare_runs.py on two runs' metrics, recorded as a check.
cmp_runs() {
  local name=$1 a=$2 b=$3 steps=$4; shift 4
  if ! ran "$a" || ! ran "$b"; then
    check parity "$name" "${SKIP_STATUS:-FAIL}" "${SKIP_REASON:-a run failed or did not run}"; return
  fi
  local out; out=$($PY "$ROOT/scripts/gpu/compare_runs.py" compare "$WORK/parity/$a/metrics.jsonl" \
                   "$WORK/parity/$b/metrics.jsonl" --steps "$steps" --name "$a vs $b" "$@" 2>&1)
  local rc=$?
  echo "$out" >>"$RES/parity/compare.log"
  check parity "$name" "$( ((rc == 0)) && echo PASS || echo FAIL)" "$out"
}
cmp_ckpt() {  # cmp_ckpt CHECK A B: the final checkpoints' tensors, bitwise
  local name=$1 a=$2 b=$3
  if ! ran "$a" || ! ran "$b"; then check parity "$name" "${SKIP_STATUS:-FAIL}" "${SKIP_REASON:-a run failed or did not run}"; return; fi
  local out; out=$($PY "$ROOT/scripts/gpu/compare_runs.py" ckpt "$WORK/parity/$a/ckpt/step_$PARITY_STEPS" \
                   "$WORK/parity/$b/ckpt/step_$PARITY_STEPS" --name "$a vs $b" 2>&1)
  local rc=$?
  echo "$out" >>"$RES/parity/compare.log"
  check parity "$name" "$( ((rc == 0)) && echo PASS || echo FAIL)" "$out"
}
step_parity() {
  local t0; t0=$(now); mkdir -p "$RES/parity" "$WORK/parity"
  if ! built trident && [[ ! -x $BUILD/trident ]]; then
    check parity all FAIL "no trident binary"; step_done parity FAIL $(( $(now) - t0 )) ""; return
  fi
  if ! make_data; then
    check parity data FAIL "trident prepare failed: $(tail -2 "$RES/parity/prepare.log" | paste -sd' ')"
    step_done parity FAIL $(( $(now) - t0 )) ""; return
  fi
  local half=$((PARITY_STEPS / 2)) all="1-$PARITY_STEPS" rest="$((PARITY_STEPS / 2 + 1))-$PARITY_STEPS"
  local cpu_t=60 gpu_t=45
  [[ $MODE == dry ]] && cpu_t=400  # 2 shared cores here
  local m cfg
  for m in gpt2 llama; do
    [[ $m == gpt2 ]] && cfg=configs/tiny.yaml || cfg=configs/tiny_llama.yaml
    # The CPU references (the CPU halves of every comparison).
    train_ok "${m}_cpu_fp32" "$cfg" cpu fp32 "$half" "$cpu_t" ""
    train_ok "${m}_cpu_bf16" "$cfg" cpu bf16 0 "$cpu_t" ""
    if [[ $MODE == dry ]]; then
      # What the GPU run does with CUDA runs, done here with CPU ones: the comparator
      # passes on equal runs, fails on a perturbed copy, and resume is bitwise.
      train_ok "${m}_cpu_fp32_resume" "$cfg" cpu fp32 "$half" "$cpu_t" "$WORK/parity/${m}_cpu_fp32/ckpt/step_$half"
      cmp_runs "$m cpu fp32 resume (bitwise)" "${m}_cpu_fp32" "${m}_cpu_fp32_resume" "$rest" --bitwise
      cmp_ckpt "$m cpu fp32 resume ckpt (bitwise)" "${m}_cpu_fp32" "${m}_cpu_fp32_resume"
      cmp_runs "$m comparator on equal runs (bitwise)" "${m}_cpu_fp32" "${m}_cpu_fp32" "$all" --bitwise
      if ran "${m}_cpu_fp32"; then
        local p="$WORK/parity/${m}_cpu_fp32_perturbed"; mkdir -p "$p"; touch "$p/.ok"
        $PY "$ROOT/scripts/gpu/compare_runs.py" perturb "$WORK/parity/${m}_cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --step "$((half + 2))" --rel 1e-7
        local out rc
        out=$($PY "$ROOT/scripts/gpu/compare_runs.py" compare "$WORK/parity/${m}_cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --steps "$all" --bitwise --name perturbed 2>&1); rc=$?
        check parity "$m comparator fails on a 1e-7 perturbation (bitwise)" "$( ((rc == 1)) && echo PASS || echo FAIL)" "expected FAIL, got: $out"
        $PY "$ROOT/scripts/gpu/compare_runs.py" perturb "$WORK/parity/${m}_cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --step "$((half + 2))" --rel 5e-2
        out=$($PY "$ROOT/scripts/gpu/compare_runs.py" compare "$WORK/parity/${m}_cpu_fp32/metrics.jsonl" "$p/metrics.jsonl" --steps "$all" "${BF16_TOL[@]}" --name perturbed 2>&1); rc=$?
        check parity "$m comparator fails on a 5e-2 perturbation (bf16 tolerance)" "$( ((rc == 1)) && echo PASS || echo FAIL)" "expected FAIL, got: $out"
      fi
      # Information: how far the CPU's bf16 is from its fp32 (not a gate).
      if ran "${m}_cpu_fp32" && ran "${m}_cpu_bf16"; then
        local info; info=$($PY "$ROOT/scripts/gpu/compare_runs.py" compare "$WORK/parity/${m}_cpu_fp32/metrics.jsonl" "$WORK/parity/${m}_cpu_bf16/metrics.jsonl" --steps "$all" --max-rel 1 --name "${m}_cpu_fp32 vs ${m}_cpu_bf16" 2>&1)
        check parity "$m cpu bf16 vs cpu fp32 (information)" PASS "$info"
      fi
      SKIP_STATUS=SKIPPED SKIP_REASON="no GPU (dry run)"
      for c in "cuda fp32 vs cpu fp32" "cuda bf16 vs cpu bf16" "cuda bf16 twice (bitwise)" \
               "cuda bf16 TRIDENT_CUDA_SYNC=1 (bitwise)" "cuda bf16 resume (bitwise)" "cuda fp32 resume (bitwise)"; do
        check parity "$m $c" SKIPPED "no GPU (dry run)"
      done
      unset SKIP_STATUS SKIP_REASON
      write_summary; pack
      continue
    fi
    train_ok "${m}_cuda_fp32" "$cfg" cuda fp32 "$half" "$gpu_t" ""
    train_ok "${m}_cuda_bf16" "$cfg" cuda bf16 "$half" "$gpu_t" ""
    train_ok "${m}_cuda_bf16_again" "$cfg" cuda bf16 "$half" "$gpu_t" ""
    train_ok "${m}_cuda_bf16_sync" "$cfg" cuda bf16 "$half" "$gpu_t" "" TRIDENT_CUDA_SYNC=1
    train_ok "${m}_cuda_bf16_resume" "$cfg" cuda bf16 "$half" "$gpu_t" "$WORK/parity/${m}_cuda_bf16/ckpt/step_$half"
    train_ok "${m}_cuda_fp32_resume" "$cfg" cuda fp32 "$half" "$gpu_t" "$WORK/parity/${m}_cuda_fp32/ckpt/step_$half"
    cmp_runs "$m cuda fp32 vs cpu fp32" "${m}_cpu_fp32" "${m}_cuda_fp32" "$all" "${FP32_TOL[@]}"
    cmp_runs "$m cuda bf16 vs cpu bf16" "${m}_cpu_bf16" "${m}_cuda_bf16" "$all" "${BF16_TOL[@]}"
    cmp_runs "$m cuda bf16 twice (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_again" "$all" --bitwise
    cmp_ckpt "$m cuda bf16 twice ckpt (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_again"
    cmp_runs "$m cuda bf16 TRIDENT_CUDA_SYNC=1 (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_sync" "$all" --bitwise
    cmp_ckpt "$m cuda bf16 TRIDENT_CUDA_SYNC=1 ckpt (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_sync"
    cmp_runs "$m cuda bf16 resume (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_resume" "$rest" --bitwise
    cmp_ckpt "$m cuda bf16 resume ckpt (bitwise)" "${m}_cuda_bf16" "${m}_cuda_bf16_resume"
    cmp_runs "$m cuda fp32 resume (bitwise)" "${m}_cuda_fp32" "${m}_cuda_fp32_resume" "$rest" --bitwise
    write_summary; pack
  done
  step_done parity "$(checks_status parity)" $(( $(now) - t0 )) "$(checks_detail parity)"
}

# --------------------------------------------------------------------------------------
# step sanitizer: compute-sanitizer memcheck on two tiny steps of each family
# --------------------------------------------------------------------------------------
step_sanitizer() {
  local t0; t0=$(now); local S="$RES/sanitizer"; mkdir -p "$S"
  if [[ $MODE == dry ]]; then
    check sanitizer memcheck SKIPPED "no GPU (dry run)"
    step_done sanitizer SKIPPED $(( $(now) - t0 )) "no GPU"; return
  fi
  if ! command -v compute-sanitizer >/dev/null; then
    check sanitizer memcheck FAIL "compute-sanitizer not found"
    step_done sanitizer FAIL $(( $(now) - t0 )) ""; return
  fi
  make_data
  local m cfg
  for m in gpt2 llama; do
    [[ $m == gpt2 ]] && cfg=configs/tiny.yaml || cfg=configs/tiny_llama.yaml
    local t; t=$(cap 60)
    if (( t == 0 )); then check sanitizer "memcheck $m" SKIPPED "no time left"; continue; fi
    local d="$WORK/sanitizer/$m"; rm -rf "$d"; mkdir -p "$d"
    tri timeout -k 5 "$t" compute-sanitizer --tool memcheck --error-exitcode 97 --log-file "$S/memcheck_$m.txt" \
      "$BUILD/trident" train --config "$ROOT/$cfg" --resume none \
      --set "data.train=$WORK/data/train_*.bin" --set data.val= --set training.max_steps=2 \
      --set training.eval_interval=0 --set checkpoint.dir="$d/ckpt" --set checkpoint.interval=0 \
      --set logging.metrics= --set runtime.device=cuda --set training.precision=bf16 >"$S/run_$m.log" 2>&1
    local rc=$?
    local summary; summary=$(grep -m1 'ERROR SUMMARY' "$S/memcheck_$m.txt" 2>/dev/null)
    if (( rc == 0 )) && [[ $summary == *" 0 errors"* ]]; then
      check sanitizer "memcheck $m" PASS "2 bf16 steps: $summary"
    elif (( rc == 124 || rc == 137 )); then
      check sanitizer "memcheck $m" FAIL "TIMEOUT after $t s; ${summary:-no summary}"
    else
      check sanitizer "memcheck $m" FAIL "exit $rc; ${summary:-no summary}; $(grep -m2 -E '^=+ (Invalid|Error|Program hit)' "$S/memcheck_$m.txt" | paste -sd' ' | cut -c1-300)$(tail -1 "$S/run_$m.log" | cut -c1-200)"
    fi
  done
  step_done sanitizer "$(checks_status sanitizer)" $(( $(now) - t0 )) "$(checks_detail sanitizer)"
}

# --------------------------------------------------------------------------------------
# step bench: GPT-2 124M, GPT-2 350M, Llama ~1B on one GPU; Trident and PyTorch eager
# --------------------------------------------------------------------------------------
# model config micro-batch: B x seq_len tokens per step (the config's seq_len), one
# micro-batch per optimizer step, BENCH_WARMUP + BENCH_STEPS steps, the last timed.
BENCH=("gpt2-124m configs/gpt2-124m.yaml 16" "gpt2-350m configs/gpt2-350m.yaml 16" "llama-1b configs/llama-1b.yaml 8")
BENCH_WARMUP=3
BENCH_STEPS=10
mem_sampler_start() {  # nvidia-smi every 200 ms into FILE; prints the sampler's pid
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
  echo $!
}
mem_peak() { sort -n "$1" 2>/dev/null | tail -1; }
step_bench() {
  local t0; t0=$(now); local Bd="$RES/bench"; mkdir -p "$Bd"
  if [[ $MODE == dry ]]; then
    # The PyTorch baseline's models on the CPU, if a torch is here: they build and step.
    local py="" c
    for c in python3 /usr/bin/python3; do command -v $c >/dev/null && $c -c 'import torch, yaml' 2>/dev/null && { py=$c; break; }; done
    if [[ -n $py ]]; then
      for c in configs/tiny.yaml configs/tiny_llama.yaml; do
        if run_to "$Bd/torch_cpu_smoke.log" 120 $py "$ROOT/bench/torch_model.py" --device cpu --config "$ROOT/$c" --batch 2 --steps 1 --warmup 1 --json "$Bd/torch_cpu_$(basename "$c" .yaml).json"; then
          check bench "torch baseline on cpu: $c" PASS "$(tail -1 "$Bd/torch_cpu_smoke.log")"
        else
          check bench "torch baseline on cpu: $c" FAIL "$(tail -2 "$Bd/torch_cpu_smoke.log" | paste -sd' ')"
        fi
      done
    else
      check bench "torch baseline on cpu" SKIPPED "no python3 with torch and yaml here"
    fi
    $PY "$ROOT/scripts/gpu/bench_report.py" --self-test >"$Bd/bench_report_selftest.log" 2>&1 &&
      check bench "bench_report self-test" PASS "$(tail -1 "$Bd/bench_report_selftest.log")" ||
      check bench "bench_report self-test" FAIL "$(tail -2 "$Bd/bench_report_selftest.log" | paste -sd' ')"
    for c in "${BENCH[@]}"; do check bench "${c%% *}" SKIPPED "no GPU (dry run)"; done
    step_done bench "$(checks_status bench)" $(( $(now) - t0 )) "$(checks_detail bench)"; return
  fi
  make_data
  local entry name cfg mb
  for entry in "${BENCH[@]}"; do
    read -r name cfg mb <<<"$entry"
    local steps=$((BENCH_WARMUP + BENCH_STEPS)) d="$WORK/bench/$name"; rm -rf "$d"; mkdir -p "$d"
    # Trident
    local t; t=$(cap 120)
    if (( t > 0 )) && built trident; then
      local pid; pid=$(mem_sampler_start "$Bd/${name}_trident_mem.txt")
      tri timeout -k 5 "$t" "$BUILD/trident" train --config "$ROOT/$cfg" --resume none \
        --set parallel.dp=1 --set parallel.zero_stage=0 --set parallel.micro_batch_size="$mb" \
        --set training.global_batch_size="$mb" --set training.max_steps="$steps" \
        --set training.eval_interval=0 --set checkpoint.dir="$d/ckpt" --set checkpoint.interval=0 \
        --set "data.train=$WORK/data/train_*.bin" --set data.val= \
        --set logging.metrics="$Bd/${name}_trident.jsonl" --set logging.log_interval=1 \
        --set runtime.device=cuda --set training.precision=bf16 >"$Bd/${name}_trident.log" 2>&1
      local rc=$?
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      $PY "$ROOT/scripts/gpu/bench_report.py" trident --config "$ROOT/$cfg" --batch "$mb" \
        --metrics "$Bd/${name}_trident.jsonl" --skip "$BENCH_WARMUP" --mem "$Bd/${name}_trident_mem.txt" \
        --rc "$rc" --name "$name" >>"$RES/bench.tsv" 2>>"$Bd/report.log"
      check bench "$name trident" "$( ((rc == 0)) && echo PASS || echo FAIL)" "exit $rc; $(grep -m1 'done:' "$Bd/${name}_trident.log" | sed 's/^info: //')$( ((rc != 0)) && tail -1 "$Bd/${name}_trident.log" | cut -c1-200)"
    else
      check bench "$name trident" SKIPPED "$( ((t == 0)) && echo 'no time left' || echo 'trident not built')"
    fi
    write_summary; pack
    # PyTorch eager, same model, batch and sequence length
    t=$(cap 100)
    if (( t > 0 )); then
      local pid; pid=$(mem_sampler_start "$Bd/${name}_torch_mem.txt")
      timeout -k 5 "$t" env PYTHONUNBUFFERED=1 $PY "$ROOT/bench/torch_model.py" --device cuda --dtype bf16 \
        --config "$ROOT/$cfg" --batch "$mb" --steps "$BENCH_STEPS" --warmup "$BENCH_WARMUP" \
        --json "$Bd/${name}_torch.json" >"$Bd/${name}_torch.log" 2>&1
      local rc=$?
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      $PY "$ROOT/scripts/gpu/bench_report.py" torch --json "$Bd/${name}_torch.json" --mem "$Bd/${name}_torch_mem.txt" \
        --rc "$rc" --name "$name" --config "$ROOT/$cfg" --batch "$mb" >>"$RES/bench.tsv" 2>>"$Bd/report.log"
      check bench "$name pytorch" "$( ((rc == 0)) && echo PASS || echo FAIL)" "exit $rc; $(tail -1 "$Bd/${name}_torch.log" | cut -c1-250)"
    else
      check bench "$name pytorch" SKIPPED "no time left"
    fi
    write_summary; pack
  done
  step_done bench "$(checks_status bench)" $(( $(now) - t0 )) "$(checks_detail bench)"
}

# --------------------------------------------------------------------------------------
log "gpu_check.sh: mode $MODE, out $OUT_DIR, work $WORK, build $BUILD, budget $BUDGET s, steps $STEPS"
write_summary
SITE_DIRS=()
for s in env build ops nccl parity bench sanitizer; do
  if ! want "$s"; then continue; fi
  if [[ $s != env ]] && (( $(left) < 15 )); then
    printf '%s\tSKIPPED\t0\tout of time (budget %s s)\n' "$s" "$BUDGET" >>"$RES/steps.tsv"; continue
  fi
  if [[ $s != env && $s != build ]] && [[ ! -x $BUILD/trident ]]; then
    printf '%s\tSKIPPED\t0\tno build (step build failed or did not run)\n' "$s" >>"$RES/steps.tsv"; continue
  fi
  [[ $s != env ]] && ! want env && [[ -z $TRI_LD ]] && step_env  # the others need its findings
  # a rerun with --steps and an existing build: the binaries are there
  if [[ $s != build && $s != env ]] && ! want build && [[ ${#BUILT[@]} -eq 0 ]]; then
    for b in trident kernels_tests cuda_tests; do [[ -x $BUILD/$b ]] && BUILT+=("$b"); done
  fi
  "step_$s"
done
write_summary; pack
log "done in $(( $(now) - START )) s; summary: $OUT_DIR/summary.md, everything: $OUT_DIR/results.tgz"
cat "$RES/summary.md"
if cut -f2 "$RES/steps.tsv" | grep FAIL >/dev/null; then exit 1; fi
if [[ $MODE == check ]] && cut -f2 "$RES/steps.tsv" | grep SKIPPED >/dev/null; then exit 1; fi
exit 0
