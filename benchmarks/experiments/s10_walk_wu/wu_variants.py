#!/usr/bin/env python3
"""Session 10's second experiment: where fwd_wu's time goes, and a faster inverse.

walk_wu.py found the Ai part of fwd_wu (K K^T, the inverse, the Ai store) at 0.142 of its ~0.16-0.2 ms
(gated_delta_rule, 4x4096x16x128), so the inverse, not W and U, is what to speed up. Variants of the generated
fwd_wu kernel (its source, transformed as text at run time, so everything else is the generated code), each
swapped into the generated op (the module's kernel global) and timed end to end, forward and forward+backward
(the backward recomputes fwd_wu):

- ``subst``: the generated kernel: each 16x16 diagonal block inverted by forward substitution (14 serial steps,
  two cross-thread reductions each), the off-diagonal blocks by fp32 ("ieee") 16x16 dots.
- ``power``: the diagonal blocks as (I + N)^{-1} = (I - N)(I + N^2)(I + N^4)(I + N^8) for the strictly lower
  N (N^16 = 0): six 16x16 dots per block, four deep, instead of the substitution.
- ``*_tf32x3``: the fp32 dots on tensor cores in three tf32 passes (near-fp32 accuracy) instead of "ieee".

Each at 1 and 2 warps (the plan has 2). Checked against the generated op (o and every gradient) and o against
the float64 reference. bf16, dense. Needs a GPU.

    python benchmarks/experiments/s10_walk_wu/wu_variants.py --out $OUT/wu_variants.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from benchmarks.experiments.harness import add_run_options, jit_from_source, timer, write_record  # noqa: E402


def power_inverse(blocks: int = 4) -> str:
    """Code that sets b_Ai{c}{c} = (I + b_A{c}{c})^{-1} by the product form, the blocks interleaved."""
    lines = ["    b_I = tl.where(o_c[:, None] == o_c[None, :], 1., 0.)",
             "    # (I + N)^{-1} = (I - N)(I + N^2)(I + N^4)(I + N^8) for a strictly lower 16x16 N (N^16 = 0)"]
    cs = range(blocks)
    lines += [f"    b_P{c} = tl.dot(b_A{c}{c}, b_A{c}{c}, input_precision=\"ieee\")" for c in cs]
    lines += [f"    b_Ai{c}{c} = tl.dot(b_I - b_A{c}{c}, b_I + b_P{c}, input_precision=\"ieee\")" for c in cs]
    for _ in range(2):
        lines += [f"    b_P{c} = tl.dot(b_P{c}, b_P{c}, input_precision=\"ieee\")" for c in cs]
        lines += [f"    b_Ai{c}{c} = tl.dot(b_Ai{c}{c}, b_I + b_P{c}, input_precision=\"ieee\")" for c in cs]
    return "\n".join(lines) + "\n"


def variant_source(src: str, name: str, variant: str) -> str:
    src = src.replace(f"def {name}(", "def variant_kernel(")
    if variant.startswith("power"):
        start = src.index("    b_X0 = -b_A00\n")
        end_marker = "    b_Ai33 = b_X3 + b_I\n"
        end = src.index(end_marker) + len(end_marker)
        src = src[:start] + power_inverse() + src[end:]
    if variant.endswith("tf32x3"):
        src = src.replace('input_precision="ieee"', 'input_precision="tf32x3"')
    return src


def load_variant(op: str, variant: str):
    chunk = importlib.import_module(f"generated.{op}.chunk")
    name = f"{op}_fwd_wu_kernel"
    src = inspect.getsource(getattr(chunk, name).fn)
    return jit_from_source(variant_source(src, name, variant), "variant_kernel")


class WithWarps:
    """A kernel whose launches take ``num_warps`` from here, whatever the plan says."""

    def __init__(self, kernel, num_warps: int) -> None:
        self.kernel, self.num_warps = kernel, num_warps

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{**kwargs, "num_warps": self.num_warps})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="delta_rule,gated_delta_rule")
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128,2x8192x8x256")
    p.add_argument("--variants", default="subst,power,subst_tf32x3,power_tf32x3")
    p.add_argument("--warps", default="1,2")
    add_run_options(p)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bench = timer(a)

    rows = []
    for op in a.ops.split(","):
        pkg = importlib.import_module(f"generated.{op}")
        chunk = pkg.chunk
        name = f"{op}_fwd_wu_kernel"
        generated_kernel = getattr(chunk, name)
        fn = getattr(pkg, f"chunk_{op}")
        kernels = {v: load_variant(op, v) for v in a.variants.split(",")}
        for shape in a.shapes.split(","):
            B, T, H, D = (int(x) for x in shape.split("x"))
            names, args, _ = make_inputs(OPS[op], (B, T, H, D, D), dtype, a.device, seed=T + D + 2)
            scale = scale_for(OPS[op], D)
            do = torch.randn_like(args[2])

            def forward(args=args, scale=scale, fn=fn):
                with torch.no_grad():
                    return fn(*args, scale=scale)[0]

            def both(args=args, scale=scale, fn=fn, do=do):
                o = fn(*args, scale=scale)[0]
                return (o, *torch.autograd.grad(o, args, do))

            setattr(chunk, name, generated_kernel)
            ref = both()
            exact = getattr(pkg.reference, f"{op}_reference")(*(t.detach().double() for t in args), scale=scale)[0] \
                if B * T <= 20000 else None
            row = {"op": op, "shape": shape, "generated": {"fwd_ms": bench(forward), "fb_ms": bench(both)},
                   "variants": []}
            print(f"{op} {shape}: generated fwd {row['generated']['fwd_ms']:.3f} ms, f+b "
                  f"{row['generated']['fb_ms']:.3f}", flush=True)
            for variant, kernel in kernels.items():
                for warps in (int(w) for w in a.warps.split(",")):
                    setattr(chunk, name, WithWarps(kernel, warps))
                    try:
                        out = both()
                        errs = [rel_err(x, r) for x, r in zip(out, ref, strict=True)]
                        err_exact = rel_err(out[0], exact) if exact is not None else None
                        fwd_ms, fb_ms = bench(forward), bench(both)
                    except Exception as e:  # noqa: BLE001 -- a variant that does not build is a result
                        errs, err_exact, fwd_ms, fb_ms = [], None, float("nan"), float("nan")
                        print(f"  {variant} {warps}w: {type(e).__name__}: {str(e)[:200]}")
                    finally:
                        setattr(chunk, name, generated_kernel)
                    row["variants"].append({"variant": variant, "warps": warps, "fwd_ms": fwd_ms, "fb_ms": fb_ms,
                                            "err_vs_generated": dict(zip(["o", *names], errs, strict=False)),
                                            "o_err_vs_fp64": err_exact})
                    print(f"  {variant:13s} {warps}w fwd {fwd_ms:.3f} f+b {fb_ms:.3f}  max err vs generated "
                          f"{max(errs, default=float('nan')):.1e}  o vs fp64 {err_exact}", flush=True)
            rows.append(row)
    write_record(a, rows)
    print("\nop               shape            generated fwd / f+b   best fwd variant          best f+b variant")
    for r in rows:
        ok = [x for x in r["variants"] if x["fwd_ms"] == x["fwd_ms"]]
        if not ok:
            continue
        bf = min(ok, key=lambda x: x["fwd_ms"])
        bb = min(ok, key=lambda x: x["fb_ms"])
        g = r["generated"]
        print(f"{r['op']:16s} {r['shape']:16s} {g['fwd_ms']:.3f} / {g['fb_ms']:.3f}       "
              f"{bf['fwd_ms']:.3f} {bf['variant']} {bf['warps']}w x{g['fwd_ms'] / bf['fwd_ms']:.2f}   "
              f"{bb['fb_ms']:.3f} {bb['variant']} {bb['warps']}w x{g['fb_ms'] / bb['fb_ms']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
