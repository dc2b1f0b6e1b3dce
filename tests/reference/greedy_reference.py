#!/usr/bin/python3
"""Independent PyTorch (float64) greedy decoding, for `trident generate --temperature 0`.

Usage: /usr/bin/python3 tests/reference/greedy_reference.py INDEX.json

INDEX.json (written by tests/e2e/generate_test.cpp from a Trident checkpoint):
  {"config": {arch, vocab_size, padded_vocab, seq_len, n_layers, n_heads, n_kv_heads,
              d_model, d_ff, norm_eps, rope_theta, tied, moe_experts, moe_top_k,
              moe_shared_experts},
   "params": {"<trident name>": {"file": "<path>", "shape": [...]}, ...},   float32 raw
   "prompt": [token ids], "max_new_tokens": N, "vocab_limit": V}

Each step recomputes the whole prefix with make_fixtures.forward (the op-by-op float64
model of both families, sharing nothing with the C++ code but the spec; with moe_experts
> 0 every layer's MLP is moe_reference.moe_mlp's router and experts) and takes the
argmax over ids < vocab_limit (the lowest id among equal maxima), stopping at seq_len
positions as Trident does (the last new token is not fed back, so the prefix never exceeds
seq_len). Prints JSON: {"tokens": [...new ids...], "margins": [top1 - top2 logit per step]}.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import dense_mlp, forward  # noqa: E402
from moe_reference import moe_mlp  # noqa: E402


def main():
    with open(sys.argv[1]) as f:
        index = json.load(f)
    cfg = index["config"]
    params = {}
    for name, entry in index["params"].items():
        values = np.fromfile(entry["file"], dtype="<f4")
        params[name] = torch.from_numpy(values.astype(np.float64)).reshape(entry["shape"])
    tokens = list(index["prompt"])
    limit = index["vocab_limit"]
    context = cfg["max_seq_len"]
    new, margins = [], []
    mlp = dense_mlp
    if cfg.get("moe_experts", 0) > 0:
        mlp = lambda cfg, P, p, h: moe_mlp(cfg, P, p, h, [])  # noqa: E731 - no statistics
    with torch.no_grad():
        for i in range(index["max_new_tokens"]):
            if i > 0:
                if len(tokens) >= context:
                    break
                tokens.append(new[-1])
            batch = torch.tensor([tokens], dtype=torch.int32)
            logits, _ = forward(cfg, params, batch, torch.zeros_like(batch), mlp=mlp)
            last = logits[0, -1, :limit]
            top2 = torch.topk(last, 2)
            nxt = int(torch.argmax(last))  # first maximal index
            new.append(nxt)
            margins.append(float(top2.values[0] - top2.values[1]))
    json.dump({"tokens": new, "margins": margins}, sys.stdout)
    print()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
