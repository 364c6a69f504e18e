#!/usr/bin/env python3
"""Session 8's experiment on the rope partner channel (benchmarks/RESULTS.md, session 8).

    python benchmarks/experiments/s8_transform_rope/rope_partner.py kernel t0,t1,t3,t4   # $OUT/tf_variants.json
    python benchmarks/experiments/s8_transform_rope/rope_partner.py decode OLD_TREE
    python benchmarks/experiments/s8_transform_rope/rope_partner.py backward b0,b1   # $OUT/tf_bwd_tiles_<v>.json

``kernel``: gated_delta_rule_rope's forward transform kernel alone (launched directly, no host work) at
4x4096x16x128 bf16, per variant (t0..t4, each file says what it is) and per (rows per program, warps), with
its bytes over the time. ``decode``: a decode step of fused_recurrent_gated_delta_rule_rope (T = 1, no
autograd: the transforms inline in the recurrent kernel) of the generated tree under OLD_TREE (a directory
holding generated/, e.g. ``git archive <rev> generated | tar -x -C OLD_TREE``) against the checkout's, in one
process, interleaved. ``backward``: the backward transform kernel alone (the checkout's generated one, or the
variants b0 / b1), per (rows per program, warps). Needs a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "benchmarks")]

OP = "gated_delta_rule_rope"


def launch_transform(kernel, x, ys, rows, H, K, BR, warps):
    kernel[(triton.cdiv(rows, BR),)](x["q"], x["k"], x["g"], x["beta"], x["A_log"], x["dt_bias"], *ys, x["pos"], K,
                                     rows, H, K, K, BR=BR, BK=K, BV=K, SAME_TOKEN=H % BR == 0, num_warps=warps)


def kernel_variants(names: list[str]) -> None:
    B, T, H, K = 4, 4096, 16, 128
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    x = {"q": randn(B, T, H, K).bfloat16(), "k": randn(B, T, H, K).bfloat16(), "g": randn(B, T, H).bfloat16(),
         "beta": randn(B, T, H).bfloat16(), "A_log": randn(H), "dt_bias": randn(H),
         "pos": torch.arange(T, device="cuda", dtype=torch.int32).repeat(B)}
    rows = B * T * H
    # q, k in and out (bf16); g in (bf16) and out (fp32); beta in and out (bf16)
    nbytes = rows * (4 * K * 2 + 2 + 4 + 2 * 2)
    first, out = None, []
    for name in names:
        kernel = importlib.import_module(name).gated_delta_rule_rope_transform_fwd_kernel
        for BR, warps in [(8, 4), (16, 4), (16, 8), (32, 8)]:
            ys = (torch.empty_like(x["q"]), torch.empty_like(x["k"]), torch.empty(B, T, H, device="cuda"),
                  torch.empty_like(x["beta"]))
            run = partial(launch_transform, kernel, x, ys, rows, H, K, BR, warps)
            run()
            torch.cuda.synchronize()
            ms = min(do_bench(run, warmup=25, rep=100, return_mode="median") for _ in range(3))
            first = first or [y.float().clone() for y in ys]
            err = max(((y.float() - f).norm() / f.norm()).item() for y, f in zip(ys, first, strict=True))
            out.append({"variant": name, "BR": BR, "warps": warps, "ms": ms, "GBps": nbytes / ms / 1e6,
                        "rel_err_vs_first": err})
            print(json.dumps(out[-1]), flush=True)
    src = torch.empty(256 * 2**20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / do_bench(partial(dst.copy_, src), return_mode="median") / 1e6
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "tf_variants.json"), "w") as f:
            json.dump({"rows": out, "copy_GBps": copy, "bytes": nbytes}, f, indent=1)
    print(f"bytes {nbytes / 1e6:.0f} MB, copy {copy:.0f} GB/s")
    for r in out:
        print(f"{r['variant']} BR={r['BR']} w={r['warps']}: {r['ms']:.4f} ms  {r['GBps']:.0f} GB/s  "
              f"err {r['rel_err_vs_first']:.1e}")


def backward_tiles(variants: list[str]) -> None:
    for name in variants:
        module = importlib.import_module(f"generated.{OP}.transforms" if name == "generated" else name)
        print(name, flush=True)
        backward_tiles_of(name, module.gated_delta_rule_rope_transform_bwd_kernel)


def backward_tiles_of(name: str, kernel) -> None:
    B, T, H, K = 4, 4096, 16, 128
    rows = B * T * H
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    x = [randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H), randn(B, T, H)]
    heads = [randn(H, dtype=torch.float32), randn(H, dtype=torch.float32)]
    dy = [randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, dtype=torch.float32), randn(B, T, H)]
    pos = torch.arange(T, device="cuda", dtype=torch.int32).repeat(B)
    # q, k, g, beta and their gradients in; the inputs' gradients out; two fp32 per-head partials per row
    nbytes = rows * (6 * K * 2 + 3 * 2 + 4 + 2 * 2 + 2 * 4)
    first, out = None, []
    for BR, warps in [(8, 4), (16, 4), (16, 8), (32, 8)]:
        dx = [torch.empty_like(t) for t in x]
        dp = [torch.empty(rows, device="cuda") for _ in heads]

        def run(BR=BR, warps=warps, dx=dx, dp=dp):
            kernel[(triton.cdiv(rows, BR),)](*x, *heads, *dy, *dx, *dp, pos, K, rows, H, K, K, BR=BR, BK=K, BV=K,
                                             SAME_TOKEN=H % BR == 0, num_warps=warps)
        run()
        torch.cuda.synchronize()
        ms = min(do_bench(run, warmup=25, rep=100, return_mode="median") for _ in range(3))
        first = first or [t.float().clone() for t in dx + dp]
        err = max(((t.float() - f).norm() / f.norm()).item() for t, f in zip(dx + dp, first, strict=True))
        out.append({"variant": name, "BR": BR, "warps": warps, "ms": ms, "GBps": nbytes / ms / 1e6,
                    "rel_err_vs_first": err})
        print(f"bwd BR={BR} w={warps}: {ms:.4f} ms  {nbytes / ms / 1e6:.0f} GB/s  err {err:.1e}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"tf_bwd_tiles_{name}.json"), "w") as f:
            json.dump({"rows": out, "bytes": nbytes}, f, indent=1)


def decode_ab(old_tree: Path) -> None:
    import ab_packages

    from fla_gen.cli import load_recurrence
    from fla_gen.sample import sample_inputs

    sides = {"old": ab_packages.import_old_tree(old_tree.resolve(), OP),
             "new": importlib.import_module(f"generated.{OP}")}
    fns = {s: getattr(m, f"fused_recurrent_{OP}") for s, m in sides.items()}
    rec = load_recurrence(ROOT / "specs" / f"{OP}.fla")
    for B in (64, 8):
        H, D = 16, 128
        xd = sample_inputs(rec, B, 1, H, D, D, torch.bfloat16, "cuda", seed=2)
        args = [xd[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
        h0 = torch.randn(B, H, D, D, device="cuda")
        with torch.no_grad():
            outs = {s: f(*args, initial_state=h0, output_final_state=True) for s, f in fns.items()}
            err = max(((a.float() - b.float()).norm() / b.float().norm()).item()
                      for a, b in zip(outs["new"], outs["old"], strict=True))
            best: dict[str, float] = {}
            for _ in range(3):
                for s, f in fns.items():
                    ms = do_bench(partial(f, *args, initial_state=h0, output_final_state=True), warmup=25, rep=100,
                                  return_mode="median")
                    best[s] = min(best.get(s, float("inf")), ms)
        print(f"decode B={B} H={H} D={D}: old {best['old']:.4f} ms, new {best['new']:.4f} ms, "
              f"rel err new vs old {err:.1e}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("kernel").add_argument("variants", help="comma-separated: t0,t1,t3,t4")
    sub.add_parser("decode").add_argument("old_tree", type=Path)
    sub.add_parser("backward").add_argument("variants", nargs="?", default="generated",
                                            help="comma-separated: generated (the checkout's), b0, b1")
    a = p.parse_args()
    if a.what == "kernel":
        kernel_variants(a.variants.split(","))
    elif a.what == "backward":
        backward_tiles(a.variants.split(","))
    else:
        decode_ab(a.old_tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
