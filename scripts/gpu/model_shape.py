"""The model shape of a Trident config file and its FLOPs per token, without PyYAML or
torch (scripts/gpu/bench_report.py and bench/torch_model.py share it).

read_model(path) reads the `model:` section of a config (flat `key: value` lines, as every
file in configs/ writes it) and applies the family defaults of docs/CONFIG.md: n_kv_heads
= n_heads, d_ff = 4·C (gpt2) or 8·C/3 rounded up to 64 (llama), tie_embeddings auto =
gpt2 tied / llama untied, the vocabulary padded to a multiple of 128.
parameters(shape) and flops_per_token(shape) are model/model_config.cpp's model_parameters and
TransformerConfig::flops_per_token: 6·N + 12·L·C·T with N the parameters without the
gpt2 position table.
"""


def _scalar(text):
    text = text.split("#", 1)[0].strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def read_model(path, overrides=None):
    model, section = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            stripped = line.split("#", 1)[0].rstrip()
            if not stripped.strip():
                continue
            if not line[0].isspace():
                section = stripped.rstrip(":").strip()
                continue
            if section == "model" and ":" in stripped:
                key, value = stripped.split(":", 1)
                model[key.strip()] = _scalar(value)
    model.update(overrides or {})
    for key in ("arch", "vocab_size", "seq_len", "n_layers", "n_heads", "d_model"):
        if key not in model:
            raise ValueError(f"{path}: model.{key} missing")
    c = model["d_model"]
    gpt2 = model["arch"] == "gpt2"
    model.setdefault("n_kv_heads", model["n_heads"])
    if not model.get("n_kv_heads"):
        model["n_kv_heads"] = model["n_heads"]
    if not model.get("d_ff"):
        model["d_ff"] = 4 * c if gpt2 else (8 * c // 3 + 63) // 64 * 64
    tie = model.get("tie_embeddings", "auto")
    if tie in ("auto", -1, "-1"):
        tie = gpt2
    model["tie_embeddings"] = bool(tie)
    model["padded_vocab"] = (model["vocab_size"] + 127) // 128 * 128
    model["head_dim"] = c // model["n_heads"]
    model.setdefault("rope_theta", 10000.0)
    model.setdefault("norm_eps", 1e-5)
    return model


def parameters(m, with_position_table=True):
    c, f, vp = m["d_model"], m["d_ff"], m["padded_vocab"]
    q = m["n_heads"] * m["head_dim"]
    kv = m["n_kv_heads"] * m["head_dim"]
    gpt2 = m["arch"] == "gpt2"
    layer = c * (2 if gpt2 else 1) + 2 * q * c + 2 * kv * c
    if gpt2:
        layer += q + 2 * kv + c
    layer += c * (2 if gpt2 else 1)
    layer += (2 * f * c + f + c) if gpt2 else 3 * f * c
    total = vp * c + m["n_layers"] * layer + c * (2 if gpt2 else 1)
    if gpt2 and with_position_table:
        total += m["seq_len"] * c  # max_seq_len = seq_len for a config without init_from
    if not m["tie_embeddings"]:
        total += vp * c
    return total


def flops_per_token(m):
    n = parameters(m, with_position_table=False)
    return 6.0 * n + 12.0 * m["n_layers"] * m["d_model"] * m["seq_len"]
