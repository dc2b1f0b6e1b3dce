#!/usr/bin/env bash
# Multi-node drills of scripts/slurm/train.sbatch on a 3-node Slurm cluster inside this
# machine (scripts/slurm/cluster.sh start DIR --nodes 3: a network + UTS + mount namespace
# per node, veth pairs on a bridge). Builds nothing; needs root (namespaces, daemons).
#
#   tests/slurm/nodes_e2e.sh TRIDENT_BINARY SCRATCH_DIR
#
# The job: 6 ranks, 2 per node, tp 2 x pp 3 (tp inside a node, the pipeline across the 3
# nodes, so every step crosses both links over Open MPI's TCP transport, which is told to
# use the bridge's subnet only), a tiny GPT-2 on byte tokens, OMP_NUM_THREADS=1.
#   normal  the 3-node job trains to the end, and every logged loss equals that of the same
#           layout on one node of the same cluster (6 ranks, shared memory instead of TCP).
#   cut     node 2's link is cut after step CUT_AT. The ranks of nodes 1 and 3 must end
#           within parallel.comm_timeout_s (5 s here) + 10 s, by the watchdog (each says
#           which call, group and peer rank it was waiting on, and the host: node 2), not
#           by a TCP error; then
#           the link is healed, train.sbatch retries the step, which resumes from a
#           checkpoint and ends with exactly the normal run's loss.
#   straggler  a wider model (width 64, 64 positions, 15 steps) twice: unthrottled, then
#           with node 2 (the middle pipeline stage) at STRAGGLER_PERCENT % of the machine's
#           CPU for the whole job (cluster.sh slow). Both complete without a retry or a
#           watchdog line, with the same losses; the unthrottled run warns of no
#           straggler, the slowed one (once per logging.straggler_window = 5 steps) of node
#           2's ranks and host and no other; its metrics file's "slowest" rank is on node 2
#           in most steps.
#   spare   4 ranks (tp 2 x pp 2) on 2 nodes of a 3-node allocation (TRIDENT_NODES=2):
#           node 2 crashes after step CUT_AT; train.sbatch leaves it out and relaunches on
#           nodes 1 and 3 without a requeue; the losses after the resume equal those of
#           an uninterrupted 2-node run; every checkpoint verifies.
#   shrink  6 ranks (2 per node) with parallel.dp: auto x tp 2, ZeRO-1, global batch 12
#           (dp 3 on 3 nodes): node 2 crashes after step CUT_AT, no spare; train.sbatch
#           asks `trident plan` and continues on nodes 1 and 3 with dp 2 (more
#           micro-batches per rank) without a requeue; the layout change is logged and
#           every loss after the resume is within 1e-5 relative of the uninterrupted run's.
#   shrink-requeue  the same with TRIDENT_MEMORY_LIMIT_BYTES between what 2 ranks need at
#           dp 3 and at dp 2: after the crash the memory plan says 2 nodes cannot hold
#           the model, and the script requeues (Restarts=1, PENDING), saying why; with
#           node 2 booted the requeued job resumes at dp 3 and ends on the reference loss.
#   save-crash  the normal job with rank 2's writer stalled in checkpoint step_20
#           (TRIDENT_FAULT_SAVE_STALL): node 2's ranks are SIGKILLed while step_20 is
#           half-written; the retry resumes from step_15 and ends on the normal loss, no
#           .tmp is left, every checkpoint verifies.
#   flap    node 2's link down for FLAP_S s, under parallel.comm_timeout_s FLAP_TIMEOUT:
#           no watchdog line, no retry, no step while the link was down, the normal
#           run's losses.
#   verbs   without a job: cut/heal show in `status`, `slow 5` throttles a busy loop on
#           the node (its cgroup's nr_throttled), `crash` leaves only the node's holder
#           and relay, `boot` makes it idle again.
#   clean   after `cluster.sh stop`: no process in the cluster's namespaces, no daemon, no
#           cgroup (cluster.sh check), and the host's interfaces, network namespaces and
#           mounts are what they were before.
# Every drill with a fault prints one line "NAME: fault -> detection X s, detection ->
# first step after recovery Y s" (a straggler is never recovered from, a flap never
# detected: "none"; shrink-requeue: detection -> requeue). Prints
# PASS/FAIL/SKIP per scenario (prefix "nodes_e2e:"); where the machine
# does not allow namespaces or veth pairs every scenario is a SKIP with the reason, and the
# script exits 0. Exits 1 if any scenario failed. Everything is stopped on exit.
#
# Environment: NODES_E2E_STEPS (default 60), NODES_E2E_TIMEOUT (seconds per job, default
#   300), NODES_E2E_STRAGGLER_PERCENT (default 1), SLURM_TEST_PORT (see cluster.sh; by default a
#   port derived from the directory).
set -uo pipefail
# Under pipefail `cmd | grep -q` fails when grep exits on its first match while cmd is
# still writing (SIGPIPE): seen on a loaded 2-core machine in about 1 of 70 tries on a
# 10 KB log. Such checks read with `grep -q PATTERN < <(cmd)` instead.

E2E=nodes_e2e
# shellcheck source=tests/slurm/common.sh
source "$(dirname "$0")/common.sh"
STEPS=${NODES_E2E_STEPS:-60}
# (+ 2: not on a checkpoint step, whose save adds collectives of its own)
CUT_AT=$((STEPS / 4 + 2))
TIMEOUT=${NODES_E2E_TIMEOUT:-300}
COMM_TIMEOUT=5
STRAGGLER_PERCENT=${NODES_E2E_STRAGGLER_PERCENT:-1}
STRAGGLER_STEPS=15
STRAGGLER_WINDOW=5
# The flap: the link down for FLAP_S s, under a comm_timeout_s of FLAP_TIMEOUT s (TCP's
# retransmission backoff after a 3 s cut resends within ~3 s of the heal).
FLAP_S=3
FLAP_TIMEOUT=20
CLUSTER=$SCRATCH/nodes
CLUSTER_SH=$REPO/scripts/slurm/cluster.sh
T0=$SECONDS

skip_all() {
  local s
  for s in normal cut straggler spare shrink shrink-requeue save-crash flap verbs clean; do result "$s" SKIP "$1"; done
  exit 0
}

# ---- can this machine do it? -------------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip_all "needs root (namespaces, veth pairs, Slurm daemons)"
unshare -n -u -m true 2>/dev/null || skip_all "unshare -n -u -m is not allowed here"
unshare -n sh -c 'ip link add name tv0 type veth peer name tv1 &&
                  ip link add name tb0 type bridge' 2>/dev/null ||
  skip_all "veth pairs or bridges cannot be created in a network namespace here"

# The host's state, compared at the end.
host_state() {
  ip -o link show | awk -F': ' '{print $2}' | sort
  echo "-- netns"; ip netns list 2>/dev/null
  echo "-- mounts"; grep -F "$SCRATCH" /proc/self/mounts
}
before=$(host_state)

cleanup() {
  local pid
  for pid in "${watchers[@]}"; do kill "$pid" 2>/dev/null; done
  "$CLUSTER_SH" stop "$CLUSTER" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---- cluster and data ------------------------------------------------------------------
eval "$("$CLUSTER_SH" start "$CLUSTER" --nodes 3)" || { result normal FAIL "cluster did not start"; exit 1; }
export SLURM_CONF
# shellcheck disable=SC1091
source "$CLUSTER/cluster.env"
say "cluster $NODE_SET on $SUBNET.0/24 up after $((SECONDS - T0)) s"

prepare_data

# Tiny, 3 layers: one per pipeline stage, one stage per node. A given peak (MFU's
# denominator) instead of rank 0's sgemm measurement at start-up, which took over 5 s on
# the loaded 2-core machine while the other ranks waited in the collective after it,
# so that a retry with the cut's 5 s timeout failed there once.
write_tiny_config "$SCRATCH/tiny.yaml" 3 "tp: 2, pp: 3, micro_batch_size: 2" "$STEPS"
echo "runtime: {peak_tflops: 0.01}" >> "$SCRATCH/tiny.yaml"

# ---- helpers -----------------------------------------------------------------------------
# submit NAME NODES [ARGS...]: train.sbatch from runs/NAME on NODES nodes (JOB_TASKS tasks
# in all, default 6, JOB_PER_NODE per node, default 6 / NODES), ARGS more trident
# arguments, the config JOB_CONFIG (default tiny.yaml). Open MPI:
# TCP only on the bridge's subnet (each node has just eth0 and lo, but a real cluster
# has more; docs/SLURM.md "Open MPI over TCP"); yield when idle (6 ranks on 2 cores).
submit() {
  local dir=$SCRATCH/runs/$1
  mkdir -p "$dir"
  (cd "$dir" && TRIDENT_BIN=$BIN TRIDENT_RETRY_DELAY=1 OMP_NUM_THREADS=1 \
    OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24 \
    sbatch --parsable -J "nodes-$1" -N "$2" -n "${JOB_TASKS:-6}" \
      --ntasks-per-node="${JOB_PER_NODE:-$((6 / $2))}" --time=30 \
      -o "$dir/job.out" "$REPO/scripts/slurm/train.sbatch" "${JOB_CONFIG:-$SCRATCH/tiny.yaml}" \
      --set "checkpoint.dir=$dir/ckpt" --set "logging.metrics=$dir/metrics.jsonl" "${@:3}")
}
# losses FILE [STEPS]: "N/STEPS LOSS" of every logged step (STEPS default $STEPS).
losses() { grep -o "step [0-9]*/${2:-$STEPS} | loss [0-9.na-]*" "$1" | awk '{print $2, $NF}'; }
last_loss() { losses "$1" | awk -v s="$STEPS/$STEPS" '$1 == s { l = $2 } END { print l }'; }
now() { date +%s.%N; }
# trident_on NODE: pids of Trident's ranks on that node.
trident_on() { "$CLUSTER_SH" ps "$CLUSTER" "$1" 2>/dev/null | awk '$2 == "trident" {print $1}'; }

# ---- a) normal: 3 nodes over TCP, the same losses as one node ---------------------------
t=$SECONDS
job1=$(submit one-node 1)
state1=$(wait_job "$job1")
job3=$(submit three-nodes 3)
state3=$(wait_job "$job3")
out1=$SCRATCH/runs/one-node/job.out
out3=$SCRATCH/runs/three-nodes/job.out
ref_loss=$(last_loss "$out3")
nodes3=$(job_field "$job3" NodeList)
if [[ $state1 == COMPLETED && $state3 == COMPLETED && -n $ref_loss ]] &&
   [[ $(losses "$out3" | wc -l) -eq $STEPS ]] && diff <(losses "$out1") <(losses "$out3") >/dev/null &&
   grep -q "on 3 node(s)" "$out3"; then
  result normal OK "jobs $job1 (1 node) and $job3 (3 nodes, $nodes3) COMPLETED in $((SECONDS - t)) s; all $STEPS losses equal, final $ref_loss"
else
  show_log "$out1"; show_log "$out3"
  diff <(losses "$out1") <(losses "$out3") | head -n 5
  result normal FAIL "jobs $job1 $state1, $job3 $state3 ($nodes3); final losses '$(last_loss "$out1")' vs '${ref_loss}'"
  ref_loss=""
fi

# ---- b) cut: node 2's link down mid-run -------------------------------------------------
if [[ -z $ref_loss ]]; then
  result cut SKIP "no reference loss (normal failed)"
else
  t=$SECONDS
  out=$SCRATCH/runs/cut/job.out
  times=$SCRATCH/runs/cut/times
  mkdir -p "$SCRATCH/runs/cut"
  # The short timeout only here: the normal runs keep the default (600 s), so that a slow
  # moment of a loaded machine cannot turn them into a retry.
  job=$(submit cut 3 --set "parallel.comm_timeout_s=$COMM_TIMEOUT")
  (
    start=$SECONDS
    until grep -q "step $CUT_AT/$STEPS | loss" "$out" 2>/dev/null; do
      (( SECONDS - start < TIMEOUT )) || exit 0
      sleep 0.1
    done
    survivors="$(trident_on 1) $(trident_on 3)"
    "$CLUSTER_SH" cut "$CLUSTER" 2 2>/dev/null
    t_cut=$(now)
    echo "[$(date '+%T')] nodes_e2e: cut the link of node 2 after step $CUT_AT" >> "$out"
    # Detection: every rank of nodes 1 and 3 (those running at the cut) has ended.
    while (( SECONDS - start < TIMEOUT )); do
      alive=0
      for pid in $survivors; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [[ $alive -eq 0 ]] && break
      sleep 0.1
    done
    t_detect=$(now)
    "$CLUSTER_SH" heal "$CLUSTER" 2 2>/dev/null
    # Recovery: the first step logged by the retry.
    until [[ -n $(awk '/retrying in/ { seen = 1 } seen && /step [0-9]+\/[0-9]+ \| loss/ { print; exit }' "$out") ]]; do
      (( SECONDS - start < TIMEOUT )) || break
      sleep 0.1
    done
    t_step=$(now)
    echo "$(wc -w <<< "$survivors") $t_cut $t_detect $t_step" > "$times"
  ) &
  watchers+=($!)
  state=$(wait_job "$job")
  wait "${watchers[-1]}" 2>/dev/null
  loss=$(last_loss "$out")
  read -r n_surv t_cut t_detect t_step < "$times" 2>/dev/null
  detect=$(awk -v a="${t_cut:-0}" -v b="${t_detect:-0}" 'BEGIN { printf "%.1f", b - a }')
  recover=$(awk -v a="${t_detect:-0}" -v b="${t_step:-0}" 'BEGIN { printf "%.1f", b - a }')
  say "cut: fault -> detection $detect s, detection -> first step after recovery $recover s"
  # One watchdog line per surviving rank, before the retry, naming its call and group; a
  # point-to-point call also names its peer's rank in the group, which must be the cut
  # node's stage (pp rank 1), and that peer's world rank and host, the cut node, e.g.
  #   [rank 0 on t..n1] watchdog: batch_p2p 'pipeline recv gradient micro 2 stage 0' with
  #   rank 1 in group 'pp' (rank 0/3) has not completed after 5.0 s (timeout 5.0 s) at
  #   step 26; rank 1 is world rank 2 on host t..n2; a peer of this group is hung, ...
  # A collective cannot know which member is missing; it lists its group's hosts, among
  # them the cut node: "all_reduce 'step data status' in group 'world' (rank 4/6) ...;
  # the group's ranks are on hosts t..n1, t..n2, t..n3". (A tp group lies inside one
  # node, so a tp line cannot name node 2; it counts without. So does the embedding group
  # of the tied wte, the first and last stages on nodes 1 and 3: a rank of it waits there
  # for its peer on node 3, which itself waits on node 2, e.g. "all_reduce 'tied wte
  # grad' in group 'embedding' (rank 0/2) ...; the group's ranks are on hosts t..n1, t..n3".)
  watchdog=$(awk '/retrying in/ { exit } /watchdog: .* in group .* has not completed/' "$out")
  survivor_lines=$(grep -cE "^\[rank [0-9]+ on ${PREFIX}n[13]\] watchdog: [a-z_0-9]+ .* in group '[a-z]+' \(rank [0-9]+/[0-9]+\) has not completed" <<< "$watchdog")
  p2p_lines=$(grep -E "^\[rank [0-9]+ on ${PREFIX}n[13]\] watchdog: [a-z_0-9]*(p2p|send|recv) " <<< "$watchdog")
  p2p=$(grep -c . <<< "$p2p_lines")
  named=$(grep -E " (from|to|with) rank 1 in group 'pp' \(rank [02]/3\)" <<< "$p2p_lines" |
          grep -cE "; rank 1 is world rank [23] on host ${PREFIX}n2; ")
  hosted=$(grep -E "^\[rank [0-9]+ on ${PREFIX}n[13]\] " <<< "$watchdog" |
           grep -cE "; rank 1 is world rank [23] on host ${PREFIX}n2; |; the group's ranks are on hosts [^;]*${PREFIX}n2(,|;| and )| in group '(tp|embedding)' ")
  tcp_errors=$(awk '/retrying in/ { exit } /btl_tcp|BTL_TCP|mca_btl/' "$out" | wc -l)
  echo "$watchdog" | sed 's/^/    /' | head -n 6
  if [[ $state == COMPLETED && $loss == "$ref_loss" && ${n_surv:-0} -eq 4 &&
        $survivor_lines -eq 4 && $named -eq $p2p && $hosted -eq 4 && $tcp_errors -eq 0 ]] &&
     grep -q "retry 1 of" "$out" &&
     awk -v d="$detect" -v l="$((COMM_TIMEOUT + 10))" 'BEGIN { exit !(d > 0 && d <= l) }'; then
    result cut OK "job $job COMPLETED in $((SECONDS - t)) s after $(grep -c 'retrying in' "$out") retry; the 4 ranks of nodes 1 and 3 ended $detect s after the cut (limit $((COMM_TIMEOUT + 10)) s) on their watchdog (4 lines naming call and group, $hosted naming the cut node ${PREFIX}n2; $p2p of them point-to-point, each naming pp rank 1, the cut node's stage, and its host); loss $loss"
  else
    show_log "$out"
    result cut FAIL "job $job state $state; ${n_surv:-?} survivors ended after $detect s (limit $((COMM_TIMEOUT + 10)) s); $survivor_lines of 4 watchdog lines, $hosted naming host ${PREFIX}n2, $named of $p2p point-to-point ones naming pp rank 1 on it; $tcp_errors TCP error lines; loss '${loss}' vs '${ref_loss}'"
  fi
fi

# ---- c) straggler: node 2 slowed for a whole job ----------------------------------------
# A model with compute to slow down: the tiny one computes ~1.5 ms of a ~30 ms step (the
# rest is waiting on TCP and the 2 loaded cores), so a CPU quota stalled node 2 mostly
# inside its communication, where the busy time (trainer/straggler.h) does not look. Width
# 64 and 64 positions: ~5 ms of compute per rank and step, ~3 s for the 15 steps. First
# an unthrottled run of it (the control: no warning), then the same with node 2 at
# STRAGGLER_PERCENT % of the machine (1 %: ~18 s). Factor 3, not the default 2: on the
# loaded 2-core machine single steps of the control reached 2.3x the median rank's busy
# time; node 2 at 1 % was 5-12x in every step (at 2 %, 2.2-5x).
t=$SECONDS
sed -e 's/d_model: 32}/d_model: 64}/' -e 's/seq_len: 32,/seq_len: 64,/' \
    -e "s/max_steps: $STEPS,/max_steps: $STRAGGLER_STEPS,/" "$SCRATCH/tiny.yaml" > "$SCRATCH/wide.yaml"
mkdir -p "$SCRATCH/runs/straggler"
out=$SCRATCH/runs/straggler/job.out
control_out=$SCRATCH/runs/straggler-control/job.out
metrics=$SCRATCH/runs/straggler/metrics.jsonl
strag_args=(--set "logging.straggler_window=$STRAGGLER_WINDOW" --set logging.straggler_factor=3)
control=$(JOB_CONFIG=$SCRATCH/wide.yaml submit straggler-control 3 "${strag_args[@]}")
control_state=$(wait_job "$control")
"$CLUSTER_SH" slow "$CLUSTER" 2 "$STRAGGLER_PERCENT" >/dev/null 2>&1
t_fault=$(now)
job=$(JOB_CONFIG=$SCRATCH/wide.yaml submit straggler 3 "${strag_args[@]}")
# Detection: the first warning (rank 0 logs it at the end of the first window).
(
  until grep -q "warning: straggler:" "$out" 2>/dev/null; do sleep 0.1; done
  now > "$SCRATCH/runs/straggler/detected"
) &
watchers+=($!)
state=$(wait_job "$job")
sleep 0.2
kill "${watchers[-1]}" 2>/dev/null
"$CLUSTER_SH" slow "$CLUSTER" 2 100 >/dev/null 2>&1
t_detect=$(cat "$SCRATCH/runs/straggler/detected" 2>/dev/null)
detect=$(awk -v a="$t_fault" -v b="${t_detect:-0}" 'BEGIN { if (b > 0) printf "%.1f", b - a; else print "never" }')
say "straggler: fault -> detection $detect s, detection -> first step after recovery none (nothing to recover: the run goes on, slower)"
# e.g. "[warning] straggler: rank 2 on t..n2 exceeded 3x the median rank's busy time in
# 5 of the last 5 steps (by 6.3x in the median of those); rank 3 on t..n2 ..."
warnings=$(grep "warning: straggler:" "$out")
n_warn=$(grep -c . <<< "$warnings")
clauses=$(grep -oE "rank [0-9]+( on [^ ]+)? exceeded" <<< "$warnings")
named=$(sort -u <<< "$clauses" | sed 's/ exceeded//' | paste -sd, -)
others=$(grep -vcE "^rank [23] on ${PREFIX}n2 exceeded" <<< "$clauses")
windows=$((STRAGGLER_STEPS / STRAGGLER_WINDOW))
# The metrics file's per-step record of the slowest rank: on node 2 (rank 2 or 3) in
# most steps; and the median step's ratio to the median rank.
read -r slowest_n2 ratio < <(python3 - "$metrics" "${PREFIX}n2" <<'PY' 2>/dev/null
import json, sys
recs = [json.loads(l)["slowest"] for l in open(sys.argv[1]) if '"slowest"' in l]
ratios = sorted(r["ratio"] for r in recs) or [0]
print(sum(r["rank"] in (2, 3) and r["host"] == sys.argv[2] for r in recs),
      f"{ratios[(len(ratios) - 1) // 2]:.1f}")
PY
)
control_warn=$(grep -c "warning: straggler:" "$control_out")
restarts=$(job_field "$job" Restarts)
s_ms=$(grep -o "done: $STRAGGLER_STEPS steps in [0-9.]* s" "$out" | awk '{print $5}')
c_ms=$(grep -o "done: $STRAGGLER_STEPS steps in [0-9.]* s" "$control_out" | awk '{print $5}')
if [[ $control_state == COMPLETED && $state == COMPLETED && ${restarts:-1} -eq 0 &&
      $control_warn -eq 0 ]] && ! grep -qE "retrying in|watchdog:" "$out" &&
   [[ $(losses "$out" "$STRAGGLER_STEPS" | wc -l) -eq $STRAGGLER_STEPS ]] &&
   diff <(losses "$out" "$STRAGGLER_STEPS") <(losses "$control_out" "$STRAGGLER_STEPS") >/dev/null &&
   [[ $n_warn -ge $((windows - 1)) && $n_warn -le $windows && $others -eq 0 ]] &&
   grep -q "^rank [23] on ${PREFIX}n2 exceeded" <<< "$clauses" &&
   (( ${slowest_n2:-0} * 2 > STRAGGLER_STEPS )); then
  result straggler OK "jobs $control (unthrottled: no warning, ${c_ms} s of training) and $job (node 2 at $STRAGGLER_PERCENT% CPU: ${s_ms} s) COMPLETED in $((SECONDS - t)) s; no retry, no watchdog line, all $STRAGGLER_STEPS losses equal; $n_warn warnings (one per $STRAGGLER_WINDOW steps) naming only ${named}; the slowest rank on ${PREFIX}n2 in $slowest_n2 of $STRAGGLER_STEPS steps, median ratio ${ratio}x"
else
  show_log "$out"
  result straggler FAIL "jobs $control $control_state ($control_warn warnings), $job $state (restarts '${restarts}'); $n_warn warnings (want $((windows - 1))-$windows), naming '${named}' ($others not node 2's); slowest on ${PREFIX}n2 in ${slowest_n2:-0} of $STRAGGLER_STEPS steps"
fi

# ---- d) spare: node 2 crashes mid-run, the allocation's spare node 3 takes its place ----
# A 4-rank job (tp 2 x pp 2, 2 layers) on 2 nodes of a 3-node allocation
# (TRIDENT_NODES=2). After step CUT_AT node 2 crashes (cluster.sh crash: slurmd and the
# tasks SIGKILLed); node 1's ranks end on their watchdog, train.sbatch probes the step's
# nodes, leaves node 2 out and relaunches on nodes 1 and 3 within the allocation (no
# requeue), resuming from the newest checkpoint; every loss after the resume, the final
# one included, equals that of an uninterrupted 2-node run.
t=$SECONDS
write_tiny_config "$SCRATCH/two.yaml" 2 "tp: 2, pp: 2, micro_batch_size: 2" "$STEPS"
echo "runtime: {peak_tflops: 0.01}" >> "$SCRATCH/two.yaml"
out=$SCRATCH/runs/spare/job.out
times=$SCRATCH/runs/spare/times
mkdir -p "$SCRATCH/runs/spare"
ref_job=$(JOB_CONFIG=$SCRATCH/two.yaml JOB_TASKS=4 JOB_PER_NODE=2 submit spare-ref 2)
ref_state=$(wait_job "$ref_job")
ref_out=$SCRATCH/runs/spare-ref/job.out
job=$(JOB_CONFIG=$SCRATCH/two.yaml JOB_TASKS=4 JOB_PER_NODE=2 TRIDENT_NODES=2 \
      TRIDENT_PROBE_TIMEOUT=10 submit spare 3 --set "parallel.comm_timeout_s=$COMM_TIMEOUT")
(
  start=$SECONDS
  until grep -q "step $CUT_AT/$STEPS | loss" "$out" 2>/dev/null; do
    (( SECONDS - start < TIMEOUT )) || exit 0
    sleep 0.1
  done
  "$CLUSTER_SH" crash "$CLUSTER" 2 >/dev/null 2>&1
  t_crash=$(now)
  echo "[$(date '+%T')] nodes_e2e: crashed node 2 after step $CUT_AT" >> "$out"
  # Detection: the failed step's end (train.sbatch logs its exit code).
  until awk '/crashed node 2/ { seen = 1 } seen && /step exited with code/ { found = 1 } END { exit !found }' "$out"; do
    (( SECONDS - start < TIMEOUT )) || break
    sleep 0.1
  done
  t_detect=$(now)
  until [[ -n $(awk '/retrying in/ { seen = 1 } seen && /step [0-9]+\/[0-9]+ \| loss/ { print; exit }' "$out") ]]; do
    (( SECONDS - start < TIMEOUT )) || break
    sleep 0.1
  done
  echo "$t_crash $t_detect $(now)" > "$times"
) &
watchers+=($!)
state=$(wait_job "$job")
wait "${watchers[-1]}" 2>/dev/null
read -r t_crash t_detect t_step < "$times" 2>/dev/null
detect=$(awk -v a="${t_crash:-0}" -v b="${t_detect:-0}" 'BEGIN { printf "%.1f", b - a }')
recover=$(awk -v a="${t_detect:-0}" -v b="${t_step:-0}" 'BEGIN { printf "%.1f", b - a }')
say "spare: fault -> detection $detect s, detection -> first step after recovery $recover s"
# The retry's losses (after "retrying in") against the uninterrupted run's same steps.
retry_losses=$(awk '/retrying in/ { seen = 1 } seen' "$out" | losses /dev/stdin)
first_retry=$(head -n1 <<< "$retry_losses" | cut -d/ -f1)
ref_part=$(losses "$ref_out" | awk -v f="${first_retry:-0}" -F'[/ ]' '$1 >= f')
restarts=$(job_field "$job" Restarts)
ckpts_ok=1
for d in "$SCRATCH"/runs/spare/ckpt/step_*; do "$BIN" ckpt verify "$d" >/dev/null 2>&1 || ckpts_ok=0; done
if [[ $ref_state == COMPLETED && $state == COMPLETED && ${restarts:-1} -eq 0 && -n $retry_losses &&
      $ckpts_ok -eq 1 ]] &&
   grep -q "node ${PREFIX}n2 did not run a probe task" "$out" &&
   grep -q "the step moves to ${PREFIX}n1 ${PREFIX}n3" "$out" &&
   [[ $retry_losses == "$ref_part" && $(last_loss "$out") == "$(last_loss "$ref_out")" ]]; then
  result spare OK "job $job COMPLETED in $((SECONDS - t)) s with 1 retry and no requeue: node 2 left out, the step moved to ${PREFIX}n1 and ${PREFIX}n3 (the spare), resumed at step $first_retry; its $(grep -c . <<< "$retry_losses") losses equal the uninterrupted run's, final $(last_loss "$out"); every checkpoint verifies"
else
  show_log "$out"
  result spare FAIL "jobs $ref_job $ref_state, $job $state (restarts '${restarts}'); retry from step '${first_retry}'; final '$(last_loss "$out")' vs '$(last_loss "$ref_out")'; checkpoints verify: $ckpts_ok"
fi
"$CLUSTER_SH" boot "$CLUSTER" 2 >/dev/null 2>&1 || say "node 2 did not boot again"

# ---- helpers of the drills below --------------------------------------------------------
STEP_ERE='step [0-9]+/[0-9]+ [|] loss'  # [|], not \|: awk -v reads backslash escapes
# wait_after FILE MARK ERE: waits (at most TIMEOUT s) until a line matching the regex ERE
# follows one matching MARK in FILE; returns 1 on timeout.
wait_after() {
  local start=$SECONDS
  until awk -v m="$2" -v e="$3" '$0 ~ m { seen = 1 } seen && $0 ~ e { found = 1; exit }
                                 END { exit !found }' "$1" 2>/dev/null; do
    (( SECONDS - start < TIMEOUT )) || return 1
    sleep 0.1
  done
}
mark() { echo "[$(date '+%T')] nodes_e2e: $2" >> "$1"; }
secs() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.1f", b - a; else print "?" }'; }
# fault_watch OUT TIMES TRIGGER FAULT_CMD MARK2 ERE2: once OUT has a line TRIGGER (a
# regex), runs FAULT_CMD and marks the log; detection is the failed step's end
# (train.sbatch logs its exit code); then waits for a line ERE2 after one MARK2. Writes
# "t_fault t_detect t_end" to TIMES.
fault_watch() {
  wait_after "$1" "^" "$3" || return 0
  eval "$4"
  local t_fault t_detect
  t_fault=$(now)
  mark "$1" "fault injected: $4"
  wait_after "$1" "fault injected" "step exited with code"
  t_detect=$(now)
  wait_after "$1" "$5" "$6"
  echo "$t_fault $t_detect $(now)" > "$2"
}
AFTER_CUT="step $CUT_AT/$STEPS [|] loss"
# metric_losses FILE: "STEP LOSS" from a metrics file at full precision, the last record
# of each step (a retry repeats the steps since its checkpoint).
metric_losses() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r and "loss" in r: last[r["step"]] = r["loss"]
for s in sorted(last): print(s, repr(last[s]))' "$1" 2>/dev/null
}
# verify_ckpts DIR: prints how many step_* of DIR there are, and returns 1 unless every
# one passes `trident ckpt verify`.
verify_ckpts() {
  local d n=0 ok=0
  for d in "$1"/step_*; do
    [[ -d $d && $d != *.tmp && $d != *.abandoned ]] || continue
    n=$((n + 1))
    "$BIN" ckpt verify "$d" >/dev/null 2>&1 || ok=1
  done
  echo "$n"
  return $ok
}
# resumed_step OUT: N of the retry's "resumed from .../step_N" line.
resumed_step() {
  awk '/retrying in/ { seen = 1 } seen' "$1" | grep -o 'resumed from [^ ]*/step_[0-9]*' |
    head -n1 | sed 's/.*step_//'
}
# await_job JOB WATCHER_PID: sets state to the job's final state (wait_job), then waits for
# the watcher (which ends by itself, at the latest after TIMEOUT).
await_job() {
  watchers+=("$2")
  state=$(wait_job "$1")
  wait "$2" 2>/dev/null
}
crash2="\"\$CLUSTER_SH\" crash \"\$CLUSTER\" 2 >/dev/null 2>&1"

# ---- e) shrink: node 2 crashes, no spare: the job continues on 2 nodes (dp: auto) -------
# 6 ranks (2 per node) of a 2-layer model, dp auto x tp 2, ZeRO-1, a global batch of 12
# in micro-batches of 2: on 3 nodes dp 3, 2 micro-batches per rank. Node 2 crashes after
# step CUT_AT; train.sbatch finds 2 healthy nodes, `trident plan` says dp auto is 2 there
# and fits, and the step continues on nodes 1 and 3 without a requeue: dp 2, 3
# micro-batches per rank, the same global batch, ZeRO-1's shards resharded from 3 to 2
# (the trainer logs the old and the new layout). Every loss after the resume is within
# 1e-5 relative of the uninterrupted 3-node run's (reduction order only: the fp32 bound
# of the equivalence tests; the differences grow over the 45 steps, most at the steps
# whose gradient norm spikes, and how much depends on the corpus: on the frozen one of
# prepare_data 4.5e-8, on the repository's docs of two revisions 4.1e-6 and 2.8e-5);
# checkpoints verify.
t=$SECONDS
write_tiny_config "$SCRATCH/elastic.yaml" 2 "dp: auto, tp: 2, zero_stage: 1, micro_batch_size: 2" "$STEPS"
sed -i 's/global_batch_size: 8,/global_batch_size: 12,/' "$SCRATCH/elastic.yaml"
echo "runtime: {peak_tflops: 0.01}" >> "$SCRATCH/elastic.yaml"
out=$SCRATCH/runs/shrink/job.out
mkdir -p "$SCRATCH/runs/shrink"
eref=$(JOB_CONFIG=$SCRATCH/elastic.yaml submit shrink-ref 3)
eref_state=$(wait_job "$eref")
job=$(JOB_CONFIG=$SCRATCH/elastic.yaml TRIDENT_PROBE_TIMEOUT=10 submit shrink 3 \
      --set "parallel.comm_timeout_s=$COMM_TIMEOUT")
fault_watch "$out" "$SCRATCH/runs/shrink/times" "$AFTER_CUT" "$crash2" "retrying in" "$STEP_ERE" &
await_job "$job" $!
read -r t_fault t_detect t_step < "$SCRATCH/runs/shrink/times" 2>/dev/null
say "shrink: fault -> detection $(secs "$t_fault" "$t_detect") s, detection -> first step after recovery $(secs "$t_detect" "$t_step") s"
from=$(resumed_step "$out")
read -r n_cmp max_diff n_equal < <(python3 -c '
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = dict(l.split() for l in open(sys.argv[2]))
d = [abs(float(got[s]) - float(ref[s])) / abs(float(ref[s])) for s in map(str, range(int(sys.argv[3]) + 1, int(sys.argv[4]) + 1))
     if s in got and s in ref]
print(len(d), "%.2e" % max(d) if d else "none", sum(x == 0 for x in d))' \
  <(metric_losses "$SCRATCH/runs/shrink-ref/metrics.jsonl") \
  <(metric_losses "$SCRATCH/runs/shrink/metrics.jsonl") "${from:-0}" "$STEPS" 2>/dev/null)
n_ckpt=$(verify_ckpts "$SCRATCH/runs/shrink/ckpt"); ckpt_rc=$?
restarts=$(job_field "$job" Restarts)
reshard=$(grep -oE "parallel.dp: resharded from dp=3 tp=2 pp=1 [^;]*to dp=2 tp=2 pp=1[^;]*" "$out" | head -n1)
if [[ $eref_state == COMPLETED && $state == COMPLETED && ${restarts:-1} -eq 0 && -n $from &&
      -n $reshard && $ckpt_rc -eq 0 && ${n_cmp:-0} -eq $((STEPS - from)) ]] &&
   grep -q "continuing on 2 node(s), 4 ranks instead of 6 (elastic shrink): parallel.dp: auto is dp 2 on 4 devices" "$out" &&
   grep -q "layout: world 4 = dp 2 x tp 2" "$out" &&
   grep -q "batch: micro_batch 2 x 2 micro-batches x dp 3 = global batch 12 " "$out" &&
   grep -q "batch: micro_batch 2 x 3 micro-batches x dp 2 = global batch 12 " \
     < <(awk '/retrying in/ { seen = 1 } seen' "$out") &&
   awk -v d="$max_diff" 'BEGIN { exit !(d + 0 <= 1e-5) }'; then  # relative
  result shrink OK "job $job COMPLETED in $((SECONDS - t)) s with 1 retry and no requeue: node 2 left out, the step continued on ${PREFIX}n1 and ${PREFIX}n3 with dp 2 (micro-batches per rank 2 -> 3, global batch 12 in both, as logged), resumed at step $from and logged '$reshard'; its $n_cmp losses within $max_diff relative of the uninterrupted dp-3 run ($n_equal equal); $n_ckpt checkpoints verify"
else
  show_log "$out"
  result shrink FAIL "jobs $eref $eref_state, $job $state (restarts '${restarts}'); resumed from '${from}'; reshard line '${reshard}'; ${n_cmp:-0} losses compared, largest relative difference ${max_diff:-?} (limit 1e-5); checkpoints verify: rc $ckpt_rc"
fi
"$CLUSTER_SH" boot "$CLUSTER" 2 >/dev/null 2>&1 || say "node 2 did not boot again"

# ---- f) shrink-requeue: the same, but the memory plan says 2 nodes cannot hold it -----
# TRIDENT_MEMORY_LIMIT_BYTES (the memory a node has, for the trainer's start-up check and
# for `trident plan`) set between what 2 ranks need at dp 3 and at dp 2 (ZeRO-1: the
# optimizer shard grows from 1/3 to 1/2 of the moments): the 3-node job starts; after node
# 2's crash train.sbatch asks the plan, which says the model does not fit on 2 nodes, so
# it requeues, saying why. The requeued job waits for 3 nodes (PENDING, Restarts=1);
# node 2 boots, and the rerun resumes at dp 3 and ends on the uninterrupted run's loss.
t=$SECONDS
plan_total() {
  "$BIN" plan --config "$SCRATCH/elastic.yaml" --devices "$1" --gpus-per-node 2 --gpu cpu \
    --configured-only --json 2>/dev/null |
    python3 -c 'import json, sys; print(int(json.load(sys.stdin)["configured"]["memory_bytes"]["total"]))' 2>/dev/null
}
need3=$(plan_total 6); need2=$(plan_total 4)
out=$SCRATCH/runs/shrink-requeue/job.out
mkdir -p "$SCRATCH/runs/shrink-requeue"
if [[ -z $need3 || -z $need2 ]] || (( need2 <= need3 )); then
  result shrink-requeue FAIL "trident plan gave per-rank totals '${need3}' (dp 3) and '${need2}' (dp 2): no limit lies between"
else
  # Just under what 2 ranks at dp 2 need: the most room for the dp-3 start.
  limit=$((2 * need2 - 2))
  job=$(JOB_CONFIG=$SCRATCH/elastic.yaml TRIDENT_PROBE_TIMEOUT=10 TRIDENT_MEMORY_LIMIT_BYTES=$limit \
        submit shrink-requeue 3 --set "parallel.comm_timeout_s=$COMM_TIMEOUT")
  fault_watch "$out" "$SCRATCH/runs/shrink-requeue/times" "$AFTER_CUT" "$crash2" "fault injected" \
    "requeueing job|giving up|training finished" &
  watchers+=($!)
  wait "${watchers[-1]}" 2>/dev/null
  read -r t_fault t_detect t_requeue < "$SCRATCH/runs/shrink-requeue/times" 2>/dev/null
  # The requeued job is PENDING (BeginTime) with Restarts=1; wait_job is not used, it
  # would start it again.
  start=$SECONDS
  until [[ $(job_field "$job" Restarts) == 1 && $(job_field "$job" JobState) == PENDING ]]; do
    (( SECONDS - start < 30 )) || break
    sleep 0.2
  done
  restarts=$(job_field "$job" Restarts); pending=$(job_field "$job" JobState)
  # Node 2 comes back; the requeued job (--no-kill, the same allocation size) starts again
  # on 3 nodes, resumes from the newest checkpoint at dp 3 and ends on the uninterrupted
  # run's loss exactly (the same layout as the checkpoint's: nothing resharded). Its first
  # step fails to launch on node 2 (the crash left that node's PMIx socket of the same
  # step id, J.0, in its spool: "Cannot bind() UNIX socket ...: Address already in use"),
  # and the script's retry (step J.1) runs; so only the first run must have no retry.
  "$CLUSTER_SH" boot "$CLUSTER" 2 >/dev/null 2>&1 || say "node 2 did not boot again"
  state=$(wait_job "$job")
  rerun=$(awk '/restart count 1/ { seen = 1 } seen' "$out")
  rerun_retries=$(grep -c "retrying in" <<< "$rerun")
  first_rerun=$(grep -m1 -oE "$STEP_ERE" <<< "$rerun" | grep -o "step [0-9]*" | cut -d' ' -f2)
  say "shrink-requeue: fault -> detection $(secs "$t_fault" "$t_detect") s, detection -> requeue $(secs "$t_detect" "$t_requeue") s (the requeued job then waits for 3 nodes: node 2 booted, its first step ${first_rerun:-none})"
  why=$(grep -o "not continuing on 2 node(s) (4 ranks): the memory plan (cpu) says they cannot hold the model: .*" "$out" | head -n1)
  final=$(metric_losses "$SCRATCH/runs/shrink-requeue/metrics.jsonl" | awk -v s="$STEPS" '$1 == s { print $2 }')
  ref_final=$(metric_losses "$SCRATCH/runs/shrink-ref/metrics.jsonl" | awk -v s="$STEPS" '$1 == s { print $2 }')
  if [[ $restarts == 1 && $pending == PENDING && -n $why && $state == COMPLETED &&
        -n $final && $final == "$ref_final" ]] &&
     grep -q "memory plan: .* 2 ranks on this machine" "$out" &&
     grep -q "requeueing job $job (restart 1)" "$out" &&
     ! awk '/restart count 1/ { exit } /retrying in/ { found = 1 } END { exit !found }' "$out" &&
     grep -q "resumed from .*/step_" <<< "$rerun" && grep -q "layout: world 6 = dp 3 x tp 2" <<< "$rerun"; then
    result shrink-requeue OK "job $job (memory limit $limit B per node: 2 x $need3 B fit at dp 3, 2 x $need2 B at dp 2 do not) started on 3 nodes; after node 2's crash it was requeued (PENDING, Restarts=1) instead of continuing on 2: '${why:0:150}...'; with node 2 back the rerun ($rerun_retries retry) resumed at dp 3 (first step $first_rerun) and COMPLETED on the uninterrupted run's final loss $final in $((SECONDS - t)) s"
  else
    show_log "$out"
    result shrink-requeue FAIL "job $job: after the crash '$pending' with restarts '$restarts', reason line '${why}'; then $state, final loss '${final}' vs '${ref_final}'"
  fi
fi
"$CLUSTER_SH" boot "$CLUSTER" 2 >/dev/null 2>&1 || say "node 2 did not boot again"

# ---- g) save-crash: node 2's ranks die while checkpoint step_20 is half-written --------
# The normal 3-node job (tp 2 x pp 3) with TRIDENT_FAULT_SAVE_STALL=2:20:MARKER: rank 2
# (on node 2) stops writing its file of step_20 after the first 4 KiB chunk and says so;
# the drill then records the half-written step_20.tmp (the rank file shorter than its
# size, no manifest, `latest` still step_15) and SIGKILLs node 2's ranks, as a crash of
# the node's processes would. The retry (same nodes) must resume from step_15, never
# from the half-written step_20, and end with exactly the normal run's loss; afterwards
# no step_*.tmp is left and every checkpoint verifies.
if [[ -z $ref_loss ]]; then
  result save-crash SKIP "no reference loss (normal failed)"
else
  t=$SECONDS
  dir=$SCRATCH/runs/save-crash
  out=$dir/job.out
  mkdir -p "$dir"
  job=$(TRIDENT_FAULT_SAVE_STALL="2:20:$dir/stalled" submit save-crash 3 \
        --set "parallel.comm_timeout_s=$COMM_TIMEOUT")
  # The fault: what the half-written checkpoint holds (it stays so: rank 2's writer is
  # stalled), then SIGKILL to node 2's ranks.
  half='f=$dir/ckpt/step_20.tmp; echo "$(stat -c %s $f/rank_2.bin) $(ls $f | paste -sd, -) $(head -n1 $dir/ckpt/latest)" > $dir/half; kill -9 $(trident_on 2)'
  fault_watch "$out" "$dir/times" "fault injection: rank file .*step_20.tmp/rank_2.bin stalls" \
    "$half" "retrying in" "$STEP_ERE" &
  await_job "$job" $!
  read -r t_fault t_detect t_step < "$dir/times" 2>/dev/null
  say "save-crash: fault -> detection $(secs "$t_fault" "$t_detect") s, detection -> first step after recovery $(secs "$t_detect" "$t_step") s"
  read -r half_size half_files half_latest < "$dir/half" 2>/dev/null
  stall_total=$(grep -o "rank_2.bin stalls after [0-9]* of [0-9]* bytes" "$out" | head -n1 | awk '{print $6}')
  from=$(resumed_step "$out")
  retry_losses=$(awk '/retrying in/ { seen = 1 } seen' "$out" | losses /dev/stdin)
  first_retry=$(head -n1 <<< "$retry_losses" | cut -d/ -f1)
  ref_part=$(losses "$out3" | awk -v f="${first_retry:-0}" -F'[/ ]' '$1 >= f')
  n_ckpt=$(verify_ckpts "$dir/ckpt"); ckpt_rc=$?
  tmps=$(find "$dir/ckpt" -maxdepth 1 -name '*.tmp' | wc -l)
  if [[ $state == COMPLETED && $from == 15 && $half_latest == step_15 && -n $half_size &&
        -n $stall_total && $half_size -lt $stall_total && $half_files != *manifest* &&
        $retry_losses == "$ref_part" && $(last_loss "$out") == "$ref_loss" &&
        $ckpt_rc -eq 0 && $tmps -eq 0 ]] && grep -q "retry 1 of" "$out"; then
    result save-crash OK "job $job COMPLETED in $((SECONDS - t)) s: node 2's ranks killed with step_20 half-written (rank_2.bin $half_size of $stall_total bytes, files $half_files, latest $half_latest); the retry resumed from step_15 and its $(grep -c . <<< "$retry_losses") losses equal the normal run's, final $ref_loss; no .tmp left, $n_ckpt checkpoints verify"
  else
    show_log "$out"
    result save-crash FAIL "job $job $state; at the kill: rank file '${half_size}' of '${stall_total}' bytes, files '${half_files}', latest '${half_latest}'; resumed from '${from}' (want 15); final '$(last_loss "$out")' vs '$ref_loss'; $tmps .tmp left; checkpoints verify: rc $ckpt_rc"
  fi
fi

# ---- h) flap: node 2's link down for FLAP_S s, shorter than parallel.comm_timeout_s -----
# The normal job with parallel.comm_timeout_s=FLAP_TIMEOUT; after step CUT_AT node 2's
# link is cut and healed FLAP_S s later. TCP retransmits once the link is back; the run
# must survive without a restart: no watchdog line, no retry, Restarts 0, no step logged
# while the link was down (so the cut did stall the run), every loss equal to the normal
# run's.
if [[ -z $ref_loss ]]; then
  result flap SKIP "no reference loss (normal failed)"
else
  t=$SECONDS
  dir=$SCRATCH/runs/flap
  out=$dir/job.out
  mkdir -p "$dir"
  job=$(submit flap 3 --set "parallel.comm_timeout_s=$FLAP_TIMEOUT")
  (
    wait_after "$out" "^" "$AFTER_CUT" || exit 0
    "$CLUSTER_SH" cut "$CLUSTER" 2 2>/dev/null
    t_cut=$(now)
    mark "$out" "cut the link of node 2 after step $CUT_AT"
    sleep "$FLAP_S"
    "$CLUSTER_SH" heal "$CLUSTER" 2 2>/dev/null
    t_heal=$(now)
    mark "$out" "healed the link of node 2"
    wait_after "$out" "healed the link" "$STEP_ERE"
    echo "$t_cut $t_heal $(now)" > "$dir/times"
  ) &
  await_job "$job" $!
  read -r t_cut t_heal t_step < "$dir/times" 2>/dev/null
  say "flap: fault -> detection none (link down $(secs "$t_cut" "$t_heal") s < comm_timeout_s $FLAP_TIMEOUT s: nothing to detect), cut -> first step after the heal $(secs "$t_cut" "$t_step") s"
  during=$(awk '/cut the link of node 2/ { seen = 1 } /healed the link/ { seen = 0 } seen && /step [0-9]+\/[0-9]+ \| loss/' "$out" | wc -l)
  restarts=$(job_field "$job" Restarts)
  if [[ $state == COMPLETED && ${restarts:-1} -eq 0 && $during -le 1 && -n $t_step ]] &&
     ! grep -qE "retrying in|watchdog:|requeueing" "$out" &&
     diff <(losses "$out") <(losses "$out3") >/dev/null; then
    result flap OK "job $job COMPLETED in $((SECONDS - t)) s without a restart: link down $(secs "$t_cut" "$t_heal") s ($during step(s) logged meanwhile), the next step $(secs "$t_cut" "$t_step") s after the cut; no watchdog line, no retry; all $STEPS losses equal the normal run's"
  else
    show_log "$out"
    result flap FAIL "job $job $state (restarts '${restarts}'); $during steps logged with the link down; $(grep -cE 'retrying in|watchdog:' "$out") retry/watchdog lines; losses equal: $(diff -q <(losses "$out") <(losses "$out3") >/dev/null && echo yes || echo no)"
  fi
fi

# ---- i) verbs: the other fault verbs do what they say (no job) ---------------------------
t=$SECONDS
problems=()
node_row() { "$CLUSTER_SH" status "$CLUSTER" 2>/dev/null | awk -v n="${PREFIX}n$1" '$1 == n'; }
# cut / heal: the status shows the link of node 3 down, then up.
"$CLUSTER_SH" cut "$CLUSTER" 3 2>/dev/null
[[ $(node_row 3 | awk '{print $3}') == DOWN ]] || problems+=("after cut: '$(node_row 3)'")
"$CLUSTER_SH" heal "$CLUSTER" 3 2>/dev/null
[[ $(node_row 3 | awk '{print $3}') == UP ]] || problems+=("after heal: '$(node_row 3)'")
# slow: a busy process on node 3 is throttled by the node's CFS quota (5% of the machine:
# low, so that it is reached even when other work leaves the loop little CPU time).
"$CLUSTER_SH" slow "$CLUSTER" 3 5 2>/dev/null || problems+=("slow failed")
"$CLUSTER_SH" exec "$CLUSTER" 3 sh -c 'timeout 1.5 sh -c "while :; do :; done"; exit 0'
throttled=$(awk '$1 == "nr_throttled" {print $2}' "$CGROUP/${PREFIX}n3/cpu.stat" 2>/dev/null)
[[ ${throttled:-0} -gt 0 ]] || problems+=("slow 5: nr_throttled '${throttled}'")
[[ $(node_row 3 | awk '{print $6}') == 5% ]] || problems+=("after slow: '$(node_row 3)'")
"$CLUSTER_SH" slow "$CLUSTER" 3 100 2>/dev/null
# crash / boot: only the holder and the relay survive on node 3; boot makes it idle again.
"$CLUSTER_SH" crash "$CLUSTER" 3 2>/dev/null
left=$("$CLUSTER_SH" ps "$CLUSTER" 3 | awk '{print $2}' | sort | tr '\n' ' ')
[[ $left == "python3 sleep " ]] || problems+=("after crash, on node 3: '$left'")
[[ $(node_row 3 | awk '{print $4}') == down ]] || problems+=("after crash: '$(node_row 3)'")
"$CLUSTER_SH" boot "$CLUSTER" 3 2>/dev/null || problems+=("boot failed")
[[ $(node_row 3 | awk '{print $4, $5}') == "up idle" ]] || problems+=("after boot: '$(node_row 3)'")
if [[ ${#problems[@]} -eq 0 ]]; then
  result verbs OK "cut/heal seen in status, slow 5 throttled a busy loop $throttled times, crash left only the holder and the relay, boot made the node idle; $((SECONDS - t)) s"
else
  result verbs FAIL "${problems[*]}"
fi

# ---- j) clean: nothing left behind ------------------------------------------------------
for pid in "${watchers[@]}"; do kill "$pid" 2>/dev/null; done
"$CLUSTER_SH" stop "$CLUSTER" 2>/dev/null
left=$("$CLUSTER_SH" check "$CLUSTER" 2>&1)
check_rc=$?
after=$(host_state)
if [[ $check_rc -eq 0 && $before == "$after" ]]; then
  result clean OK "$left; host interfaces, network namespaces and mounts unchanged"
else
  diff <(echo "$before") <(echo "$after")
  result clean FAIL "$left"
fi

say "$failures failed; $((SECONDS - T0)) s in all"
[[ $failures -eq 0 ]]
