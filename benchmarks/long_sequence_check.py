#!/usr/bin/env python3
"""Every chunk op on one sequence so long that a [B, T, H, D] tensor holds more than 2^31 elements, on the GPU.

    python benchmarks/long_sequence_check.py                          # every op, forward and gradients
    python benchmarks/long_sequence_check.py --ops dplr_delta_rule,rwkv7 --modes fwd
    python benchmarks/long_sequence_check.py --ops kda --gate-scale 0.01 --out long.json

A kernel that computes an element offset in 32-bit integers reads and writes the wrong memory past 2^31 elements
(at H = 16, D = 128: past 2^20 tokens), silently or with an illegal address. No float64 reference runs at this
length, so the oracle is the op itself on the same sequence cut in two at ``--cut`` tokens, where each piece
stays under 2^31 elements, for the kernels that the short checks (gpu_check.py) have already compared with the
reference:
- the full call's outputs before the cut against the head alone; after the cut against the tail started from the
  head's final state; the full call's final state against the tail's;
- with gradients (``--modes grad``): a random do on the tail only, zero before the cut, so that the gradients of
  the tail's inputs are the tail call's (the head's inputs reach the loss only through the state at the cut);
- packed (``cu_seqlens`` [0, cut, T]): each sequence's outputs and final state against its own dense call.
Every comparison is ||a - b|| / ||b|| (float64); pass: all at most ``--threshold`` and finite.

With the realistic gates of gpu_check.py (logsigmoid(randn) / 16 per token) the state forgets the head within a
few hundred tokens, and the two sides agree bit for bit; ``--gate-scale 0.01`` keeps the head's state alive past
the cut, so that the tail's check also tests the state carried across it. At 2^20 + 2^16 tokens, H = 16, D = 128
and bf16, one tensor of q, k or v is 4.3 GiB; DPLR's and RWKV-7's forward+backward need more than an H200's
139 GiB there (run them with ``--modes fwd``). A call that runs out of memory is reported as such, not as a pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _ops  # noqa: E402
import torch  # noqa: E402

from fla_gen.verify import poisoned_allocations  # noqa: E402

INT32_ELEMENTS = 2**31
# tokens past the 2^31-element line at the end of the full call, and short of it at the cut
MARGIN_TOKENS = 2**16
CHUNK_TOKENS = 64


def plan_lengths(H: int, D: int) -> tuple[int, int]:
    """(T, cut) for H heads of head dim D: T puts a [1, T, H, D] tensor MARGIN_TOKENS tokens past 2^31 elements,
    the cut MARGIN_TOKENS short of it, on a chunk boundary."""
    line = -(-INT32_ELEMENTS // (H * D))
    return line + MARGIN_TOKENS, (line - MARGIN_TOKENS) // CHUNK_TOKENS * CHUNK_TOKENS


def split_errors(fn, names: list[str], args: list[torch.Tensor], cut: int, grads: bool,
                 seed: int = 0) -> dict[str, float]:
    """The comparisons of the module docstring for one op: ``fn`` the chunk op (fla's calling convention),
    ``args`` its inputs [1, T, ...] in fla's order (``names``), ``cut`` the token where the sequence is cut.
    Returns name -> relative error; a name's value is nan where either side is not finite. Every allocation of the
    calls starts as NaN: an element no kernel wrote would otherwise read what its memory held, the expected values
    included (a call's output in the block another one just freed)."""
    with poisoned_allocations():
        return _split_errors(fn, names, args, cut, grads, seed)


def _split_errors(fn, names: list[str], args: list[torch.Tensor], cut: int, grads: bool,
                  seed: int) -> dict[str, float]:
    T = args[0].shape[1]
    errors: dict[str, float] = {}
    leaves = [a.detach().requires_grad_(grads) for a in args]
    with torch.set_grad_enabled(grads):
        o, ht = fn(*leaves, output_final_state=True)
    full_grads = {}
    do = None
    if grads:
        gen = torch.Generator(device=o.device)
        gen.manual_seed(seed)
        do = torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype)
        do[:, :cut] = 0
        o.backward(do)
        full_grads = {n: a.grad[:, cut:].clone() for n, a in zip(names, leaves, strict=True)}
    o, ht = o.detach(), ht.detach()
    del leaves
    with torch.no_grad():
        o_head, s_head = fn(*(a.detach()[:, :cut].contiguous() for a in args), output_final_state=True)
    errors["o before the cut"] = _ops.rel_err(o[:, :cut], o_head)
    # the tail's inputs, copied once: the tail call from the head's state, then (detached) its packed sequence alone
    tail_inputs = [a.detach()[:, cut:].contiguous() for a in args]
    tail = [a.detach().requires_grad_(grads) for a in tail_inputs]
    with torch.set_grad_enabled(grads):
        o_tail, ht_tail = fn(*tail, initial_state=s_head, output_final_state=True)
    errors["o after the cut"] = _ops.rel_err(o[:, cut:], o_tail.detach())
    errors["final state"] = _ops.rel_err(ht, ht_tail.detach())
    if grads:
        o_tail.backward(do[:, cut:])
        for n, a in zip(names, tail, strict=True):
            errors[f"d{n} after the cut"] = _ops.rel_err(full_grads[n], a.grad)
    del o, tail, o_tail, full_grads, do
    with torch.no_grad():
        cu = torch.tensor([0, cut, T], dtype=torch.int32, device=args[0].device)
        o_packed, ht_packed = fn(*(a.detach() for a in args), cu_seqlens=cu, output_final_state=True)
        errors["packed: o of sequence 0"] = _ops.rel_err(o_packed[:, :cut], o_head)
        errors["packed: final state of sequence 0"] = _ops.rel_err(ht_packed[0], s_head[0])
        del o_head
        o_alone, s_alone = fn(*tail_inputs, output_final_state=True)
        errors["packed: o of sequence 1"] = _ops.rel_err(o_packed[:, cut:], o_alone)
        errors["packed: final state of sequence 1"] = _ops.rel_err(ht_packed[1], s_alone[0])
    return errors


def check_op(opname: str, args: argparse.Namespace, grads: bool) -> dict:
    """One op in one mode: its row of the report (errors, status ok / FAIL / OOM / ERR, seconds)."""
    op = _ops.OPS[opname]
    device = torch.device(args.device)
    T, cut = (args.tokens, args.cut) if args.tokens else plan_lengths(args.heads, args.head_dim)
    row = {"op": opname, "mode": "grad" if grads else "fwd", "T": T, "cut": cut, "errors": {}}
    start = time.perf_counter()
    try:
        fn = _ops.resolve_ours(op, "chunk")
        names, inputs, _ = _ops.make_inputs(op, (1, T, args.heads, args.head_dim, args.head_dim),
                                            getattr(torch, args.dtype), device, _ops.seed_for(args.seed, opname),
                                            requires_grad=False, gate_scale=args.gate_scale)
        row["errors"] = split_errors(fn, names, inputs, cut, grads, seed=args.seed)
        # a nan (not finite) fails: it is not <= the threshold
        row["status"] = "ok" if all(e <= args.threshold for e in row["errors"].values()) else "FAIL"
    except torch.OutOfMemoryError as e:
        row["status"], row["note"] = "OOM", _ops.err_text(e, 120)
    except Exception as e:
        row["status"], row["note"] = "ERR", _ops.err_text(e)
    row["seconds"] = round(time.perf_counter() - start, 1)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def render_row(r: dict) -> str:
    """One line for one (op, mode): its worst comparison and status, then, unless ok, every comparison."""
    errors = r["errors"]
    # a nan (not finite) is the worst
    worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"), default=None)
    line = (f"{r['op']:<18} {r['mode']:<5} T={r['T']} cut={r['cut']}  "
            + (f"worst {errors[worst]:.2e} ({worst})" if worst else "no comparison")
            + f"  {r['status']}  {r['seconds']} s" + (f"  {r['note']}" if "note" in r else ""))
    if r["status"] != "ok":
        line += "".join(f"\n    {k}: {v:.2e}" for k, v in errors.items())
    return line


def main(argv=None) -> int:
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(description=" ".join(head.split()), epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(_ops.OPS), help=f"comma-separated, from {','.join(_ops.OPS)} "
                                                              "(default: all)")
    p.add_argument("--modes", default="fwd,grad", help="fwd (outputs and final states), grad (also the tail's "
                                                        "gradients); default: both")
    p.add_argument("--heads", type=int, default=16, help="H (default: 16)")
    p.add_argument("--head-dim", type=int, default=128, help="K = V (default: 128)")
    p.add_argument("--tokens", type=int, default=0,
                   help="T instead of the one past 2^31 elements (with --cut; e.g. a small run on the CPU)")
    p.add_argument("--cut", type=int, default=0, help="the token where the sequence is cut (with --tokens)")
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="multiplies every log gate (0.01: a state that carries past the cut; default: 1)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--threshold", type=float, default=1e-2, help="largest relative error that passes (default: 1e-2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    modes = [m for m in args.modes.split(",") if m]
    if not ops or any(o not in _ops.OPS for o in ops):
        p.error(f"--ops: {args.ops!r} names no op or an unknown one; the ops: {', '.join(_ops.OPS)}")
    if not modes or any(m not in ("fwd", "grad") for m in modes):
        p.error(f"--modes: {args.modes!r}; the modes: fwd, grad")
    if bool(args.tokens) != bool(args.cut) or (args.tokens and not 0 < args.cut < args.tokens):
        p.error(f"--tokens {args.tokens} and --cut {args.cut}: both or neither, with 0 < cut < tokens")
    if args.heads < 1 or args.head_dim < 1:
        p.error(f"--heads {args.heads} and --head-dim {args.head_dim} must be positive")
    rows = []
    for opname in ops:
        for mode in modes:
            rows.append(check_op(opname, args, mode == "grad"))
            print(render_row(rows[-1]), flush=True)
    print(f"{sum(r['status'] == 'ok' for r in rows)}/{len(rows)} ok")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
