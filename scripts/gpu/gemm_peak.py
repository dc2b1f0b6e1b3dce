#!/usr/bin/env python3
"""The GEMM rate PyTorch reaches on this machine, the second peak the GPU check divides
by for MFU (the first is the datasheet's): C = A @ B with square N x N matrices, after
warm-up, timed over --iters products (CUDA events on a GPU, the wall clock on a CPU).

    gemm_peak.py --device cuda --dtype bf16 --n 8192 --iters 20 --json OUT
    gemm_peak.py --device cpu --dtype fp32 --n 256 --iters 3     (the dry run)

Prints one line, "gemm N^3 DTYPE on DEVICE: X TFLOP/s (MS ms per product, ...)", and with
--json writes {"tflops", "ms", "n", "dtype", "device", "name", "torch"}.
"""
import argparse
import json
import sys
import time


def measure(device, dtype_name, n, iters, warmup):
    import torch
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    dev = torch.device(device)
    torch.manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(warmup):
        c = a @ b
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            c = a @ b
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
        name = torch.cuda.get_device_name(0)
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            c = a @ b
        ms = (time.perf_counter() - t0) * 1000 / iters
        name = "cpu"
    del c
    return {"tflops": 2.0 * n**3 / (ms / 1000) / 1e12, "ms": ms, "n": n, "dtype": dtype_name,
            "device": str(dev), "name": name, "torch": torch.__version__}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    if a.n < 1 or a.iters < 1 or a.warmup < 0:
        print("gemm_peak: --n and --iters must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    r = measure(a.device, a.dtype, a.n, a.iters, a.warmup)
    print(f"gemm {a.n}^3 {a.dtype} on {r['name']}: {r['tflops']:.4g} TFLOP/s "
          f"({r['ms']:.3f} ms per product, torch {r['torch']})")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
