# shellcheck shell=bash
# Shared by the Slurm end-to-end tests (slurm_e2e.sh, nodes_e2e.sh); sourced, not run.
# Before sourcing: E2E (the prefix of every line, e.g. "slurm_e2e"); the arguments are
# the test's: TRIDENT_BINARY SCRATCH_DIR. Sets REPO, BIN, SCRATCH, failures, watchers;
# TIMEOUT must be set before wait_job is called.

if [[ $# -ne 2 ]]; then
  echo "usage: $0 TRIDENT_BINARY SCRATCH_DIR" >&2; exit 2
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[[ -x $BIN ]] || { echo "not an executable: $1" >&2; exit 2; }
mkdir -p "$2"
SCRATCH=$(cd "$2" && pwd)

say() { echo "[$(date '+%T')] $E2E: $*"; }
failures=0
result() {  # result NAME OK|FAIL|SKIP DETAIL
  case $2 in
    OK) say "PASS $1 ($3)" ;;
    SKIP) say "SKIP $1 ($3)" ;;
    *) say "FAIL $1 ($3)"; failures=$((failures + 1)) ;;
  esac
}
show_log() { echo "---- $1 (last 40 lines)"; tail -n 40 "$1"; echo "----"; }
# shellcheck disable=SC2034  # the tests add their background watchers
watchers=()

# prepare_data: SCRATCH/data (byte tokens; any English text will do, but a frozen one:
# tests/reference/fixtures/moe_balance_text.txt, a copy of an old docs/ARCHITECTURE.md that
# is never edited, repeated to 1.3 MB; the drills trained on the live README and docs
# before, so every docs edit moved their trajectories, and the shrink drill's
# reduction-order differences with them) and an empty SCRATCH/runs. Exits on failure.
prepare_data() {
  rm -rf "$SCRATCH/data" "$SCRATCH/runs"
  mkdir -p "$SCRATCH/data" "$SCRATCH/runs"
  for _ in $(seq 20); do cat "$REPO/tests/reference/fixtures/moe_balance_text.txt"; done \
    > "$SCRATCH/data/corpus.txt"
  "$BIN" prepare --input "$SCRATCH/data/corpus.txt" --out "$SCRATCH/data" --tokenizer byte \
    > "$SCRATCH/data/prepare.log" 2>&1 || { cat "$SCRATCH/data/prepare.log"; echo "FAIL: prepare"; exit 1; }
}

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1; }

# wait_job JOBID: waits for a final state; a requeued job is let start after 5 s instead of
# Slurm's 120 s BeginTime delay. Prints the final state.
wait_job() {
  local job=$1 start=$SECONDS state reason pending_since=""
  while (( SECONDS - start < TIMEOUT )); do
    state=$(job_field "$job" JobState)
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$state"; return ;;
      PENDING)
        # Not at once: a rerun started ~1 s after the requeue collided with the old run's
        # step ("StepId=6.0 aborted before step completely launched") and srun still exited
        # 0. 3 s after the requeue was enough in trials; the node must be idle too.
        reason=$(job_field "$job" Reason)
        if [[ $reason == BeginTime ]]; then
          [[ -n $pending_since ]] || pending_since=$SECONDS
          if (( SECONDS - pending_since >= 5 )) && [[ $(sinfo -h -N -o '%t' | head -n1) == idle ]]; then
            scontrol update JobId="$job" StartTime=now 2>/dev/null
          fi
        fi ;;
    esac
    sleep 0.5
  done
  scancel "$job" 2>/dev/null
  echo "TIMEOUT_IN_TEST"
}

# write_tiny_config FILE N_LAYERS PARALLEL STEPS: the tiny GPT-2 the tests train, on
# SCRATCH/data, PARALLEL the inside of the parallel mapping; a checkpoint every 5 steps,
# every step logged.
write_tiny_config() {
  cat > "$1" <<YAML
model: {arch: gpt2, vocab_size: 256, seq_len: 32, n_layers: $2, n_heads: 4, d_model: 32}
parallel: {$3}
data: {train: $SCRATCH/data/train_*.bin, shuffle: false, seed: 1}
training: {global_batch_size: 8, max_steps: $4, lr: 3.0e-3, warmup_steps: 4,
           lr_schedule: cosine, grad_clip: 1.0, eval_interval: 0}
checkpoint: {interval: 5, keep_last: 2}
logging: {log_interval: 1}
YAML
}
