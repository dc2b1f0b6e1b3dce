#!/usr/bin/python3
"""PyTorch eager baseline for bench/bench_model: the same GPT-2 presets, batch, fp32
and thread count, one training step = forward + backward + AdamW. Prints a table in the
format of bench_model: ms/step (and tokens/s, GFLOP/s from it) is the median of the timed
steps, mean_ms their mean. Run with Debian's /usr/bin/python3 (python3-torch).

    /usr/bin/python3 bench/torch_model.py [--preset small|medium|all] [--steps N] [--threads N]

With --config, the baseline of scripts/gpu_check.sh's GPU benchmark instead: the model of a
Trident config (gpt2 or llama: RMSNorm, SwiGLU, RoPE, grouped-query attention, tied or
untied head; vocabulary padded to a multiple of 128 as Trident pads it), one micro-batch of
--batch sequences of the config's seq_len per step, on --device, in --dtype (bf16 = autocast
mixed precision: fp32 weights and AdamW state, bf16 matmuls, as Trident's bf16), attention
through F.scaled_dot_product_attention (is_causal; PyTorch picks its fused kernel) where
this torch has it, fused AdamW on CUDA, global-norm clipping at 1.0. --json writes the
figures (ms/step, tokens/s, FLOPs/token by Trident's formula, MFU against --peak-tflops,
peak memory) for scripts/gpu/bench_report.py.

    python3 bench/torch_model.py --device cuda --dtype bf16 --config configs/gpt2-350m.yaml \
        --batch 16 --steps 10 --warmup 3 --json out.json
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu"))
import model_shape  # noqa: E402  (the config reader and FLOPs formula, shared)

PRESETS = {
    "small": dict(n_layers=4, n_heads=4, d_model=128, seq_len=64, micro_batch=4, vocab=256),
    "medium": dict(n_layers=6, n_heads=6, d_model=384, seq_len=256, micro_batch=4, vocab=256),
}


class Block(torch.nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = torch.nn.LayerNorm(c)
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.proj = torch.nn.Linear(c, c)
        self.ln2 = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, 4 * c)
        self.fcproj = torch.nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        hd = c // self.nh
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.nh, hd).transpose(1, 2)
        k = k.view(b, t, self.nh, hd).transpose(1, 2)
        v = v.view(b, t, self.nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        c = p["d_model"]
        self.wte = torch.nn.Embedding(p["vocab"], c)
        self.wpe = torch.nn.Embedding(p["seq_len"], c)
        self.blocks = torch.nn.ModuleList(Block(c, p["n_heads"]) for _ in range(p["n_layers"]))
        self.lnf = torch.nn.LayerNorm(c)
        t = p["seq_len"]
        self.register_buffer("mask", torch.tril(torch.ones(t, t)))
        # GPT-2 initialisation, as Trident's: N(0, 0.02) matrices and embeddings.
        for name, w in self.named_parameters():
            if w.dim() == 2:
                torch.nn.init.normal_(w, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_token(p):
    c, l, t, v = p["d_model"], p["n_layers"], p["seq_len"], p["vocab"]
    v_pad = (v + 127) // 128 * 128
    n = v_pad * c + l * (12 * c * c + 13 * c) + 2 * c  # without the position table
    return 6 * n + 12 * l * c * t


def attention(q, k, v):
    """Causal attention of (b, h, t, d) q and (b, kv, t, d) k, v (kv divides h)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        if hasattr(F, "scaled_dot_product_attention"):
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:  # torch < 2.5: no enable_gqa
                pass
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return (att.masked_fill(~mask, float("-inf")).softmax(dim=-1)) @ v


class ConfigGPT2(torch.nn.Module):
    """GPT-2 of a Trident config: pre-LN blocks, tanh GELU, tied head, learned positions."""

    def __init__(self, m):
        super().__init__()
        c, self.nh = m["d_model"], m["n_heads"]
        self.wte = torch.nn.Embedding(m["padded_vocab"], c)
        self.wpe = torch.nn.Embedding(m["seq_len"], c)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            ln1=torch.nn.LayerNorm(c), qkv=torch.nn.Linear(c, 3 * c), proj=torch.nn.Linear(c, c),
            ln2=torch.nn.LayerNorm(c), fc=torch.nn.Linear(c, m["d_ff"]),
            fcproj=torch.nn.Linear(m["d_ff"], c))) for _ in range(m["n_layers"]))
        self.lnf = torch.nn.LayerNorm(c)
        for w in self.parameters():
            if w.dim() == 2:
                torch.nn.init.normal_(w, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            c = x.shape[-1]
            q, k, v = blk["qkv"](blk["ln1"](x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
            x = x + blk["proj"](attention(q, k, v).transpose(1, 2).reshape(b, t, c))
            x = x + blk["fcproj"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh"))
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class RMSNorm(torch.nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(c))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class ConfigLlama(torch.nn.Module):
    """Llama of a Trident config: RMSNorm, RoPE, GQA, SwiGLU, no biases."""

    def __init__(self, m):
        super().__init__()
        c, hd = m["d_model"], m["head_dim"]
        self.nh, self.nkv, self.hd = m["n_heads"], m["n_kv_heads"], hd
        self.wte = torch.nn.Embedding(m["padded_vocab"], c)
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            ln1=RMSNorm(c, m["norm_eps"]), q=lin(c, self.nh * hd), k=lin(c, self.nkv * hd),
            v=lin(c, self.nkv * hd), o=lin(self.nh * hd, c), ln2=RMSNorm(c, m["norm_eps"]),
            gate=lin(c, m["d_ff"]), up=lin(c, m["d_ff"]), down=lin(m["d_ff"], c)))
            for _ in range(m["n_layers"]))
        self.lnf = RMSNorm(c, m["norm_eps"])
        self.head = None if m["tie_embeddings"] else lin(c, m["padded_vocab"])
        inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(m["seq_len"]).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for w in self.parameters():
            if w.dim() == 2:
                torch.nn.init.normal_(w, std=0.02)

    def rope(self, x):  # (b, h, t, d), rotating the halves (the Hugging Face Llama layout)
        t, half = x.shape[2], x.shape[3] // 2
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx)
        for blk in self.blocks:
            h = blk["ln1"](x)
            q = self.rope(blk["q"](h).view(b, t, self.nh, self.hd).transpose(1, 2))
            k = self.rope(blk["k"](h).view(b, t, self.nkv, self.hd).transpose(1, 2))
            v = blk["v"](h).view(b, t, self.nkv, self.hd).transpose(1, 2)
            x = x + blk["o"](attention(q, k, v).transpose(1, 2).reshape(b, t, self.nh * self.hd))
            h = blk["ln2"](x)
            x = x + blk["down"](F.silu(blk["gate"](h)) * blk["up"](h))
        h = self.lnf(x)
        logits = h @ (self.wte.weight if self.head is None else self.head.weight).t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run_config(a):
    """The GPU benchmark's baseline (see the module docstring)."""
    m = model_shape.read_model(a.config)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    build = ConfigGPT2 if m["arch"] == "gpt2" else ConfigLlama
    if hasattr(torch.device, "__enter__"):  # torch >= 2.0: build and initialise on the device
        with dev:
            model = build(m)
    else:
        model = build(m).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    expected = model_shape.parameters(m)
    if n_params != expected:
        print(f"warning: {n_params} parameters built, Trident's formula gives {expected}",
              file=sys.stderr)
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    b, t = a.batch, m["seq_len"]
    idx = torch.randint(0, m["vocab_size"], (b, t), device=dev)
    tgt = torch.randint(0, m["vocab_size"], (b, t), device=dev)
    bf16 = a.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # one host sync per step, as Trident reads its loss

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    losses = [step() for _ in range(a.warmup)]
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(a.steps):
        losses.append(step())
    sync()
    ms = (time.perf_counter() - start) * 1000 / a.steps
    tok_s = b * t / (ms / 1000)
    fpt = model_shape.flops_per_token(m)
    out = dict(impl="pytorch", torch=torch.__version__, config=a.config, arch=m["arch"],
               device=str(dev), dtype=a.dtype, params=n_params, flops_per_token=fpt, batch=b,
               seq=t, steps=a.steps, warmup=a.warmup, ms_per_step=ms, tokens_per_s=tok_s,
               mfu=fpt * tok_s / (a.peak_tflops * 1e12), loss_first=losses[0],
               loss_last=losses[-1],
               sdpa=hasattr(F, "scaled_dot_product_attention"))
    if dev.type == "cuda":
        out.update(peak_mem_allocated=torch.cuda.max_memory_allocated(),
                   peak_mem_reserved=torch.cuda.max_memory_reserved(),
                   gpu=torch.cuda.get_device_name(0))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    print(f"# pytorch {torch.__version__} eager, {a.dtype}, {dev}, {m['arch']} "
          f"{n_params / 1e6:.1f}M params, {b} x {t} tokens per step")
    print(f"  ms/step {ms:.2f}  tokens/s {tok_s:.0f}  MFU {out['mfu']:.1%} of "
          f"{a.peak_tflops:g} TF/s  loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="all")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--config", help="a Trident config: benchmark its model (see above)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.config:
        return run_config(a)
    torch.manual_seed(0)
    print(f"# pytorch {torch.__version__} eager training step (fwd + bwd + AdamW), fp32, "
          f"{torch.get_num_threads()} threads")
    print(f"# {'preset':<8} {'tokens':>8} {'ms/step':>10} {'mean_ms':>10} {'tokens/s':>12} "
          f"{'GFLOP/s':>10} {'loss0':>10}")
    for name, p in PRESETS.items():
        if a.preset not in ("all", name):
            continue
        model = GPT2(p)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
        b, t = p["micro_batch"], p["seq_len"]
        idx = torch.randint(0, p["vocab"], (b, t))
        tgt = torch.randint(0, p["vocab"], (b, t))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss.item()

        loss0 = step()
        step()
        times = []
        for _ in range(a.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        ms, mean_ms = statistics.median(times) * 1000, statistics.fmean(times) * 1000
        tok_s = b * t / (ms / 1000)
        print(f"  {name:<8} {b * t:>8} {ms:>10.2f} {mean_ms:>10.2f} {tok_s:>12.0f} "
              f"{flops_per_token(p) * tok_s / 1e9:>10.1f} {loss0:>10.4f}")


if __name__ == "__main__":
    sys.exit(main())
