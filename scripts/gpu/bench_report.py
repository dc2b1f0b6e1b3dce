#!/usr/bin/env python3
"""One row of scripts/gpu_check.sh's benchmark table (markdown), from a Trident run's
metrics JSONL or bench/torch_model.py's --json output, plus an nvidia-smi memory trace.

    bench_report.py trident --name gpt2-124m --config C.yaml --batch 16 --metrics M.jsonl
                            --skip 3 --mem MEM.txt --rc 0 [--label "trident cudnn"]
                            [--gemm-peak 790] [--status "SKIPPED: why"]
    bench_report.py torch --name gpt2-124m --config C.yaml --batch 16 --json T.json
                          --mem MEM.txt --rc 0 [--gemm-peak 790]
    bench_report.py --self-test
    bench_report.py --header                 the table's two header lines

Both rows use the same FLOPs per token (model_shape.py: Trident's 6·N + 12·L·C·T) and the
same peaks: 989 TFLOP/s (H100/H200 SXM dense bf16, the datasheet) for the first MFU
column, and --gemm-peak (TFLOP/s of a large bf16 GEMM measured by gemm_peak.py in the same
call; "-" without it) for the second; "own MFU" is the figure the program reported itself
(Trident against its peak table). Timed steps: Trident's
steps after the first --skip, tokens/s = their tokens / their summed step_ms; PyTorch's are
timed by torch_model.py after its warm-up. Peak GPU memory: the largest nvidia-smi
memory.used sample during the run (the same measure for both), and torch's own
max_memory_reserved in brackets.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_shape  # noqa: E402

PEAK = 989e12


def mem_peak(path):
    try:
        with open(path, encoding="utf-8") as f:
            values = [int(v) for v in f.read().split() if v.strip().isdigit()]
    except OSError:
        return None
    return max(values) if values else None


def fmt_mem(mib, extra=None):
    text = "?" if mib is None else f"{mib / 1024:.1f} GiB"
    if extra:
        text += f" ({extra / 2**30:.1f} GiB reserved)"
    return text


HEADER = ("| model | impl | B x T | ms/step | tokens/s | MFU (989 TF/s) | MFU (measured GEMM "
          "peak) | own MFU | peak GPU mem | loss first -> last | status |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def row(a, impl, b, t, ms, tok_s, flops, own_mfu, mem, loss0, loss1, status):
    def num(v, f):
        return "-" if v is None else f.format(v)
    mfu = None if tok_s is None else flops * tok_s / PEAK
    gemm = None
    if tok_s is not None and getattr(a, "gemm_peak", None):
        gemm = flops * tok_s / (a.gemm_peak * 1e12)
    return (f"| {a.name} | {impl} | {b} x {t} | {num(ms, '{:.1f}')} | {num(tok_s, '{:,.0f}')} | "
            f"{num(mfu, '{:.1%}')} | {num(gemm, '{:.1%}')} | {num(own_mfu, '{:.1%}')} | {mem} | "
            f"{num(loss0, '{:.3f}')} -> {num(loss1, '{:.3f}')} | {status} |")


def trident_row(a, shape):
    steps = {}
    try:
        with open(a.metrics, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict) and "step" in r and "step_ms" in r:
                    steps[r["step"]] = r
    except OSError:
        pass
    timed = [steps[s] for s in sorted(steps) if s > a.skip]
    status = "PASS" if a.rc == 0 and timed else f"FAIL (exit {a.rc}, {len(timed)} timed steps)"
    status = getattr(a, "status", None) or status
    label = getattr(a, "label", None) or "trident"
    flops = model_shape.flops_per_token(shape)
    if not timed:
        return row(a, label, a.batch, shape["seq_len"], None, None, flops, None,
                   fmt_mem(mem_peak(a.mem)), None, None, status)
    ms = sum(r["step_ms"] for r in timed) / len(timed)
    tok_s = a.batch * shape["seq_len"] / (ms / 1000)
    first = steps[min(steps)]["loss"]
    return row(a, label, a.batch, shape["seq_len"], ms, tok_s, flops,
               sum(r.get("mfu", 0) for r in timed) / len(timed), fmt_mem(mem_peak(a.mem)),
               first, timed[-1]["loss"], status)


def torch_row(a, shape):
    try:
        with open(a.json, encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, json.JSONDecodeError):
        r = None
    flops = model_shape.flops_per_token(shape)
    if not r:
        return row(a, "pytorch", a.batch, shape["seq_len"], None, None, flops, None,
                   fmt_mem(mem_peak(a.mem)), None, None, f"FAIL (exit {a.rc}, no result)")
    return row(a, f"pytorch {r.get('torch', '')} eager", r["batch"], r["seq"],
               r["ms_per_step"], r["tokens_per_s"], flops, None,
               fmt_mem(mem_peak(a.mem), r.get("peak_mem_reserved")), r["loss_first"],
               r["loss_last"], "PASS" if a.rc == 0 else f"FAIL (exit {a.rc})")


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = os.path.join(here, "..", "..", "configs", "gpt2-124m.yaml")
    with tempfile.TemporaryDirectory() as d:
        metrics, mem, tj = (os.path.join(d, n) for n in ("m.jsonl", "mem.txt", "t.json"))
        with open(metrics, "w") as f:
            f.write('{"segment":{}}\n')
            for s in range(1, 6):
                f.write(json.dumps({"step": s, "loss": 11.0 - s, "step_ms": 100.0,
                                    "tokens_per_s": 0, "mfu": 0.5}) + "\n")
        with open(mem, "w") as f:
            f.write("100\n20480\n300\n")
        with open(tj, "w") as f:
            json.dump({"torch": "x", "batch": 16, "seq": 1024, "ms_per_step": 200.0,
                       "tokens_per_s": 81920.0, "loss_first": 11.0, "loss_last": 9.0,
                       "peak_mem_reserved": 2**31}, f)
        t = trident_row(argparse.Namespace(metrics=metrics, mem=mem, skip=3, rc=0, name="m",
                                           batch=16, label="trident cudnn", gemm_peak=700.0),
                        model_shape.read_model(cfg))
        p = torch_row(argparse.Namespace(json=tj, mem=mem, rc=0, name="m", batch=16,
                                         gemm_peak=None), model_shape.read_model(cfg))
        f = trident_row(argparse.Namespace(metrics=mem, mem=mem, skip=3, rc=139, name="m",
                                           batch=16, label=None, gemm_peak=700.0),
                        model_shape.read_model(cfg))
    # 16 x 1024 tokens in 100 ms = 163,840 tok/s; x 855,383,040 FLOP / 989e12 = 14.2%,
    # / 700e12 = 20.0%
    expect_t = "| m | trident cudnn | 16 x 1024 | 100.0 | 163,840 | 14.2% | 20.0% | 50.0% | 20.0 GiB | 10.000 -> 6.000 | PASS |"
    expect_p = "| m | pytorch x eager | 16 x 1024 | 200.0 | 81,920 | 7.1% | - | - | 20.0 GiB (2.0 GiB reserved) | 11.000 -> 9.000 | PASS |"
    expect_f = "| m | trident | 16 x 1024 | - | - | - | - | - | 20.0 GiB | - -> - | FAIL (exit 139, 0 timed steps) |"
    ok = t == expect_t and p == expect_p and f == expect_f
    print(t)
    print(p)
    print(f)
    print("self-test " + ("PASS" if ok else f"FAIL: expected\n{expect_t}\n{expect_p}\n{expect_f}"))
    return 0 if ok else 1


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if argv == ["--header"]:
        print(HEADER)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("impl", choices=["trident", "torch"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--metrics")
    ap.add_argument("--json")
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--mem", default="")
    ap.add_argument("--rc", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--gemm-peak", type=float, default=0.0)
    ap.add_argument("--status", default="", help="the row's status instead of PASS/FAIL "
                    "(a run that was skipped or not run)")
    a = ap.parse_args(argv)
    shape = model_shape.read_model(a.config)
    print(trident_row(a, shape) if a.impl == "trident" else torch_row(a, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
