#!/usr/bin/env python3
"""Compares the output of `trex model run` with the PyTorch reference's.

  compare.py C_OUT REF_OUT --case NAME

Prints exactly one line
  ref-compare: <case> logits=<rel err> losses=<rel err> grads=<worst rel err> (<tensor>)
rel err = max-abs error / max-abs of the reference tensor (logits: worst of logits and mtp_logits;
losses: worst of the 5 scalars, each relative to |ref| (absolute error where ref is exactly 0);
grads: worst over all grad.* tensors; a reference grad that is exactly all-zero is judged by absolute
error <= 1e-6 instead). Exits 1 if logits or losses > 1e-5, any grad > 1e-4, a tensor is missing on
either side, shapes differ, or any value is not finite.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

TOL_LOGITS = 1e-5
TOL_LOSSES = 1e-5
TOL_GRADS = 1e-4
TOL_ZERO_GRAD = 1e-6
LOSSES = ("loss", "loss_main", "loss_mtp", "loss_balance", "loss_indexer")


def rel_err(c, r):
    """(error, is_absolute). inf when anything is not finite."""
    c = c.astype(np.float64)
    r = r.astype(np.float64)
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
        return float("inf"), False
    err = float(np.max(np.abs(c - r))) if r.size else 0.0
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    if scale == 0.0:
        return err, True
    return err / scale, False


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("c_out")
    ap.add_argument("ref_out")
    ap.add_argument("--case", required=True)
    a = ap.parse_args(argv)
    problems = []
    try:
        C, _ = st.load(a.c_out)
    except Exception as e:  # noqa: BLE001
        print(f"ref-compare: {a.case} logits=n/a losses=n/a grads=n/a (cannot read {a.c_out}: {e})")
        return 1
    Rf, _ = st.load(a.ref_out)

    def get(name):
        if name not in C:
            problems.append(f"missing in C output: {name}")
            return None
        if name not in Rf:
            problems.append(f"missing in reference output: {name}")
            return None
        if list(C[name].shape) != list(Rf[name].shape):
            problems.append(f"shape of {name}: C {list(C[name].shape)} vs ref {list(Rf[name].shape)}")
            return None
        return rel_err(C[name], Rf[name])

    logit_err = 0.0
    for name in ("logits", "mtp_logits"):
        e = get(name)
        if e is not None:
            logit_err = max(logit_err, e[0])
        elif name == "logits" or name in C or name in Rf:
            logit_err = float("inf")
    loss_err = 0.0
    for name in LOSSES:
        e = get(name)
        loss_err = max(loss_err, e[0] if e is not None else float("inf"))
    gnames = sorted(set(k for k in list(C) + list(Rf) if k.startswith("grad.")))
    worst_score, worst_err, worst_name = 0.0, 0.0, "none"
    if not gnames:
        problems.append("no grad.* tensors")
        worst_score, worst_err, worst_name = float("inf"), float("inf"), "none"
    for name in gnames:
        e = get(name)
        if e is None:
            score, err = float("inf"), float("inf")
        else:
            err, absolute = e
            score = err / (TOL_ZERO_GRAD if absolute else TOL_GRADS)
        if score > worst_score or worst_name == "none":
            worst_score, worst_err, worst_name = score, err, name[len("grad."):]
    fail = bool(problems) or not (logit_err <= TOL_LOGITS) or not (loss_err <= TOL_LOSSES) or \
        not (worst_score <= 1.0)
    tail = ""
    if problems:
        tail = f" [{len(problems)} problem(s): {problems[0]}{' ...' if len(problems) > 1 else ''}]"
    print(f"ref-compare: {a.case} logits={logit_err:.3e} losses={loss_err:.3e} "
          f"grads={worst_err:.3e} ({worst_name}){tail}")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
