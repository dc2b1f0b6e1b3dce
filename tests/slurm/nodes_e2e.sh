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
#   verbs   without a job: cut/heal show in `status`, `slow 5` throttles a busy loop on
#           the node (its cgroup's nr_throttled), `crash` leaves only the node's holder
#           and relay, `boot` makes it idle again.
#   clean   after `cluster.sh stop`: no process in the cluster's namespaces, no daemon, no
#           cgroup (cluster.sh check), and the host's interfaces, network namespaces and
#           mounts are what they were before.
# The cut, straggler and spare drills print one line "NAME: fault -> detection X s, detection ->
# first step after recovery Y s" (a straggler is never recovered from: "none"). Prints
# PASS/FAIL/SKIP per scenario (prefix "nodes_e2e:"); where the machine
# does not allow namespaces or veth pairs every scenario is a SKIP with the reason, and the
# script exits 0. Exits 1 if any scenario failed. Everything is stopped on exit.
#
# Environment: NODES_E2E_STEPS (default 60), NODES_E2E_TIMEOUT (seconds per job, default
#   300), NODES_E2E_STRAGGLER_PERCENT (default 1), SLURM_TEST_PORT (see cluster.sh; by default a
#   port derived from the directory).
set -uo pipefail

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
CLUSTER=$SCRATCH/nodes
CLUSTER_SH=$REPO/scripts/slurm/cluster.sh
T0=$SECONDS

skip_all() {
  local s
  for s in normal cut straggler spare verbs clean; do result "$s" SKIP "$1"; done
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
  # node, so a tp line cannot name node 2; it counts without.)
  watchdog=$(awk '/retrying in/ { exit } /watchdog: .* in group .* has not completed/' "$out")
  survivor_lines=$(grep -cE "^\[rank [0-9]+ on ${PREFIX}n[13]\] watchdog: [a-z_0-9]+ .* in group '[a-z]+' \(rank [0-9]+/[0-9]+\) has not completed" <<< "$watchdog")
  p2p_lines=$(grep -E "^\[rank [0-9]+ on ${PREFIX}n[13]\] watchdog: [a-z_0-9]*(p2p|send|recv) " <<< "$watchdog")
  p2p=$(grep -c . <<< "$p2p_lines")
  named=$(grep -E " (from|to|with) rank 1 in group 'pp' \(rank [02]/3\)" <<< "$p2p_lines" |
          grep -cE "; rank 1 is world rank [23] on host ${PREFIX}n2; ")
  hosted=$(grep -E "^\[rank [0-9]+ on ${PREFIX}n[13]\] " <<< "$watchdog" |
           grep -cE "; rank 1 is world rank [23] on host ${PREFIX}n2; |; the group's ranks are on hosts [^;]*${PREFIX}n2(,|;| and )| in group 'tp' ")
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

# ---- e) verbs: the other fault verbs do what they say (no job) ---------------------------
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

# ---- f) clean: nothing left behind ------------------------------------------------------
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
