#!/usr/bin/env bash
# Writes the checkpoint fixtures that tests/e2e/old_checkpoint_test.cpp resumes: checkpoints
# written by an earlier trident, so that a change to the model, the layout or the checkpoint
# code that would stop old checkpoints from loading, or change what they resume to, fails a
# test. Run it with the trident binary of the commit the fixture should stand for:
#
#   tests/reference/make_resume_fixtures.sh build/trident tests/reference/fixtures/resume
#
# For each case (gpt2 fp32 in one process; llama bf16 at dp=2 tp=2 ZeRO-1 on 4 ranks) it
# trains 4 steps with a checkpoint at the end, and 8 steps straight (the constant LR after
# warmup makes the first 4 steps of both the same), then keeps in OUT/<case>/:
#   config.yaml     the run's config; every path in it is relative (the test runs in a copy)
#   data/           the byte-token corpus it trained on
#   ckpt/           the checkpoint after step 4 (step_4/, latest), as that trident wrote it
#   expected.VENDOR.jsonl  the straight run's metrics records of steps 5-8 (loss, grad
#                   norm, lr); VENDOR is this CPU's /proc/cpuinfo vendor_id (GenuineIntel,
#                   AuthenticAMD), with .noavx512f added on a CPU without AVX-512
#   commit.txt      the trident commit that wrote them (git describe of the source tree)
# The test resumes each ckpt/step_4 to step 8 and compares steps 5-8 with its CPU vendor's
# file, digit for digit (OpenBLAS picks its kernels per CPU, so the last bits of fp32
# differ between the kinds; without a file for the vendor it compares within 1e-6).
#
# For a CPU kind the fixtures lack, build the commit in commit.txt and run
#
#   tests/reference/make_resume_fixtures.sh --expected-here OLD_BUILD/trident tests/reference/fixtures/resume
#
# on it: that binary resumes each fixture's ckpt/step_4 to step 8 there and writes the
# records of steps 5-8 as expected.VENDOR.jsonl (the fixture's checkpoint is not touched).
set -euo pipefail
expected_here=0
if [[ ${1:-} == --expected-here ]]; then
  expected_here=1
  shift
fi
trident=$(realpath "$1")
out=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(realpath "$out")
work=$(mktemp -d /tmp/trident-fixture.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Three q/k/v GEMMs, the arithmetic tests/e2e/old_checkpoint_test.cpp replays bit for bit
# (a binary from before the variable ignores it and runs three anyway).
export TRIDENT_FUSED_QKV=0
vendor=$(sed -n 's/^vendor_id[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n1)
vendor=${vendor:-unknown}
# A CPU without AVX-512 is a kind of its own (its kernels give other last bits).
grep -qw avx512f /proc/cpuinfo || vendor=$vendor.noavx512f

# metrics.jsonl's records of steps 5-8 -> expected.$vendor.jsonl (in the current directory)
keep_steps_5_to_8() {
  VENDOR=$vendor python3 - <<'PY'
import json, os
records = [json.loads(l) for l in open("metrics.jsonl") if l.strip()]
steps = [r for r in records if r.get("step", 0) in (5, 6, 7, 8) and "loss" in r]
assert [r["step"] for r in steps] == [5, 6, 7, 8], steps
with open("expected.%s.jsonl" % os.environ["VENDOR"], "w") as f:
    for r in steps:
        f.write(json.dumps(r, sort_keys=True) + "\n")
PY
}

launcher() {  # ranks -> the mpirun prefix (none for one rank)
  if (( $1 > 1 )); then
    echo mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np "$1"
  fi
}

if ((expected_here)); then
  for fixture in "$out"/*/; do
    name=$(basename "$fixture")
    case $name in
      gpt2_fp32_1rank) ranks=1 ;;
      llama_bf16_dp2_tp2_zero1) ranks=4 ;;
      *) echo "make_resume_fixtures: $fixture: unknown case" >&2; exit 1 ;;
    esac
    cp -a "$fixture" "$work/$name"
    (cd "$work/$name" && rm -f metrics.jsonl &&
       $(launcher "$ranks") "$trident" train --config config.yaml --resume auto > train.log 2>&1 ||
       { cat train.log; exit 1; }
     keep_steps_5_to_8)
    cp "$work/$name/expected.$vendor.jsonl" "$fixture"
    echo "$fixture: expected.$vendor.jsonl"
  done
  exit 0
fi

make_case() {  # name ranks model-yaml parallel-yaml precision
  local name=$1 ranks=$2 model=$3 parallel=$4 precision=$5
  local dir=$work/$name
  mkdir -p "$dir"
  cd "$dir"
  # The corpus: this script's own text and the README, as bytes (any text will do; it is
  # committed with the fixture, so later edits of these files do not matter).
  cat "$repo/tests/reference/make_resume_fixtures.sh" "$repo/README.md" > corpus.txt
  "$trident" prepare --input corpus.txt --out data --tokenizer byte --val-fraction 0 > /dev/null
  rm corpus.txt
  cat > config.yaml <<YAML
model: $model
parallel: $parallel
data: {train: data/train_*.bin}
training: {global_batch_size: 8, max_steps: 8, lr: 0.003, warmup_steps: 2,
           lr_schedule: constant, weight_decay: 0.1, grad_clip: 1.0, precision: $precision}
checkpoint: {dir: ckpt, interval: 4, keep_last: 10}
logging: {metrics: metrics.jsonl, log_interval: 1000}
YAML
  local launch=($(launcher "$ranks"))
  "${launch[@]}" "$trident" train --config config.yaml --resume none \
    --set checkpoint.dir=straight > train.log 2>&1 || { cat train.log; exit 1; }
  keep_steps_5_to_8
  rm -rf straight metrics.jsonl
  "${launch[@]}" "$trident" train --config config.yaml --resume none \
    --set training.max_steps=4 --set logging.metrics=first.jsonl > train.log 2>&1 ||
    { cat train.log; exit 1; }
  [[ -f ckpt/step_4/manifest.json && ! -e ckpt/step_8 ]] || { echo "no ckpt/step_4"; exit 1; }
  rm -f first.jsonl train.log
  git -C "$repo" describe --always --dirty > commit.txt
  rm -rf "${out:?}/$name"
  cp -a "$dir" "$out/$name"
}

make_case gpt2_fp32_1rank 1 \
  "{arch: gpt2, vocab_size: 256, seq_len: 16, n_layers: 2, n_heads: 4, d_model: 32}" \
  "{micro_batch_size: 1}" fp32
make_case llama_bf16_dp2_tp2_zero1 4 \
  "{arch: llama, vocab_size: 256, seq_len: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_model: 32}" \
  "{dp: 2, tp: 2, zero_stage: 1, micro_batch_size: 1}" bf16
echo "fixtures written to $out"
