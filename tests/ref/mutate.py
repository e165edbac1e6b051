#!/usr/bin/env python3
"""Sensitivity check of the reference comparison (a development tool, not part of the test suite):
runs `trex model run` once on a small packed and masked case, then runs the reference with one
deliberate mistake at a time (the easy mistakes of MODEL_SPEC §12 and a few more) and checks that
compare.py rejects every one of them. The unmutated reference must be accepted.

  mutate.py --trex build/trex [--config configs/dsv4-tiny.json] [--T 96]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dsv4_ref as R  # noqa: E402

ORIG = {k: getattr(R, k) for k in ("rope", "compress", "sinkhorn", "swiglu_clamped", "rope_freqs_fp32",
                                  "visible_mask", "window_mask", "load_batch", "hc_pre", "router_weights")}
ORIG_MOE = R.DSV4.moe


def restore():
    for k, v in ORIG.items():
        setattr(R, k, v)
    R.DSV4.moe = ORIG_MOE


def m_no_inverse_rope():
    R.rope = lambda x, c, s, inverse=False: x if inverse else ORIG["rope"](x, c, s)


def m_comp_rope_last_token():
    def comp(x, wkv, wgate, ape, normw, m, c, overlap, cos, sin, eps):
        if x.shape[0] >= m:
            cos, sin = cos[m - 1:], sin[m - 1:]
        return ORIG["compress"](x, wkv, wgate, ape, normw, m, c, overlap, cos, sin, eps)
    R.compress = comp


def m_overlap_swapped():
    def comp(x, wkv, wgate, ape, normw, m, c, overlap, cos, sin, eps):
        if overlap:
            wkv = torch.cat([wkv[c:], wkv[:c]])
            wgate = torch.cat([wgate[c:], wgate[:c]])
            ape = torch.cat([ape[:, c:], ape[:, :c]], 1)
        return ORIG["compress"](x, wkv, wgate, ape, normw, m, c, overlap, cos, sin, eps)
    R.compress = comp


def m_no_ape():
    R.compress = lambda x, wkv, wgate, ape, *a: ORIG["compress"](x, wkv, wgate, ape * 0, *a)


def m_sinkhorn_19():
    R.sinkhorn = lambda lg, it, eps: ORIG["sinkhorn"](lg, it - 1, eps)


def m_swa_yarn():
    R.rope_freqs_fp32 = lambda cfg, ratio: ORIG["rope_freqs_fp32"](cfg, 4)


def m_no_yarn():
    def f(cfg, ratio):
        y = cfg.yarn
        cfg.yarn = None
        try:
            return ORIG["rope_freqs_fp32"](cfg, ratio)
        finally:
            cfg.yarn = y
    R.rope_freqs_fp32 = f


def m_visibility():
    R.visible_mask = lambda L, nb, m: ORIG["visible_mask"](L + 1, nb, m)[1:]


def m_window():
    R.window_mask = lambda L, w: ORIG["window_mask"](L, w + 1)


def m_shared_unclamped():
    def sw(x, w1, w3, w2, limit, g=None):
        return ORIG["swiglu_clamped"](x, w1, w3, w2, limit if g is not None else 1e9, g)
    R.swiglu_clamped = sw


def m_mask_on_inputs():
    def lb(path):
        t, m, d = ORIG["load_batch"](path)
        return t, torch.cat([m[:, 1:], m[:, -1:]], 1), d
    R.load_batch = lb


def m_normalised_pre_sum():
    def hp(cfg, X, fn, scale, base):
        x_in, post, comb = ORIG["hc_pre"](cfg, X, fn, scale, base)
        # recover pre from x_in is not possible; recompute it the same way as the reference
        n = cfg.hc
        v = X.reshape(X.shape[0], -1)
        mu = (v @ fn.t()) * torch.rsqrt((v * v).mean(-1, keepdim=True) + cfg.eps)
        pre = torch.sigmoid(scale[0] * mu[:, :n] + base[:n]) + cfg.hc_eps
        return (pre[:, :, None] * R.rms_norm(X, None, cfg.eps)).sum(1), post, comb
    R.hc_pre = hp


def m_router_unnormalised():
    R.router_weights = lambda s, idx, rs: rs * torch.gather(s, -1, idx)


def m_balance_on_hash():
    def moe(self, pfx, li, x, tokens, stats):
        n0 = len(stats.balance)
        y = ORIG_MOE(self, pfx, li, x, tokens, stats)
        if len(stats.balance) == n0:  # a hash layer: add the balance term it should not have
            stats.balance.append(stats.balance[-1] if stats.balance else x.sum() * 0 + 1e-4)
        return y
    R.DSV4.moe = moe


MUTATIONS = [
    ("no inverse RoPE on the output", m_no_inverse_rope),
    ("compressed RoPE at the block's last token", m_comp_rope_last_token),
    ("CSA overlap halves swapped", m_overlap_swapped),
    ("compressor ape ignored", m_no_ape),
    ("Sinkhorn with 19 column normalisations", m_sinkhorn_19),
    ("SWA layers with compress theta + YaRN", m_swa_yarn),
    ("no YaRN in compressed layers", m_no_yarn),
    ("visibility off by one", m_visibility),
    ("window one token too wide", m_window),
    ("shared expert not clamped", m_shared_unclamped),
    ("loss mask read on inputs instead of targets", m_mask_on_inputs),
    ("streams normalised before the pre-sum", m_normalised_pre_sum),
    ("router weights not renormalised", m_router_unnormalised),
    ("balance loss in hash layers", m_balance_on_hash),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trex", required=True)
    ap.add_argument("--config", default="configs/dsv4-tiny.json")
    ap.add_argument("--T", type=int, default=96)
    a = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        w, b, c, r = (os.path.join(d, n) for n in ("w.st", "b.st", "c.st", "r.st"))
        subprocess.run([py, os.path.join(HERE, "make_case.py"), "--config", a.config, "--seed", "3", "--B", "1",
                        "--T", str(a.T), "--packed", "--mask", "--weights", w, "--batch", b], check=True)
        subprocess.run([a.trex, "model", "run", "--config", a.config, "--weights", w, "--batch", b, "--out", c,
                        "--backward"], check=True, stdout=subprocess.DEVNULL)
        npass = nfail = 0
        for name, mut in [("(none)", None)] + MUTATIONS:
            restore()
            if mut:
                mut()
            R.main(["--config", a.config, "--weights", w, "--batch", b, "--out", r, "--backward"])
            p = subprocess.run([py, os.path.join(HERE, "compare.py"), c, r, "--case", name], capture_output=True,
                               text=True)
            good = (p.returncode == 0) if mut is None else (p.returncode != 0)
            npass += good
            nfail += not good
            print(f"{'ok  ' if good else 'FAIL'} {'accepted' if p.returncode == 0 else 'rejected'}: "
                  f"{p.stdout.strip()}", flush=True)
        restore()
        print(f"{npass} passed, {nfail} failed")
        return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
