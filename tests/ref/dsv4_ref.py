#!/usr/bin/env python3
"""Independent PyTorch (float64) reference of DeepSeek-V4: forward, losses and autograd backward.

Written from MODEL_SPEC.md and docs/model-conventions.md only; it is the oracle for the C engine.
Clarity over speed: every document of a packed row is processed as its own sequence, attention is
dense masked attention over (window tokens + compressed entries) with the sink in the denominator.

CLI (same as `trex model run`):
  dsv4_ref.py --config C --weights W.safetensors --batch IN.safetensors --out OUT.safetensors
              [--backward] [--indexer-mode dense|sparse] [--mtp-weight 0.3]
              [--balance-weight 1e-4] [--indexer-weight 1.0]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

DT = torch.float64
NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------
# configuration


class Config:
    def __init__(self, j):
        def req(k):
            if k not in j:
                raise ValueError(f"config: missing field '{k}'")
            return j[k]

        self.vocab = int(req("vocab_size"))
        self.d = int(req("hidden_size"))
        self.n_layers = int(req("num_hidden_layers"))
        self.n_heads = int(req("num_attention_heads"))
        self.head_dim = int(req("head_dim"))
        self.rope_dim = int(req("qk_rope_head_dim"))
        self.q_lora = int(req("q_lora_rank"))
        self.o_groups = int(req("o_groups"))
        self.o_lora = int(req("o_lora_rank"))
        self.window = int(req("sliding_window"))
        self.n_mtp = int(j.get("num_nextn_predict_layers", 0))
        self.ratios = [int(r) for r in req("compress_ratios")]
        if len(self.ratios) < self.n_layers + self.n_mtp:
            raise ValueError("config: compress_ratios needs num_hidden_layers + num_nextn_predict_layers entries")
        self.compress_theta = float(req("compress_rope_theta"))
        self.rope_theta = float(req("rope_theta"))
        rs = j.get("rope_scaling")
        self.yarn = None
        if rs:
            self.yarn = dict(
                factor=float(rs["factor"]),
                orig=float(rs["original_max_position_embeddings"]),
                beta_fast=float(rs["beta_fast"]),
                beta_slow=float(rs["beta_slow"]),
            )
        self.idx_heads = int(req("index_n_heads"))
        self.idx_dim = int(req("index_head_dim"))
        self.idx_topk = int(req("index_topk"))
        self.n_experts = int(req("n_routed_experts"))
        self.n_shared = int(j.get("n_shared_experts", 1))
        self.topk = int(req("num_experts_per_tok"))
        self.moe_inter = int(req("moe_intermediate_size"))
        self.route_scale = float(req("routed_scaling_factor"))
        sf = j.get("scoring_func", "sqrtsoftplus")
        if sf != "sqrtsoftplus":
            raise ValueError(f"config: scoring_func {sf} not supported (sqrtsoftplus only)")
        self.n_hash = int(req("num_hash_layers"))
        self.swiglu_limit = float(req("swiglu_limit"))
        self.hc = int(req("hc_mult"))
        self.sk_iters = int(req("hc_sinkhorn_iters"))
        self.hc_eps = float(req("hc_eps"))
        self.eps = float(req("rms_norm_eps"))
        for r in self.ratios:
            if r < 0:
                raise ValueError("config: negative compress ratio")

    @staticmethod
    def load(path):
        with open(path) as f:
            return Config(json.load(f))


# ----------------------------------------------------------------------------------------------
# RoPE tables (fp32, as DeepSeek's code builds them; then widened to float64)


def rope_freqs_fp32(cfg, ratio):
    """Per-pair frequencies f'_i (fp32 numpy) for a layer of the given compress ratio."""
    r = cfg.rope_dim
    theta = cfg.compress_theta if ratio > 0 else cfg.rope_theta
    half = r // 2
    i = np.arange(half)
    expo = (2.0 * i).astype(np.float32) / np.float32(r)  # fp32 2i/r
    powv = np.float32(np.power(np.float64(theta), expo.astype(np.float64)))  # correctly rounded powf
    f = (np.float32(1.0) / powv).astype(np.float32)
    if ratio > 0 and cfg.yarn is not None:
        y = cfg.yarn
        s = np.float32(y["factor"])

        def g(beta):
            return r * math.log(y["orig"] / (2 * math.pi * beta)) / (2 * math.log(theta))

        lo = max(math.floor(g(y["beta_fast"])), 0)
        hi = min(math.ceil(g(y["beta_slow"])), r - 1)
        if hi == lo:
            hi += 0.001
        ramp = (np.arange(half, dtype=np.float32) - np.float32(lo)) / np.float32(hi - lo)
        ramp = np.clip(ramp, np.float32(0), np.float32(1)).astype(np.float32)
        smooth = (np.float32(1) - ramp).astype(np.float32)
        a = ((f / s).astype(np.float32) * (np.float32(1) - smooth)).astype(np.float32)
        b = (f * smooth).astype(np.float32)
        f = (a + b).astype(np.float32)
    return f


def rope_table(cfg, ratio, npos):
    """cos, sin [npos, r/2] float64 tensors (values rounded through fp32)."""
    f = rope_freqs_fp32(cfg, ratio)
    pos = np.arange(npos, dtype=np.float32)
    ang = (pos[:, None] * f[None, :]).astype(np.float32)  # fp32 product
    cos = np.cos(ang.astype(np.float64)).astype(np.float32)
    sin = np.sin(ang.astype(np.float64)).astype(np.float32)
    return torch.from_numpy(cos.astype(np.float64)), torch.from_numpy(sin.astype(np.float64))


def rope(x, cos, sin, inverse=False):
    """Interleaved-pair rotation of the last r dims of x. cos/sin broadcast to [..., r/2]."""
    r = cos.shape[-1] * 2
    head, tail = x[..., :-r], x[..., -r:]
    a = tail[..., 0::2]
    b = tail[..., 1::2]
    if inverse:
        sin = -sin
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    rot = torch.stack([ra, rb], dim=-1).reshape(tail.shape)
    return torch.cat([head, rot], dim=-1)


# ----------------------------------------------------------------------------------------------
# primitive ops


def rms_norm(x, w, eps):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def softplus(z):
    return torch.clamp(z, min=0) + torch.log1p(torch.exp(-torch.abs(z)))


def sinkhorn(logits, iters, eps):
    """§2.3 step 5: softmax_row + eps, column norm, then (iters-1) x (row norm, column norm).
    logits [..., n, n], row index j = source stream, column index k = destination stream."""
    m = torch.softmax(logits, dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def hc_pre(cfg, X, fn, scale, base):
    """X [N, n, d] -> x_in [N, d], post [N, n], comb [N, n, n]."""
    n = cfg.hc
    N = X.shape[0]
    v = X.reshape(N, -1)
    rho = torch.rsqrt((v * v).mean(-1, keepdim=True) + cfg.eps)
    mu = (v @ fn.t()) * rho
    pre = torch.sigmoid(scale[0] * mu[:, :n] + base[:n]) + cfg.hc_eps
    post = 2 * torch.sigmoid(scale[1] * mu[:, n:2 * n] + base[n:2 * n])
    lg = (scale[2] * mu[:, 2 * n:] + base[2 * n:]).reshape(N, n, n)
    comb = sinkhorn(lg, cfg.sk_iters, cfg.hc_eps)
    x_in = (pre[:, :, None] * X).sum(1)
    return x_in, post, comb


def hc_post(y, X, post, comb):
    """X'_k = post_k y + sum_j comb[j,k] X_j."""
    return post[:, :, None] * y[:, None, :] + torch.einsum("njk,njd->nkd", comb, X)


def hc_head(cfg, X, fn, base, scale):
    N = X.shape[0]
    v = X.reshape(N, -1)
    rho = torch.rsqrt((v * v).mean(-1, keepdim=True) + cfg.eps)
    mu = (v @ fn.t()) * rho
    w = torch.sigmoid(scale * mu + base) + cfg.hc_eps
    return (w[:, :, None] * X).sum(1)


def visible_mask(L, nb, m):
    """[L, nb] bool: compressed entry i visible to query p iff i < floor((p+1)/m)."""
    p = torch.arange(L)
    i = torch.arange(nb)
    return i[None, :] < torch.div(p + 1, m, rounding_mode="floor")[:, None]


def window_mask(L, win):
    t = torch.arange(L)
    j = torch.arange(L)
    return (j[None, :] <= t[:, None]) & (j[None, :] > t[:, None] - win)


def compress(x, wkv, wgate, ape, normw, m, c, overlap, cos, sin, eps):
    """§3.4 compressor over one document. x [L, d] -> entries [floor(L/m), c] (normed, RoPE at i*m).
    cos/sin: tables indexed by position (at least L rows)."""
    L = x.shape[0]
    nb = L // m
    if nb == 0:
        return x.new_zeros(0, c)
    xs = x[: nb * m]
    K = (xs @ wkv.t()).reshape(nb, m, -1)
    Z = (xs @ wgate.t()).reshape(nb, m, -1) + ape[None]
    if overlap:
        Ka, Za = K[:, :, c:], Z[:, :, c:]  # current block ("a" part)
        Kb, Zb = K[:, :, :c], Z[:, :, :c]  # overlap part, feeds the next block
        Kprev = torch.cat([x.new_zeros(1, m, c), Kb[:-1]], 0)
        Zprev = torch.cat([x.new_full((1, m, c), NEG_INF), Zb[:-1]], 0)
        Kc = torch.cat([Kprev, Ka], 1)
        Zc = torch.cat([Zprev, Za], 1)
    else:
        Kc, Zc = K, Z
    S = torch.softmax(Zc, dim=1)
    C = (S * Kc).sum(1)
    C = rms_norm(C, normw, eps)
    bp = torch.arange(nb) * m
    return rope(C, cos[bp], sin[bp])


def sink_attention(q, ent, mask, sink, scale):
    """q [L, H, c], ent [E, c] (keys = values), mask [L, E] bool, sink [H].
    Returns o [L, H, c] and probabilities p [L, H, E] (sink column dropped)."""
    L, H, _ = q.shape
    z = torch.einsum("thc,ec->the", q, ent) * scale
    z = z.masked_fill(~mask[:, None, :], NEG_INF)
    zs = torch.cat([z, sink.reshape(1, H, 1).expand(L, H, 1)], dim=-1)
    p = torch.softmax(zs, dim=-1)[..., :-1]
    o = torch.einsum("the,ec->thc", p, ent)
    return o, p


def topk_lower_index(scores, k):
    """scores: numpy [..., N] (may hold -inf). Returns bool mask of the top k per row; ties -> lower
    index; -inf entries are never selected."""
    N = scores.shape[-1]
    order = np.argsort(-scores, axis=-1, kind="stable")
    sel = np.zeros(scores.shape, dtype=bool)
    kk = min(k, N)
    np.put_along_axis(sel, order[..., :kk], True, axis=-1)
    sel &= np.isfinite(scores)
    return sel


def router_weights(s, idx, route_scale):
    sI = torch.gather(s, -1, idx)
    return route_scale * sI / sI.sum(-1, keepdim=True)


def swiglu_clamped(x, w1, w3, w2, limit, g=None):
    a = x @ w1.t()
    u = x @ w3.t()
    a = torch.clamp(a, max=limit)
    u = torch.clamp(u, min=-limit, max=limit)
    h = F.silu(a) * u
    if g is not None:
        h = h * g[:, None]
    return h @ w2.t()


# ----------------------------------------------------------------------------------------------
# model


class Stats:
    def __init__(self):
        self.kl_sum = {}
        self.kl_cnt = {}
        self.balance = []
        self.router_gap = math.inf  # smallest gap at the router top-k cut (diagnostic)
        self.index_gap = math.inf  # smallest non-tie gap at the indexer top-k cut (diagnostic)
        self.debug = None  # optional dict to collect attention probabilities


class DSV4:
    def __init__(self, cfg, weights, indexer_mode="dense", balance_weight=1e-4, dtype=DT):
        self.cfg = cfg
        self.dtype = dtype  # float64 always for the oracle; float32 only for tolerance experiments
        self.mode = indexer_mode
        self.alpha = balance_weight
        self.P = {}
        self.trainable = []
        for name, arr in weights.items():
            if name.endswith(".tid2eid"):
                t = torch.from_numpy(np.asarray(arr).astype(np.int64))
                E = cfg.n_experts
                if t.min() < 0 or t.max() >= E:
                    raise ValueError(f"{name}: expert index out of range")
                srt, _ = torch.sort(t, dim=-1)
                if (srt[:, 1:] == srt[:, :-1]).any():
                    raise ValueError(f"{name}: a row holds a repeated expert")
                self.P[name] = t
                continue
            npdt = np.float64 if dtype == torch.float64 else np.float32  # fp32/bf16 runs: no float64 copy
            t = torch.from_numpy(np.asarray(arr, dtype=npdt).copy()).to(dtype)
            if name.endswith(".scale"):
                raise ValueError(f"{name}: quantisation scale tensors are not supported by the reference")
            if not name.endswith(".ffn.gate.bias"):
                t.requires_grad_(True)
                self.trainable.append(name)
            self.P[name] = t
        self.ropes = {}
        self.chunk = 0  # query chunk of the attention (0: max(window, 64)); only speed depends on it

    def w(self, name):
        if name not in self.P:
            raise KeyError(f"weights: missing tensor '{name}'")
        return self.P[name]

    def tables(self, ratio, npos):
        key = (ratio, npos)
        if key not in self.ropes:
            self.ropes[key] = tuple(t.to(self.dtype) for t in rope_table(self.cfg, ratio, npos))
        return self.ropes[key]

    # ---- attention over one document --------------------------------------------------------
    def attention_doc(self, pfx, li, ratio, x, stats):
        cfg = self.cfg
        L = x.shape[0]
        H, c = cfg.n_heads, cfg.head_dim
        eps = cfg.eps
        cos, sin = self.tables(ratio, max(L, 1))
        a = pfx + "attn."
        qr = rms_norm(x @ self.w(a + "wq_a.weight").t(), self.w(a + "q_norm.weight"), eps)
        q = (qr @ self.w(a + "wq_b.weight").t()).reshape(L, H, c)
        q = rms_norm(q, None, eps)
        q = rope(q, cos[:L, None, :], sin[:L, None, :])
        kv = rms_norm(x @ self.w(a + "wkv.weight").t(), self.w(a + "kv_norm.weight"), eps)
        kv = rope(kv, cos[:L], sin[:L])
        ent = kv
        mask = window_mask(L, cfg.window)
        nwin = L
        I = None
        sel = None
        if ratio > 0:
            overlap = ratio == 4
            C = compress(x, self.w(a + "compressor.wkv.weight"), self.w(a + "compressor.wgate.weight"),
                         self.w(a + "compressor.ape"), self.w(a + "compressor.norm.weight"),
                         ratio, c, overlap, cos, sin, eps)
            nb = C.shape[0]
            vis = visible_mask(L, nb, ratio)
            if overlap and nb > 0:
                I = self.indexer_scores(a + "indexer.", x.detach(), qr.detach(), L, cos, sin)
                I_np = I.detach().double().masked_fill(~vis, NEG_INF).numpy()  # double(): bf16 under autocast
                top = topk_lower_index(I_np, cfg.idx_topk)
                self._note_index_gap(I_np, top, stats)
                sel = torch.from_numpy(top) if self.mode == "sparse" else vis
            else:
                sel = vis
            ent = torch.cat([kv, C], 0)
            mask = torch.cat([mask, sel], 1)
        # Dense masked attention, in chunks of queries only to skip window tokens that no query of the
        # chunk can see (the result is the same as one call over all L queries and all entries).
        sink = self.w(a + "attn_sink")
        nb = ent.shape[0] - nwin
        chunk = self.chunk or max(cfg.window, 64)
        outs, pcomp, pfull = [], [], []
        for q0 in range(0, L, chunk):
            q1 = min(L, q0 + chunk)
            k0 = max(0, q0 - cfg.window + 1)
            keys = torch.cat([torch.arange(k0, q1), nwin + torch.arange(nb)])
            oc, pc = sink_attention(q[q0:q1], ent[keys], mask[q0:q1][:, keys], sink, c ** -0.5)
            outs.append(oc)
            pcomp.append(pc[:, :, q1 - k0:].detach())
            if stats.debug is not None:
                full = torch.zeros(q1 - q0, H, nwin + nb, dtype=pc.dtype)
                full[:, :, keys] = pc.detach()
                pfull.append(full)
        o = torch.cat(outs, 0)
        if stats.debug is not None:
            stats.debug.setdefault((pfx, "p"), []).append(torch.cat(pfull, 0))
        o = rope(o, cos[:L, None, :], sin[:L, None, :], inverse=True)
        if I is not None:
            self.indexer_kl(li, torch.cat(pcomp, 0), I, sel, stats)
        G, dg = cfg.o_groups, cfg.o_lora
        og = o.reshape(L, G, (H // G) * c)
        wa = self.w(a + "wo_a.weight").reshape(G, dg, (H // G) * c)
        u = torch.einsum("tgk,gdk->tgd", og, wa).reshape(L, G * dg)
        return u @ self.w(a + "wo_b.weight").t()

    def indexer_scores(self, ip, xd, qrd, L, cos, sin):
        cfg = self.cfg
        nI, cI = cfg.idx_heads, cfg.idx_dim
        qI = (qrd @ self.w(ip + "wq_b.weight").t()).reshape(L, nI, cI)
        qI = rope(qI, cos[:L, None, :], sin[:L, None, :])
        KI = compress(xd, self.w(ip + "compressor.wkv.weight"), self.w(ip + "compressor.wgate.weight"),
                      self.w(ip + "compressor.ape"), self.w(ip + "compressor.norm.weight"),
                      4, cI, True, cos, sin, cfg.eps)
        wts = (xd @ self.w(ip + "weights_proj.weight").t()) * (cI ** -0.5) * (nI ** -0.5)
        dots = torch.relu(torch.einsum("thc,sc->ths", qI, KI))
        return torch.einsum("th,ths->ts", wts, dots)

    def indexer_kl(self, li, pc, I, att, stats):
        """KL(p || softmax(I)) over the attended compressed entries, per query; p detached."""
        pc = pc.sum(1)  # [L, nb], sum over heads
        rows = att.any(1)
        pc = torch.where(att, pc, torch.zeros_like(pc))
        denom = pc.sum(1, keepdim=True)
        pn = pc / torch.where(denom > 0, denom, torch.ones_like(denom))
        Im = I.masked_fill(~att, NEG_INF)
        Im = torch.where(rows[:, None], Im, torch.zeros_like(Im))
        logq = torch.log_softmax(Im, dim=-1)
        use = att & (pn > 0)
        logq_s = torch.where(use, logq, torch.zeros_like(logq))
        pn_s = torch.where(use, pn, torch.ones_like(pn))
        terms = torch.where(use, pn_s * (torch.log(pn_s) - logq_s), torch.zeros_like(logq))
        kl = terms.sum(1)[rows].sum()
        stats.kl_sum[li] = stats.kl_sum.get(li, 0) + kl
        stats.kl_cnt[li] = stats.kl_cnt.get(li, 0) + int(rows.sum())

    @staticmethod
    def _note_index_gap(I_np, top, stats):
        for t in range(I_np.shape[0]):
            s = I_np[t]
            fin = np.isfinite(s)
            if top[t].sum() == fin.sum():
                continue  # everything visible selected: no cut
            lowest_in = s[top[t]].min()
            highest_out = s[fin & ~top[t]].max()
            gap = lowest_in - highest_out
            if gap > 0:
                scale = max(float(np.abs(s[fin]).max()), 1e-30)
                stats.index_gap = min(stats.index_gap, gap / scale)

    # ---- MoE ---------------------------------------------------------------------------------
    def moe(self, pfx, li, x, tokens, stats):
        """x [B, N, d]; tokens [B, N] (LongTensor) for hash layers."""
        cfg = self.cfg
        B, N, d = x.shape
        f = pfx + "ffn."
        xf = x.reshape(B * N, d)
        z = xf @ self.w(f + "gate.weight").t()
        s = torch.sqrt(softplus(z))
        is_hash = pfx.startswith("layers.") and li < cfg.n_hash
        K, E = cfg.topk, cfg.n_experts
        if is_hash:
            idx = self.w(f + "gate.tid2eid")[tokens.reshape(-1)]
        else:
            biased = (s.detach() + self.w(f + "gate.bias")).numpy()
            order = np.argsort(-biased, axis=-1, kind="stable")
            idx = torch.from_numpy(order[:, :K].copy())
            srt = -np.sort(-biased, axis=-1)
            if E > K:
                gap = (srt[:, K - 1] - srt[:, K]).min()
                stats.router_gap = min(stats.router_gap, float(gap))
        g = router_weights(s, idx, cfg.route_scale)
        sh = f + "shared_experts."
        y = swiglu_clamped(xf, self.w(sh + "w1.weight"), self.w(sh + "w3.weight"), self.w(sh + "w2.weight"),
                           cfg.swiglu_limit)
        for e in range(E):
            hit = (idx == e)
            rows, slots = torch.nonzero(hit, as_tuple=True)
            if rows.numel() == 0:
                continue
            ep = f"{f}experts.{e}."
            ye = swiglu_clamped(xf[rows], self.w(ep + "w1.weight"), self.w(ep + "w3.weight"),
                                self.w(ep + "w2.weight"), cfg.swiglu_limit, g[rows, slots])
            y = y.index_add(0, rows, ye)
        if not is_hash:
            counts = torch.zeros(B * N, E, dtype=s.dtype)
            counts.scatter_(1, idx, 1.0)
            fcoef = (E / (K * N)) * counts.reshape(B, N, E).sum(1)  # constant
            Pi = (s / s.sum(-1, keepdim=True)).reshape(B, N, E).mean(1)
            stats.balance.append((self.alpha * (fcoef * Pi).sum(-1)).mean())
        return y.reshape(B, N, d)

    # ---- block -------------------------------------------------------------------------------
    def block(self, pfx, li, ratio, X, segs, tokens, stats):
        """X [B, N, n, d]; segs: per row a list of (start, end) documents."""
        B, N, n, d = X.shape
        Xf = X.reshape(B * N, n, d)
        x_in, post, comb = hc_pre(self.cfg, Xf, self.w(pfx + "hc_attn_fn"), self.w(pfx + "hc_attn_scale"),
                                  self.w(pfx + "hc_attn_base"))
        xn = rms_norm(x_in, self.w(pfx + "attn_norm.weight"), self.cfg.eps).reshape(B, N, d)
        rows = []
        for b in range(B):
            parts = [self.attention_doc(pfx, li, ratio, xn[b, s:e], stats) for (s, e) in segs[b]]
            rows.append(torch.cat(parts, 0))
        y = torch.stack(rows, 0).reshape(B * N, d)
        Xf = hc_post(y, Xf, post, comb)
        x_in, post, comb = hc_pre(self.cfg, Xf, self.w(pfx + "hc_ffn_fn"), self.w(pfx + "hc_ffn_scale"),
                                  self.w(pfx + "hc_ffn_base"))
        xn = rms_norm(x_in, self.w(pfx + "ffn_norm.weight"), self.cfg.eps).reshape(B, N, d)
        y = self.moe(pfx, li, xn, tokens, stats).reshape(B * N, d)
        Xf = hc_post(y, Xf, post, comb)
        return Xf.reshape(B, N, n, d)

    def head_logits(self, X, hpfx, normname):
        B, N, n, d = X.shape
        h = hc_head(self.cfg, X.reshape(B * N, n, d), self.w(hpfx + "hc_head_fn"), self.w(hpfx + "hc_head_base"),
                    self.w(hpfx + "hc_head_scale"))
        h = rms_norm(h, self.w(normname), self.cfg.eps)
        return (h @ self.w("head.weight").t()).reshape(B, N, -1)

    # ---- full forward ------------------------------------------------------------------------
    def forward(self, tokens, doc_ids, stats):
        """tokens, doc_ids: LongTensor [B, T]. Returns logits [B,T,V], mtp_logits [B,T-1,V] or None."""
        cfg = self.cfg
        B, T = tokens.shape
        segs = [segments(doc_ids[b].tolist()) for b in range(B)]
        emb = self.w("embed.weight")[tokens]  # [B, T, d]
        X = emb[:, :, None, :].expand(B, T, cfg.hc, cfg.d)
        for li in range(cfg.n_layers):
            X = self.block(f"layers.{li}.", li, cfg.ratios[li], X, segs, tokens, stats)
        logits = self.head_logits(X, "", "norm.weight")
        mtp_logits = None
        if cfg.n_mtp > 0 and T >= 2:
            p = "mtp.0."
            segs_m = [segments(doc_ids[b, : T - 1].tolist()) for b in range(B)]
            e = rms_norm(self.w("embed.weight")[tokens[:, 1:]], self.w(p + "enorm.weight"), cfg.eps)
            h = rms_norm(X[:, : T - 1], self.w(p + "hnorm.weight"), cfg.eps)
            Z = (e @ self.w(p + "e_proj.weight").t())[:, :, None, :] + h @ self.w(p + "h_proj.weight").t()
            Z = self.block(p, cfg.n_layers, cfg.ratios[cfg.n_layers], Z, segs_m, tokens[:, : T - 1], stats)
            mtp_logits = self.head_logits(Z, p, p + "norm.weight")
        elif cfg.n_mtp > 0:
            mtp_logits = logits[:, :0]  # T = 1: no MTP position
        return logits, mtp_logits


def segments(ids):
    """Maximal runs of equal ids -> list of (start, end)."""
    out = []
    s = 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or ids[t] != ids[s]:
            out.append((s, t))
            s = t
    return out


def cross_entropy_mean(logits, targets, valid):
    """Mean over valid positions of -log softmax(logits)[target]; 0 when none are valid."""
    if int(valid.sum()) == 0:
        return logits.sum() * 0.0 + 0.0  # +0.0 keeps the graph and avoids -0
    lse = torch.logsumexp(logits, dim=-1)
    tgt = torch.gather(logits, -1, targets[..., None])[..., 0]
    nll = lse - tgt
    return nll[valid].sum() / valid.sum()


def compute(model, tokens, loss_mask, doc_ids, mtp_weight=0.3, indexer_weight=1.0):
    """Returns (outputs dict of tensors, total loss tensor, stats)."""
    stats = Stats()
    B, T = tokens.shape
    logits, mtp_logits = model.forward(tokens, doc_ids, stats)
    m = loss_mask.bool()
    same = doc_ids[:, 1:] == doc_ids[:, :-1]  # [B, T-1]: doc[t] == doc[t-1] for t>=1
    valid = m[:, 1:] & same
    loss_main = cross_entropy_mean(logits[:, :-1], tokens[:, 1:], valid)
    zero = logits.sum() * 0.0 + 0.0
    loss_mtp = zero
    if mtp_logits is not None and T >= 3:
        vm = m[:, 2:] & same[:, :-1] & same[:, 1:]
        loss_mtp = cross_entropy_mean(mtp_logits[:, :-1], tokens[:, 2:], vm)
    loss_bal = sum(stats.balance) if stats.balance else zero
    loss_idx = zero
    for li in sorted(stats.kl_sum):
        if stats.kl_cnt[li] > 0:
            loss_idx = loss_idx + stats.kl_sum[li] / stats.kl_cnt[li]
    loss = loss_main + mtp_weight * loss_mtp + loss_bal + indexer_weight * loss_idx
    out = dict(logits=logits, mtp_logits=mtp_logits, loss=loss, loss_main=loss_main, loss_mtp=loss_mtp,
               loss_balance=loss_bal, loss_indexer=loss_idx)
    return out, loss, stats


def load_batch(path):
    b, _ = st.load(path)
    if "tokens" not in b:
        raise ValueError(f"{path}: no 'tokens' tensor")
    tokens = torch.from_numpy(b["tokens"].astype(np.int64))
    if tokens.dim() != 2:
        raise ValueError(f"{path}: tokens must be [B,T]")
    mask = torch.from_numpy(b["loss_mask"].astype(np.int64)) if "loss_mask" in b else torch.ones_like(tokens)
    docs = torch.from_numpy(b["doc_ids"].astype(np.int64)) if "doc_ids" in b else torch.zeros_like(tokens)
    return tokens, mask, docs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--indexer-mode", choices=["dense", "sparse"], default="dense")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--balance-weight", type=float, default=1e-4)
    ap.add_argument("--indexer-weight", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the float64 BLAS here is single-threaded and extra "
                         "OpenMP threads only spin on a shared machine; 0 leaves torch's default)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                    help="float64 (the oracle); float32 only to estimate what an fp32 engine can reach")
    a = ap.parse_args(argv)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cfg = Config.load(a.config)
    weights, _ = st.load(a.weights)
    model = DSV4(cfg, weights, a.indexer_mode, a.balance_weight,
                 torch.float64 if a.dtype == "float64" else torch.float32)
    tokens, mask, docs = load_batch(a.batch)
    if tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise ValueError("tokens out of range")
    with torch.set_grad_enabled(a.backward):
        out, loss, stats = compute(model, tokens, mask, docs, a.mtp_weight, a.indexer_weight)
    res = {}
    for k, v in out.items():
        if v is None:
            continue
        res[k] = v.detach().numpy().astype(np.float32)
    if a.backward:
        loss.backward()
        for name in model.trainable:
            p = model.P[name]
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            res["grad." + name] = g.numpy().astype(np.float32)
    st.save(a.out, res)
    print(f"dsv4_ref: loss={float(loss):.8f} main={float(out['loss_main']):.8f} "
          f"mtp={float(out['loss_mtp']):.8f} balance={float(out['loss_balance']):.6e} "
          f"indexer={float(out['loss_indexer']):.8f} router_gap={stats.router_gap:.3e} "
          f"index_rel_gap={stats.index_gap:.3e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
