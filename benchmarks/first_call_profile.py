#!/usr/bin/env python3
"""Where a generated op's first call goes once Triton's cache is warm (issue 7: under 2 s).

    python benchmarks/first_call_profile.py --op linear_attn --shape 8x2048x32x64 [--top 25]

Runs the op's first forward + backward twice, each in a fresh process on one Triton cache: the
first run compiles the plan, the second is the user's first call after that (the case issue 7
times). The second run is profiled with cProfile, and the report splits its wall time into

* ``triton_launch``: Triton's ``JITFunction.run`` per kernel (binder, cache lookup, cubin load,
  launch), by kernel name;
* ``imports``: modules imported during the call (torch imports sympy and torch.fx on the first
  ``backward()``);
* the rest, with the top functions by cumulative time.

On a CPU without a GPU it runs under ``TRITON_INTERPRET=1`` at the given shape (use a small one):
that checks the script, not the numbers.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def first_call(op_name: str, shape_text: str, profile: bool, top: int = 25) -> dict:
    """First forward and first backward of ``op_name`` in this process, wall seconds each; with
    ``profile`` also the cProfile breakdown of both (see the module docstring)."""
    import _ops
    import torch

    op = _ops.OPS[op_name]
    shape = _ops.parse_shape(shape_text)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fn = _ops.resolve_ours(op, "chunk")
    _, args, kwargs = _ops.make_inputs(op, shape, dtype, device, seed=0)
    do = torch.randn(*shape[:3], shape[4], device=device, dtype=dtype)
    scale = _ops.scale_for(op, shape[3])
    _ops.sync(device)
    prof = cProfile.Profile() if profile else None
    modules_before = set(sys.modules)
    out: dict = {}
    for phase, call in (("fwd", lambda: fn(*args, scale=scale, **kwargs)), ("bwd", None)):
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        if phase == "fwd":
            o, _ = call()
        else:
            o.backward(do)
        _ops.sync(device)
        if prof:
            prof.disable()
        out[f"first_{phase}_s"] = round(time.perf_counter() - t0, 3)
    if prof:
        out.update(_breakdown(prof, top))
        out["modules_imported"] = sorted(set(sys.modules) - modules_before)[:40]
    return out


def _breakdown(prof: cProfile.Profile, top: int = 25) -> dict:
    """Seconds in Triton's kernel runs (by kernel), in imports, and the top functions."""
    st = pstats.Stats(prof)
    triton_runs: dict[str, float] = {}
    imports = 0.0
    for (path, _line, name), (_cc, _nc, _tt, ct, callers) in st.stats.items():
        if name == "_find_and_load" and "importlib" in path:
            imports += ct  # cProfile counts a recursive function's time once, at its outermost call
        if path.endswith(os.path.join("triton", "runtime", "jit.py")) and name in ("run", "<lambda>"):
            for caller, c in callers.items():  # the launcher that called kernel[grid](...)
                if not caller[0].endswith("jit.py"):
                    key = f"{Path(caller[0]).name}:{caller[2]}"
                    triton_runs[key] = round(triton_runs.get(key, 0.0) + c[3], 3)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return {"triton_run_s_by_caller": triton_runs, "triton_run_s": round(sum(triton_runs.values()), 3),
            "imports_s": round(imports, 3), "cprofile_top": buf.getvalue()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True)
    p.add_argument("--shape", default="4x4096x16x128")
    p.add_argument("--top", type=int, default=25, help="functions listed by cumulative time")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--child", choices=("warm", "profile"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(first_call(args.op, args.shape, args.child == "profile", args.top)))
        return 0
    env = dict(os.environ)
    env.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="flagen_first_call_"))
    res = {}
    for child in ("warm", "profile"):
        cmd = [sys.executable, __file__, "--op", args.op, "--shape", args.shape, "--top", str(args.top),
               "--child", child]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            print(run.stdout, run.stderr, file=sys.stderr)
            return run.returncode
        res[child] = json.loads(run.stdout.strip().splitlines()[-1])
    prof = res["profile"]
    print(f"{args.op} {args.shape}: compiling run {res['warm']['first_fwd_s']} + {res['warm']['first_bwd_s']} s; "
          f"warm-cache run {prof['first_fwd_s']} + {prof['first_bwd_s']} s")
    print(f"  in Triton's JITFunction.run: {prof['triton_run_s']} s; in imports: {prof['imports_s']} s")
    for k, v in sorted(prof["triton_run_s_by_caller"].items(), key=lambda kv: -kv[1]):
        print(f"    {v:7.3f} s  {k}")
    print(prof["cprofile_top"])
    if args.out:
        Path(args.out).write_text(json.dumps({"op": args.op, "shape": args.shape, **res}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
