#!/usr/bin/env python3
"""Try launch-config variants of each kernel of a generated chunk op on one GPU; record which wins and why.

    python benchmarks/sweep_plans.py --ops gla,delta_rule --shapes 4x4096x16x128 --budget-s 520 \
        --out sweep.json --table sweep_table.txt [--stages fwd_o,bwd_dv] [--max-variants 10]
    python benchmarks/sweep_plans.py --propose sweep.json   # fla_gen/measurements.py entries for the wins
    python benchmarks/sweep_plans.py --render sweep.json    # re-print a saved sweep's table
    python benchmarks/sweep_plans.py --fake                 # CPU: the real ops in Triton's interpreter
    python benchmarks/sweep_plans.py --ops gated_delta_rule --value-heads 32 --stages fwd_solve,fwd_wu  # Qwen3-Next

Per (op, shape) one worker process selects the op's build-time plan, runs the default plan once
(outputs kept as the check), then per kernel (``stage``) tries variants through
``fla_gen.runtime.dispatch.overridden_plans``, without rebuilding:
- the grid: block_k, block_v in {32, 64, 128} (at most the padded head dim), num_warps {4, 8},
  num_stages {1, 2, 3, 4}; variants nearest the default first (one field changed, then two, ...), at
  most ``--max-variants`` per kernel; ``--extra-variants JSON`` adds hand-picked ones first.
- the forward's two paths: where the plan takes fwd_fused (the walk that writes the outputs), a variant of
  fwd_h or fwd_o runs the split forward (launch.fused_walk_launch), and a variant of fwd_fused runs the walk
  whatever the grid; the default is the plan's own choice, so those rows compare the two paths.
- timing: a ``fwd_*``/``cumsum`` kernel in the op's forward, a ``bwd_*`` kernel in forward+backward.
  ``op_ms``: ``triton.testing.do_bench`` median of that call; ``kernel_ms``: the kernel alone, its GPU
  time per call from ``torch.profiler`` (every launch of it in one call, e.g. fwd_h twice in
  forward+backward). Ranking uses kernel_ms where both sides have it, op_ms otherwise. The
  default is re-timed before each kernel's variants, so clock drift between kernels cancels.
- check: the variant's output (forward) or output and input gradients (forward+backward) against
  the default plan's on the same inputs, relative norm error <= ``--tol``; else 'mismatch'.
- a variant whose launch (BK, BV, warps, stages as the launcher passes them: it clamps tiles to
  the head dim, a whole-K kernel ignores block_k) equals the default's or an earlier variant's is
  recorded as 'same_launch' and not timed.
- failures are recorded with why: 'compile_error', 'out_of_resources' (shared memory / registers),
  'error' (e.g. an override the dispatcher refuses), 'mismatch', 'crash' (the worker died: it is
  restarted after that variant), 'timeout' (no progress for ``--variant-timeout`` s).

Results: the worker appends one JSON line per event; the parent folds them into ``--out`` after
every variant, so a run cut off from outside still leaves its JSON. The whole run keeps within
``--budget-s``, each (op, shape), and within it each kernel, getting an even share of the time left
when it starts (variants not tried for lack of time are counted as 'untried').
``--fake``: TRITON_INTERPRET=1 on the CPU, float32, tiny shapes, wall-clock timing: it exercises
this script's logic (and the overrides, which the interpreter honours for tiles), not the GPU.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _ops  # noqa: E402

FIELDS = ("block_k", "block_v", "num_warps", "num_stages")
TILES = (32, 64, 128)
WARPS = (4, 8)
# 4 stages: measured fastest for the scalar- and channel-gate state walks at head dim 256 (fla_gen/measurements.py)
STAGES = (1, 2, 3, 4)
# Test hooks, comma-separated: "stage:variant" makes the worker die (os._exit) there, "cuda:stage:variant"
# raise a CUDA error there (exercises the restart paths).
CRASH_ENV = "FLA_GEN_SWEEP_TEST_CRASH"
# A worker's exit status after a CUDA error it recorded (the context is unusable): the parent restarts it.
FATAL_RC = 3


def vkey(cfg: dict) -> str:
    """'bk64_bv128_w4_s2' for a full config dict."""
    return f"bk{cfg['block_k']}_bv{cfg['block_v']}_w{cfg['num_warps']}_s{cfg['num_stages']}"


def stage_mode(stage: str) -> str:
    """'fwd' for kernels of the forward, 'fwdbwd' for backward kernels."""
    return "fwdbwd" if stage.startswith("bwd") else "fwd"


def variants(default: dict, K: int, V: int, limit: int, extra: list[dict] | None = None) -> list[dict]:
    """Full configs to try for one kernel, nearest the default first (fields changed, then log2
    distance), at most ``limit``; ``extra`` (partial dicts over the default) go first. Tiles stay
    within the padded head dims, as the launcher clamps them (the default too: 64 at K = 20 is 32)."""
    pk, pv = 1 << max(K - 1, 0).bit_length(), 1 << max(V - 1, 0).bit_length()
    default = {**default, "block_k": min(default["block_k"], max(pk, 16)),
               "block_v": min(default["block_v"], max(pv, 16))}
    seen = {vkey(default)}
    out = []
    for e in extra or []:
        cfg = {**default, **e}
        if vkey(cfg) not in seen:
            seen.add(vkey(cfg))
            out.append(cfg)
    grid = []
    for bk, bv, w, s in itertools.product(TILES, TILES, WARPS, STAGES):
        if bk > max(pk, 32) or bv > max(pv, 32):
            continue  # the launcher clamps the tile to the padded head dim: same as a smaller variant
        cfg = {"block_k": bk, "block_v": bv, "num_warps": w, "num_stages": s}
        if vkey(cfg) in seen:
            continue
        changed = sum(cfg[f] != default[f] for f in FIELDS)
        dist = sum(abs(math.log2(cfg[f] / default[f])) for f in FIELDS)
        grid.append((changed, dist, vkey(cfg), cfg))
    grid.sort(key=lambda x: x[:3])
    out += [g[3] for g in grid]
    return out[:max(limit, len(extra or []))]


def classify(e: BaseException) -> str:
    """'out_of_resources', 'compile_error' or 'error' for an exception of a variant's first call."""
    text = f"{type(e).__name__} {e}".lower()
    if "outofresources" in text or "out of resource" in text:
        return "out_of_resources"
    if "compil" in text or "ptxas" in text or type(e).__module__.startswith("triton"):
        return "compile_error"
    return "error"


def fatal_cuda(e: BaseException) -> bool:
    """An error after which the CUDA context is unusable (the worker exits to be restarted)."""
    text = str(e).lower()
    return "illegal memory access" in text or "unspecified launch failure" in text or "cuda error" in text


# =============================================================================================
# worker: one (op, shape), every requested kernel; appends JSON lines


class _Log:
    def __init__(self, path: str):
        self.f = open(path, "a")  # noqa: SIM115

    def __call__(self, **rec):
        rec["t"] = round(time.time(), 3)
        self.f.write(json.dumps(rec, default=str) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def _timers(device: str, quick: bool):
    """(op_ms, kernel_ms): op_ms(fn) -> median ms; kernel_ms(fn, name) -> ms per call or None."""
    import torch

    if torch.device(device).type != "cuda":
        def op_ms_cpu(fn, grads=()):
            ts = []
            for _ in range(2 if quick else 5):
                for t in grads:
                    t.grad = None
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return sorted(ts)[len(ts) // 2]
        return op_ms_cpu, lambda fn, name, grads=(): None

    from triton.testing import do_bench

    warmup, rep = (5, 20) if quick else (25, 100)

    def op_ms(fn, grads=()):
        return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=list(grads) or None, return_mode="median"))

    def kernel_ms(fn, name, grads=(), reps=5 if quick else 20):
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                for t in grads:
                    t.grad = None
                fn()
            torch.cuda.synchronize()
        total = 0.0
        for ev in prof.key_averages():
            if ev.key == name or ev.key.startswith(name + "_") or ev.key.endswith(name):
                total += getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        return round(total / reps / 1e3, 5) if total else None
    return op_ms, kernel_ms


LAUNCH_KEYS = ("BK", "BV", "num_warps", "num_stages")


def recorded_launches(module, name: str, call):
    """(call(), launches): each launch of kernel ``name`` of ``module`` during ``call`` as a tuple of
    its LAUNCH_KEYS arguments, or None when the module has no such kernel. The launcher may clamp a
    tile or ignore a field (a whole-K kernel takes BK = K): two configs with equal launches are one."""
    kernel = getattr(module, name, None)
    if kernel is None:
        return call(), None
    seen: list[tuple] = []

    class _Recorder:
        def __getitem__(self, grid):
            launch = kernel[grid]

            def go(*a, **kw):
                seen.append(tuple(kw.get(k) for k in LAUNCH_KEYS))
                return launch(*a, **kw)
            return go

    setattr(module, name, _Recorder())
    try:
        return call(), tuple(seen)
    finally:
        setattr(module, name, kernel)


def worker(spec: dict) -> int:
    import torch

    from fla_gen.runtime.dispatch import arch_of, overridden_plans, select_plan

    log = _Log(spec["log"])
    op = _ops.OPS[spec["op"]]
    device, dtype = spec["device"], getattr(torch, spec["dtype"])
    B, T, H, K, V = spec["shape_t"]
    try:
        fn = _ops.resolve_ours(op, "chunk")
        pkg = fn.__module__.rsplit(".", 1)[0]  # generated.<pkg>
        plans = importlib.import_module(pkg + ".plans").CHUNK_PLANS
        plan = select_plan(plans, torch.device(device), dtype, max(K, V))  # 'no plan for ...' ends here
    except Exception as e:
        log(event="setup_error", error=_ops.err_text(e, 400))
        return 0
    arch = arch_of(torch.device(device))
    seed = _ops.seed_for(spec["seed"], op.name, spec["shape"])
    HV = spec.get("value_heads") or H
    names, args, kwargs = _ops.make_inputs(op, tuple(spec["shape_t"]), dtype, device, seed, value_heads=HV)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    do = torch.randn(B, T, HV, V, generator=gen, device=device, dtype=torch.float32).to(dtype)
    scale = _ops.scale_for(op, K)

    def fwd():
        return fn(*args, scale=scale, **kwargs)[0]

    def fwdbwd():
        fwd().backward(do)

    def outputs(mode: str) -> list:
        """o, and with 'fwdbwd' every input gradient, as fresh tensors."""
        for t in args:
            t.grad = None
        if mode == "fwd":
            with torch.no_grad():
                return [fwd().detach().clone()]
        o = fwd()
        o.backward(do)
        outs = [o.detach().clone()] + [t.grad.detach().clone() for t in args if t.grad is not None]
        for t in args:
            t.grad = None
        return outs

    op_ms, kernel_ms = _timers(device, spec["quick"])
    calls = {"fwd": fwd, "fwdbwd": fwdbwd}
    # the kernels are named after the public op (chunk_dplr_delta_rule: dplr_delta_rule_fwd_intra_kernel), which
    # need not be the package's name (generated.dplr)
    kernel_prefix = fn.__name__.removeprefix("chunk_")
    module = sys.modules[fn.__module__]
    log(event="plan", package=pkg.split(".")[-1], arch=arch, chunk_size=plan.chunk_size,
        inputs={n: list(t.shape) for n, t in zip(names, args, strict=True)},
        kernels={s: {f: getattr(c, f) for f in FIELDS} | {"reason": c.reason} for s, c in plan.kernels})
    stages = spec["stages"] or [s for s, _ in plan.kernels if s != "cumsum"]
    skip = set(spec.get("skip", []))  # "stage:variant" done by an earlier worker of this (op, shape)
    timed = set(spec.get("timed", []))  # stages whose default an earlier worker timed
    expected: dict[str, list] = {}
    crash_at = os.environ.get(CRASH_ENV, "").split(",")

    def measure(stage: str, mode: str) -> dict:
        grads = args if mode == "fwdbwd" else ()
        r = {"op_ms": round(op_ms(calls[mode], grads), 5)}
        try:
            r["kernel_ms"] = kernel_ms(calls[mode], f"{kernel_prefix}_{stage}_kernel", grads)
        except Exception as e:  # the profiler is a nicety: op_ms still ranks
            r["kernel_error"] = _ops.err_text(e, 200)
        for t in args:
            t.grad = None
        return r

    stages = [st for st in stages if st not in spec.get("skip_stages", [])]
    for j, stage in enumerate(stages):
        # an even share of the worker's time left per kernel, so the last kernels are not starved
        stage_deadline = time.time() + (spec["deadline"] - time.time()) / (len(stages) - j)
        if stage not in dict(plan.kernels):
            log(event="stage_error", stage=stage, error=f"plan has no kernel {stage!r}: {[s for s, _ in plan.kernels]}")
            continue
        mode = stage_mode(stage)
        if time.time() > spec["deadline"] - spec["min_left_s"]:
            log(event="budget", stage=stage)
            return 0
        if mode not in expected:
            try:
                expected[mode] = outputs(mode)
            except Exception as e:
                log(event="stage_error", stage=stage, error=f"default plan failed: {_ops.err_text(e, 400)}")
                if fatal_cuda(e):
                    return FATAL_RC
                continue
        cfg = plan.config(stage)
        default = {f: getattr(cfg, f) for f in FIELDS}
        todo = [v for v in variants(default, K, V, spec["max_variants"], spec.get("extra", {}).get(stage, []))
                if f"{stage}:{vkey(v)}" not in skip]
        if not todo and stage in timed:
            continue
        kname = f"{kernel_prefix}_{stage}_kernel"
        _, launch = recorded_launches(module, kname, lambda mode=mode: outputs(mode))
        tried = {launch: "the default"} if launch else {}
        log(event="default", stage=stage, mode=mode, cfg=default, planned=len(todo), launch=launch,
            **measure(stage, mode))
        for n, var in enumerate(todo):
            key = vkey(var)
            if time.time() > spec["deadline"] - spec["min_left_s"]:
                log(event="budget", stage=stage, untried=len(todo) - n)
                return 0
            if time.time() > stage_deadline - 2:
                log(event="stage_budget", stage=stage, untried=len(todo) - n)
                break
            log(event="start", stage=stage, variant=key)
            if f"{stage}:{key}" in crash_at:
                os._exit(7)
            changed = {f: v for f, v in var.items() if v != default.get(f)}
            rec = {"event": "result", "stage": stage, "mode": mode, "variant": key, "cfg": var}
            t0 = time.perf_counter()
            try:
                with overridden_plans({stage: changed}):
                    if f"cuda:{stage}:{key}" in crash_at:
                        raise RuntimeError("CUDA error: an illegal memory access was encountered (test hook)")
                    got, launch = recorded_launches(module, kname, lambda mode=mode: outputs(mode))  # compiles
                    rec["first_s"] = round(time.perf_counter() - t0, 2)
                    rec["launch"] = launch
                    if launch and launch in tried:
                        rec["status"] = "same_launch"
                        rec["error"] = f"launched as {tried[launch]}: {dict(zip(LAUNCH_KEYS, launch[0], strict=True))}"
                        log(**rec)
                        continue
                    if launch:
                        tried[launch] = key
                    errs = [_ops.rel_err(a, b) for a, b in zip(got, expected[mode], strict=True)]
                    rec["max_err"] = max(errs)
                    del got
                    if not rec["max_err"] <= spec["tol"]:
                        rec["status"] = "mismatch"
                    else:
                        rec.update(measure(stage, mode))
                        rec["status"] = "ok"
            except Exception as e:
                rec["status"] = classify(e)
                rec["error"] = _ops.err_text(e, 400)
                if fatal_cuda(e):
                    rec["status"] = "crash"
                    log(**rec)
                    return FATAL_RC
            log(**rec)
    log(event="done")
    return 0


# =============================================================================================
# parent: one worker per (op, shape), restarted after a crash, within the budget


def fold(lines: list[dict], op: str, shape: str) -> list[dict]:
    """Rows {op, shape, stage, mode, default, variants, best, speedup} from one worker's JSON lines."""
    rows: dict[str, dict] = {}
    started: dict[str, str] = {}
    for rec in lines:
        ev, stage = rec.get("event"), rec.get("stage")
        if ev in ("default", "result", "start", "lost", "stage_error"):
            row = rows.setdefault(stage, {"op": op, "shape": shape, "stage": stage, "variants": []})
        if ev == "default":
            row["mode"] = rec["mode"]
            # the latest default timing stands (a restarted worker re-times it)
            row["default"] = {k: rec[k] for k in ("cfg", "op_ms", "kernel_ms", "kernel_error") if k in rec}
        elif ev == "start":
            started[stage] = rec["variant"]
        elif ev == "result":
            started.pop(stage, None)
            row["variants"].append({k: v for k, v in rec.items() if k not in ("event", "stage", "t")})
        elif ev == "lost":
            row["variants"].append({"variant": rec["variant"], "status": rec["status"], "error": rec.get("error")})
        elif ev == "stage_error":
            row["error"] = rec["error"]
        if ev in ("budget", "stage_budget") and stage in rows:
            rows[stage]["untried"] = rec.get("untried", 0)
    for row in rows.values():
        _rank(row)
    return list(rows.values())


def _rank(row: dict) -> None:
    """The best ok variant and its speedup over the default (kernel_ms where both have it)."""
    d = row.get("default") or {}
    ok = [v for v in row["variants"] if v.get("status") == "ok"]
    use_kernel = bool(d.get("kernel_ms")) and ok and all(v.get("kernel_ms") for v in ok)
    metric = "kernel_ms" if use_kernel else "op_ms"
    row["metric"] = metric
    row["counts"] = {}
    for v in row["variants"]:
        row["counts"][v["status"]] = row["counts"].get(v["status"], 0) + 1
    if not ok or not d.get(metric):
        return
    best = min(ok, key=lambda v: v[metric])
    row["best"] = best["variant"]
    row["best_cfg"] = best["cfg"]
    row["speedup"] = round(d[metric] / best[metric], 3)
    row["speedup_op"] = round(d["op_ms"] / best["op_ms"], 3) if d.get("op_ms") and best.get("op_ms") else None


def _read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut off by a kill
    return out


def run(args) -> dict:
    ops = _ops.parse_ops(args.ops)
    shapes = _ops.parse_shapes(args.shapes)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    device = "cpu" if args.fake else (args.device or "cuda")
    dtype = args.dtype or ("float32" if args.fake else "bfloat16")
    extra = json.loads(args.extra_variants) if args.extra_variants else {}
    t0 = time.monotonic()
    deadline = time.time() + args.budget_s
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="flagen_sweep_"))
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "seed": seed, "device": device, "dtype": dtype,
        "fake": args.fake, "quick": args.quick, "tol": args.tol, "budget_s": args.budget_s,
        "value_heads": args.value_heads,
        "workdir": str(workdir), "versions": _ops.versions(), "workers": {}, "rows": [], "notes": [],
    }
    state = {"proc": None}

    def save():
        report["elapsed_s"] = round(time.monotonic() - t0, 1)
        _ops.write_json(args.out, report)

    def kill(proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: it and its compilers
        except ProcessLookupError:
            pass
        proc.wait()

    def on_term(signum, frame):
        if state["proc"] is not None and state["proc"].poll() is None:
            kill(state["proc"])
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_CACHE_DIR=str(workdir / "triton_cache"))
    if args.fake:
        env["TRITON_INTERPRET"] = "1"
    stages = [s for s in (args.stages or "").split(",") if s]
    tasks = list(itertools.product(ops, shapes))
    try:
        for i, (op, shape) in enumerate(tasks):
            # an even share of what is left, so that one slow op cannot starve the ones after it
            task_deadline = time.time() + (deadline - time.time()) / (len(tasks) - i)
            sstr = _ops.shape_str(shape)
            tag = f"{op}_{sstr}"
            path = workdir / f"{tag}.jsonl"
            info = report["workers"].setdefault(tag, {"starts": 0, "ended": []})
            while True:
                if time.time() > task_deadline - args.min_left_s:
                    info["ended"].append("budget")
                    break
                spec = {"op": op, "shape": sstr, "shape_t": list(shape), "value_heads": args.value_heads,
                        "seed": seed, "device": device,
                        "dtype": dtype, "quick": args.quick, "tol": args.tol, "stages": stages,
                        "max_variants": args.max_variants, "extra": extra, **_resume(_read_lines(path)),
                        "deadline": task_deadline, "min_left_s": args.min_left_s, "log": str(path)}
                info["starts"] += 1
                with open(workdir / f"{tag}.log", "a") as out:
                    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker",
                                             json.dumps(spec)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=str(ROOT))
                    state["proc"] = proc
                    n_seen, last_progress = 0, time.monotonic()
                    while proc.poll() is None:
                        time.sleep(0.5 if not args.fake else 0.1)
                        lines = _read_lines(path)
                        if len(lines) != n_seen:
                            n_seen, last_progress = len(lines), time.monotonic()
                            report["rows"] = [r for r in report["rows"] if (r["op"], r["shape"]) != (op, sstr)]
                            report["rows"] += fold(lines, op, sstr)
                            save()
                        stalled = time.monotonic() - last_progress > args.variant_timeout
                        if stalled or time.time() > task_deadline + 5:
                            kill(proc)
                            break
                    state["proc"] = None
                rc = proc.returncode
                lines = _read_lines(path)
                pending = _pending(lines)
                if rc == 0 and (not lines or lines[-1].get("event") in ("done", "budget", "setup_error")):
                    last = lines[-1] if lines else {}
                    info["ended"].append(last.get("event", "done"))
                    if last.get("event") == "setup_error":
                        info["error"] = last["error"]
                elif time.time() > task_deadline:
                    info["ended"].append("budget (killed)")
                    if pending:
                        _Log(str(path))(event="lost", stage=pending[0], variant=pending[1], status="timeout",
                                        error="cut off by the budget")
                else:
                    status = "timeout" if rc in (-9, None) else "crash"
                    why = (f"no progress for {args.variant_timeout:.0f} s" if status == "timeout"
                           else f"worker exited with rc {rc}")
                    info["ended"].append(f"{status}: {why}")
                    if pending is None and rc != FATAL_RC:
                        tail = (workdir / f"{tag}.log").read_text(errors="replace").strip().splitlines()[-8:]
                        info["log_tail"] = tail
                        break  # died outside a variant (import, default run): a restart would die again
                    if pending is not None:
                        _Log(str(path))(event="lost", stage=pending[0], variant=pending[1], status=status,
                                        error=why)
                    if info["starts"] >= args.max_restarts + 1:
                        info["ended"].append("too many restarts")
                        break
                    continue
                break
            report["rows"] = [r for r in report["rows"] if (r["op"], r["shape"]) != (op, sstr)]
            report["rows"] += fold(_read_lines(path), op, sstr)
            plan = next((rec for rec in _read_lines(path) if rec.get("event") == "plan"), None)
            if plan:
                report.setdefault("arch", plan["arch"])
                info["package"] = plan["package"]
                info["plan"] = plan["kernels"]
                info["inputs"] = plan.get("inputs")
            save()
    except SystemExit as e:
        report["notes"].append(f"run stopped early: {e}")
    finally:
        if state["proc"] is not None and state["proc"].poll() is None:
            kill(state["proc"])
        save()
    return report


def _resume(lines: list[dict]) -> dict:
    """What a restarted worker skips: variants with an outcome, stages that failed, stages already timed."""
    return {"skip": sorted({f"{r['stage']}:{r['variant']}" for r in lines if r.get("event") in ("result", "lost")}),
            "skip_stages": sorted({r["stage"] for r in lines if r.get("event") == "stage_error"}),
            "timed": sorted({r["stage"] for r in lines if r.get("event") == "default"})}


def _pending(lines: list[dict]) -> tuple[str, str] | None:
    """(stage, variant) started but without a result, if the worker died inside a variant."""
    done = {(r["stage"], r["variant"]) for r in lines if r.get("event") in ("result", "lost")}
    for r in reversed(lines):
        if r.get("event") == "start":
            return None if (r["stage"], r["variant"]) in done else (r["stage"], r["variant"])
    return None


# =============================================================================================
# table and proposals


def render_table(report: dict) -> str:
    v = report.get("versions", {})
    lines = [f"sweep_plans  device={v.get('gpu', report.get('device'))} arch={report.get('arch')}  "
             f"torch={v.get('torch')} triton={v.get('triton')}  dtype={report.get('dtype')}  "
             f"tol={report.get('tol')}  elapsed={report.get('elapsed_s')} s"
             f"{'  value heads ' + str(report['value_heads']) if report.get('value_heads') else ''}"
             f"{'  FAKE' if report.get('fake') else ''}"]
    hdr = ["op", "shape", "kernel", "in", "default", "default ms", "best", "best ms", "speedup", "op ms d/b",
           "tried"]
    body = []
    for r in report.get("rows", []):
        d = r.get("default") or {}
        metric = r.get("metric", "op_ms")
        best = next((x for x in r["variants"] if x["variant"] == r.get("best")), None)
        op_pair = "-"
        if best and d.get("op_ms") and best.get("op_ms"):
            op_pair = f"{_ops.fmt(d['op_ms'])}/{_ops.fmt(best['op_ms'])}"
        counts = ",".join(f"{k}:{n}" for k, n in sorted(r.get("counts", {}).items())) or "-"
        if r.get("untried"):
            counts += f",untried:{r['untried']}"
        body.append([r["op"], r["shape"], r["stage"], r.get("mode", "-"),
                     vkey(d["cfg"]) if d.get("cfg") else r.get("error", "-"),
                     _ops.fmt(d.get(metric)), r.get("best") or "-", _ops.fmt(best.get(metric)) if best else "-",
                     _ops.fmt(r.get("speedup"), 2), op_pair, counts])
    lines += _ops.grid(hdr, body)
    lines.append("ms: kernel alone (torch.profiler, per call) where measured, else the whole call (do_bench "
                 "median); speedup = default / best (> 1: a variant beats the plan); op ms d/b: the whole "
                 "fwd or fwd+bwd call, default / best")
    fails = []
    for r in report.get("rows", []):
        for x in r["variants"]:
            if x.get("status") not in ("ok", None):
                why = x.get("error") or (f"max err {x.get('max_err'):.2e}" if x.get("max_err") is not None else "")
                fails.append(f"  {r['op']} {r['shape']} {r['stage']} {x['variant']}: {x['status']}  {why[:160]}")
    if fails:
        lines.append("not kept:")
        lines += fails
    for tag, w in report.get("workers", {}).items():
        if w.get("error"):
            lines.append(f"{tag}: not swept: {w['error']}")
        elif w.get("ended") and w["ended"][-1] != "done":
            lines.append(f"worker {tag}: {'; '.join(w['ended'])}" + (f" | {w['log_tail'][-1]}" if w.get("log_tail")
                                                                     else ""))
    for n in report.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)


def propose(report: dict, min_speedup: float, source: str) -> str:
    """Lines for fla_gen/tuned.py (Python source) for every kernel whose best variant beats the default by
    ``min_speedup``, grouped by the entry key, and the fla_gen/measurements.py Source of each new id; rows of
    one key that disagree are emitted commented out, for a person to decide."""
    from fla_gen.canonical import canonicalize
    from fla_gen.check import check_spec
    from fla_gen.parse import read_spec
    from fla_gen.plan import select_algorithms
    from fla_gen.runtime.plan_types import head_dim_bucket

    arch = report.get("arch")
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[report["dtype"]]
    gpu = report.get("versions", {}).get("gpu") or report.get("device")
    algo_of: dict[str, str] = {}
    groups: dict[tuple, list[dict]] = {}
    for r in report.get("rows", []):
        if not r.get("best") or (r.get("speedup") or 0) < min_speedup:
            continue
        pkg = report.get("workers", {}).get(f"{r['op']}_{r['shape']}", {}).get("package", r["op"])
        if pkg not in algo_of:
            rec = canonicalize(check_spec(read_spec(ROOT / "specs" / f"{pkg}.fla")))
            algo_of[pkg] = select_algorithms(rec)[0].name
        _, _, _, K, V = _ops.parse_shape(r["shape"])
        key = (algo_of[pkg], r["stage"], dtype, head_dim_bucket(max(K, V)))
        groups.setdefault(key, []).append(r)
    out = [f"# proposed from {source} (min speedup {min_speedup}); fla_gen/tuned.py, under TUNED[{arch!r}]:"]
    sources: dict[str, list[str]] = {}
    for key, rows in groups.items():
        cfgs = {r["best"] for r in rows}
        best = rows[0]["best_cfg"]
        sid = f"{arch}-{key[0].removeprefix('chunk_')}-{key[1]}".replace("_", "-").lower()
        entry = (f"        {key!r}: Tuned({best['block_k']}, {best['block_v']}, {best['num_warps']}, "
                 f"{best['num_stages']}, {sid!r}),")
        if len(cfgs) > 1:
            out.append(f"# rows of {key} disagree on the best variant ({sorted(cfgs)}): decide by hand")
            entry = "# " + entry
        else:
            sources.setdefault(sid, []).extend(_measurement(r, report.get("value_heads")) for r in rows)
        out.append(entry)
    if not groups:
        out.append(f"# no kernel beat its default by {min_speedup}x")
    if sources:
        out.append("# fla_gen/measurements.py, in SOURCES:")
        for sid, whys in sources.items():
            text = f"{gpu}: {'; '.join(whys)} (benchmarks/sweep_plans.py, {Path(source).name})"
            out.append(f"    {sid!r}: Source({text!r}, ({arch!r},)),")
    return "\n".join(out)


def _measurement(row: dict, value_heads: int | None = None) -> str:
    """'gla 4x4096x16x128: fwd_o kernel 0.41 -> 0.33 ms, fwd 1.33 -> 1.25 ms, against bk64_bv64_w4_s2' (the
    shape followed by ', HV=32' for grouped value heads)."""
    best = next(x for x in row["variants"] if x["variant"] == row["best"])
    d = row["default"]
    parts = []
    if row["metric"] == "kernel_ms":
        parts.append(f"{row['stage']} kernel {d['kernel_ms']:.4g} -> {best['kernel_ms']:.4g} ms")
    parts.append(f"{row['mode'].replace('fwdbwd', 'fwd+bwd')} {d['op_ms']:.4g} -> {best['op_ms']:.4g} ms")
    heads = f", HV={value_heads}" if value_heads else ""
    return f"{row['op']} {row['shape']}{heads}: {', '.join(parts)}, against {vkey(d['cfg'])}"


# =============================================================================================


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=None, help=f"comma-separated chunk ops (default gla; --fake: linear_attn), "
                                               f"from: {','.join(_ops.OPS)}")
    p.add_argument("--shapes", default=None, help="comma-separated BxTxHxD or BxTxHxKxV "
                                                  "(default 4x4096x16x128; --fake: 1x64x1x64)")
    p.add_argument("--value-heads", type=int, default=None, metavar="HV",
                   help="grouped value heads for the ops that take them (v, g, beta on HV heads, q and k on the "
                        "shapes' H; Qwen3-Next: 32 with H = 16); default H")
    p.add_argument("--stages", default=None, help="kernels to sweep, e.g. fwd_o,bwd_dv (default: all but cumsum)")
    p.add_argument("--max-variants", type=int, default=10, help="variants per kernel, nearest the default first")
    p.add_argument("--extra-variants", default=None,
                   help='JSON {stage: [{field: value}, ...]}: tried first, e.g. \'{"fwd_o": [{"num_warps": 8}]}\'')
    p.add_argument("--tol", type=float, default=1e-2, help="max relative error against the default plan's outputs")
    p.add_argument("--budget-s", type=float, default=520.0, help="wall budget for the whole run")
    p.add_argument("--min-left-s", type=float, default=15.0, help="start no variant with less time than this left")
    p.add_argument("--variant-timeout", type=float, default=150.0,
                   help="kill a worker that reports nothing for this long (seconds)")
    p.add_argument("--max-restarts", type=int, default=6, help="worker restarts per (op, shape) after crashes")
    p.add_argument("--quick", action="store_true", help="short do_bench (5 ms warm-up, 20 ms repeats)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="default cuda (cpu with --fake)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default bfloat16 (float32 with --fake)")
    p.add_argument("--out", default=None, help="JSON result, rewritten after every variant")
    p.add_argument("--table", default=None, help="also write the table here")
    p.add_argument("--workdir", default=None, help="scratch dir (worker logs, JSON lines, Triton cache)")
    p.add_argument("--fake", action="store_true", help="CPU: the real ops in Triton's interpreter, tiny shapes")
    p.add_argument("--render", default=None, metavar="JSON", help="only print the table of a saved sweep")
    p.add_argument("--propose", default=None, metavar="JSON", help="print fla_gen/measurements.py entries for the wins")
    p.add_argument("--min-speedup", type=float, default=1.03, help="with --propose: smallest speedup to propose")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = args.ops or ("linear_attn" if args.fake else "gla")
    args.shapes = args.shapes or ("1x64x1x64" if args.fake else "4x4096x16x128")
    if args.value_heads is not None and not args.worker and not args.render and not args.propose:
        if args.value_heads < 1:
            p.error(f"--value-heads must be positive, got {args.value_heads}")
        for name, shape in itertools.product(_ops.parse_ops(args.ops), _ops.parse_shapes(args.shapes)):
            if not _ops.has_value_heads(_ops.OPS[name]):  # even at HV = H: the flag asks for a grouped call
                p.error(f"--value-heads: {name} has no grouped value heads")
            try:
                _ops.check_value_heads(_ops.OPS[name], shape[2], args.value_heads)
            except ValueError as e:
                p.error(f"--value-heads: {e} ({name} {_ops.shape_str(shape)})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.render:
        print(render_table(json.loads(Path(args.render).read_text())))
        return 0
    if args.propose:
        print(propose(json.loads(Path(args.propose).read_text()), args.min_speedup, args.propose))
        return 0
    report = run(args)
    _ops.print_table(render_table(report), args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
