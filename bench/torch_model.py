#!/usr/bin/python3
"""PyTorch eager baseline for bench/bench_model: the same GPT-2 presets, batch, fp32
and thread count, one training step = forward + backward + AdamW. Prints a table in the
format of bench_model. Run with Debian's /usr/bin/python3 (python3-torch).

    /usr/bin/python3 bench/torch_model.py [--preset small|medium|all] [--steps N] [--threads N]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="all")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"# pytorch {torch.__version__} eager training step (fwd + bwd + AdamW), fp32, "
          f"{torch.get_num_threads()} threads")
    print(f"# {'preset':<8} {'tokens':>8} {'ms/step':>10} {'tokens/s':>12} {'GFLOP/s':>10} {'loss0':>10}")
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
        start = time.perf_counter()
        for _ in range(a.steps):
            step()
        ms = (time.perf_counter() - start) * 1000 / a.steps
        tok_s = b * t / (ms / 1000)
        print(f"  {name:<8} {b * t:>8} {ms:>10.2f} {tok_s:>12.0f} "
              f"{flops_per_token(p) * tok_s / 1e9:>10.1f} {loss0:>10.4f}")


if __name__ == "__main__":
    main()
