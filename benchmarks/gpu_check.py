#!/usr/bin/env python3
"""bf16 correctness of every generated chunk_* and fused_recurrent_* op on the GPU, at real sizes.

    python benchmarks/gpu_check.py --ops linear_attn,simple_gla,gla --out check.json \
        [--table check_table.txt] [--shape 4x4096x16x128] [--grad-T 1024]

Oracle: the generated step-by-step reference ``<op>_reference`` run in float32 (``--ref-dtype``)
on the GPU, on the same bf16 inputs upcast, with TF32 off. Per op, the reference runs once and
both modes are compared with it. Cases:
- fwd:    the full shape (default B=4, T=4096, H=16, K=V=128) with a random fp32 initial state and
          output_final_state=True: o and the final state.
- grad:   T cut to ``--grad-T`` (default 1024) because autograd through a T-step reference keeps
          every step's state (about 3 x T x B*H*K*V x 4 bytes): the gradients of every input and of
          the initial state for random do and dht (o and ht re-checked there too). On an
          out-of-memory error T is halved again (the row says which T ran).
- varlen: B=1, cu_seqlens (int32) cutting ``--grad-T`` tokens into 4 sequences of uneven lengths
          (one of 3 tokens), an initial state per sequence: o, final states and all gradients.
- narrow: as grad at B=1 with V=16, narrower than the kernels' narrowest tile (launch.HEAD_DIM_MIN_TILE):
          16-wide tiles once read past wgmma's shared memory on sm90 (an illegal address in KDA, a wrong o
          in the gated delta rule).
Error: ||ours - ref|| / ||ref|| (float64). Pass: every error <= ``--threshold`` (1e-2 for bf16),
everything finite, shapes as fla's. Inputs are fresh random each run (seed printed); their
distributions are those of benchmarks/_ops.py (gates logsigmoid(randn)/16).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _ops  # noqa: E402
import torch  # noqa: E402

# the narrow case's value head dim
NARROW_V = 16


def _leaf(t: torch.Tensor, dtype=None) -> torch.Tensor:
    t = t.detach()
    if dtype is not None:
        t = t.to(dtype)
    return t.clone().requires_grad_(True)


def _run(fn, args, h0, scale, kwargs, cu_seqlens, grads: bool, do=None, dht=None):
    """Call fn; with grads, backpropagate (do, dht) and return the input and h0 gradients."""
    if grads:
        leaves = [_leaf(a) for a in args]
        h0l = _leaf(h0)
    else:
        leaves, h0l = [a.detach() for a in args], h0.detach()
    extra = {"cu_seqlens": cu_seqlens} if cu_seqlens is not None else {}
    with torch.set_grad_enabled(grads):
        o, ht = fn(*leaves, scale=scale, initial_state=h0l, output_final_state=True, **kwargs, **extra)
        if not grads:
            return o, ht, None
        outs, gouts = [o], [do.to(o.dtype)]
        if ht is not None:
            outs.append(ht)
            gouts.append(dht.to(ht.dtype))
        torch.autograd.backward(outs, gouts)
    return o.detach(), ht.detach() if ht is not None else None, [x.grad for x in leaves] + [h0l.grad]


def _compare(case: dict, got, ref, names, threshold: float, expect_shapes: dict) -> None:
    """Fill case['err'] (name -> rel err) and case['problems']."""
    o, ht, g = got
    ro, rht, rg = ref
    errs, problems = case["err"], case["problems"]
    pairs = [("o", o, ro), ("ht", ht, rht)]
    if g is not None and rg is not None:
        pairs += [(f"d{n}", a, b) for n, a, b in zip([*names, "h0"], g, rg, strict=True)]
    for n, a, b in pairs:
        if a is None or b is None:
            if b is not None:
                problems.append(f"{n} is None")
            continue
        if n in expect_shapes and tuple(a.shape) != expect_shapes[n]:
            problems.append(f"{n} shape {tuple(a.shape)} != {expect_shapes[n]}")
            continue
        if not torch.isfinite(a).all():
            problems.append(f"{n} not finite")
            errs[n] = float("nan")
            continue
        errs[n] = _ops.rel_err(a, b)
        if not errs[n] <= threshold:
            problems.append(f"{n} {errs[n]:.2e}")
    if ht is not None and ht.dtype != torch.float32:
        problems.append(f"ht dtype {ht.dtype}")


def _run_and_compare(case: dict, fn, run_args: tuple, ref, names, threshold: float, shapes: dict) -> None:
    """Run one mode and fill ``case`` with its errors; an exception becomes the row's problem."""
    try:
        _compare(case, _run(fn, *run_args), ref, names, threshold, shapes)
    except Exception as e:
        case["problems"].append(_ops.err_text(e))
        case["status"] = "ERR"


def check_op(opname: str, args, report: dict, deadline: float) -> list[dict]:
    op = _ops.OPS[opname]
    device, fake = args.device, args.fake
    B, T, H, K, V = _ops.parse_shape(args.shape)
    dtype = getattr(torch, args.dtype or ("float32" if fake and device == "cpu" else "bfloat16"))
    ref_dtype = getattr(torch, args.ref_dtype)
    rows: list[dict] = []

    def row(mode, case, **kw):
        r = {"op": opname, "mode": mode, "case": case, "err": {}, "problems": [], **kw}
        rows.append(r)
        return r

    try:
        ref_fn = _ops.resolve_ours(op, "reference", fake)
    except Exception as e:
        row("-", "-", status="SKIP", note=_ops.err_text(e))
        return rows
    fns = {}
    for mode in args.modes.split(","):
        try:
            fns[mode] = _ops.resolve_ours(op, mode, fake)
        except Exception as e:
            row(mode, "-", status="SKIP", note=_ops.err_text(e))
    if not fns:
        return rows
    seed = _ops.seed_for(report["seed"], opname)
    scale = _ops.scale_for(op, K)

    def states(N, s, Vs=V):
        gen = torch.Generator(device=device)
        gen.manual_seed(s)
        h0 = 0.1 * torch.randn(N, H, K, Vs, generator=gen, device=device)
        return h0, gen

    def ref_call(a, h0, kwargs, cu, grads, do=None, dht=None):
        a32 = [x.detach().to(ref_dtype) for x in a]
        kw32 = {k: v.to(ref_dtype) for k, v in kwargs.items()}
        return _run(ref_fn, a32, h0.to(ref_dtype), scale, kw32, cu, grads, do, dht)

    # ---- fwd at the full shape
    names, a, kwargs = _ops.make_inputs(op, (B, T, H, K, V), dtype, device, seed, g_gamma=args.g_gamma,
                                        requires_grad=False, gate_scale=args.gate_scale)
    h0, _ = states(B, seed + 1)
    shapes = {"o": (B, T, H, V), "ht": (B, H, K, V)}
    t0 = time.perf_counter()
    try:
        ref = ref_call(a, h0, kwargs, None, False)
        _ops.sync(device)
        ref_s = time.perf_counter() - t0
    except Exception as e:
        row("-", f"fwd T={T}", status="ERR", note="reference: " + _ops.err_text(e))
        ref = None
    if ref is not None:
        for mode, fn in fns.items():
            r = row(mode, f"fwd T={T}", ref_s=round(ref_s, 2))
            _run_and_compare(r, fn, (a, h0, scale, kwargs, None, False), ref, names, args.threshold, shapes)
    del a, ref
    _free(device)

    # ---- gradients (and varlen) at a shorter T; "narrow": a 16-wide V, the head dim under the kernels' narrowest
    # tile (launch.HEAD_DIM_MIN_TILE), where 16-wide tiles once read past wgmma's shared memory on sm90
    Tg = min(T, args.grad_T)
    for case in ("grad", "varlen", "narrow"):
        if time.monotonic() > deadline:
            row("-", case, status="SKIP", note="budget")
            continue
        Vc = NARROW_V if case == "narrow" else V
        while True:
            if case in ("grad", "narrow"):
                Bc, Tc, cu = (B if case == "grad" else 1), Tg, None
            else:
                Bc, Tc = 1, Tg
                cuts = [0, int(0.244 * Tc), int(0.244 * Tc) + 3, int(0.708 * Tc), Tc]
                cu = torch.tensor(cuts, dtype=torch.int32, device=device)
            N = Bc if cu is None else len(cu) - 1
            names, a, kwargs = _ops.make_inputs(op, (Bc, Tc, H, K, Vc), dtype, device, seed + 7 + len(case),
                                                g_gamma=args.g_gamma, requires_grad=False,
                                                gate_scale=args.gate_scale)
            h0, gen = states(N, seed + 11 + len(case), Vc)
            do = torch.randn(Bc, Tc, H, Vc, generator=gen, device=device)
            dht = torch.randn(N, H, K, Vc, generator=gen, device=device)
            label = f"{'grad' if case == 'narrow' else case} T={Tc}" + ("" if cu is None else f" cu={cuts}")
            label += f" V={Vc}" if case == "narrow" else ""
            try:
                t0 = time.perf_counter()
                ref = ref_call(a, h0, kwargs, cu, True, do, dht)
                _ops.sync(device)
                ref_s = time.perf_counter() - t0
                break
            except torch.OutOfMemoryError:
                del a
                _free(device)
                if Tg <= 128:
                    row("-", label, status="ERR", note="reference out of memory")
                    ref = None
                    break
                Tg //= 2
                report["notes"].append(f"{opname}: reference backward out of memory, grad T -> {Tg}")
            except Exception as e:
                row("-", label, status="ERR", note="reference: " + _ops.err_text(e))
                ref = None
                break
        if ref is None:
            continue
        shapes = {"o": (Bc, Tc, H, Vc), "ht": (N, H, K, Vc)}
        shapes.update({f"d{n}": tuple(x.shape) for n, x in zip(names, a, strict=True)})
        shapes["dh0"] = (N, H, K, Vc)
        for mode, fn in fns.items():
            r = row(mode, label, ref_s=round(ref_s, 2))
            _run_and_compare(r, fn, (a, h0, scale, kwargs, cu, True, do, dht), ref, names, args.threshold, shapes)
        del a, ref
        _free(device)
    for r in rows:
        r.setdefault("status", "FAIL" if r["problems"] else "ok")
    return rows


def _free(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def render_table(report: dict) -> str:
    cols: list[str] = ["o", "ht"]
    for r in report["rows"]:
        for k in r["err"]:
            if k not in cols and k != "dh0":
                cols.append(k)
    cols.append("dh0")
    cols = [c for c in cols if any(c in r["err"] for r in report["rows"])]
    hdr = ["op", "mode", "case", *cols, "status"]
    body = []
    notes = []
    for r in report["rows"]:
        cells = [r["op"], r["mode"], r["case"]]
        cells += [f"{r['err'][c]:.1e}" if c in r["err"] else "" for c in cols]
        st = r["status"]
        if r.get("problems") or r.get("note"):
            notes.append(f"{r['op']} {r['mode']} {r['case']}: {r.get('note') or '; '.join(r['problems'])}")
            st += f" [{len(notes)}]"
        body.append([*cells, st])
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *body, strict=True)] if body else [len(h) for h in hdr]
    fmt = "  ".join(f"{{:<{n}}}" if i < 3 else f"{{:>{n}}}" for i, n in enumerate(w))
    v = report["versions"]
    out = [f"gpu_check  device={v.get('gpu', report.get('device'))}  torch={v.get('torch')}  triton={v.get('triton')}  "
           f"seed={report['seed']}  shape={report['shape']}  ref={report['ref_dtype']}  "
           f"threshold={report['threshold']}{'  FAKE' if report.get('fake') else ''}",
           fmt.format(*hdr), "  ".join("-" * n for n in w)]
    out += [fmt.format(*[str(x) for x in b]) for b in body]
    n_bad = sum(r["status"] != "ok" for r in report["rows"])
    out.append(f"errors: ||ours-ref||/||ref||; {len(report['rows']) - n_bad}/{len(report['rows'])} rows ok"
               f" ({report.get('elapsed_s')} s)")
    out += [f"note: {n}" for n in report["notes"]]
    out += [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="linear_attn,simple_gla,gla", help=f"from: {','.join(_ops.OPS)}")
    p.add_argument("--modes", default="chunk,fused_recurrent")
    p.add_argument("--shape", default="4x4096x16x128", help="BxTxHxD or BxTxHxKxV")
    p.add_argument("--grad-T", type=int, default=1024, help="T of the gradient and varlen cases")
    p.add_argument("--threshold", type=float, default=1e-2)
    p.add_argument("--ref-dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--g-gamma", action="store_true", help="simple_gla with g_gamma instead of g")
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="multiply every per-token log gate (_ops.make_inputs), e.g. to reach strong-gate paths")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--budget-s", type=float, default=1e9, help="skip what starts after this many seconds")
    p.add_argument("--out", default=None)
    p.add_argument("--table", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="inputs' dtype (default bfloat16; float32 with --fake on a CPU)")
    p.add_argument("--fake", action="store_true", help="CPU stand-ins: tests this script only")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    report = {"seed": args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
              "shape": args.shape, "grad_T": args.grad_T, "ref_dtype": args.ref_dtype,
              "threshold": args.threshold, "dtype": args.dtype or "bfloat16", "device": args.device, "fake": args.fake,
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "versions": _ops.versions(),
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "rows": [], "notes": []}

    def save():
        report["elapsed_s"] = round(time.monotonic() - t_start, 1)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    def on_term(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        for opname in [o for o in args.ops.split(",") if o]:
            if opname not in _ops.OPS:
                report["notes"].append(f"unknown op {opname}")
                continue
            if time.monotonic() > deadline:
                report["notes"].append(f"{opname}: skipped (budget)")
                continue
            t0 = time.monotonic()
            try:
                rows = check_op(opname, args, report, deadline)
            except Exception as e:  # a bug here must not hide the other ops
                rows = [{"op": opname, "mode": "-", "case": "-", "err": {}, "problems": [],
                         "status": "ERR", "note": "gpu_check: " + _ops.err_text(e)}]
            report["rows"] += rows
            print(f"[check] {opname} ({time.monotonic() - t0:.1f} s): "
                  + ", ".join(f"{r['mode']} {r['case']} {r['status']}" for r in rows), flush=True)
            save()
    except SystemExit as e:
        report["notes"].append(f"stopped early: {e}")
    save()
    table = render_table(report)
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(table + "\n")
    print(table, flush=True)
    return 0 if all(r["status"] == "ok" for r in report["rows"]) and report["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
