#!/usr/bin/env python3
# The `trident plan` figures of docs/PERFORMANCE.md ("trident plan vs published runs")
# and of the Llama configs' comments: runs build/trident plan --json for the published
# model, layout and batch and prints plan's prediction next to the published figure.
#   python3 bench/plan_vs_published.py megatron|llama3|titan|configs|errors
#       [--trident BIN] [--hardware FILE]   (from the repo root)
# `errors` prints one line per published run (the published layout as `configured`): the
# published MFU, the plan's, whether it fits and the error in points, then the error's
# distribution; run it with an older binary and its hardware table to compare.
import json, statistics, subprocess, sys
args = sys.argv[1:]
def option(flag, default):
    if flag in args:
        i = args.index(flag); v = args[i + 1]; del args[i:i + 2]; return v
    return default
T = option("--trident", "build/trident")
HW = option("--hardware", None)
def plan(config, devices, gpu, sets):
    cmd = [T, "plan", "--config", config, "--devices", str(devices), "--gpu", gpu, "--json"]
    if HW: cmd += ["--hardware", HW]
    for s in sets: cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
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
        sets = ["parallel.dp=64","parallel.tp=1","parallel.pp=1","parallel.stage_layers=[]","parallel.zero_stage=3","parallel.micro_batch_size=1","training.global_batch_size=64",f"training.recompute={rc}"]
        j, err = plan(f"configs/{cfg}.yaml", 64, "a100", sets)
        if j is None: print("ERR", err); continue
        c = j["configured"]
        print(f"{cfg} 64 x A100 FSDP lbs1 {rc}: published {pub_wps} tok/s/GPU {pub_mfu}% | plan {show(c)} dp comm {c['comm_bytes_per_step']['dp']/1e9:.1f} GB | rec {show(j['recommended'])}")
if mode == "errors":
    # (label, config, GPUs, gpu, sets, published MFU in %). Megatron: Table 1's TFLOP/s
    # over 312, converted from its recomputed-forward count to model FLOPs
    # (docs/PERFORMANCE.md); Llama 3: Table 4; torchtitan: docs/performance.md.
    published = []
    for (b,nh,h,L,tp,pp,g,bs,tf) in [(1.7,24,2304,24,1,1,32,512,137),(3.6,32,3072,30,2,1,64,512,138),
            (7.5,32,4096,36,4,1,128,512,142),(18.4,48,6144,40,8,1,256,1024,135),(39.1,64,8192,48,8,2,512,1536,138),
            (76.1,80,10240,60,8,4,1024,1792,140),(145.6,96,12288,80,8,8,1536,2304,148),(310.1,128,16384,96,8,16,1920,2160,155),
            (529.6,128,20480,105,8,35,2520,2520,163),(1008.0,160,25600,128,8,64,3072,3072,163)]:
        s_, V = 2048, 51200
        mfu = 100 * tf / 312 * 72 * (1 + s_/(6*h) + V/(12*L*h)) / (96 * (1 + s_/(6*h) + V/(16*L*h)))
        sets = ["model.arch=gpt2","model.vocab_size=51200","model.seq_len=2048",f"model.n_layers={L}",f"model.n_heads={nh}",
                f"model.n_kv_heads={nh}",f"model.d_model={h}",f"parallel.dp={g//(tp*pp)}",f"parallel.tp={tp}",f"parallel.pp={pp}",
                "parallel.zero_stage=0","parallel.micro_batch_size=1",f"training.global_batch_size={bs}",
                "training.precision=bf16","training.recompute=full"]
        published.append((f"megatron {b}B {g} GPUs tp{tp} pp{pp}", "configs/gpt2-350m.yaml", g, "a100", sets, mfu))
    # Llama 3 405B, tp 8 x pp 16, sequence parallel, no recompute; Meta's FSDP shards the
    # gradients and optimizer (ZeRO-2 here; ZeRO-3 for its sharded parameters) and its
    # first and last stages hold one layer fewer (7 + 14 x 8 + 7 = 126).
    uneven = "parallel.stage_layers=[7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7]"
    for (g, dp, pub) in [(8192, 64, 43), (16384, 128, 41)]:
        base = [f"parallel.dp={dp}", "parallel.tp=8", "parallel.pp=16", "training.global_batch_size=2048",
                "training.recompute=none", "parallel.sequence_parallel=true"]
        published.append((f"llama3 405B {g} GPUs z1 balanced", "configs/llama-405b.yaml", g, "h100", base, pub))
        for z in (2, 3):
            published.append((f"llama3 405B {g} GPUs FSDP z{z} Meta stages", "configs/llama-405b.yaml", g, "h100",
                               base + [f"parallel.zero_stage={z}", uneven], pub))
    for cfg, rc, pub in [("llama-8b", "selective", 58.2), ("llama-70b", "full", 50.5)]:
        sets = ["parallel.dp=64","parallel.tp=1","parallel.pp=1","parallel.stage_layers=[]","parallel.zero_stage=3",
                "parallel.micro_batch_size=1","training.global_batch_size=64",f"training.recompute={rc}"]
        published.append((f"torchtitan {cfg} 64 GPUs FSDP", f"configs/{cfg}.yaml", 64, "a100", sets, pub))
    # torchtitan's Llama 2 table (the same 64 A100s, FSDP): 13B and 70B, seq_len 4096,
    # vocab 32000, local batch 2 (70B selective: 1). "selective op" is Trident's selective.
    for name, shape, lbs, rc, pub in [("13B", (40, 5120, 40, 40, 13824), 2, "none", 61.1),
                                      ("13B", (40, 5120, 40, 40, 13824), 2, "selective", 53.8),
                                      ("70B", (80, 8192, 64, 8, 28672), 1, "selective", 50.8),
                                      ("70B", (80, 8192, 64, 8, 28672), 2, "full", 50.5)]:
        L, h, nh, kv, ff = shape
        sets = ["model.vocab_size=32000","model.seq_len=4096",f"model.n_layers={L}",f"model.d_model={h}",
                f"model.n_heads={nh}",f"model.n_kv_heads={kv}",f"model.d_ff={ff}","parallel.dp=64","parallel.tp=1",
                "parallel.pp=1","parallel.stage_layers=[]","parallel.zero_stage=3",f"parallel.micro_batch_size={lbs}",
                f"training.global_batch_size={64*lbs}",f"training.recompute={rc}"]
        published.append((f"torchtitan llama2-{name} lbs{lbs} {rc} 64 GPUs FSDP", "configs/llama-8b.yaml", 64, "a100",
                          sets, pub))
    errors = []
    for (label, config, g, gpu, sets, pub) in published:
        j, err = plan(config, g, gpu, sets)
        if j is None or j["configured"] is None:
            print(f"{label:44s} published {pub:5.1f}%  plan ERR ({err.strip()[:80]})"); continue
        c = j["configured"]
        e = 100 * c["mfu"] - pub
        errors.append(e)
        print(f"{label:44s} published {pub:5.1f}%  plan {100*c['mfu']:5.1f}%  error {e:+6.1f} pts ({100*e/pub:+5.0f}%)  "
              f"fits={c['fits']} {c['memory_bytes']['total']/2**30:5.1f} GiB")
    a = sorted(abs(e) for e in errors)
    print(f"{len(errors)} rows: mean error {statistics.mean(errors):+.1f} pts, mean |error| {statistics.mean(a):.1f}, "
          f"median |error| {statistics.median(a):.1f}, max |error| {a[-1]:.1f}")
