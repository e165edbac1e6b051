"""tests/ref/bounds.py — the shared pieces of the suite's bound checks (tests/test_precision.sh): a
safetensors output as flat float64 arrays, the relative L2 error, and a checker that prints each
measure against its bound and collects the names of those out of bounds."""
import numpy as np

import st  # the suite's safetensors reader


def load(path):
    return {k: v.astype(np.float64).ravel() for k, v in st.load(path)[0].items()}


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class Checks:
    """check(name, value, bound): value <= bound, or with worse_if_below value >= bound; printed as
    '<label>: <name padded to width> <value> (bound <= <bound>)', '  FAIL' appended when out."""

    def __init__(self, label, width):
        self.label, self.width, self.fails = label, width, []

    def check(self, name, val, lim, worse_if_below=False):
        bad = val < lim if worse_if_below else not (val <= lim)
        print("%s: %-*s %.3e (bound %s %.1e)%s" % (self.label, self.width, name, val,
                                                   ">=" if worse_if_below else "<=", lim,
                                                   "  FAIL" if bad else ""))
        if bad:
            self.fails.append(name)
