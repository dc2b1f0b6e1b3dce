#!/usr/bin/env python3
# The `trident plan` figures of docs/PERFORMANCE.md ("trident plan vs published runs")
# and of the Llama configs' comments: runs build/trident plan --json for the published
# model, layout and batch and prints plan's prediction next to the published figure.
#   python3 bench/plan_vs_published.py megatron|llama3|titan|configs|errors|table|calibrated NAME
#       [--trident BIN] [--hardware FILE]   (from the repo root)
# `errors` prints one line per run of tests/plan/published_runs.json (the published layout
# as `configured`): the published MFU, the plan's, the relative error and the memory, then
# the error's distribution; `table` the same as docs/PERFORMANCE.md's Markdown table, with
# plan's recommendation. Run either with an older binary and its hardware table to compare.
# `calibrated NAME` calibrates the GPU of the run whose name contains NAME from that run's
# published throughput alone (a metrics file with its step time, step = tokens per step /
# published tokens/s; no communication figures, so the links keep theirs: `trident plan
# --calibrate`) and prints every run on that GPU with the calibrated table.
import json, os, statistics, subprocess, sys
args = sys.argv[1:]
def option(flag, default):
    if flag in args:
        i = args.index(flag); v = args[i + 1]; del args[i:i + 2]; return v
    return default
T = option("--trident", "build/trident")
HW = option("--hardware", None)
def plan(config, devices, gpu, sets, extra=(), attention=None, selective_reruns=None, hardware=None):
    cmd = [T, "plan", "--config", config, "--devices", str(devices), "--gpu", gpu, "--json", *extra]
    if hardware or HW: cmd += ["--hardware", hardware or HW]
    # A run whose selective recomputation is another trainer's policy (torchtitan's "op").
    if selective_reruns: cmd += ["--selective-reruns", selective_reruns]
    for s in sets: cmd += ["--set", s]
    # A run of the data file with "attention": "plain" (scores materialized, pre-flash
    # Megatron-LM) is planned as the CUDA backend's plain path: TRIDENT_ATTENTION=plain.
    env = dict(os.environ)
    env.pop("TRIDENT_ATTENTION", None)
    if attention == "plain": env["TRIDENT_ATTENTION"] = "plain"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if not r.stdout.strip():
        return None, r.stderr
    return json.loads(r.stdout), r.stderr
def name(l):
    return f"dp{l['dp']} tp{l['tp']} pp{l['pp']}{(' v'+str(l['virtual_stages'])) if l['virtual_stages']>1 else ''} z{l['zero_stage']}{' sp' if l['sequence_parallel'] else ''} {l['recompute']} mbs{l['micro_batch_size']}"
def show(l):
    if l is None: return "none fits"
    return f"{name(l)}: {l['step_time_s']:.2f} s/step, {l['tokens_per_s_per_gpu']:.0f} tok/s/GPU, MFU {100*l['mfu']:.1f}%, {l['memory_bytes']['total']/2**30:.1f} GiB, fits={l['fits']}"
mode = args[0]
if mode == "configs":
    for cfg in ["llama-8b", "llama-70b", "llama-405b"]:
        for n in [64, 256, 1024]:
            j, err = plan(f"configs/{cfg}.yaml", n, "h100", [])
            if j is None: print(cfg, n, "ERR", err.strip()); continue
            print(cfg, n, "rec:", show(j["recommended"]), "| conf:", show(j["configured"]))
if mode == "megatron":
    rows = [(1.7,24,2304,24,1,1,32,512,44),(3.6,32,3072,30,2,1,64,512,44),(7.5,32,4096,36,4,1,128,512,46),
            (18.4,48,6144,40,8,1,256,1024,43),(39.1,64,8192,48,8,2,512,1536,44),(76.1,80,10240,60,8,4,1024,1792,45),
            (145.6,96,12288,80,8,8,1536,2304,47),(310.1,128,16384,96,8,16,1920,2160,50),
            (529.6,128,20480,105,8,35,2520,2520,52),(1008.0,160,25600,128,8,64,3072,3072,52)]
    for (b,nh,h,L,tp,pp,g,bs,pct) in rows:
        dp = g//(tp*pp)
        sets = ["model.arch=gpt2","model.vocab_size=51200","model.seq_len=2048",f"model.n_layers={L}",f"model.n_heads={nh}",
                f"model.n_kv_heads={nh}",f"model.d_model={h}",f"parallel.dp={dp}",f"parallel.tp={tp}",f"parallel.pp={pp}",
                "parallel.zero_stage=0","parallel.micro_batch_size=1",f"training.global_batch_size={bs}",
                "training.precision=bf16","training.recompute=full"]
        j, err = plan("configs/gpt2-350m.yaml", g, "a100", sets)
        if j is None: print(b, "ERR", err.strip()); continue
        c = j["configured"]
        # best over micro-batch sizes for the same dp/tp/pp, ZeRO 0, full recompute, no sp
        same = [l for l in j["layouts"] if l["dp"]==dp and l["tp"]==tp and l["pp"]==pp and l["zero_stage"]==0 and l["recompute"]=="full" and not l["sequence_parallel"] and l["fits"]]
        best = max(same, key=lambda l: l["tokens_per_s_per_gpu"]) if same else None
        print(f"{b}B tp{tp} pp{pp} dp{dp} {g} GPUs batch {bs}: published {pct}% HFU -> {0.75*pct:.1f}% MFU | plan mbs1 {100*c['mfu']:.1f}% fits={c['fits']} mem {c['memory_bytes']['total']/2**30:.1f} GiB bubble {100*c['bubble']:.1f}% | best mbs: {show(best)} | rec: {show(j['recommended'])}")
if mode == "llama3":
    for (g, dp, bsdp, pub) in [(8192, 64, 32, 43), (16384, 128, 16, 41)]:
        sets = [f"parallel.dp={dp}", "parallel.tp=8", "parallel.pp=16", f"training.global_batch_size={dp*bsdp}"]
        for extra in [["training.recompute=none"], ["training.recompute=none","parallel.sequence_parallel=true"], ["training.recompute=selective","parallel.sequence_parallel=true"], ["training.recompute=full","parallel.sequence_parallel=true"]]:
            j, err = plan("configs/llama-405b.yaml", g, "h100", sets + extra)
            if j is None: print("ERR", err); continue
            c = j["configured"]
            print(f"405B {g} GPUs tp8 pp16 dp{dp} gbs {dp*bsdp} {extra}: published {pub}% | plan {show(c)} bubble {100*c['bubble']:.1f}% | rec {show(j['recommended'])}")
if mode == "titan":
    # torchtitan: Llama 3 8B / 70B on 64 A100 80GB, FSDP (ZeRO-3) 64, local batch 1, seq 8192
    for cfg, rc, pub_wps, pub_mfu in [("llama-8b", "selective", 2973, 58.2), ("llama-70b", "full", 323, 50.5)]:
        sets = ["parallel.dp=64","parallel.tp=1","parallel.pp=1","parallel.stage_layers=[]","parallel.zero_stage=3","parallel.micro_batch_size=1","parallel.sequence_parallel=false","training.global_batch_size=64",f"training.recompute={rc}"]
        # torchtitan's "selective" here is its op-level policy.
        j, err = plan(f"configs/{cfg}.yaml", 64, "a100", sets,
                      selective_reruns="torchtitan-op" if rc == "selective" else None)
        if j is None: print("ERR", err); continue
        c = j["configured"]
        print(f"{cfg} 64 x A100 FSDP lbs1 {rc}: published {pub_wps} tok/s/GPU {pub_mfu}% | plan {show(c)} dp comm {c['comm_bytes_per_step']['dp']/1e9:.1f} GB | rec {show(j['recommended'])}")
import tempfile
WORK = tempfile.TemporaryDirectory()
def calibrate_from(src, hardware=None):
    """The hardware table calibrated from run `src`'s published throughput alone: a metrics
    file with its step (tokens per step / published tokens/s), no communication figures
    (the links keep theirs), through `trident plan --calibrate`. Returns (path, its line)."""
    j, _ = plan(src["config"], src["devices"], src["gpu"], src["set"], extra=["--configured-only"],
                attention=src.get("attention"), selective_reruns=src.get("selective_reruns"),
                hardware=hardware)
    c = j["configured"]
    tokens_per_step = c["tokens_per_s_per_gpu"] * src["devices"] * c["step_time_s"]
    step_ms = 1e3 * tokens_per_step / (src["published_tokens_per_s_per_gpu"] * src["devices"])
    tag = str(abs(hash(src["name"])))
    m, hw = f"{WORK.name}/published-{tag}.jsonl", f"{WORK.name}/hw-{tag}.yaml"
    with open(m, "w") as f:
        f.write(json.dumps({"segment": {"run_id": "published", "start_step": 0, "world_size": src["devices"]}}) + "\n")
        for step in (1, 2):
            zero = {"tp": 0, "dp": 0, "pp": 0, "embedding": 0}
            f.write(json.dumps({"step": step, "step_ms": step_ms, "comm_exposed_ms": zero, "comm_hidden_ms": zero}) + "\n")
    cmd = [T, "plan", "--calibrate", m, "--config", src["config"], "--gpu", src["gpu"],
           "--write-hardware", hw] + [a for x in src["set"] for a in ("--set", x)]
    if hardware or HW: cmd += ["--hardware", hardware or HW]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0: sys.exit(f"calibrating from {src['name']}: {r.stderr}")
    return hw, f"{step_ms:.1f} ms/step published; " + r.stdout.strip().splitlines()[-2]
# A row with "calibrated_from" (a software stack whose per-GPU efficiency differs from the
# one configs/hardware.yaml was fitted to) is planned with the table calibrated from that
# row, as tests/plan/published_runs_test.cpp plans it.
STACKS = {}
def row_hardware(r, runs):
    src = r.get("calibrated_from")
    if not src: return None
    if src not in STACKS:
        STACKS[src] = calibrate_from(next(x for x in runs if x["name"] == src))[0]
    return STACKS[src]
if mode == "calibrated":
    runs = json.load(open("tests/plan/published_runs.json"))["runs"]
    src = next(r for r in runs if args[1] in r["name"])
    hw, line = calibrate_from(src)
    print(f"# calibrated {src['gpu']} from {src['name']}: {line}")
    for r in runs:
        if r["gpu"] != src["gpu"] or "published_tokens_per_s_per_gpu" not in r: continue
        j, err = plan(r["config"], r["devices"], r["gpu"], r["set"], extra=["--configured-only"],
                      attention=r.get("attention"), selective_reruns=r.get("selective_reruns"), hardware=hw)
        c = j["configured"]
        pub = 100 * r["published_tokens_per_s_per_gpu"] * c["mfu"] / c["tokens_per_s_per_gpu"]
        print(f"{r['name']:52s} published {pub:5.1f}%  calibrated plan {100*c['mfu']:5.1f}%  "
              f"error {100 * (100 * c['mfu'] / pub - 1):+6.1f}%{'  (the calibration run)' if r is src else ''}")
if mode in ("errors", "table"):
    # Every run of tests/plan/published_runs.json (the data published_runs_test.cpp holds
    # the plan to): the published layout as `configured` (--configured-only: no search
    # bound), the published MFU in the 6N + 12·L·h·s convention (a published throughput
    # converted with Trident's FLOPs per token, as the test does), the plan's, the error;
    # `table` also runs the full search for plan's recommendation and prints Markdown.
    runs = json.load(open("tests/plan/published_runs.json"))["runs"]
    peak = {"a100": 312e12, "h100": 989e12}
    errors = []
    if mode == "table":
        print("| run | GPUs | published | published MFU | plan MFU | error | plan memory | plan's recommendation |")
        print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        cmd_sets = r["set"]
        hw = row_hardware(r, runs)
        j, err = plan(r["config"], r["devices"], r["gpu"], cmd_sets, extra=["--configured-only"],
                      attention=r.get("attention"), selective_reruns=r.get("selective_reruns"), hardware=hw)
        if j is None or j["configured"] is None:
            print(f"{r['name']:52s} plan ERR ({(err or '').strip()[:80]})"); continue
        c = j["configured"]
        if "published_tokens_per_s_per_gpu" in r:
            pub = 100 * r["published_tokens_per_s_per_gpu"] * c["mfu"] / c["tokens_per_s_per_gpu"]
        else:
            pub = r["published_mfu_pct"]
        e = 100 * (100 * c["mfu"] / pub - 1)
        errors.append((r["family"], e))
        mem = f"{'fits' if c['fits'] else 'does not fit'}, {c['memory_bytes']['total']/2**30:.1f} GiB"
        if mode == "errors":
            print(f"{r['name']:52s} published {pub:5.1f}%  plan {100*c['mfu']:5.1f}%  error {e:+6.1f}%  {mem}")
            continue
        full, ferr = plan(r["config"], r["devices"], r["gpu"], cmd_sets, attention=r.get("attention"), hardware=hw)
        if full is None or full.get("recommended") is None:
            rec = "refused: " + (ferr or "").strip().split(": ", 1)[-1][:60] if full is None else "none fits"
        else:
            rl = full["recommended"]
            rec = f"{name(rl)}: {100*rl['mfu']:.1f}% ({rl['step_time_s']/c['step_time_s']:.2f}x the published layout's step)"
        print(f"| {r['name']} | {r['devices']} {r['gpu'].upper()} | {r['published']} | {pub:.1f}% | "
              f"{100*c['mfu']:.1f}% | {e:+.1f}% | {mem} | {rec} |")
    a = sorted(abs(e) for _, e in errors)
    near = sum(x <= 15 for x in a)
    print(f"{len(errors)} rows: {near} within ±15% ({100*near/len(a):.0f}%), mean error {statistics.mean(e for _, e in errors):+.1f}%, "
          f"mean |error| {statistics.mean(a):.1f}%, median |error| {statistics.median(a):.1f}%, max |error| {a[-1]:.1f}%")
    for fam in dict.fromkeys(f for f, _ in errors):
        fe = [abs(e) for f, e in errors if f == fam]
        print(f"  {fam}: {len(fe)} rows, {sum(x <= 15 for x in fe)} within ±15%, mean |error| {statistics.mean(fe):.1f}%")
