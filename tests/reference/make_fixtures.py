#!/usr/bin/python3
"""Independent PyTorch (float64) reference for Trident's two model families.

Writes, next to this script, in fixtures/:
  gpt2.bin, llama.bin   TRFX fixtures (format below): config, every parameter (Trident's
                        names, model/transformer.h), one batch with its logits, mean loss
                        and every parameter's gradient, and a 5-step AdamW run.
  gpt2_llmc.bin         the same gpt2 weights as an llm.c GPT-2 checkpoint (version 3,
                        fp32), for model/llmc_checkpoint.h.

The model is written out op by op from the formulas of kernels/ops.h (no torch.nn
modules, no fused attention), so that it shares nothing with the C++ code but the spec.

TRFX format (little-endian):
  magic   4 bytes "TRFX"
  version uint32 (1)
  count   uint32 number of entries
  entry:  uint32 name_len, name bytes (utf-8),
          uint8 dtype (0 = float64, 1 = int32, 2 = utf-8 text bytes),
          uint8 ndim, int64 dims[ndim], then prod(dims) elements (row-major).
Entry names:
  config.<key>          scalars: int32 arch-independent ints, float64 eps/theta
  meta.<key>            text notes (family, weight init, clip and AdamW formulas,
                        zero_grad_params: comma-separated names whose exact gradient is 0)
  param.<name>          initial parameters
  grad.<name>           d mean_loss / d param for tokens/targets
  tokens, targets       int32 [B, T]
  logits                float64 [B, T, Vp] (padded columns included; they are 0)
  loss                  float64 scalar
  adamw.<hyper>         float64 scalars: lr, beta1, beta2, eps, weight_decay, grad_clip;
                        int32 adamw.steps
  step<k>.tokens/targets  int32 [B, T], the batch of optimizer step k (1-based)
  step<k>.loss          loss of step k's batch BEFORE step k's update
  step<k>.grad_norm     global gradient norm before clipping at step k
  final.<name>          parameters after all steps

Run:  /usr/bin/python3 tests/reference/make_fixtures.py [--check-f32]
--check-f32 reruns everything in float32 and prints how far a correct float32
implementation lands from the float64 fixture (it guides the C++ test tolerances).
"""

import math
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

B, T = 2, 16
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
STEPS = 5
CLIP_FORMULA = ("norm = sqrt(sum over all parameters of sum(grad^2)); "
                "if grad_clip > 0 and norm > grad_clip: grad *= grad_clip / norm "
                "(no 1e-6 term, unlike torch.nn.utils.clip_grad_norm_)")
ADAMW_FORMULA = ("m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; mhat = m/(1-b1^k); "
                 "vhat = v/(1-b2^k); p -= lr*(mhat/(sqrt(vhat)+eps) + wd*p), "
                 "wd = weight_decay for 2-D parameters, 0 otherwise")

GPT2 = dict(arch="gpt2", vocab_size=64, padded_vocab=128, seq_len=16, n_layers=2,
            n_heads=4, n_kv_heads=4, d_model=32, d_ff=128, norm_eps=1e-5,
            rope_theta=10000.0, tied=1, seed=1001)
LLAMA = dict(arch="llama", vocab_size=64, padded_vocab=128, seq_len=16, n_layers=2,
             n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, norm_eps=1e-5,
             rope_theta=10000.0, tied=0, seed=2002)

WEIGHT_INIT = ("embeddings (wte, wpe, lm_head) N(0, 0.1); linear weights N(0, 0.05); "
               "biases N(0, 0.02); norm weights 1 + N(0, 0.1); norm biases N(0, 0.05); "
               "padded vocabulary rows 0")


# ---- parameters ---------------------------------------------------------------------

def param_shapes(cfg):
    """Trident's parameter table (model/transformer.h), in order."""
    V_p, C, F, L = cfg["padded_vocab"], cfg["d_model"], cfg["d_ff"], cfg["n_layers"]
    HD = C // cfg["n_heads"]
    q_out, kv_out = cfg["n_heads"] * HD, cfg["n_kv_heads"] * HD
    gpt2 = cfg["arch"] == "gpt2"
    shapes = [("wte", (V_p, C))]
    if gpt2:
        shapes.append(("wpe", (cfg["seq_len"], C)))
    for i in range(L):
        p = f"layers.{i}."
        shapes.append((p + "ln1.weight", (C,)))
        if gpt2:
            shapes.append((p + "ln1.bias", (C,)))
        for name, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            shapes.append((p + f"attn.{name}.weight", (out, C)))
            if gpt2:
                shapes.append((p + f"attn.{name}.bias", (out,)))
        shapes.append((p + "attn.o.weight", (C, q_out)))
        if gpt2:
            shapes.append((p + "attn.o.bias", (C,)))
        shapes.append((p + "ln2.weight", (C,)))
        if gpt2:
            shapes.append((p + "ln2.bias", (C,)))
            shapes += [(p + "mlp.fc.weight", (F, C)), (p + "mlp.fc.bias", (F,)),
                       (p + "mlp.proj.weight", (C, F)), (p + "mlp.proj.bias", (C,))]
        else:
            shapes += [(p + "mlp.gate.weight", (F, C)), (p + "mlp.up.weight", (F, C)),
                       (p + "mlp.down.weight", (C, F))]
    shapes.append(("lnf.weight", (C,)))
    if gpt2:
        shapes.append(("lnf.bias", (C,)))
    if not cfg["tied"]:
        shapes.append(("lm_head.weight", (V_p, C)))
    return shapes


def init_params(cfg):
    gen = torch.Generator().manual_seed(cfg["seed"])
    params = {}
    for name, shape in param_shapes(cfg):
        def randn(std):
            return torch.randn(shape, generator=gen, dtype=torch.float64) * std
        parts = name.split(".")
        is_norm = len(parts) >= 2 and parts[-2] in ("ln1", "ln2", "lnf")
        if name in ("wte", "wpe", "lm_head.weight"):
            t = randn(0.1)
            if name != "wpe":
                t[cfg["vocab_size"]:] = 0.0  # padded vocabulary rows
        elif is_norm and parts[-1] == "weight":
            t = 1.0 + randn(0.1)
        elif is_norm:
            t = randn(0.05)
        elif parts[-1] == "bias":
            t = randn(0.02)
        else:
            t = randn(0.05)
        params[name] = t
    return params


# ---- the model, from the formulas of kernels/ops.h ----------------------------------

def layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, w, b=None):
    y = x @ w.t()
    return y if b is None else y + b


def rope(x, theta):
    # x [B, T, H, HD]; "rotate half": (x[i], x[i + HD/2]) rotated by pos * theta^(-2i/HD).
    _, t_len, _, hd = x.shape
    half = hd // 2
    i = torch.arange(half, dtype=x.dtype)
    inv_freq = theta ** (-2.0 * i / hd)
    ang = torch.arange(t_len, dtype=x.dtype)[:, None] * inv_freq[None, :]  # [T, HD/2]
    cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, n_heads, n_kv):
    # q [B, T, NH, HD], k/v [B, T, NKV, HD] -> [B, T, NH*HD]; head h reads kv h // (NH/NKV).
    b, t_len, _, hd = q.shape
    group = n_heads // n_kv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    q, k, v = (z.permute(0, 2, 1, 3) for z in (q, k, v))  # [B, NH, T, HD]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(t_len, t_len, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    out = att @ v  # [B, NH, T, HD]
    return out.permute(0, 2, 1, 3).reshape(b, t_len, n_heads * hd)


def dense_mlp(cfg, P, p, h):
    """Layer p's MLP: GPT-2's GELU fc/proj or Llama's SwiGLU gate/up/down, named `prefix`."""
    return family_mlp(cfg, P, p + "mlp.", h)


def family_mlp(cfg, P, prefix, h):
    if cfg["arch"] == "gpt2":
        return linear(gelu_tanh(linear(h, P[prefix + "fc.weight"], P[prefix + "fc.bias"])),
                      P[prefix + "proj.weight"], P[prefix + "proj.bias"])
    gate = linear(h, P[prefix + "gate.weight"])
    up = linear(h, P[prefix + "up.weight"])
    return linear(gate * torch.sigmoid(gate) * up, P[prefix + "down.weight"])


def forward(cfg, P, tokens, targets, mlp=dense_mlp):
    """Returns (logits [B, T, Vp], mean loss). `mlp(cfg, P, layer prefix, h)`: each layer's
    MLP on its normed input (the mixture-of-experts reference passes its own)."""
    gpt2 = cfg["arch"] == "gpt2"
    b, t_len = tokens.shape
    C, NH, NKV = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    HD, eps = C // NH, cfg["norm_eps"]
    x = P["wte"][tokens.long()]
    if gpt2:
        x = x + P["wpe"][:t_len]
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        g = (lambda n: P.get(p + n)) if gpt2 else (lambda n: None)
        h = (layernorm(x, P[p + "ln1.weight"], P[p + "ln1.bias"], eps) if gpt2
             else rmsnorm(x, P[p + "ln1.weight"], eps))
        q = linear(h, P[p + "attn.q.weight"], g("attn.q.bias")).view(b, t_len, NH, HD)
        k = linear(h, P[p + "attn.k.weight"], g("attn.k.bias")).view(b, t_len, NKV, HD)
        v = linear(h, P[p + "attn.v.weight"], g("attn.v.bias")).view(b, t_len, NKV, HD)
        if not gpt2:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        x = x + linear(attention(q, k, v, NH, NKV), P[p + "attn.o.weight"], g("attn.o.bias"))
        h = (layernorm(x, P[p + "ln2.weight"], P[p + "ln2.bias"], eps) if gpt2
             else rmsnorm(x, P[p + "ln2.weight"], eps))
        x = x + mlp(cfg, P, p, h)
    x = (layernorm(x, P["lnf.weight"], P["lnf.bias"], eps) if gpt2
         else rmsnorm(x, P["lnf.weight"], eps))
    head = P["wte"] if cfg["tied"] else P["lm_head.weight"]
    logits = x @ head.t()  # all Vp rows; the padded ones are 0
    V = cfg["vocab_size"]
    logp = torch.log_softmax(logits[..., :V], dim=-1)
    loss = -logp.gather(-1, targets.long()[..., None]).mean()
    return logits, loss


def loss_and_grads(cfg, P, tokens, targets):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in P.items()}
    logits, loss = forward(cfg, leaves, tokens, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {n: t.grad.detach() for n, t in leaves.items()}


def random_batch(cfg, gen):
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int32)
    return tokens, targets


def adamw_run(cfg, P, batches):
    """STEPS of AdamW with global-norm clipping, written out (see ADAMW_FORMULA)."""
    a = ADAMW
    P = {n: t.clone() for n, t in P.items()}
    m = {n: torch.zeros_like(t) for n, t in P.items()}
    v = {n: torch.zeros_like(t) for n, t in P.items()}
    losses, norms = [], []
    for k, (tokens, targets) in enumerate(batches, start=1):
        _, loss, grads = loss_and_grads(cfg, P, tokens, targets)
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        losses.append(float(loss))
        norms.append(norm)
        if a["grad_clip"] > 0 and norm > a["grad_clip"]:
            grads = {n: g * (a["grad_clip"] / norm) for n, g in grads.items()}
        for n in P:
            g = grads[n]
            wd = a["weight_decay"] if P[n].dim() == 2 else 0.0
            m[n] = a["beta1"] * m[n] + (1 - a["beta1"]) * g
            v[n] = a["beta2"] * v[n] + (1 - a["beta2"]) * g * g
            mhat = m[n] / (1 - a["beta1"] ** k)
            vhat = v[n] / (1 - a["beta2"] ** k)
            P[n] = P[n] - a["lr"] * (mhat / (torch.sqrt(vhat) + a["eps"]) + wd * P[n])
    return P, losses, norms


def torch_adamw_run(cfg, P, batches):
    """The same run through torch.optim.AdamW: a cross-check of adamw_run."""
    a = ADAMW
    leaves = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    decay = [t for t in leaves.values() if t.dim() == 2]
    no_decay = [t for t in leaves.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    for tokens, targets in batches:
        opt.zero_grad()
        _, loss = forward(cfg, leaves, tokens, targets)
        loss.backward()
        with torch.no_grad():
            norm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in leaves.values()))
            if norm > a["grad_clip"]:
                for t in leaves.values():
                    t.grad *= a["grad_clip"] / norm
        opt.step()
    return {n: t.detach() for n, t in leaves.items()}


def build(cfg, dtype=torch.float64):
    P = {n: t.to(dtype) for n, t in init_params(cfg).items()}
    gen = torch.Generator().manual_seed(cfg["seed"] + 7)
    tokens, targets = random_batch(cfg, gen)
    logits, loss, grads = loss_and_grads(cfg, P, tokens, targets)
    batches = [random_batch(cfg, gen) for _ in range(STEPS)]
    final, losses, norms = adamw_run(cfg, P, batches)
    return dict(P=P, tokens=tokens, targets=targets, logits=logits, loss=loss, grads=grads,
                batches=batches, final=final, losses=losses, norms=norms)


# ---- writers ------------------------------------------------------------------------

class Writer:
    def __init__(self):
        self.entries = []

    def _add(self, name, dtype_code, dims, payload):
        self.entries.append((name, dtype_code, tuple(int(d) for d in dims), payload))

    def f64(self, name, t):
        t = torch.as_tensor(t, dtype=torch.float64).contiguous()
        self._add(name, 0, t.shape, t.numpy().astype("<f8").tobytes())

    def i32(self, name, t):
        t = torch.as_tensor(t, dtype=torch.int32).contiguous()
        self._add(name, 1, t.shape, t.numpy().astype("<i4").tobytes())

    def text(self, name, s):
        data = s.encode("utf-8")
        self._add(name, 2, (len(data),), data)

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"TRFX" + struct.pack("<II", 1, len(self.entries)))
            for name, code, dims, payload in self.entries:
                nb = name.encode("utf-8")
                f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<BB", code, len(dims)))
                f.write(struct.pack(f"<{len(dims)}q", *dims))
                f.write(payload)


def write_fixture(cfg, r, path):
    w = Writer()
    for key in ("vocab_size", "padded_vocab", "seq_len", "n_layers", "n_heads", "n_kv_heads",
                "d_model", "d_ff", "tied"):
        w.i32("config." + key, cfg[key])
    w.i32("config.batch", B)
    w.i32("config.seq", T)
    w.f64("config.norm_eps", cfg["norm_eps"])
    w.f64("config.rope_theta", cfg["rope_theta"])
    w.text("meta.arch", cfg["arch"])
    w.text("meta.weight_init", WEIGHT_INIT)
    w.text("meta.clip_formula", CLIP_FORMULA)
    w.text("meta.adamw_formula", ADAMW_FORMULA)
    w.text("meta.generator", "tests/reference/make_fixtures.py, torch " + torch.__version__
           + ", float64")
    # Parameters whose exact gradient is 0 (gpt2 attn.k.bias: softmax ignores the
    # per-query constant q.b_k). A float32 implementation returns rounding noise there,
    # which AdamW's normalisation turns into O(lr) updates, so tests must treat them apart.
    gnorm = math.sqrt(sum(float((g ** 2).sum()) for g in r["grads"].values()))
    zero = [n for n, _ in param_shapes(cfg) if float(r["grads"][n].norm()) < 1e-12 * gnorm]
    w.text("meta.zero_grad_params", ",".join(zero))
    for name, _ in param_shapes(cfg):
        w.f64("param." + name, r["P"][name])
    w.i32("tokens", r["tokens"])
    w.i32("targets", r["targets"])
    w.f64("logits", r["logits"])
    w.f64("loss", r["loss"])
    for name, _ in param_shapes(cfg):
        w.f64("grad." + name, r["grads"][name])
    for key, val in ADAMW.items():
        w.f64("adamw." + key, val)
    w.i32("adamw.steps", STEPS)
    for k, (tokens, targets) in enumerate(r["batches"], start=1):
        w.i32(f"step{k}.tokens", tokens)
        w.i32(f"step{k}.targets", targets)
        w.f64(f"step{k}.loss", r["losses"][k - 1])
        w.f64(f"step{k}.grad_norm", r["norms"][k - 1])
    for name, _ in param_shapes(cfg):
        w.f64("final." + name, r["final"][name])
    w.save(path)


def write_llmc(cfg, P, path):
    """llm.c GPT-2 checkpoint, version 3 (fp32): header int32[256], then the tensors."""
    C, L = cfg["d_model"], cfg["n_layers"]
    header = [0] * 256
    header[0:8] = [20240326, 3, cfg["seq_len"], cfg["vocab_size"], L, cfg["n_heads"], C,
                   cfg["padded_vocab"]]

    def stack(fn):
        return torch.stack([fn(f"layers.{i}.") for i in range(L)])

    tensors = [
        P["wte"], P["wpe"],
        stack(lambda p: P[p + "ln1.weight"]), stack(lambda p: P[p + "ln1.bias"]),
        stack(lambda p: torch.cat([P[p + f"attn.{n}.weight"] for n in "qkv"], 0)),
        stack(lambda p: torch.cat([P[p + f"attn.{n}.bias"] for n in "qkv"], 0)),
        stack(lambda p: P[p + "attn.o.weight"]), stack(lambda p: P[p + "attn.o.bias"]),
        stack(lambda p: P[p + "ln2.weight"]), stack(lambda p: P[p + "ln2.bias"]),
        stack(lambda p: P[p + "mlp.fc.weight"]), stack(lambda p: P[p + "mlp.fc.bias"]),
        stack(lambda p: P[p + "mlp.proj.weight"]), stack(lambda p: P[p + "mlp.proj.bias"]),
        P["lnf.weight"], P["lnf.bias"],
    ]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for t in tensors:
            f.write(t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes())


# ---- self-checks --------------------------------------------------------------------

def rel(a, b):
    d = float((a.double() - b.double()).norm())
    n = float(b.double().norm())
    return d / n if n > 0 else d


def self_check(cfg, r):
    # The written-out AdamW agrees with torch.optim.AdamW.
    ref = torch_adamw_run(cfg, r["P"], r["batches"])
    worst = max(rel(r["final"][n], ref[n]) for n in ref)
    assert worst < 1e-10, f"{cfg['arch']}: adamw_run vs torch.optim.AdamW: {worst}"
    # Autograd gradient agrees with a central difference on a few elements.
    gen = torch.Generator().manual_seed(5)
    for name in list(r["P"])[::7]:
        t = r["P"][name]
        idx = int(torch.randint(0, t.numel(), (1,), generator=gen))
        h = 1e-6
        plus, minus = dict(r["P"]), dict(r["P"])
        plus[name] = t.clone().view(-1)
        plus[name][idx] += h
        plus[name] = plus[name].view(t.shape)
        minus[name] = t.clone().view(-1)
        minus[name][idx] -= h
        minus[name] = minus[name].view(t.shape)
        fd = (float(forward(cfg, plus, r["tokens"], r["targets"])[1])
              - float(forward(cfg, minus, r["tokens"], r["targets"])[1])) / (2 * h)
        g = float(r["grads"][name].view(-1)[idx])
        assert abs(fd - g) < 1e-7 + 1e-5 * abs(g), f"{name}[{idx}]: fd {fd} vs autograd {g}"
    # Padded logit columns are exactly 0.
    assert float(r["logits"][..., cfg["vocab_size"]:].abs().max()) == 0.0


def check_f32(cfg, r64):
    """How close a float32 computation lands: guidance for the C++ tolerances."""
    r32 = build(cfg, torch.float32)
    print(f"[{cfg['arch']}] float32 vs float64:")
    lg = float((r32["logits"].double() - r64["logits"]).abs().max()
               / r64["logits"].abs().max())
    print(f"  logits max|d|/max|ref| {lg:.2e}   loss rel "
          f"{abs(float(r32['loss']) - float(r64['loss'])) / float(r64['loss']):.2e}")
    gnorm = math.sqrt(sum(float((g ** 2).sum()) for g in r64["grads"].values()))
    for n in r64["grads"]:
        g64 = r64["grads"][n]
        note = "" if float(g64.norm()) > 1e-9 * gnorm else "  (structurally ~0)"
        e = rel(r32["grads"][n], g64)
        if e > 1e-6 or note:
            print(f"  grad {n:28s} rel {e:.2e} |g|={float(g64.norm()):.2e}{note}")
    print("  step losses rel", ["%.1e" % (abs(a - b) / b) for a, b in
                                zip(r32["losses"], r64["losses"])])
    for n in r64["final"]:
        e = rel(r32["final"][n], r64["final"][n])
        if e > 1e-6:
            print(f"  final {n:28s} rel {e:.2e}")


def main():
    os.makedirs(OUT, exist_ok=True)
    for cfg in (GPT2, LLAMA):
        r = build(cfg)
        self_check(cfg, r)
        path = os.path.join(OUT, cfg["arch"] + ".bin")
        write_fixture(cfg, r, path)
        print(f"{path}: loss {float(r['loss']):.6f}, step losses "
              + " ".join("%.6f" % x for x in r["losses"]) + f", {os.path.getsize(path)} bytes")
        if cfg["arch"] == "gpt2":
            llmc = os.path.join(OUT, "gpt2_llmc.bin")
            write_llmc(cfg, r["P"], llmc)
            print(f"{llmc}: {os.path.getsize(llmc)} bytes")
        if "--check-f32" in sys.argv:
            check_f32(cfg, r)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
