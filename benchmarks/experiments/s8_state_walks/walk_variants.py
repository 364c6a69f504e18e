#!/usr/bin/env python3
"""Session 8's experiment on the delta rule's state walks: kernel variants against fla-core's kernels, alone,
in one process, on the same inputs (benchmarks/RESULTS.md, session 8).

    python benchmarks/experiments/s8_state_walks/walk_variants.py fwd_h v0,v1,v3,v4   # $OUT/fwd_h_variants.json
    python benchmarks/experiments/s8_state_walks/walk_variants.py bwd_dh d0,d1,d3,d5,d6
    python benchmarks/experiments/s8_state_walks/walk_variants.py fwd_h generated,generated_gated --sweep

The variants are copies of generated/delta_rule/chunk.py's kernels as they were before the session, edited
(each file says how): v0 / d0 as generated then, v1 fwd_h subtracting W h after the dot (adopted), v3 that
with U loaded first, v4 fwd_h on [64, BV] row blocks; d1 bwd_dh's two dots summed apart, d3 its dot chain
without the negated copy, d4 d1 with the scale after the dot, d5 row blocks (adopted; two blocks, so K <= 128
only: its K = 256 rows are wrong and show NaN errors), d6 d3 with do loaded first. fla-core's
chunk_gated_delta_rule_fwd_kernel_h_blockdim64 / ..._bwd_kernel_dhu_blockdim64 run unwrapped (no autotune) at
the same launch configs. ``generated`` / ``generated_gated``: generated/delta_rule's and gated_delta_rule's
fwd_h as the checkout has them (the gated one on a chunk-local cumulative gate of logsigmoid(randn) / 16);
``--sweep`` runs the wider config table (SWEEP) that chose the head-dim-128 plans. Needs a GPU and fla-core.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from functools import partial

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

# shape -> (BV, warps, stages) configs, as run on 2026-11-24
CONFIGS = {
    "fwd_h": {(2, 8192, 8, 256): [(32, 4, 3), (32, 4, 2), (64, 4, 2)],
              (1, 16384, 16, 128): [(16, 4, 2), (32, 4, 2), (32, 4, 3), (64, 4, 3)],
              (4, 4096, 16, 128): [(32, 4, 2), (64, 4, 3), (64, 4, 2)]},
    "bwd_dh": {(1, 16384, 16, 128): [(16, 4, 3), (32, 4, 3), (16, 4, 2)],
               (4, 4096, 16, 128): [(64, 4, 3), (32, 4, 3), (32, 4, 2), (64, 4, 2)],
               (2, 8192, 8, 256): [(32, 4, 2), (16, 4, 2)],
               (8, 2048, 32, 64): [(64, 4, 2), (64, 4, 3)]},
}


# the generated fwd_h at more configs (results/2026-11-24_h100_walks_s8.json, there with bwd_dh's d0 beside it)
SWEEP = {(2, 8192, 8, 256): [(32, 4, 2), (32, 4, 3), (16, 4, 3)],
         (1, 16384, 16, 128): [(16, 4, 3), (32, 4, 3), (32, 4, 4), (64, 4, 3), (32, 4, 2)],
         (4, 4096, 16, 128): [(32, 4, 3), (64, 4, 3), (64, 4, 4), (32, 4, 2)],
         (8, 2048, 32, 64): [(64, 4, 2), (64, 4, 3), (32, 4, 3)]}


def unwrap(kernel):
    """The JITFunction under fla's autotune / heuristics decorators."""
    while type(kernel).__name__ != "JITFunction":
        kernel = kernel.fn
    return kernel


def make_inputs(shape):
    """k unit-norm rows, w = k / 2 (a contracting walk), u, q, do, dv_local; bf16 on the GPU."""
    B, T, H, K = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1)
    return {"k": k.bfloat16(), "w": (0.5 * k).bfloat16(),
            "u": (0.5 * torch.randn(B, T, H, K, device="cuda", generator=gen)).bfloat16(),
            "q": torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16(),
            "do": torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16(),
            "dv_local": (0.1 * torch.randn(B, T, H, K, device="cuda", generator=gen)).bfloat16(),
            "g_cum": torch.cumsum((F.logsigmoid(torch.randn(B, T // 64, 64, H, device="cuda", generator=gen)) / 16),
                                  2).view(B, T, H).contiguous()}


def launch_fwd_h(kernel, label: str, x, h, v_new, shape, BV, warps, stages):
    B, T, H, K = shape
    if label == "generated_gated":
        kernel[(triton.cdiv(K, BV), B * H)](
            x["k"], x["w"], x["u"], x["g_cum"], h, v_new, None, None, None, None, T, H=H, K=K, V=K, BT=64, BK=K, BV=BV,
            USE_G=True, USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, IS_VARLEN=False, num_warps=warps,
            num_stages=stages)
    elif label == "fla":
        kernel[(triton.cdiv(K, BV) * B * H,)](
            x["k"], x["u"], x["w"], v_new, None, None, h, None, None, None, None, T, H=H, HV=H, K=K, V=K, BT=64, BV=BV,
            USE_G=False, USE_GK=False, USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, SAVE_NEW_VALUE=True,
            STATE_V_FIRST=False, IS_VARLEN=False, num_warps=warps, num_stages=stages)
    else:
        kernel[(triton.cdiv(K, BV), B * H)](
            x["k"], x["w"], x["u"], h, v_new, None, None, None, None, T, H=H, K=K, V=K, BT=64, BK=K, BV=BV,
            USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, IS_VARLEN=False, num_warps=warps, num_stages=stages)


def launch_bwd_dh(kernel, label: str, x, dh, dv_new, shape, BV, warps, stages):
    B, T, H, K = shape
    if label == "fla":
        kernel[(triton.cdiv(K, BV) * B * H,)](
            x["q"], x["k"], x["w"], None, None, None, None, x["do"], dh, x["dv_local"], dv_new, None, None, K ** -0.5,
            T, H=H, HV=H, K=K, V=K, BT=64, BV=BV, USE_G=False, USE_GK=False, USE_INITIAL_STATE=False,
            USE_FINAL_STATE_GRADIENT=False, STATE_V_FIRST=False, IS_VARLEN=False, num_warps=warps, num_stages=stages)
    else:
        kernel[(triton.cdiv(K, BV), B * H)](
            x["q"], x["k"], x["w"], x["do"], x["dv_local"], dh, dv_new, None, None, None, None, K ** -0.5, T, H=H, K=K,
            V=K, BT=64, BK=K, BV=BV, USE_FINAL_STATE_GRADIENT=False, STORE_INITIAL_STATE_GRADIENT=False,
            IS_VARLEN=False, num_warps=warps, num_stages=stages)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel", choices=("fwd_h", "bwd_dh"))
    p.add_argument("variants", help="comma-separated module names in this directory (v0, d5, ...), or "
                                    "generated / generated_gated (fwd_h)")
    p.add_argument("--sweep", action="store_true", help="the SWEEP config table instead of CONFIGS")
    a = p.parse_args()
    from fla.ops.common import chunk_delta_h

    fla_kernel = unwrap(chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64 if a.kernel == "fwd_h"
                        else chunk_delta_h.chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64)
    name = "delta_rule_fwd_h_kernel" if a.kernel == "fwd_h" else "delta_rule_bwd_dh_kernel"
    modules = {"generated": "generated.delta_rule.chunk", "generated_gated": "generated.gated_delta_rule.chunk"}
    kernels = {"fla": fla_kernel}
    for v in a.variants.split(","):
        module = importlib.import_module(modules.get(v, v))
        kernels[v] = getattr(module, name.replace("delta_rule", "gated_delta_rule") if v == "generated_gated" else name)
    launch = launch_fwd_h if a.kernel == "fwd_h" else launch_bwd_dh
    rows = []
    for shape, configs in (SWEEP if a.sweep else CONFIGS[a.kernel]).items():
        B, T, H, K = shape
        x = make_inputs(shape)
        first = None
        for BV, warps, stages in configs:
            for label, kernel in kernels.items():
                state = torch.full((B, T // 64, H, K, K), float("nan"), device="cuda", dtype=torch.bfloat16)
                tokens = torch.full_like(x["u"], float("nan"))
                run = partial(launch, kernel, label, x, state, tokens, shape, BV, warps, stages)
                try:
                    run()
                    torch.cuda.synchronize()
                    key = label == "generated_gated"  # the gated walk computes something else
                    first = first or {}
                    first.setdefault(key, (state.clone(), tokens.clone()))
                    err = max(rel(state, first[key][0]), rel(tokens, first[key][1]))
                    ms = min(do_bench(run, warmup=25, rep=100, return_mode="median") for _ in range(2))
                except Exception as e:  # a config over the shared-memory limit is a result, not a crash
                    err, ms = float("nan"), float("nan")
                    print(label, shape, BV, warps, stages, type(e).__name__, str(e)[:200])
                rows.append({"shape": "x".join(map(str, shape)), "variant": label, "BV": BV, "warps": warps,
                             "stages": stages, "ms": ms, "rel_err_vs_first": err})
                print(json.dumps(rows[-1]), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{a.kernel}_variants.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("| shape | BV/warps/stages | " + " | ".join(kernels) + " |")
    for key in dict.fromkeys((r["shape"], r["BV"], r["warps"], r["stages"]) for r in rows):
        cells = [f"{r['ms']:.3f}" for r in rows if (r["shape"], r["BV"], r["warps"], r["stages"]) == key]
        print(f"| {key[0]} | {key[1]}/{key[2]}/{key[3]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
