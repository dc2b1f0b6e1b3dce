#!/usr/bin/env python3
# `trident plan` predicted against measured on this machine's CPU ranks (docs/PERFORMANCE.md
# "trident plan calibrated on CPU ranks"): trains a GPT-2 (L4 H4 C256 T256, byte
# vocabulary, global batch 8 x 256 tokens, micro-batch 1) on 2 MPI ranks in each layout
# below, `rounds` times round-robin. Each round calibrates the hardware table from one run
# only, its run of the first layout (`trident plan --calibrate`), and predicts the round's
# other runs with it: the machine is shared, and its load drifts between rounds more than
# within one. Printed per layout, medians over the rounds: the measured step time (with
# the rounds' range) and exposed communication (rank 0's metrics: per run the median of
# the steps after the first; tp and dp the least of the group's ranks, which is the
# communication without the two ranks' arrival skew, pp rank 0's stage's wait; per round
# beside the medians, and rank 0's tp and dp errors), the round's calibrated plan, the
# uncalibrated plan (this machine's sgemm rate measured as it runs), and the per-round
# errors. The calibration
# run has both overlap switches off: every collective is waited for, so its communication
# time is the transfer's (with overlap on, the hidden time of a collective on these ranks
# includes the compute it shares the cores with).
# With --paired, each layout's run follows a calibration run of its own (the first layout
# again), calibrated and used for that layout alone: the load's drift between the two is
# seconds, not a round's minutes (twice the runs).
# With --two-run, each layout's run follows two calibration runs of its own, dp2 ZeRO-1 and
# dp2 ZeRO-3 with both overlap switches off, and the table is fitted to both at once
# (`trident plan --calibrate M1 --calibrate-set ... --calibrate M2 --calibrate-set ...`):
# where their calls per byte on the link differ enough, the link's per-call latency with
# its bandwidth, else the bandwidth alone (the output line says which). --two-run=tp2
# takes tp 2 (many small all-reduces on the same link) as the second run instead, and
# --two-run=z0 dp2 ZeRO-0 with both overlap switches off (its all-reduces: with the
# metrics' comm_kind_least_ms the fit gives each collective kind its own bandwidth, the
# reduce-scatter's and all-gather's from ZeRO-1, the all-reduce's from ZeRO-0). A list
# takes several further runs, all fitted together: --two-run=z0,z3 calibrates from dp2
# ZeRO-1, ZeRO-0 and ZeRO-3, all three with overlap off (each kind's bandwidth from runs
# of few and of many calls, and one per-call latency). z2on is dp2 ZeRO-2 with overlap on,
# a layout the bench does not predict: with it, the table's overlap rates (the speed a
# collective keeps beside compute on these shared cores, and the compute's while one is in
# flight) are fitted from its waits and step, the links and the compute from the runs
# with overlap off (--two-run=z0,z3,z2on; docs/PLAN.md "Calibration"). tp2s is tp 2 on the
# model at a quarter of the sequence (T 64): 144 all-reduces a step of 64 KiB each, 33x
# ZeRO-0's calls per byte, so that the link's per-call latency is fitted apart from its
# bandwidth (of the predicted tp2's 144 of 256 KiB, about a fifth is latency); it and ZeRO-3 with
# overlap off, whose compute thread waits at every group, also give the ranks' arrival
# skew (the least total less each collective's least; --two-run=z0,z3,z2on,tp2s).
# (ZeRO-0 in 1 MiB buckets, 3x z0's calls per byte, did not separate the latency: a
# fraction of a ms between the two, within the runs' noise, gave a negative one.) Printed
# per round: the fitted bandwidth and latency; at the end, each layout's exposed
# communication error per group (three times the runs).
# With --calibrate-on=z3, the calibration run (the first layout) is dp2 ZeRO-3 with both
# overlap switches off instead of ZeRO-1: 84 collectives over 82 MB a step on this model,
# against ZeRO-1's 12 over 13 MB, whose few ms of waiting are mostly the two ranks'
# arrival skew rather than the transfer; ZeRO-1 with overlap off is then a predicted row.
#   python3 bench/plan_calibration_bench.py [steps] [rounds] [--paired | --two-run[=z3|tp2|z0|z0,z3|z0,z3,z2on,tp2s]]
#     [--calibrate-on=z3] [--layouts=I,J,...]   (default 6 3; from the repo root)
import json, os, statistics, subprocess, sys, tempfile, time

two_run = next((a for a in sys.argv[1:] if a == "--two-run" or a.startswith("--two-run=")), None)
further = (two_run.split("=", 1)[1] if two_run and "=" in two_run else "z3").split(",")
if not further or any(x not in ("z3", "tp2", "tp2s", "z0", "z2on") for x in further) or len(set(further)) < len(further):
    sys.exit(f"{two_run}: the further calibration runs are z3 (the default), tp2, tp2s, z0, z2on, or several of them (z0,z3,z2on,tp2s)")
paired = "--paired" in sys.argv or two_run is not None
on_z3 = "--calibrate-on=z3" in sys.argv
if on_z3 and two_run:
    sys.exit("--calibrate-on=z3 and --two-run: the two-run fit already takes ZeRO-1 and a second run")
# --layouts=I,J,...: run only these layouts (indices into LAYOUTS, 1..7) besides the
# calibration run, which always runs.
only = next((a for a in sys.argv[1:] if a.startswith("--layouts=")), None)
argv = [a for a in sys.argv[1:] if a not in ("--paired", two_run, "--calibrate-on=z3", only)]
# --compare BIN: also calibrate from the same runs and plan every run with another trident
# binary (its own table: a model change's effect on the same measurements).
compare = None
if "--compare" in argv:
    k = argv.index("--compare"); compare = argv[k + 1]; del argv[k:k + 2]
steps = int(argv[0]) if len(argv) > 0 else 6
rounds = int(argv[1]) if len(argv) > 1 else 3
T = os.environ.get("TRIDENT_BIN", "build/trident")  # the binary benchmarked
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MODEL = ["model.arch=gpt2", "model.vocab_size=256", "model.seq_len=256", "model.n_layers=4",
         "model.n_heads=4", "model.d_model=256", "parallel.micro_batch_size=1",
         "training.global_batch_size=8", "training.lr=3e-4", "training.warmup_steps=0"]
# (label, --set overrides of the layout); every one is 2 ranks on the same 2 cores.
OFF = ["parallel.overlap_grad_reduce=false", "parallel.overlap_param_gather=false"]
LAYOUTS = [
    ("dp2 z1 overlap off (calibration)", ["parallel.dp=2", "parallel.zero_stage=1"] + OFF),
    ("dp2 z1 overlap on", ["parallel.dp=2", "parallel.zero_stage=1"]),
    ("dp2 z0 overlap on", ["parallel.dp=2", "parallel.zero_stage=0"]),
    ("dp2 z3 overlap on", ["parallel.dp=2", "parallel.zero_stage=3"]),
    ("dp2 z3 overlap off", ["parallel.dp=2", "parallel.zero_stage=3"] + OFF),
    ("tp2", ["parallel.tp=2"]),
    ("pp2 1f1b", ["parallel.pp=2"]),
    ("pp2 v2 interleaved", ["parallel.pp=2", "parallel.virtual_stages=2"]),
]
if on_z3:
    LAYOUTS[0], LAYOUTS[4] = (("dp2 z3 overlap off (calibration)", LAYOUTS[4][1]),
                              ("dp2 z1 overlap off", LAYOUTS[0][1]))

if only:
    keep = {int(x) for x in only.split("=", 1)[1].split(",")}
    if not keep <= set(range(1, len(LAYOUTS))):
        sys.exit(f"{only}: layout indices are 1..{len(LAYOUTS) - 1}")
    LAYOUTS = [x for i, x in enumerate(LAYOUTS) if i == 0 or i in keep]

# --two-run's further calibration runs.
FURTHER = [{"z3": ("dp2 z3 overlap off", ["parallel.dp=2", "parallel.zero_stage=3"] + OFF),
            "tp2": ("tp2", ["parallel.tp=2"]),
            "z0": ("dp2 z0 overlap off", ["parallel.dp=2", "parallel.zero_stage=0"] + OFF),
            "tp2s": ("tp2 T64", ["parallel.tp=2", "model.seq_len=64"]),
            "z2on": ("dp2 z2 overlap on", ["parallel.dp=2", "parallel.zero_stage=2"])}[x] for x in further]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def load():
    return open("/proc/loadavg").read().split()[:3]


def sets(xs):
    return [a for x in xs for a in ("--set", x)]


with tempfile.TemporaryDirectory() as work:
    with open(f"{work}/text.txt", "w") as f:
        for _ in range(10):
            for name in sorted(os.listdir("docs")):
                f.write(open(f"docs/{name}").read())
    sh([T, "prepare", "--input", f"{work}/text.txt", "--out", f"{work}/data", "--tokenizer", "byte"])
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    print(f"# machine: {cpu}, {os.cpu_count()} cores, {'avx512f' if 'avx512f' in flags else 'no avx512f'}; "
          f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {' '.join(load())}")
    print(f"# GPT-2 L4 H4 C256 T256, byte vocabulary, global batch 8 x 256, micro-batch 1, 2 MPI ranks, "
          f"{steps} steps (medians of steps 2..{steps})")
    def plan(base, extra, binary=T):
        j = json.loads(sh([binary, "plan", "--config", "bench/medium.yaml", "--devices", "2", "--gpu", "cpu",
                           "--configured-only", "--json"] + sets(base) + extra))["configured"]
        # pp: rank 0's stage's wait in its pipeline transfers (a binary without the per-stage
        # figure: the slowest stage's, transfers plus the bubble).
        slowest = j["time_s"]["pp"] + j["time_s"]["bubble"]
        pp = j["stage_pp_wait_s"][0] if "stage_pp_wait_s" in j else slowest
        return {"step": j["step_time_s"], "tp": j["time_s"]["tp"], "dp": j["time_s"]["dp"], "pp": pp,
                "pp_slowest": slowest, "tp_call": j["time_s"]["tp"], "dp_call": j.get("dp_comm_s", 0)}

    results = {label: [] for label, _ in LAYOUTS}  # per round: (measured, calibrated, uncalibrated)
    def train(rnd, i, layout, tag=""):
        base = MODEL + layout + [f"data.train={work}/data/train_*.bin", f"training.max_steps={steps}",
                                 f"logging.metrics={work}/m{rnd}_{i}{tag}.jsonl", f"checkpoint.dir={work}/ck{rnd}_{i}{tag}",
                                 "checkpoint.save_final=false", "logging.log_interval=1"]
        sh(["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", "2",
            T, "train", "--config", "bench/medium.yaml"] + sets(base))
        return base, f"{work}/m{rnd}_{i}{tag}.jsonl"

    def calibrate(rnd, i, base, metrics, hw):
        out = sh([T, "plan", "--calibrate", metrics, "--config", "bench/medium.yaml"] +
                 sets(base) + ["--gpu", "cpu", "--write-hardware", hw])
        if compare:  # its own table from the same run (a table it may not read otherwise)
            sh([compare, "plan", "--calibrate", metrics, "--config", "bench/medium.yaml"] +
               sets(base) + ["--gpu", "cpu", "--write-hardware", hw + ".cmp"])
        if rnd == 0 and i == 0 and not two_run:
            print(f"# calibration ({'before each layout, from a run of the first layout' if paired else 'each round, from its first run'}): " +
                  " ".join(["trident", "plan", "--calibrate", "METRICS", "--config", "bench/medium.yaml"] +
                           sets(MODEL + LAYOUTS[0][1]) + ["--gpu", "cpu", "--write-hardware", "HW"]))
        print(f"# round {rnd + 1}{f' layout {i}' if paired else ''}: " + "; ".join(out.splitlines()[-4:-1]))

    def calibrate_two(rnd, i, hw):
        # Both calibration runs right before the layout's, fitted together.
        runs = [train(rnd, i, LAYOUTS[0][1], "c")] + [train(rnd, i, lay, "d" + str(n)) for n, (_, lay) in enumerate(FURTHER)]
        shared = MODEL + [f"data.train={work}/data/train_*.bin"]
        per_run = lambda layout, m: ["--calibrate", m] + [a for x in layout for a in ("--calibrate-set", x)]
        cmd = ([T, "plan"] + per_run(LAYOUTS[0][1], runs[0][1]) +
               [a for (_, lay), run in zip(FURTHER, runs[1:]) for a in per_run(lay, run[1])] +
               ["--config", "bench/medium.yaml"] + sets(shared) + ["--gpu", "cpu", "--write-hardware", hw])
        if rnd == 0 and i == 0:
            print(f"# calibration (before each layout, from a {LAYOUTS[0][0]} run and " +
                  " and ".join(f"a {label} run" for label, _ in FURTHER) + "): " +
                  " ".join(["trident", "plan"] + per_run(LAYOUTS[0][1], "M1") +
                           [a for n, (_, lay) in enumerate(FURTHER) for a in per_run(lay, f"M{n + 2}")] +
                           ["--config", "bench/medium.yaml"] + sets(MODEL) + ["--gpu", "cpu", "--write-hardware", "HW"]))
        if compare:
            # The compare binary from the runs with overlap off (a binary without the
            # overlap rates' fit would take z2on's hidden time as the link's).
            blocking = [(lay, run) for (label, lay), run in zip(FURTHER, runs[1:]) if "overlap on" not in label]
            c = subprocess.run([compare, "plan"] + per_run(LAYOUTS[0][1], runs[0][1]) +
                               [a for lay, run in blocking for a in per_run(lay, run[1])] +
                               ["--config", "bench/medium.yaml"] + sets(shared) +
                               ["--gpu", "cpu", "--write-hardware", hw + ".cmp"],
                               capture_output=True, text=True, env=env)
            if c.returncode != 0:  # refused: the compare binary's table from the first run alone
                sh([compare, "plan", "--calibrate", runs[0][1], "--config", "bench/medium.yaml"] +
                   sets(runs[0][0]) + ["--gpu", "cpu", "--write-hardware", hw + ".cmp"])
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode == 2:
            # Refused (the two runs' times fit no positive bandwidth and latency): this
            # layout is planned from the first calibration run alone, and the round says so.
            print(f"# round {rnd + 1} layout {i}: two-run fit refused ({r.stderr.splitlines()[0]}); "
                  f"calibrated from the {LAYOUTS[0][0]} run alone")
            calibrate(rnd, i, runs[0][0], runs[0][1], hw)
            return
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
        out = r.stdout
        fitted = [l for l in out.splitlines() if l.startswith("shared memory") or l.startswith("compute efficiencies")
                  or l.startswith("overlap on shared cores") or l.startswith("arrival skew")]
        print(f"# round {rnd + 1} layout {i} (load {' '.join(load())}): " + "; ".join(fitted))

    for rnd in range(rounds):
        for i, (label, layout) in enumerate(LAYOUTS):
            hw = f"{work}/hw{rnd}_{i}.yaml" if paired else f"{work}/hw{rnd}.yaml"
            if two_run:
                calibrate_two(rnd, i, hw)
            elif paired and i > 0:
                cbase, cm = train(rnd, i, LAYOUTS[0][1], "c")
                calibrate(rnd, i, cbase, cm, hw)
            base, metrics = train(rnd, i, layout)
            recs = [j for j in map(json.loads, open(metrics)) if "step_ms" in j][1:]
            med = lambda f: statistics.median(f(r) for r in recs) / 1e3
            # tp, dp: the least exposed time of the group's ranks (comm_exposed_least_ms), the
            # communication without the ranks' arrival skew; pp: rank 0's, its stage's wait.
            least = lambda r: r["comm_exposed_least_ms"]
            m = {"step": med(lambda r: r["step_ms"]), "tp": med(lambda r: least(r)["tp"]),
                 "pp": med(lambda r: r["comm_exposed_ms"]["pp"]),
                 "dp": med(lambda r: least(r)["dp"] + least(r)["embedding"]),
                 "dp_rank0": med(lambda r: r["comm_exposed_ms"]["dp"] + r["comm_exposed_ms"]["embedding"]),
                 "tp_rank0": med(lambda r: r["comm_exposed_ms"]["tp"])}
            # Per call (comm_kind_least_ms, where the binary writes it): each collective's
            # least over the group's ranks, summed over the kinds; exposed + hidden, so
            # against the plan's whole time of the group (tp_s; dp_comm_s).
            if all("comm_kind_least_ms" in r for r in recs):
                calls = lambda r, g: sum(r["comm_kind_least_ms"][g].values())
                m["tp_call"] = med(lambda r: calls(r, "tp"))
                m["dp_call"] = med(lambda r: calls(r, "dp") + calls(r, "embedding"))
            if i == 0 and not two_run:
                calibrate(rnd, i, base, metrics, hw)
            planned = MODEL + layout + [f"data.train={work}/data/train_*.bin"]
            results[label].append((m, plan(planned, ["--hardware", hw]), plan(planned, [])) +
                                  ((plan(planned, ["--hardware", hw + ".cmp"], compare),) if compare else ()))
        print(f"# round {rnd + 1} done {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {' '.join(load())}")
    print("| layout | measured ms/step (rounds' range) | calibrated plan | error | uncalibrated plan | error | "
          "exposed tp ms meas / plan | exposed pp ms meas / plan | exposed dp ms meas / plan |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs, plain_errs = [], []
    for label, _ in LAYOUTS:
        rs = results[label]
        m, c, u = ({k: statistics.median(r[i][k] for r in rs) for k in rs[0][i]} for i in range(3))
        e, ue = (statistics.median(100 * (r[i]["step"] / r[0]["step"] - 1) for r in rs) for i in (1, 2))
        lo, hi = min(r[0]["step"] for r in rs), max(r[0]["step"] for r in rs)
        if "calibration" not in label:
            errs.append(abs(e))
            plain_errs.append(abs(ue))
        cell = lambda k: f"{1e3 * m[k]:.1f} / {1e3 * c[k]:.1f}"
        print(f"| {label} | {1e3 * m['step']:.1f} ({1e3 * lo:.0f}–{1e3 * hi:.0f}) | {1e3 * c['step']:.1f} | {e:+.1f}% | "
              f"{1e3 * u['step']:.1f} | {ue:+.1f}% | {cell('tp')} | {cell('pp')} | {cell('dp')} |")
    print(f"# {len(errs)} layouts besides the calibration run (median error over rounds): calibrated |error| mean "
          f"{statistics.mean(errs):.1f}%, max {max(errs):.1f}%, {sum(x <= 20 for x in errs)} within 20%; uncalibrated "
          f"mean {statistics.mean(plain_errs):.1f}%, max {max(plain_errs):.1f}%, {sum(x <= 20 for x in plain_errs)} within 20%")
    # Exposed communication per group, where the run measured at least 1 ms of it: the
    # calibrated plan's error (median over rounds); a layout counts as within 20% when every
    # such group is. pp: rank 0's stage's wait (stage_pp_wait_s[0]); beside it the slowest
    # stage's transfers plus the bubble, which is what plan predicted before it gave each
    # stage's wait.
    print("# exposed communication, calibrated plan against measured (median error over rounds):")
    within = 0
    for label, _ in LAYOUTS:
        rs = results[label]
        errs_of = {k: statistics.median(100 * (r[1][k] / r[0][k] - 1) for r in rs if r[0][k] > 0)
                   for k in ("tp", "pp", "dp") if statistics.median(r[0][k] for r in rs) >= 1e-3}
        cells = [f"{k} {statistics.median(1e3 * r[0][k] for r in rs):.1f} ms {e:+.0f}% (per round, measured/planned ms: "
                 + " ".join(f"{1e3 * r[0][k]:.1f}/{1e3 * r[1][k]:.1f}" for r in rs) + ")"
                 for k, e in errs_of.items()]
        for k in ("tp", "dp"):
            if k in errs_of:
                cells.append(f"{k} as rank 0's {statistics.median(1e3 * r[0][k + '_rank0'] for r in rs):.1f} ms "
                             f"{statistics.median(100 * (r[1][k] / r[0][k + '_rank0'] - 1) for r in rs if r[0][k + '_rank0'] > 0):+.0f}%")
        for k in ("tp", "dp"):
            if k in errs_of and all(k + "_call" in r[0] and r[0][k + "_call"] > 0 for r in rs):
                cells.append(f"{k} per call (exposed + hidden) {statistics.median(1e3 * r[0][k + '_call'] for r in rs):.1f} ms, "
                             f"plan's whole {statistics.median(1e3 * r[1][k + '_call'] for r in rs):.1f} ms "
                             f"{statistics.median(100 * (r[1][k + '_call'] / r[0][k + '_call'] - 1) for r in rs):+.0f}%")
        if "pp" in errs_of:
            cells.append("pp as the slowest stage's "
                         f"{statistics.median(100 * (r[1]['pp_slowest'] / r[0]['pp'] - 1) for r in rs if r[0]['pp'] > 0):+.0f}%")
        ok = bool(errs_of) and all(abs(e) <= 20 for e in errs_of.values())
        within += ok and "calibration" not in label
        print(f"#   {label}: " + ("; ".join(cells) if cells else "none measured") + (" (within 20%)" if ok else ""))
    print(f"#   {within} of {len(LAYOUTS) - 1} layouts besides the calibration run within 20% on every exposed group")
    if compare:
        print(f"# the same runs, calibrated and planned by {compare} (median over rounds):")
        cerrs, cwithin = [], 0
        for label, _ in LAYOUTS:
            rs = results[label]
            e = statistics.median(100 * (r[3]["step"] / r[0]["step"] - 1) for r in rs)
            if "calibration" not in label:
                cerrs.append(abs(e))
            errs_of = {k: statistics.median(100 * (r[3][k] / r[0][k] - 1) for r in rs if r[0][k] > 0)
                       for k in ("tp", "pp", "dp") if statistics.median(r[0][k] for r in rs) >= 1e-3}
            ok = bool(errs_of) and all(abs(x) <= 20 for x in errs_of.values())
            cwithin += ok and "calibration" not in label
            print(f"#   {label}: step {1e3 * statistics.median(r[3]['step'] for r in rs):.1f} ms ({e:+.1f}%); exposed " +
                  ", ".join(f"{k} {x:+.0f}%" for k, x in errs_of.items()) + (" (within 20%)" if ok else ""))
        print(f"#   calibrated |error| mean {statistics.mean(cerrs):.1f}%, max {max(cerrs):.1f}%, "
              f"{sum(x <= 20 for x in cerrs)} within 20%; {cwithin} of {len(LAYOUTS) - 1} layouts within 20% on every exposed group")
