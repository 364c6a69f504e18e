"""GPU checks of the torch integration: torch.compile (inductor, fullgraph, no graph break) and CUDA graphs.

For a few generated ops, on the GPU with real kernels:
  compile   torch.compile(fullgraph=True) with inductor of chunk_<op> then fused_recurrent_<op>:
            zero graph breaks; forward and every gradient equal to eager;
  cudagraph torch.cuda.graph capture of a forward (chunk prefill, and a one-token fused_recurrent decode
            step that carries the state), replayed on new inputs copied into the static buffers: equal to
            eager on the same inputs;
  reduce-overhead  torch.compile(mode="reduce-overhead") (inductor's CUDA-graph trees) of the decode
            step: equal to eager;
  layer     fla_gen.layers around the op, compiled with inductor: no graph break, equal to eager.

    python benchmarks/torch_integration_gpu.py            # ~1 minute on an H100, prints a PASS/FAIL table
    python benchmarks/torch_integration_gpu.py --ops gla  # a subset

Exit status 1 when any check fails. Importing this file does nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OPS = ("simple_gla", "gla", "gated_delta_rule")



def _public(pkg, prefix: str):
    """The package's public function whose name starts with ``prefix`` (a package may be named apart
    from its op, e.g. generated.dplr holds chunk_dplr_delta_rule)."""
    return getattr(pkg, next(n for n in pkg.__all__ if n.startswith(prefix)))

def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(rec, B, T, H, K, V, dtype):
    from fla_gen.sample import sample_inputs

    return sample_inputs(rec, B, T, H, K, V, dtype, "cuda")


def check_compile(op, rec, pkg, dtype):
    """Inductor, fullgraph: no graph break; forward and gradients equal to eager."""
    import torch
    from torch._dynamo.utils import counters

    B, T, H, K, V = 2, 300, 4, 64, 64
    x = _inputs(rec, B, T, H, K, V, dtype)
    h0 = torch.randn(B, H, K, V, device="cuda")
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    chunk, recurrent = _public(pkg, "chunk_"), _public(pkg, "fused_recurrent_")
    do = torch.randn(B, T, H, V, device="cuda", dtype=dtype)

    def f(*args):
        *inputs, h = args
        o, ht = chunk(*inputs, initial_state=h, output_final_state=True)
        o2, ht2 = recurrent(*inputs, initial_state=ht, output_final_state=True)
        return (o.float() * do).sum() + (o2.float() * do).sum() + ht2.square().sum()

    eager = f(*leaves)
    eager_grads = torch.autograd.grad(eager, leaves, allow_unused=True)
    torch._dynamo.reset()
    counters.clear()
    cf = torch.compile(f, fullgraph=True)
    got = cf(*leaves)
    got_grads = torch.autograd.grad(got, leaves, allow_unused=True)
    breaks = sum(counters["graph_break"].values())
    errs = [_rel(got, eager)] + [_rel(g, e) for g, e in zip(got_grads, eager_grads, strict=True) if e is not None]
    worst = max(errs)
    ok = breaks == 0 and worst < 1e-3
    return ok, f"graph breaks {breaks}, worst rel err {worst:.1e} (fwd + {len(errs) - 1} grads)"


def _capture(fn, static_args):
    """Warm up on a side stream (Triton compiles there), then capture ``fn(*static_args)``."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*static_args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static_args)
    return graph, out


def check_cudagraph(op, rec, pkg, dtype):
    """Capture a chunk prefill and a fused_recurrent decode step; replay on new inputs; compare to eager."""
    import torch

    B, H, K, V = 2, 4, 64, 64
    chunk, recurrent = _public(pkg, "chunk_"), _public(pkg, "fused_recurrent_")
    notes, ok = [], True
    with torch.no_grad():
        for name, fn, T in (("prefill", chunk, 256), ("decode", recurrent, 1)):
            static = [*_inputs(rec, B, T, H, K, V, dtype).values(), torch.randn(B, H, K, V, device="cuda")]

            def run(*args, fn=fn):
                *inputs, h = args
                return fn(*inputs, initial_state=h, output_final_state=True)

            graph, (o_static, ht_static) = _capture(run, static)
            fresh = [*_inputs(rec, B, T, H, K, V, dtype).values(), torch.randn(B, H, K, V, device="cuda")]
            for dst, src in zip(static, fresh, strict=True):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            o_ref, ht_ref = run(*fresh)
            err = max(_rel(o_static, o_ref), _rel(ht_static, ht_ref))
            ok &= err < 1e-6
            notes.append(f"{name} T={T}: rel err {err:.1e}")
    return ok, "; ".join(notes)


def check_reduce_overhead(op, rec, pkg, dtype):
    """torch.compile(mode="reduce-overhead") of a decode step (inductor's CUDA graphs) equals eager."""
    import torch

    B, H, K, V = 2, 4, 64, 64
    recurrent = _public(pkg, "fused_recurrent_")

    def step(*args):
        *inputs, h = args
        return recurrent(*inputs, initial_state=h, output_final_state=True)

    torch._dynamo.reset()
    cf = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    worst = 0.0
    with torch.no_grad():
        for _ in range(4):  # the first calls record, later ones replay
            args = [*_inputs(rec, B, 1, H, K, V, dtype).values(), torch.randn(B, H, K, V, device="cuda")]
            o, ht = cf(*args)
            o, ht = o.clone(), ht.clone()
            o_ref, ht_ref = step(*args)
            worst = max(worst, _rel(o, o_ref), _rel(ht, ht_ref))
    return worst < 1e-6, f"worst rel err over 4 calls {worst:.1e}"


def check_layer(op, rec, pkg, dtype):
    """A layer around the op, inductor fullgraph: no graph break, forward and gradients equal to eager."""
    import torch
    from torch._dynamo.utils import counters

    from fla_gen.layers import layer_for

    torch.manual_seed(0)
    layer = layer_for(pkg, 256, 4, 64).to("cuda", dtype)
    x = torch.randn(2, 300, 256, device="cuda", dtype=dtype, requires_grad=True)
    params = [x, *layer.parameters()]
    eager = layer(x)[0].float().square().mean()
    eager_grads = torch.autograd.grad(eager, params)
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(lambda x: layer(x)[0], fullgraph=True)(x).float().square().mean()
    got_grads = torch.autograd.grad(got, params)
    breaks = sum(counters["graph_break"].values())
    worst = max([_rel(got, eager)] + [_rel(g, e) for g, e in zip(got_grads, eager_grads, strict=True)])
    # bf16 projections fused differently by inductor: a looser bar than for the op alone.
    return breaks == 0 and worst < 3e-2, f"graph breaks {breaks}, worst rel err {worst:.1e}"


CHECKS = {"compile": check_compile, "cudagraph": check_cudagraph, "reduce-overhead": check_reduce_overhead,
          "layer": check_layer}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help="comma-separated ops of generated/")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, from {', '.join(CHECKS)}")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("torch_integration_gpu: no CUDA device", file=sys.stderr)
        return 2
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from fla_gen.cli import load_recurrence

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton "
          f"{importlib.import_module('triton').__version__}  {args.dtype}")
    rows, failed = [], False
    for op in args.ops.split(","):
        rec = load_recurrence(REPO_ROOT / "specs" / f"{op}.fla")
        pkg = importlib.import_module(f"generated.{op}")
        for check in args.checks.split(","):
            torch.manual_seed(0)
            start = time.perf_counter()
            try:
                ok, note = CHECKS[check](op, rec, pkg, dtype)
            except Exception as e:  # a crash is a FAIL with its message; the other checks still run
                ok, note = False, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
                traceback.print_exc()
            failed |= not ok
            rows.append((op, check, "PASS" if ok else "FAIL", f"{time.perf_counter() - start:.1f}", note))
            print(f"  {op:<18} {check:<16} {rows[-1][2]}  ({rows[-1][3]} s)  {note}", flush=True)
    print("\n| op | check | result | s | detail |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
