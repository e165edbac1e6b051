#!/usr/bin/env bash
# tests/test_optim_torch.sh — AdamW and Muon steps of trex against PyTorch.
#
# A float64 PyTorch reference (torch.optim.AdamW for the AdamW groups; Muon and the hybrid
# Newton–Schulz written here from MODEL_SPEC §9) runs three steps on the small layout `toy` of
# tests/test_optim.c (same names, kinds and shapes: keep the two in step) and writes the start, the
# gradients, the learning rates, the parameters and optimizer state after the steps, and a few
# Newton–Schulz input/output pairs to a safetensors file; `test_optim --torch-ref FILE` runs trex's
# optimizer on the same inputs and compares (relative tolerance 1e-5).
# Env: BUILD (default build), PYTHON (default /usr/bin/python3).
# asan: yes
. "$(dirname "$0")/lib.sh"
build=${BUILD:-build}
bin="$build/tests/test_optim"
if [ ! -x "$bin" ]; then
  bad "missing $bin: build it first (make BUILD=$build $bin)"
  finish
fi
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  echo "skipped: $PY has no torch/numpy (the reference needs them)"
  finish
fi

"$PY" - "$tmp/ref.safetensors" <<'PY'
import json, math, struct, sys
import numpy as np
import torch

torch.set_default_dtype(torch.float64)
out_path = sys.argv[1]

# name, kind, shape — tests/test_optim.c `toy`, in layout order
TOY = [
    ("embed.weight", "embed", (12, 8)),
    ("layers.0.hc_attn_fn", "hc_fn", (6, 16)),
    ("layers.0.hc_attn_base", "hc_base", (6,)),
    ("layers.0.attn_norm.weight", "norm", (8,)),
    ("layers.0.attn.wq_a.weight", "attn", (6, 8)),
    ("layers.0.attn.wo_a.weight", "attn", (10, 12)),
    ("layers.0.attn.attn_sink", "attn_sink", (3,)),
    ("layers.0.attn.compressor.ape", "ape", (4, 6)),
    ("layers.0.ffn.gate.weight", "gate", (4, 8)),
    ("layers.0.ffn.gate.bias", "gate_bias", (4,)),
    ("layers.0.ffn.experts.0.w2.weight", "expert", (8, 4)),
    ("head.weight", "head", (12, 8)),
]
O_GROUPS = 2
ADAMW_KINDS = {"embed", "head", "norm", "hc_base", "hc_scale", "attn_sink", "ape"}
FROZEN_KINDS = {"gate_bias", "tid2eid"}
LR = [0.015625, 0.03125, 0.0234375]  # exact in fp32
BETAS, EPS, WD, MU, RMS = (0.9, 0.95), 1e-20, 0.1, 0.95, 0.18


def group(kind, shape, opt):
    if kind in FROZEN_KINDS:
        return "frozen"
    if opt == "adamw" or len(shape) != 2 or kind in ADAMW_KINDS:
        return "adamw"
    return "muon"


def newton_schulz(m):
    """Hybrid Newton-Schulz of MODEL_SPEC §9, float64."""
    x = m.clone()
    nrm = torch.linalg.norm(x)
    if nrm == 0:
        return x
    x = x / nrm
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for it in range(10):
        a, b, c = (3.4445, -4.7750, 2.0315) if it < 8 else (2.0, -1.5, 0.5)
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if tall else x


def f32(t):
    return t.to(torch.float32).to(torch.float64)  # values exactly representable in fp32


rng = np.random.default_rng(20260701)
init = {n: f32(torch.tensor(rng.normal(0, 0.5, s))) for n, _, s in TOY}
grads = [{n: f32(torch.tensor(rng.normal(0, 1.0 + t, s))) for n, _, s in TOY} for t in range(len(LR))]
out = {"lr": np.array(LR, dtype=np.float32)}
for n, _, _ in TOY:
    out["init." + n] = init[n]
    for t in range(len(LR)):
        out[f"grad.{t}.{n}"] = grads[t][n]

for tag, opt, nesterov in (("muon", "muon", True), ("muon_plain", "muon", False), ("adamw", "adamw", True)):
    params = {n: torch.nn.Parameter(init[n].clone()) for n, _, _ in TOY}
    decay = [params[n] for n, k, s in TOY if group(k, s, opt) == "adamw" and len(s) == 2]
    nodecay = [params[n] for n, k, s in TOY if group(k, s, opt) == "adamw" and len(s) != 2]
    adam = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": nodecay, "weight_decay": 0.0}],
                             lr=LR[0], betas=BETAS, eps=EPS)
    momentum = {n: torch.zeros(s) for n, k, s in TOY if group(k, s, opt) == "muon"}
    for t, lr in enumerate(LR):
        for n, _, _ in TOY:
            params[n].grad = grads[t][n].clone()
        for g in adam.param_groups:
            g["lr"] = lr
        adam.step()
        with torch.no_grad():
            for n, k, s in TOY:
                if group(k, s, opt) != "muon":
                    continue
                g = grads[t][n]
                momentum[n] = MU * momentum[n] + g
                u = MU * momentum[n] + g if nesterov else momentum[n]
                blocks = O_GROUPS if n.endswith(".attn.wo_a.weight") else 1
                rows = s[0] // blocks
                upd = torch.cat([newton_schulz(u[q * rows:(q + 1) * rows]) * math.sqrt(max(rows, s[1])) * RMS
                                 for q in range(blocks)])
                params[n].mul_(1 - lr * WD).sub_(lr * upd)
    for n, k, s in TOY:
        out[f"{tag}.{n}"] = params[n].detach()
        g = group(k, s, opt)
        if g == "muon":
            out[f"{tag}.muon_m.{n}"] = momentum[n]
        elif g == "adamw":
            st = adam.state[params[n]]
            out[f"{tag}.adam_m.{n}"] = st["exp_avg"]
            out[f"{tag}.adam_v.{n}"] = st["exp_avg_sq"]

for i, shape in enumerate([(16, 24), (24, 16), (7, 7), (1, 9), (20, 64)]):
    m = f32(torch.tensor(rng.normal(0, 1, shape)))
    out[f"ns.in.{i}"] = m
    out[f"ns.out.{i}"] = newton_schulz(m)

# a minimal safetensors writer (F32)
header, blobs, off = {"__metadata__": {"steps": str(len(LR))}}, [], 0
for name, val in out.items():
    a = np.ascontiguousarray(val.numpy() if torch.is_tensor(val) else val, dtype="<f4")
    b = a.tobytes()
    header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(out_path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
rc=$?
if [ $rc -ne 0 ]; then
  bad "the PyTorch reference failed (exit $rc)"
  finish
fi
"$bin" --torch-ref "$tmp/ref.safetensors"
