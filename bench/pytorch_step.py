#!/usr/bin/env python3
"""Trains the DeepSeek-V4 model of tests/ref/dsv4_ref.py (the independent PyTorch reference of the C
engine, imported, not rewritten) in PyTorch, to compare trex's training step against PyTorch's on the
same config (bench/compare.sh, docs/perf.md "Against PyTorch").

  bench/pytorch_step.py --config C --seq T --mbs B [--steps N] [--warmup W] [--threads 2]
                        [--weights FILE] [--optimizer adamw] [--fp32] [--indexer-mode dense|sparse]
                        [--save-batch FILE] [--seed S] [--mem-limit-gib G] [--json]

One step = forward under torch.autocast("cpu", dtype=torch.bfloat16) (fp32 with --fp32), the losses
of trex (main + 0.3 MTP + balance 1e-4 + indexer KL, as dsv4_ref.compute builds them), backward, global
grad-norm clip to 1.0 and a torch.optim.AdamW step (trex's AdamW settings of docs/optim.md: lr 2.7e-4,
betas 0.9/0.95, eps 1e-20, weight decay 0.1 on 2-D tensors only). Parameters are fp32 torch leaves.
Not done (as in trex, outside the timed product work): the router-bias rule update of ffn.gate.bias.

Weights: --weights FILE (e.g. from `trex model init --config C --seed 1 --out FILE`), else random ones
from tests/ref/make_case.py (seed --seed). Tokens: uniform random in [0, vocab), a fresh [B, T] batch
per step from a fixed seed; --save-batch writes the first one (tokens I32 [B,T]) for `trex model run`.

Prints one line per step (wall and process CPU seconds, loss); with --json the last line is one JSON
object: tokens_per_s (B*T / median step wall time over the timed steps), step_s, cpu_s (median process
CPU seconds per step), peak_rss_mib, losses, first_loss, seq, mbs, threads, torch_version, ...
Out of memory (a failed allocation; the address space is capped by --mem-limit-gib so that the
allocation fails in Python rather than the kernel's OOM killer ending the process) prints
`pytorch_step: out of memory ...` (and a JSON object with "error") and exits with status 3.
"""
import argparse
import gc
import json
import math
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
import dsv4_ref  # noqa: E402
import st  # noqa: E402

EXIT_OOM = 3


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def vm_size_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    return 0


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def is_oom(e):
    if isinstance(e, MemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in msg or "not enough memory" in msg
                                            or "std::bad_alloc" in msg)


def load_weights(path):
    """name -> read-only numpy view of the file (np.memmap): no whole-file copy in memory, unlike st.load;
    DSV4 copies each tensor into its own torch parameter. BF16 tensors are widened (copied)."""
    header, start = st.read_header(path)
    header.pop("__metadata__", None)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in st._NP:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        shape = [int(x) for x in info["shape"]]
        b, e = (int(x) for x in info["data_offsets"])
        npdt = st._NP[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * npdt.itemsize or start + e > mm.size:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {b},{e} for {dt} {shape}")
        arr = mm[start + b:start + e].view(npdt).reshape(shape)
        out[name] = st.bf16_bits_to_f32(arr) if dt == "BF16" else arr
    return out


def make_optimizer(model, name):
    if name != "adamw":
        raise ValueError(f"--optimizer {name}: only adamw is supported")
    decay = [model.P[n] for n in model.trainable if model.P[n].dim() >= 2]
    no_decay = [model.P[n] for n in model.trainable if model.P[n].dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=2.7e-4, betas=(0.9, 0.95), eps=1e-20)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="model config.json")
    ap.add_argument("--seq", type=int, required=True, help="tokens per row T")
    ap.add_argument("--mbs", type=int, default=1, help="rows per step B [1]")
    ap.add_argument("--steps", type=int, default=3, help="timed steps [3]")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first [1]")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads [2]")
    ap.add_argument("--weights", help="weights .safetensors (default: random, tests/ref/make_case.py)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the tokens (and of random weights) [1]")
    ap.add_argument("--optimizer", default="adamw", help="adamw (the only one: torch has no Muon) [adamw]")
    ap.add_argument("--fp32", "--no-autocast", dest="fp32", action="store_true",
                    help="no bf16 autocast: the whole step in fp32")
    ap.add_argument("--indexer-mode", choices=["dense", "sparse"], default="sparse",
                    help="CSA attention: all visible compressed entries, or the indexer's top-k [sparse]")
    ap.add_argument("--save-batch", help="write the first step's tokens (I32 [B,T]) to this .safetensors")
    ap.add_argument("--mem-limit-gib", type=float, default=None,
                    help="cap on new address space in GiB so that running out of memory is an error "
                         "(default: MemAvailable at start; 0: no cap)")
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    a = ap.parse_args(argv)
    for k in ("seq", "mbs", "steps", "threads"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be >= 1")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    if a.optimizer != "adamw":
        ap.error(f"--optimizer {a.optimizer}: only adamw (torch 1.13 has no Muon)")

    info = dict(config=os.path.basename(a.config), seq=a.seq, mbs=a.mbs, threads=a.threads,
                steps=a.steps, warmup=a.warmup, precision="fp32" if a.fp32 else "bf16-autocast",
                optimizer=a.optimizer, indexer_mode=a.indexer_mode, torch_version=torch.__version__,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""))

    def fail_oom(where, e):
        msg = f"out of memory during {where} at T={a.seq} B={a.mbs} (peak RSS {peak_rss_mib():.0f} MiB): " \
              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        print(f"pytorch_step: {msg}", file=sys.stderr, flush=True)
        if a.json:
            print(json.dumps(dict(info, error=msg, peak_rss_mib=round(peak_rss_mib(), 1))), flush=True)
        return EXIT_OOM

    limit = a.mem_limit_gib
    if limit is None:
        cap_kib = meminfo_kib("MemAvailable")
    else:
        cap_kib = int(limit * 1024 * 1024)
    if cap_kib > 0:
        cap = (vm_size_kib() + cap_kib) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = dsv4_ref.Config.load(a.config)
    t0 = time.perf_counter()
    try:
        if a.weights:
            weights = load_weights(a.weights)
        else:
            import make_case  # noqa: E402 (tests/ref)
            weights = make_case.random_weights(cfg, np.random.default_rng(a.seed))
        model = dsv4_ref.DSV4(cfg, weights, a.indexer_mode, 1e-4, torch.float32)
        del weights
        gc.collect()
        opt = make_optimizer(model, a.optimizer)
    except (MemoryError, RuntimeError) as e:
        if is_oom(e):
            return fail_oom("weight loading", e)
        raise
    info["load_s"] = round(time.perf_counter() - t0, 2)
    info["params"] = int(sum(model.P[n].numel() for n in model.trainable))
    print(f"pytorch_step: {info['config']} {info['params'] / 1e6:.2f}M trainable params, T={a.seq} B={a.mbs}, "
          f"{info['precision']}, {a.threads} threads, torch {torch.__version__}, loaded in {info['load_s']}s",
          file=sys.stderr, flush=True)

    params = [model.P[n] for n in model.trainable]
    gen = torch.Generator().manual_seed(a.seed)
    B, T = a.mbs, a.seq
    mask = torch.ones(B, T, dtype=torch.long)
    docs = torch.zeros(B, T, dtype=torch.long)
    walls, cpus, losses, norms = [], [], [], []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, cfg.vocab, (B, T), generator=gen, dtype=torch.long)
        if step == 0 and a.save_batch:
            st.save(a.save_batch, {"tokens": tokens.numpy().astype(np.int32)})
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not a.fp32):
                out, loss, _ = dsv4_ref.compute(model, tokens, mask, docs)
            parts = {k: float(out[k]) for k in ("loss_main", "loss_mtp", "loss_balance", "loss_indexer")}
            loss.backward()
            del out
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        except (MemoryError, RuntimeError) as e:
            if is_oom(e):
                return fail_oom(f"step {step}", e)
            raise
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        lv = float(loss)
        del loss
        losses.append(lv)
        norms.append(float(gn))
        tag = "warmup" if step < a.warmup else "step"
        print(f"{tag} {step}: {wall:.3f} s wall, {cpu:.3f} s cpu, {B * T / wall:.1f} tokens/s, loss {lv:.6f} "
              f"(main {parts['loss_main']:.6f} mtp {parts['loss_mtp']:.6f} balance {parts['loss_balance']:.3e} "
              f"indexer {parts['loss_indexer']:.6f}) grad-norm {float(gn):.4f}, peak RSS {peak_rss_mib():.0f} MiB",
              file=sys.stderr, flush=True)
        if step == 0:
            info["first_losses"] = dict(loss=lv, **parts)
        if step >= a.warmup:
            walls.append(wall)
            cpus.append(cpu)
    step_s = statistics.median(walls)
    res = dict(info, tokens_per_s=round(B * T / step_s, 3), step_s=round(step_s, 4),
               cpu_s=round(statistics.median(cpus), 4),
               tokens_per_cpu_s=round(B * T / statistics.median(cpus), 3),
               step_times=[round(x, 4) for x in walls], peak_rss_mib=round(peak_rss_mib(), 1),
               first_loss=losses[0], losses=losses, grad_norms=norms,
               finite=all(math.isfinite(x) for x in losses))
    print(f"pytorch_step: {res['tokens_per_s']:.2f} tokens/s (median of {a.steps} steps, {step_s:.3f} s/step, "
          f"{res['cpu_s']:.3f} cpu s/step), peak RSS {res['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
