#!/usr/bin/env python3
"""Writes a random DeepSeek-V4 test case: weights with every tensor name of MODEL_SPEC §7.1 (F32, no
`.scale` tensors; `tid2eid` I64 with K distinct experts per row) and a batch (tokens, optional
doc_ids / loss_mask).

  make_case.py --config C --seed S --B b --T t [--packed] [--mask] --weights W.safetensors --batch IN.safetensors

Scales are chosen so that every path is exercised: activations stay O(1), mHC is far from its trivial
init (hc scale 0.3-1, base N(0, 0.5), comb base N(0, 2)), the SwiGLU clamps trigger on a few hidden units, the sink and
the router bias matter.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
from dsv4_ref import Config  # noqa: E402


def param_shapes(cfg):
    """Ordered dict name -> shape of every tensor (MODEL_SPEC §7.1, no .scale tensors)."""
    d, n, V = cfg.d, cfg.hc, cfg.vocab
    H, c, dc, G, dg = cfg.n_heads, cfg.head_dim, cfg.q_lora, cfg.o_groups, cfg.o_lora
    E, I, K = cfg.n_experts, cfg.moe_inter, cfg.topk
    Ish = cfg.moe_inter * cfg.n_shared
    nI, cI = cfg.idx_heads, cfg.idx_dim
    mix = (2 + n) * n
    out = {
        "embed.weight": [V, d],
        "head.weight": [V, d],
        "norm.weight": [d],
        "hc_head_fn": [n, n * d],
        "hc_head_base": [n],
        "hc_head_scale": [1],
    }
    prefixes = [(f"layers.{i}.", i) for i in range(cfg.n_layers)]
    prefixes += [(f"mtp.{k}.", cfg.n_layers + k) for k in range(cfg.n_mtp)]
    for p, li in prefixes:
        ratio = cfg.ratios[li]
        out[p + "attn_norm.weight"] = [d]
        out[p + "ffn_norm.weight"] = [d]
        for s in ("attn", "ffn"):
            out[p + f"hc_{s}_fn"] = [mix, n * d]
            out[p + f"hc_{s}_base"] = [mix]
            out[p + f"hc_{s}_scale"] = [3]
        a = p + "attn."
        out[a + "wq_a.weight"] = [dc, d]
        out[a + "q_norm.weight"] = [dc]
        out[a + "wq_b.weight"] = [H * c, dc]
        out[a + "wkv.weight"] = [c, d]
        out[a + "kv_norm.weight"] = [c]
        out[a + "wo_a.weight"] = [G * dg, (H // G) * c]
        out[a + "wo_b.weight"] = [d, G * dg]
        out[a + "attn_sink"] = [H]
        if ratio > 0:
            w = 2 if ratio == 4 else 1
            out[a + "compressor.wkv.weight"] = [w * c, d]
            out[a + "compressor.wgate.weight"] = [w * c, d]
            out[a + "compressor.ape"] = [ratio, w * c]
            out[a + "compressor.norm.weight"] = [c]
        if ratio == 4:
            out[a + "indexer.wq_b.weight"] = [nI * cI, dc]
            out[a + "indexer.weights_proj.weight"] = [nI, d]
            out[a + "indexer.compressor.wkv.weight"] = [2 * cI, d]
            out[a + "indexer.compressor.wgate.weight"] = [2 * cI, d]
            out[a + "indexer.compressor.ape"] = [4, 2 * cI]
            out[a + "indexer.compressor.norm.weight"] = [cI]
        f = p + "ffn."
        out[f + "gate.weight"] = [E, d]
        if p.startswith("layers.") and li < cfg.n_hash:
            out[f + "gate.tid2eid"] = [V, K]
        else:
            out[f + "gate.bias"] = [E]
        for e in range(E):
            out[f + f"experts.{e}.w1.weight"] = [I, d]
            out[f + f"experts.{e}.w3.weight"] = [I, d]
            out[f + f"experts.{e}.w2.weight"] = [d, I]
        out[f + "shared_experts.w1.weight"] = [Ish, d]
        out[f + "shared_experts.w3.weight"] = [Ish, d]
        out[f + "shared_experts.w2.weight"] = [d, Ish]
        if p.startswith("mtp."):
            out[p + "e_proj.weight"] = [d, d]
            out[p + "h_proj.weight"] = [d, d]
            out[p + "enorm.weight"] = [d]
            out[p + "hnorm.weight"] = [d]
            out[p + "norm.weight"] = [d]
            out[p + "hc_head_fn"] = [n, n * d]
            out[p + "hc_head_base"] = [n]
            out[p + "hc_head_scale"] = [1]
    return out


def random_weights(cfg, rng):
    W = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("tid2eid"):
            V, K = shape
            W[name] = np.argsort(rng.random((V, cfg.n_experts)), axis=1)[:, :K].astype(np.int64)
            continue
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("_scale"):  # hc_*_scale, hc_head_scale: gating factors
            a = rng.uniform(0.3, 1.0, shape)
        elif name.endswith("_base"):
            a = 0.5 * rng.standard_normal(shape)
            if shape[0] == (2 + cfg.hc) * cfg.hc:
                # comb logits of scale ~2: Sinkhorn is then not converged after 20 iterations, so the
                # exact iteration count (1 softmax, 20 column and 19 row normalisations) matters
                a[2 * cfg.hc:] *= 4.0
        elif name.endswith("attn_sink"):
            a = 0.5 * rng.standard_normal(shape)
        elif name.endswith("gate.bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith(".ape"):
            a = 0.1 * rng.standard_normal(shape)
        elif name == "embed.weight":
            a = rng.standard_normal(shape)
        elif len(shape) == 2:  # Linear [out, in] and hc fn matrices: keep outputs O(1)
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
            if name.endswith(".w1.weight") or name.endswith(".w3.weight"):
                # a few hidden units with large weights so that the SwiGLU clamps (gate <= L, |up| <= L)
                # are active on some tokens
                rows = rng.choice(shape[0], size=max(1, shape[0] // 64), replace=False)
                a[rows] *= 8.0
            if name.endswith(".w2.weight"):
                a *= 0.5
        else:
            raise AssertionError(f"no init rule for {name} {shape}")
        W[name] = np.asarray(a, dtype=np.float32)
    return W


def packed_doc_ids(rng, T, row):
    """3-4 documents of uneven lengths: one shorter than the ratio 4, one shorter than 16, the rest long.
    Ids are reused non-adjacently in some rows (two runs of the same id are two documents)."""
    nd = 4 if row % 2 == 0 else 3
    if T < 24:
        nd = min(nd, max(1, T // 4))
    short = [int(rng.integers(1, 4)), int(rng.integers(5, 16))][: max(0, nd - 1)]
    rest = T - sum(short)
    nlong = nd - len(short)
    if nlong > 1:
        cut = sorted(rng.choice(np.arange(1, rest), size=nlong - 1, replace=False).tolist())
        longs = [b - a for a, b in zip([0] + cut, cut + [rest])]
    else:
        longs = [rest]
    lens = short + longs
    rng.shuffle(lens)
    ids = [7, 3, 7, 11] if row % 2 == 0 else [2, 5, 9]
    out = np.concatenate([np.full(l, ids[k % len(ids)], dtype=np.int32) for k, l in enumerate(lens)])
    assert out.shape[0] == T
    return out


def loss_mask(rng, T):
    m = np.ones(T, dtype=np.uint8)
    for _ in range(3):
        ln = int(rng.integers(3, max(4, T // 6)))
        s = int(rng.integers(0, max(1, T - ln)))
        m[s:s + ln] = 0
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--B", type=int, required=True)
    ap.add_argument("--T", type=int, required=True)
    ap.add_argument("--packed", action="store_true")
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    a = ap.parse_args(argv)
    cfg = Config.load(a.config)
    rng = np.random.default_rng(a.seed)
    st.save(a.weights, random_weights(cfg, rng))
    brng = np.random.default_rng(a.seed + 1000003)
    batch = {"tokens": brng.integers(0, cfg.vocab, size=(a.B, a.T)).astype(np.int32)}
    if a.packed:
        batch["doc_ids"] = np.stack([packed_doc_ids(brng, a.T, b) for b in range(a.B)])
    if a.mask:
        batch["loss_mask"] = np.stack([loss_mask(brng, a.T) for _ in range(a.B)])
    st.save(a.batch, batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
