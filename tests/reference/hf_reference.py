#!/usr/bin/python3
"""Logits of a Hugging Face model directory (model.safetensors + config.json), computed
by GPT-2, Llama and Mixtral written out in Hugging Face's published architecture and
module names (transformers' modeling_gpt2.py / modeling_llama.py / modeling_mixtral.py),
sharing no code with Trident.

It checks what `trident export --format safetensors` promises: the tensor names load
strictly into HF's module tree (a tied head is absent from the file and tied to the
embedding), the shapes and conventions (GPT-2 Conv1D weights [in, out], c_attn = q|k|v,
Llama's rotate_half RoPE with q/k rows as HF orders them; Mixtral's sparse MoE block: a
softmax router, the top num_experts_per_tok experts renormalised, w2(silu(w1 x) * w3 x))
give the model's logits.

Neither `transformers` nor `safetensors` is needed: the file is parsed with json +
struct, the tensors with torch.frombuffer.

usage: hf_reference.py --model DIR --tokens FILE --batch B --out FILE [--dtype float64]
  --tokens: B*T little-endian int32 token ids; --out: B*T*vocab_size little-endian float32
  logits (computed in --dtype, default float64). Prints one summary line.
  [--targets FILE --loss-out FILE]: also the mean cross-entropy of the B*T logits against
  the B*T int32 targets, one little-endian float64 (computed in --dtype).
usage: hf_reference.py --model DIR --greedy --prompt-ids 1,2,3 --max-new-tokens N [--dtype]
  Greedy decoding, for `trident generate --temperature 0` on the exported directory: each
  step recomputes the whole prefix (no cache: this is the reference) and takes the argmax
  of the last position's logits (the lowest id among equal maxima). Prints JSON
  {"tokens": [new ids], "margins": [top-1 minus top-2 logit of each step]}.
Exit 0 on success, 1 on any error (with the message on stderr).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
from torch import nn

DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        numel = math.prod(shape)
        if end - begin != numel * size or base + end > len(data):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {entry['data_offsets']}")
        buf = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape).clone()
    return tensors


# ---- GPT-2 (modeling_gpt2.py) -------------------------------------------------------------
class Conv1D(nn.Module):
    """HF's Conv1D: weight [nx (in), nf (out)], y = x @ W + b."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_dim = cfg["n_embd"]
        self.num_heads = cfg["n_head"]
        self.head_dim = self.embed_dim // self.num_heads
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)

    def split_heads(self, x):  # [B, T, C] -> [B, NH, T, HD]
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.embed_dim, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        w = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # scale_attn_weights
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        w = w.masked_fill(~causal, torch.finfo(w.dtype).min)
        w = torch.softmax(w, dim=-1)
        out = (w @ v).permute(0, 2, 1, 3).reshape(b, t, c)
        return self.c_proj(out)


class GPT2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        inner = cfg.get("n_inner") or 4 * cfg["n_embd"]
        self.c_fc = Conv1D(inner, cfg["n_embd"])
        self.c_proj = Conv1D(cfg["n_embd"], inner)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.wpe = nn.Embedding(cfg["n_positions"], cfg["n_embd"])
        self.h = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=cfg["layer_norm_epsilon"])

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])[None, :]
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg["activation_function"] in ("gelu_new", "gelu_pytorch_tanh")
        self.transformer = GPT2Model(cfg)
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)

    def tie(self):
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


# ---- Llama (modeling_llama.py) ------------------------------------------------------------
class LlamaRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(t, dim, base, dtype):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def repeat_kv(x, n_rep):  # [B, NKV, T, HD] -> [B, NKV * n_rep, T, HD]
    b, nkv, t, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, hd).reshape(b, nkv * n_rep, t, hd)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv = cfg.get("num_key_value_heads") or self.num_heads
        self.head_dim = cfg.get("head_dim") or c // self.num_heads
        self.rope_theta = cfg.get("rope_theta", 10000.0)
        self.scaling = self.head_dim ** -0.5
        bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(c, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c, self.num_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c, self.num_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c, bias=bias)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(t, self.head_dim, self.rope_theta, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, self.num_heads // self.num_kv)
        v = repeat_kv(v, self.num_heads // self.num_kv)
        w = (q @ k.transpose(2, 3)) * self.scaling
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        w = w.masked_fill(~causal, torch.finfo(w.dtype).min)
        w = torch.softmax(w, dim=-1)
        out = (w @ v).transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(c, f, bias=False)
        self.up_proj = nn.Linear(c, f, bias=False)
        self.down_proj = nn.Linear(f, c, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = LlamaRMSNorm(cfg["hidden_size"], eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg["hidden_size"], eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = LlamaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.get("hidden_act", "silu") == "silu"
        assert cfg.get("rope_scaling") is None
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def tie(self):
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        return self.lm_head(self.model(ids))


# ---- Mixtral (modeling_mixtral.py) --------------------------------------------------------
# Llama's attention and RMSNorm; the MLP is the sparse block. HF computes the router's
# softmax in float32 (dtype=torch.float); here it runs in the reference's --dtype, so a
# float64 reference stays float64 throughout.
class MixtralBlockSparseTop2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.w1 = nn.Linear(c, f, bias=False)
        self.w2 = nn.Linear(f, c, bias=False)
        self.w3 = nn.Linear(c, f, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_experts = cfg["num_local_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.gate = nn.Linear(cfg["hidden_size"], self.num_experts, bias=False)
        self.experts = nn.ModuleList([MixtralBlockSparseTop2MLP(cfg) for _ in range(self.num_experts)])

    def forward(self, x):
        b, t, c = x.shape
        h = x.reshape(-1, c)
        routing = torch.softmax(self.gate(h), dim=1)
        # torch.topk on CPU: among equal probabilities the lowest expert index first.
        weights, selected = torch.topk(routing, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(self.num_experts):
            rows, slot = torch.where(selected == e)
            if rows.numel() == 0:
                continue
            out.index_add_(0, rows, self.experts[e](h[rows]) * weights[rows, slot, None])
        return out.reshape(b, t, c)


class MixtralDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = LlamaRMSNorm(cfg["hidden_size"], eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg["hidden_size"], eps)
        self.block_sparse_moe = MixtralSparseMoeBlock(cfg)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class MixtralModel(LlamaModel):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.layers = nn.ModuleList([MixtralDecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])


class MixtralForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.get("hidden_act", "silu") == "silu"
        assert cfg.get("rope_scaling") is None
        assert cfg.get("sliding_window") is None
        self.model = MixtralModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def tie(self):
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        return self.lm_head(self.model(ids))


ARCHITECTURES = {"gpt2": (GPT2LMHeadModel, True), "llama": (LlamaForCausalLM, False),
                 "mixtral": (MixtralForCausalLM, False)}


def load_model(model_dir, dtype):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cls, tie_default = ARCHITECTURES[cfg["model_type"]]
    expected_arch = cls.__name__
    if cfg.get("architectures") != [expected_arch]:
        raise ValueError(f"config.json architectures {cfg.get('architectures')} != [{expected_arch}]")
    model = cls(cfg)
    tied = cfg.get("tie_word_embeddings", tie_default)
    state = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if tied and "lm_head.weight" in state:
        raise ValueError("tied model: lm_head.weight must not be stored (it is the embedding)")
    state = {k: v.to(dtype) for k, v in state.items()}
    model = model.to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = ["lm_head.weight"] if tied else []
    if sorted(missing) != allowed_missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie()
    return model.eval(), cfg


def greedy(model, prompt, max_new_tokens):
    """New ids and the top-1 minus top-2 logit margin of each step."""
    ids = list(prompt)
    tokens, margins = [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids], dtype=torch.int64))[0, -1]
            top = torch.topk(logits, 2)
            best = int(torch.nonzero(logits == top.values[0])[0])  # lowest id among maxima
            tokens.append(best)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(best)
    return tokens, margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--out")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--prompt-ids", help="comma-separated token ids (--greedy)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--targets", help="B*T int32 targets: also the mean cross-entropy")
    ap.add_argument("--loss-out", help="where the mean cross-entropy goes (float64)")
    args = ap.parse_args()
    if args.greedy and not args.prompt_ids:
        ap.error("--greedy needs --prompt-ids")
    if not args.greedy and (args.tokens is None or args.batch is None or args.out is None):
        ap.error("--tokens, --batch and --out are required (or --greedy)")
    if (args.targets is None) != (args.loss_out is None):
        ap.error("--targets and --loss-out go together")
    dtype = getattr(torch, args.dtype)
    if args.greedy:
        try:
            model, _ = load_model(args.model, dtype)
            prompt = [int(t) for t in args.prompt_ids.split(",")]
            tokens, margins = greedy(model, prompt, args.max_new_tokens)
        except Exception as e:  # noqa: BLE001 - one line on stderr, exit 1
            print(f"hf_reference.py: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(json.dumps({"tokens": tokens, "margins": margins}))
        return 0
    try:
        model, cfg = load_model(args.model, dtype)
        with open(args.tokens, "rb") as f:
            raw = bytearray(f.read())
        ids = torch.frombuffer(raw, dtype=torch.int32).to(torch.int64).reshape(args.batch, -1)
        with torch.no_grad():
            logits = model(ids)
        with open(args.out, "wb") as f:
            f.write(logits.to(torch.float32).contiguous().numpy().tobytes())
        if args.targets:
            with open(args.targets, "rb") as f:
                traw = bytearray(f.read())
            targets = torch.frombuffer(traw, dtype=torch.int32).to(torch.int64).reshape(-1)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
            with open(args.loss_out, "wb") as f:
                f.write(struct.pack("<d", loss.item()))
    except Exception as e:  # noqa: BLE001 - one line on stderr, exit 1
        print(f"hf_reference.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"hf_reference: {cfg['model_type']} logits {list(logits.shape)} "
          f"max|logit| {logits.abs().max().item():.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
