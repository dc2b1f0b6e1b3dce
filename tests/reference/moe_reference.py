#!/usr/bin/python3
"""A float64 PyTorch reference of a mixture-of-experts decoder (gpt2 or llama blocks whose
MLP is a routed set of experts), written from the published descriptions and sharing no
code with Trident:

- the router (Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al. 2024): logits
  = h @ W_router^T, softmax, the top k experts per token, their k probabilities
  renormalised to sum to 1 (Mixtral); a tie between equal probabilities goes to the lowest
  expert index (a stable descending sort);
- the experts: the family's MLP (GPT-2's GELU fc/proj with biases, Llama's SwiGLU
  gate/up/down), every token through its k experts (no capacity: nothing dropped), the
  outputs summed with the weights, plus the shared experts every token goes through with
  weight 1 (DeepSeekMoE, Dai et al. 2024);
- the load-balancing loss (Switch Transformer, eq. 4): E * sum_e f_e * P_e per layer, with
  f_e the fraction of the N * k token-expert assignments that went to expert e (a
  constant: no gradient flows through the choice) and P_e the mean router probability of
  expert e; and the router z-loss (ST-MoE, Zoph et al. 2022): mean over tokens of
  logsumexp(logits)^2.

The rest of the model (embeddings, norms, attention, RoPE, the head, cross-entropy) and
the experts' MLP are make_fixtures.py's, the reference of the dense model.

usage: moe_reference.py IN.json OUT.json [IN.json OUT.json ...]  (one torch start-up for all)
  IN: {"config": {arch, vocab_size, n_layers, n_heads, n_kv_heads, d_model, norm_eps,
       rope_theta, tied, moe_experts, moe_top_k, moe_shared_experts, moe_first_dense_layers
       (optional: leading layers with the family's dense MLP, as DeepSeek)}, "aux_coef",
       "z_coef", "B", "T",
       "tokens": [B*T], "targets": [B*T], "params": {name: {"shape": [...], "data": [...]}}}
  OUT: {"loss" (the LM loss), "aux_loss", "z_loss" (each summed over layers, before its
       coefficient), "experts": per MoE layer the chosen experts [B*T*k], "grads": {name:
       [...]}: the gradient of loss + aux_coef * aux_loss + z_coef * z_loss}
Exit 0 on success, 1 on any error (the message on stderr).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import family_mlp, forward  # noqa: E402


def moe_mlp(cfg, P, p, h, record):
    """One layer's experts on h [B, T, C]; appends (balance loss, z-loss, choices) to
    `record`."""
    E, K = cfg["moe_experts"], cfg["moe_top_k"]
    shape = h.shape
    h = h.reshape(-1, shape[-1])
    N = h.shape[0]
    logits = h @ P[p + "moe.router.weight"].t()  # [N, E]
    probs = torch.softmax(logits, dim=-1)
    order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices
    chosen = order[:, :K]  # [N, K]
    top = probs.gather(1, chosen)
    weights = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        rows, slot = (chosen == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        y = family_mlp(cfg, P, f"{p}moe.experts.{e}.", h[rows])
        out = out.index_add(0, rows, weights[rows, slot][:, None] * y)
    # Shared experts (DeepSeekMoE): every token, weight 1.
    for s in range(cfg.get("moe_shared_experts", 0)):
        out = out + family_mlp(cfg, P, f"{p}moe.shared_experts.{s}.", h)
    counts = torch.bincount(chosen.reshape(-1), minlength=E).to(h.dtype)
    f = counts / (N * K)
    balance = E * (f * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    record.append((balance, z, chosen.reshape(-1).tolist()))
    return out.view(shape)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        raise ValueError("usage: moe_reference.py IN.json OUT.json [IN.json OUT.json ...]")
    for i in range(0, len(args), 2):
        run(args[i], args[i + 1])


def run(in_path, out_path):
    with open(in_path) as f:
        inp = json.load(f)
    cfg = inp["config"]
    B, T = inp["B"], inp["T"]
    tokens = torch.tensor(inp["tokens"], dtype=torch.int32).view(B, T)
    targets = torch.tensor(inp["targets"], dtype=torch.int32).view(B, T)
    P = {n: torch.tensor(t["data"], dtype=torch.float64).view(t["shape"]).requires_grad_(True)
         for n, t in inp["params"].items()}
    record = []
    dense = cfg.get("moe_first_dense_layers", 0)

    def mlp(cfg, P, p, h):
        # p is "layers.{i}.": the leading `dense` layers keep the dense MLP (DeepSeek).
        if int(p.split(".")[1]) < dense:
            return family_mlp(cfg, P, p + "mlp.", h)
        return moe_mlp(cfg, P, p, h, record)

    _, loss = forward(cfg, P, tokens, targets, mlp=mlp)
    aux = sum(r[0] for r in record)
    z = sum(r[1] for r in record)
    experts = [r[2] for r in record]
    (loss + inp["aux_coef"] * aux + inp["z_coef"] * z).backward()
    out = {"loss": float(loss), "aux_loss": float(aux), "z_loss": float(z), "experts": experts,
           # (an expert no token reached has no gradient: zeros)
           "grads": {n: (t.grad if t.grad is not None else torch.zeros_like(t)).reshape(-1).tolist()
                     for n, t in P.items()}}
    with open(out_path, "w") as f:
        json.dump(out, f)
    print(f"moe_reference: loss {float(loss):.6f} aux {float(aux):.6f} z {float(z):.6f}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure is exit 1 with its message
        print(f"moe_reference.py: {e}", file=sys.stderr)
        sys.exit(1)
