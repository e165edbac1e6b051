#!/usr/bin/env python3
"""Self-checks of the PyTorch reference (tests/ref/dsv4_ref.py). Prints one line per check and
`N passed, N failed`; exits non-zero on any failure. Runs in a few seconds on a micro config.

  (a) torch.autograd.gradcheck of Sinkhorn, compressor pooling (overlap and not), router weights and
      the balance term, sink attention, indexer scores + KL
  (b) Sinkhorn column sums = 1
  (c) visible compressed blocks for query p = floor((p+1)/m), measured on the attention itself
  (d) packed == unpacked: each document of a packed row gives the logits of that document run alone
  plus: literal per-query/per-block loops agree with the vectorised attention and compressor; causality
  (changing token t leaves logits before t unchanged); chunked attention == one chunk; a whole-model
  directional derivative check.
"""
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_ref as R  # noqa: E402
from make_case import random_weights  # noqa: E402

torch.set_num_threads(1)
DT = torch.float64

MICRO = {
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
    "head_dim": 32, "qk_rope_head_dim": 16, "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 16,
    "sliding_window": 8, "compress_ratios": [0, 4, 8, 4, 0], "compress_rope_theta": 160000,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 2, "index_head_dim": 32, "index_topk": 3, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "num_hash_layers": 1,
    "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1,
}

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}", flush=True)


def rnd(*shape, s=1.0, g=None):
    return (torch.randn(*shape, dtype=DT, generator=g) * s).requires_grad_(True)


def gradchecks():
    g = torch.Generator().manual_seed(1)
    cfg = R.Config(MICRO)
    # Sinkhorn
    L = rnd(3, 4, 4, s=2.0, g=g)
    ok = torch.autograd.gradcheck(lambda x: R.sinkhorn(x, 20, 1e-6), (L,), eps=1e-6, atol=1e-7, rtol=1e-5)
    check("gradcheck sinkhorn", ok)
    # HC pre/post composite
    X = rnd(5, 4, 6, g=g)
    fn = rnd(24, 24, s=0.2, g=g)
    sc = rnd(3, g=g)
    base = rnd(24, s=0.5, g=g)
    y = rnd(5, 6, g=g)
    c4 = dict(MICRO, hidden_size=6)
    cfg6 = R.Config(c4)

    def hc(X, fn, sc, base, y):
        x_in, post, comb = R.hc_pre(cfg6, X, fn, sc, base)
        return R.hc_post(y + x_in, X, post, comb)
    check("gradcheck hc_pre/hc_post", torch.autograd.gradcheck(hc, (X, fn, sc, base, y), eps=1e-6, atol=1e-7))
    # compressor pooling, both kinds
    cos, sin = R.rope_table(cfg, 4, 32)
    for m, overlap in ((4, True), (8, False), (4, False)):
        c = 8
        w = 2 if overlap else 1
        x = rnd(19, 6, g=g)
        wkv = rnd(w * c, 6, s=0.4, g=g)
        wg = rnd(w * c, 6, s=0.4, g=g)
        ape = rnd(m, w * c, s=0.3, g=g)
        nw = rnd(c, s=0.1, g=g)
        cs, sn = cos[:, :2], sin[:, :2]  # 4 rope dims of the 8
        f = lambda x, a, b, e, n: R.compress(x, a, b, e, 1 + n, m, c, overlap, cs, sn, 1e-6)  # noqa: E731
        ok = torch.autograd.gradcheck(f, (x, wkv, wg, ape, nw), eps=1e-6, atol=1e-7)
        check(f"gradcheck compressor m={m} overlap={overlap}", ok)
    # router weights and balance term
    z = rnd(7, 6, s=2.0, g=g)
    idx = torch.tensor([[0, 3], [1, 2], [5, 4], [0, 1], [2, 5], [3, 4], [1, 0]])

    def router(z):
        s = torch.sqrt(R.softplus(z))
        gts = R.router_weights(s, idx, 1.5)
        P = (s / s.sum(-1, keepdim=True)).mean(0)
        return gts, P
    check("gradcheck router (sqrt-softplus, renormalised weights, balance P)",
          torch.autograd.gradcheck(router, (z,), eps=1e-6, atol=1e-7))
    # sink attention (mask with window + a compressed part)
    q = rnd(6, 3, 8, g=g)
    ent = rnd(9, 8, g=g)
    sink = rnd(3, g=g)
    mask = torch.rand(6, 9, generator=g) < 0.5
    mask[torch.arange(6), torch.arange(6)] = True
    check("gradcheck sink attention",
          torch.autograd.gradcheck(lambda q, e, s: R.sink_attention(q, e, mask, s, 8 ** -0.5)[0], (q, ent, sink),
                                   eps=1e-6, atol=1e-7))
    # indexer scores + KL on the micro model's first CSA layer
    rw = random_weights(cfg, np.random.default_rng(3))
    model = R.DSV4(cfg, rw)
    cos, sin = model.tables(4, 24)
    xd = torch.randn(24, cfg.d, dtype=DT, generator=g)
    qrd = torch.randn(24, cfg.q_lora, dtype=DT, generator=g)
    names = ["layers.1.attn.indexer.wq_b.weight", "layers.1.attn.indexer.weights_proj.weight",
             "layers.1.attn.indexer.compressor.wkv.weight", "layers.1.attn.indexer.compressor.ape"]
    base_p = {n: model.P[n].detach().clone() for n in names}
    pc = torch.rand(24, 4, 6, dtype=DT, generator=g)
    att = R.visible_mask(24, 6, 4)

    def kl(*ps):
        for n, p in zip(names, ps):
            model.P[n] = p
        I = model.indexer_scores("layers.1.attn.indexer.", xd, qrd, 24, cos, sin)
        stt = R.Stats()
        model.indexer_kl(1, torch.where(att[:, None, :], pc, torch.zeros_like(pc)), I, att, stt)
        return stt.kl_sum[1]
    args = tuple(base_p[n].clone().requires_grad_(True) for n in names)
    check("gradcheck indexer scores + KL", torch.autograd.gradcheck(kl, args, eps=1e-6, atol=1e-6))


def sinkhorn_cols():
    g = torch.Generator().manual_seed(2)
    worst = 0.0
    for s in (1.0, 5.0, 20.0):
        M = R.sinkhorn(torch.randn(200, 4, 4, dtype=DT, generator=g) * s, 20, 1e-6)
        worst = max(worst, float((M.sum(-2) - 1).abs().max()))
    check("sinkhorn column sums = 1", worst < 1e-5, f"max |colsum-1| = {worst:.2e}")


def model_and_batch(cfg, seed, B, T):
    rw = random_weights(cfg, np.random.default_rng(seed))
    g = np.random.default_rng(seed + 1)
    tokens = torch.from_numpy(g.integers(0, cfg.vocab, (B, T)))
    return rw, tokens


def visibility():
    """Count the compressed entries each query actually attends in an HCA layer (m=8) and a dense CSA
    layer (m=4): must be floor((p+1)/m)."""
    cfg = R.Config(MICRO)
    rw, tokens = model_and_batch(cfg, 11, 1, 37)
    model = R.DSV4(cfg, rw, "dense")
    stats = R.Stats()
    stats.debug = {}
    with torch.no_grad():
        model.forward(tokens, torch.zeros_like(tokens), stats)
    bad = []
    for pfx, m in (("layers.1.", 4), ("layers.2.", 8), ("layers.3.", 4)):
        p = stats.debug[(pfx, "p")][0]  # [L, H, L + nb]
        L = p.shape[0]
        ncomp = (p[:, 0, L:] > 0).sum(-1)
        want = torch.div(torch.arange(L) + 1, m, rounding_mode="floor")
        if not torch.equal(ncomp, want):
            bad.append(pfx)
        nwin = (p[:, 0, :L] > 0).sum(-1)
        wwant = torch.clamp(torch.arange(L) + 1, max=cfg.window)
        if not torch.equal(nwin, wwant):
            bad.append(pfx + "window")
    # sparse mode: min(topk, visible)
    model = R.DSV4(cfg, rw, "sparse")
    stats = R.Stats()
    stats.debug = {}
    with torch.no_grad():
        model.forward(tokens, torch.zeros_like(tokens), stats)
    p = stats.debug[("layers.1.", "p")][0]
    L = p.shape[0]
    ncomp = (p[:, 0, L:] > 0).sum(-1)
    want = torch.clamp(torch.div(torch.arange(L) + 1, 4, rounding_mode="floor"), max=cfg.idx_topk)
    if not torch.equal(ncomp, want):
        bad.append("sparse")
    check("visible compressed blocks = floor((p+1)/m) (and window, sparse k)", not bad, ", ".join(bad))


def loops_vs_vectorised():
    """Literal per-block compressor and per-query attention (§3.4, §3.7) against the vectorised code."""
    g = torch.Generator().manual_seed(5)
    c, r = 8, 4
    cfg = R.Config(MICRO)
    cos, sin = R.rope_table(cfg, 4, 64)
    cs, sn = cos[:, : r // 2], sin[:, : r // 2]
    x = torch.randn(23, 5, dtype=DT, generator=g)
    worst = 0.0
    for overlap, mm in ((True, 4), (False, 8)):
        w = 2 if overlap else 1
        wkv = torch.randn(w * c, 5, dtype=DT, generator=g)
        wg = torch.randn(w * c, 5, dtype=DT, generator=g)
        ape = torch.randn(mm, w * c, dtype=DT, generator=g)
        nw = torch.randn(c, dtype=DT, generator=g)
        C = R.compress(x, wkv, wg, ape, nw, mm, c, overlap, cs, sn, 1e-6)
        nb = 23 // mm
        ref = []
        for i in range(nb):
            ent = torch.zeros(c, dtype=DT)
            for f in range(c):
                zs, ks = [], []
                for j in range(mm):
                    t = i * mm + j
                    kt = x[t] @ wkv.t()
                    zt = x[t] @ wg.t() + ape[j]
                    off = c if overlap else 0
                    zs.append(float(zt[off + f]))
                    ks.append(float(kt[off + f]))
                    if overlap and i > 0:
                        tp = (i - 1) * mm + j
                        kp = x[tp] @ wkv.t()
                        zp = x[tp] @ wg.t() + ape[j]
                        zs.append(float(zp[f]))
                        ks.append(float(kp[f]))
                mx = max(zs)
                e = [math.exp(z - mx) for z in zs]
                ent[f] = sum(ei * ki for ei, ki in zip(e, ks)) / sum(e)
            ent = ent / math.sqrt(float((ent * ent).mean()) + 1e-6) * nw
            # rotate the last r dims by angle (i*mm) * f
            for pi in range(r // 2):
                a, b = float(ent[c - r + 2 * pi]), float(ent[c - r + 2 * pi + 1])
                co, si = float(cs[i * mm, pi]), float(sn[i * mm, pi])
                ent[c - r + 2 * pi] = a * co - b * si
                ent[c - r + 2 * pi + 1] = a * si + b * co
            ref.append(ent)
        ref = torch.stack(ref)
        worst = max(worst, float((ref - C).abs().max()))
    check("compressor: per-block loop == vectorised", worst < 1e-12, f"max err {worst:.1e}")
    # attention: explicit entry lists per query
    L, H, E = 10, 2, 3
    q = torch.randn(L, H, c, dtype=DT, generator=g)
    ent = torch.randn(L + E, c, dtype=DT, generator=g)
    sink = torch.randn(H, dtype=DT, generator=g)
    mask = torch.cat([R.window_mask(L, 4), R.visible_mask(L, E, 3)], 1)
    o, _ = R.sink_attention(q, ent, mask, sink, c ** -0.5)
    worst = 0.0
    for t in range(L):
        es = list(range(max(0, t - 3), t + 1)) + [L + i for i in range(E) if i < (t + 1) // 3]
        for h in range(H):
            zs = [float(q[t, h] @ ent[e]) / math.sqrt(c) for e in es]
            den = sum(math.exp(z) for z in zs) + math.exp(float(sink[h]))
            oo = sum(math.exp(z) / den * ent[e] for z, e in zip(zs, es))
            worst = max(worst, float((oo - o[t, h]).abs().max()))
    check("attention: per-query loop == vectorised", worst < 1e-12, f"max err {worst:.1e}")


def causality():
    cfg = R.Config(MICRO)
    rw, tokens = model_and_batch(cfg, 21, 1, 33)
    worst = 0.0
    for mode in ("dense", "sparse"):
        model = R.DSV4(cfg, rw, mode)
        with torch.no_grad():
            l1, m1 = model.forward(tokens, torch.zeros_like(tokens), R.Stats())
            for t in (5, 16, 31):
                t2 = tokens.clone()
                t2[0, t] = (t2[0, t] + 7) % cfg.vocab
                l2, m2 = model.forward(t2, torch.zeros_like(tokens), R.Stats())
                worst = max(worst, float((l1[0, :t] - l2[0, :t]).abs().max()))
                # MTP position i uses token i+1: positions < t-1 must not change
                worst = max(worst, float((m1[0, : t - 1] - m2[0, : t - 1]).abs().max()))
                if float((l1[0, t:] - l2[0, t:]).abs().max()) == 0:
                    worst = math.inf  # the change must be visible from t on
    check("causality (token t changes nothing before t)", worst < 1e-13, f"max change {worst:.1e}")


def chunked_attention():
    """The attention runs in query chunks that skip unreachable window tokens; any chunk size must give
    the same logits and gradients as one chunk over the whole sequence."""
    cfg = R.Config(MICRO)
    rw, tokens = model_and_batch(cfg, 51, 1, 45)
    res = []
    for chunk in (1000, 5, 8):
        model = R.DSV4(cfg, rw, "sparse")
        model.chunk = chunk
        out, loss, _ = R.compute(model, tokens, torch.ones_like(tokens), torch.zeros_like(tokens))
        loss.backward()
        res.append((out["logits"].detach(), out["loss_indexer"].detach(),
                    model.P["layers.1.attn.wq_a.weight"].grad.clone(),
                    model.P["layers.1.attn.indexer.wq_b.weight"].grad.clone()))
    worst = max(float((a - b).abs().max()) for r in res[1:] for a, b in zip(res[0], r))
    check("chunked attention == one chunk (logits, KL, grads)", worst < 1e-12, f"max err {worst:.1e}")


def packed_vs_unpacked():
    """(d): a row packed with documents of lengths 3, 13, 2, 22 (ids 4 4 4 | 9.. | 4 4 | 1..) equals each
    document run alone, in dense and sparse mode (logits and MTP logits of in-document positions)."""
    cfg = R.Config(MICRO)
    lens = [3, 13, 2, 22]
    ids = [4, 9, 4, 1]
    T = sum(lens)
    rw, tokens = model_and_batch(cfg, 31, 1, T)
    doc = torch.cat([torch.full((l,), i, dtype=torch.long) for l, i in zip(lens, ids)])[None]
    worst = 0.0
    for mode in ("dense", "sparse"):
        model = R.DSV4(cfg, rw, mode)
        with torch.no_grad():
            lp, mp = model.forward(tokens, doc, R.Stats())
            s = 0
            for l in lens:
                la, ma = model.forward(tokens[:, s:s + l], torch.zeros(1, l, dtype=torch.long), R.Stats())
                worst = max(worst, float((la[0] - lp[0, s:s + l]).abs().max()))
                if l >= 2:
                    worst = max(worst, float((ma[0] - mp[0, s:s + l - 1]).abs().max()))
                s += l
    check("packed == unpacked (per-document logits, dense and sparse)", worst < 1e-10, f"max err {worst:.1e}")


def directional():
    """Whole model: autograd gradient . v against a central finite difference of the loss.
    The indexer's inputs are detached on purpose, so: (1) with indexer_weight 0 over all parameters but
    the indexer's; (2) the full loss along the indexer parameters only."""
    cfg = R.Config(MICRO)
    rw, tokens = model_and_batch(cfg, 41, 2, 24)
    g = np.random.default_rng(42)
    doc = torch.from_numpy(np.array([[0] * 10 + [1] * 14, [0] * 24]))
    mask = torch.ones_like(tokens)
    mask[0, 3:6] = 0
    msgs = []
    ok = True
    for part, iw in (("non-indexer", 0.0), ("indexer", 1.0)):
        model = R.DSV4(cfg, rw, "sparse", 1e-2)
        sel = [n for n in model.trainable if ((".indexer." in n) == (part == "indexer"))]
        out, loss, _ = R.compute(model, tokens, mask, doc, 0.3, iw)
        loss.backward()
        v = {n: torch.from_numpy(g.standard_normal(model.P[n].shape)) for n in sel}
        ana = sum(float((model.P[n].grad * v[n]).sum()) if model.P[n].grad is not None else 0.0 for n in sel)
        h = 1e-6
        vals = []
        for sgn in (1, -1):
            for n in sel:
                model.P[n] = (model.P[n].detach() + sgn * h * v[n])
            with torch.no_grad():
                _, lval, _ = R.compute(model, tokens, mask, doc, 0.3, iw)
            vals.append(float(lval))
            for n in sel:
                model.P[n] = model.P[n] - sgn * h * v[n]
        fd = (vals[0] - vals[1]) / (2 * h)
        rel = abs(fd - ana) / max(abs(ana), 1e-12)
        ok &= rel < 1e-5
        msgs.append(f"{part}: analytic {ana:.8e} fd {fd:.8e} rel {rel:.1e}")
    check("directional derivative of the total loss", ok, "; ".join(msgs))


def main():
    t0 = time.time()
    for f in (gradchecks, sinkhorn_cols, visibility, loops_vs_vectorised, causality, chunked_attention,
              packed_vs_unpacked, directional):
        try:
            f()
        except Exception as e:  # a crash is a failed check, not a silent skip
            check(f.__name__, False, f"exception {type(e).__name__}: {e}")
    p = sum(results)
    n = len(results) - p
    print(f"selfcheck: {time.time() - t0:.1f}s")
    print(f"{p} passed, {n} failed")
    return 0 if n == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
