#!/usr/bin/env python3
"""Benchmark generated ops against fla-core and PyTorch SDPA on one GPU, in one command.

    python benchmarks/bench_ops.py --ops linear_attn,simple_gla,gla --shapes 4x4096x16x128 \
        --out $OUT/bench.json [--table $OUT/bench_table.txt] [--quick] [--skip-first-call]

Per op and shape, for ours (``generated.<op>``), fla-core (``fla.ops``) and SDPA (causal softmax
attention, same B, T, H, D), each in its own fresh process:
- first call: wall seconds of the very first forward and the first backward in a fresh process
  with an empty ``TRITON_CACHE_DIR`` (Triton compile + any autotune; imports excluded, reported
  apart, and so is torch's own one-time cost of a process's first ``backward(grad)``, which imports
  sympy: ``torch_autograd_init_s``, 2.8 s on the H100 machine, paid once by any torch model).
  Timeout per process ``--timeout`` (400 s), reported as 'timeout'.
- forward and forward+backward time: ``triton.testing.do_bench`` median (its warm-up excluded),
  inputs with requires_grad (a training forward), gradients reset to None between repetitions.
- peak memory of one forward+backward: ``torch.cuda.max_memory_allocated`` after a reset, with
  the inputs, ``do`` and the gradients counted (``peak_extra_mb`` excludes what existed before).
- correctness: ours vs fla (relative norm error ||ours - fla|| / ||fla|| of o and of every input
  gradient, same inputs: every process draws them from the same seed), and ours and fla vs our
  float64 reference on a cheap slice (B=1, H<=2, T<=256: causal and per-head, so the first tokens
  of the full run are comparable).
- memory floor: bytes that must move (forward: inputs read once + o written once; forward+backward:
  that + inputs and do read + gradients written) over the device-to-device copy bandwidth measured
  in the same run (a 1 GiB copy, bytes read + written, do_bench median).

Inputs: bf16, distributions documented in benchmarks/_ops.py (gates logsigmoid(randn)/16).
Nothing here crashes on a missing or refusing library: a missing generated op is skipped with a
note, an fla import error or a raise (e.g. its Hopper refusal of the gated backward) becomes the
cell's text, and a worker that dies or times out is reported as such. Results are written after
every worker, so a run killed from outside still leaves its JSON. The whole run keeps within
``--budget-s``: what does not fit is reported 'skipped (budget)'; ours runs before fla.

``--fla-jobs N`` runs fla's first calls (compile + autotune: minutes) N at a time, then times
each one alone from its warmed cache; first-call seconds measured that way are marked '*'.
``--autotune-cache DIR`` keeps fla's autotune results across device calls: fla-core caches each
kernel's chosen config as ``<hash>/<kernel>.autotune.json`` in the Triton cache (its default
``cache_results``; the hash covers Triton, the GPU, the kernel source and the tuning key). fla workers'
cache dirs are seeded from DIR, and every result file of the run is copied back into DIR at the end, so
a later call (DIR carried to the device) compiles only the chosen configs instead of autotuning for
minutes. fla's first-call seconds from a seeded cache exclude the autotune: the report says so.
``--fake`` replaces every op by a CPU stand-in to exercise this script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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

LIBS = ("sdpa", "ours", "fla")


# =============================================================================================
# worker: runs in a fresh process, writes one JSON result


def _bench_fn(device: str, quick: bool):
    """Median milliseconds of fn(): do_bench on CUDA, a perf_counter loop elsewhere."""
    import torch

    if torch.device(device).type == "cuda":
        from triton.testing import do_bench

        warmup, rep = (5, 20) if quick else (25, 100)

        def bench(fn, grad_to_none=None):
            return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                  return_mode="median"))
        return bench

    def bench_cpu(fn, grad_to_none=None):
        fn()
        ts = []
        for _ in range(3 if quick else 7):
            for t in grad_to_none or ():
                t.grad = None
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        return ts[len(ts) // 2]
    return bench_cpu


class _Result:
    def __init__(self, path: str, **fields):
        self.path = path
        self.d = dict(fields)
        self.d.setdefault("errors", {})
        self.write()

    def __setitem__(self, k, v):
        self.d[k] = v
        self.write()

    def err(self, phase: str, e: BaseException):
        self.d["errors"][phase] = _ops.err_text(e)
        self.write()

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.d, f, indent=1)
        os.replace(tmp, self.path)


def _peak(device, fn):
    """(peak MB, peak minus memory before) of fn() on CUDA; (None, None) elsewhere."""
    import torch

    if torch.device(device).type != "cuda":
        fn()
        return None, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak / 2**20, (peak - base) / 2**20


def _dtype(spec: dict):
    """bfloat16 unless --dtype says otherwise; float32 for --fake on a CPU."""
    import torch

    name = spec.get("dtype") or ("float32" if spec.get("fake") and spec["device"] == "cpu" else "bfloat16")
    return getattr(torch, name)


def worker_op(spec: dict) -> None:
    t_imp = time.perf_counter()
    import torch

    res = _Result(spec["result"], **{k: spec[k] for k in ("lib", "op", "shape", "mode")})
    op = _ops.OPS[spec["op"]]
    device, fake = spec["device"], spec["fake"]
    try:
        if spec["lib"] == "ours":
            fn = _ops.resolve_ours(op, spec["mode"], fake)
        else:
            fn = _ops.resolve_fla(op, spec["mode"], fake)
    except Exception as e:  # ImportError, AttributeError, anything raised at import
        res["missing"] = _ops.err_text(e)
        return
    bound = spec.get("gate_lower_bound")
    if bound is not None and not fake:
        # ours: gate_lower_bound; fla-core 0.6.0's DPLR ops: lower_bound (both pick longer chunks with it)
        import inspect

        key = "gate_lower_bound" if spec["lib"] == "ours" else "lower_bound"
        if key in inspect.signature(fn).parameters:
            unbounded = fn

            def fn(*a, **kw):
                return unbounded(*a, **kw, **{key: bound})
        else:
            res["note"] = f"no {key} argument: run without a bound"
    res["import_s"] = round(time.perf_counter() - t_imp, 2)
    try:
        ref = _ops.resolve_ours(op, "reference", fake) if spec["ref_slice"] else None
    except Exception as e:
        ref = None
        res.err("ref_import", e)

    shape = tuple(spec["shape_t"])
    B, T, H, K, V = shape
    dtype = _dtype(spec)
    seed = _ops.seed_for(spec["seed"], op.name, spec["shape"], spec["g_gamma"])
    names, args, kwargs = _ops.make_inputs(op, shape, dtype, device, seed, g_gamma=spec["g_gamma"],
                                           gate_scale=spec.get("gate_scale", 1.0))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    do = torch.randn(B, T, H, V, generator=gen, device=device, dtype=torch.float32).to(dtype)
    scale = _ops.scale_for(op, K)

    def fwd():
        return fn(*args, scale=scale, **kwargs)

    def fwd_bwd():
        o, _ = fwd()
        o.backward(do)

    bwd_ok = True
    if spec["first_call"]:
        res["torch_autograd_init_s"] = round(_ops.prime_torch_autograd(), 3)
        out = []
        try:
            res["first_fwd_s"] = round(_ops.wall(lambda: out.append(fwd()), device), 3)
        except Exception as e:
            res.err("fwd", e)
            return
        try:
            res["first_bwd_s"] = round(_ops.wall(lambda: out[0][0].backward(do), device), 3)
        except Exception as e:
            res.err("fwd_bwd", e)
            bwd_ok = False
        del out
    if not spec["measure"]:
        return

    bench = _bench_fn(device, spec["quick"])
    try:
        with torch.no_grad():
            o_nograd, _ = fwd()  # warm-up (compiles here when no first call ran)
        # keep o off the device so that it does not count in the peak memory below
        Ts, Hs = min(T, 256), min(H, 2)
        o_head = o_nograd[:1, :Ts, :Hs].double()
        o_cpu = o_nograd.detach().cpu()
        res["bytes_out"] = int(o_nograd.numel() * o_nograd.element_size())
        del o_nograd
        res["fwd_ms"] = round(bench(fwd), 4)
    except Exception as e:
        res.err("fwd", e)
        return
    if bwd_ok:
        try:
            fwd_bwd()
        except Exception as e:
            res.err("fwd_bwd", e)
            bwd_ok = False
    for t in args:
        t.grad = None
    saved = {}
    if bwd_ok:
        outs = []
        res["peak_mb"], res["peak_extra_mb"] = _peak(device, lambda: outs.append(fwd_bwd()))
        saved["grads"] = {n: t.grad.detach().cpu() for n, t in zip(names, args, strict=True)
                          if t.grad is not None}
        res["fwdbwd_ms"] = round(bench(fwd_bwd, grad_to_none=args), 4)
    saved["o"] = o_cpu
    res["bytes_in"] = int(sum(t.numel() * t.element_size() for t in args))
    if spec.get("save"):
        torch.save(saved, spec["save"])
        res["saved"] = spec["save"]

    if ref is not None:
        try:
            sl = [a.detach()[:1, :Ts, :Hs].double() for a in args]
            kw = {k: v[:Hs].double() for k, v in kwargs.items()}
            with torch.no_grad():
                o_ref, _ = ref(*sl, scale=scale, **kw)
            res["ref_slice_err"] = _ops.rel_err(o_head, o_ref)
            res["ref_slice"] = f"1x{Ts}x{Hs}"
        except Exception as e:
            res.err("ref_slice", e)


def worker_baseline(spec: dict) -> None:
    """SDPA causal timings for one shape, and (once) the device-to-device copy bandwidth."""
    t_imp = time.perf_counter()
    import torch
    import torch.nn.functional as F

    res = _Result(spec["result"], lib="sdpa", op="sdpa", shape=spec["shape"], mode="causal")
    device = spec["device"]
    res["import_s"] = round(time.perf_counter() - t_imp, 2)
    bench = _bench_fn(device, spec["quick"])
    B, T, H, K, V = spec["shape_t"]
    dtype = _dtype(spec)
    gen = torch.Generator(device=device)
    gen.manual_seed(spec["seed"])
    if spec.get("copy_bw"):
        try:
            n = (1 << 30) if device != "cpu" else (1 << 26)
            x = torch.randn(n // 4, generator=gen, device=device)
            y = torch.empty_like(x)
            ms = bench(lambda: y.copy_(x))
            res["copy_bytes"] = 2 * n
            res["copy_ms"] = round(ms, 4)
            res["copy_tbs"] = round(2 * n / (ms * 1e-3) / 1e12, 3)
            del x, y
        except Exception as e:
            res.err("copy_bw", e)
    if not spec["sdpa"]:
        return
    try:
        qkv = [torch.randn(B, T, H, D, generator=gen, device=device).to(dtype).requires_grad_(True)
               for D in (K, K, V)]
        do = torch.randn(B, T, H, V, generator=gen, device=device).to(dtype).transpose(1, 2)

        def fwd():
            q, k, v = (t.transpose(1, 2) for t in qkv)  # [B, H, T, D] views of [B, T, H, D]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            fwd().backward(do)

        t1 = _ops.wall(fwd, device)
        t2 = _ops.wall(fwd_bwd, device)
        res["first_fwd_s"], res["first_bwd_s"] = round(t1, 3), round(t2, 3)
        res["fwd_ms"] = round(bench(fwd), 4)
        for t in qkv:
            t.grad = None
        res["peak_mb"], res["peak_extra_mb"] = _peak(device, fwd_bwd)
        res["fwdbwd_ms"] = round(bench(fwd_bwd, grad_to_none=qkv), 4)
    except Exception as e:
        res.err("sdpa", e)


# =============================================================================================
# parent: schedules workers within the budget, compares, prints


class Runner:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="flagen_bench_"))
        for sub in ("res", "log", "cache", "tensors"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.active: dict[int, subprocess.Popen] = {}

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def start(self, spec: dict, cache_dir: Path) -> tuple[subprocess.Popen, object, float]:
        env = dict(os.environ)
        env["TRITON_CACHE_DIR"] = str(cache_dir)
        env["PYTHONUNBUFFERED"] = "1"
        cache_dir.mkdir(parents=True, exist_ok=True)
        if spec.get("lib") == "fla" and self.args.autotune_cache:
            copy_autotune_results(Path(self.args.autotune_cache), cache_dir)
        log = open(self.workdir / "log" / (spec["tag"] + ".log"), "a")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(ROOT))
        self.active[proc.pid] = proc
        return proc, log, time.monotonic()

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: it and its compilers
        except ProcessLookupError:
            pass
        proc.wait()

    def kill_all(self) -> None:
        for proc in list(self.active.values()):
            if proc.poll() is None:
                self.kill(proc)
        self.active.clear()

    def finish(self, spec, proc, log, started, timeout) -> dict:
        """Wait for a started worker; return its result dict with the way it ended."""
        try:
            proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
            ended = None if proc.returncode == 0 else f"crash (rc {proc.returncode})"
        except subprocess.TimeoutExpired:
            self.kill(proc)
            ended = f"timeout ({timeout:.0f} s)"
        log.close()
        self.active.pop(proc.pid, None)
        path = Path(spec["result"])
        res = json.loads(path.read_text()) if path.exists() else {"errors": {}}
        res["worker_s"] = round(time.monotonic() - started, 1)
        if ended:
            res["ended"] = ended
            tail = (self.workdir / "log" / (spec["tag"] + ".log")).read_text(errors="replace")
            res["log_tail"] = tail.strip().splitlines()[-12:]
        return res

    def timeout_now(self) -> float | None:
        left = self.remaining() - 5
        if left < 20:
            return None
        return min(self.args.timeout, left)

    def run_one(self, spec: dict, cache_dir: Path) -> dict:
        timeout = self.timeout_now()
        if timeout is None:
            return {"skipped": "budget"}
        proc, log, started = self.start(spec, cache_dir)
        return self.finish(spec, proc, log, started, timeout)

    def run_parallel(self, specs_dirs: list, jobs: int) -> list[dict]:
        """Run specs at most `jobs` at a time; results in input order."""
        results: list[dict | None] = [None] * len(specs_dirs)
        pending = list(enumerate(specs_dirs))
        running: list = []
        while pending or running:
            while pending and len(running) < jobs:
                timeout = self.timeout_now()
                i, (spec, cdir) = pending.pop(0)
                if timeout is None:
                    results[i] = {"skipped": "budget"}
                    continue
                running.append((i, spec, timeout, *self.start(spec, cdir)))
            time.sleep(0.5)
            for item in list(running):
                i, spec, timeout, proc, log, started = item
                over = time.monotonic() - started > timeout
                if proc.poll() is not None or over:
                    results[i] = self.finish(spec, proc, log, started, timeout)
                    running.remove(item)
        return [r if r is not None else {"skipped": "budget"} for r in results]


def autotune_result_files(root: Path) -> list[Path]:
    """Triton's autotune result files (``<hash>/<kernel>.autotune.json``) under root; none if it is absent."""
    return sorted(root.glob("**/*.autotune.json")) if root.is_dir() else []


def copy_autotune_results(src: Path, dst: Path) -> int:
    """Copy every Triton autotune result file found under src into dst, keeping the hash directory;
    returns how many were copied (0 when src does not exist)."""
    n = 0
    for f in autotune_result_files(src):
        target = dst / f.parent.name / f.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
            n += 1
    return n


def warm_call(r: Runner, spec: dict, cache_dir: Path) -> dict:
    """First forward and backward of one more fresh process on the Triton cache that a measured run
    left behind: the first call a user sees once Triton has compiled the plan (imports excluded)."""
    spec = {**spec, "tag": spec["tag"] + "_warm", "result": spec["result"].replace(".json", "_warm.json")}
    res = r.run_one(spec, cache_dir)
    out = {f"warm_{k}": res[k] for k in ("first_fwd_s", "first_bwd_s", "torch_autograd_init_s") if k in res}
    if res.get("ended") or res.get("errors"):
        # the worker's errors are already footnote texts, by stage
        out["warm_error"] = res.get("ended") or "; ".join(f"{k}: {v}" for k, v in res["errors"].items())
    return out


def compare_saved(ours: dict, fla: dict) -> dict:
    """Relative errors ours vs fla from the tensors both workers saved (CPU, float64)."""
    import torch

    out: dict = {}
    if not (ours.get("saved") and fla.get("saved")):
        return out
    try:
        a = torch.load(ours["saved"], map_location="cpu")
        b = torch.load(fla["saved"], map_location="cpu")
    except Exception as e:
        return {"error": _ops.err_text(e)}
    out["o"] = _ops.rel_err(a["o"], b["o"])
    for n, g in a.get("grads", {}).items():
        if n in b.get("grads", {}):
            out["d" + n] = _ops.rel_err(g, b["grads"][n])
    return out


def run(args) -> dict:
    ops = _ops.parse_ops(args.ops)
    shapes = _ops.parse_shapes(args.shapes)
    libs = [x for x in args.libs.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    r = Runner(args)
    report: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seed": seed, "device": device, "fake": args.fake, "quick": args.quick,
        "g_gamma": args.g_gamma, "gate_scale": args.gate_scale, "gate_lower_bound": args.gate_lower_bound,
        "dtype": args.dtype or "bfloat16", "first_call": not args.skip_first_call,
        "fla_jobs": args.fla_jobs,
        "autotune_cache_seeded": len(autotune_result_files(Path(args.autotune_cache))) if args.autotune_cache else 0,
        "workdir": str(r.workdir), "versions": _versions(), "baseline": {}, "rows": [], "notes": [],
    }

    def save():
        report["elapsed_s"] = round(time.monotonic() - r.t0, 1)
        _ops.write_json(args.out, report)

    def on_term(signum, frame):
        r.kill_all()
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    def spec_for(lib, op, shape, mode, first_call, measure):
        tag = f"{lib}_{op}_{mode}_{_ops.shape_str(shape)}"
        return {
            "kind": "op", "lib": lib, "op": op, "mode": mode, "shape": _ops.shape_str(shape),
            "shape_t": list(shape), "seed": seed, "g_gamma": args.g_gamma, "quick": args.quick,
            "fake": args.fake, "device": device, "first_call": first_call, "measure": measure,
            "dtype": args.dtype, "gate_lower_bound": args.gate_lower_bound, "gate_scale": args.gate_scale,
            "ref_slice": not args.no_ref_slice, "tag": tag,
            "result": str(r.workdir / "res" / f"{tag}.json"),
            "save": str(r.workdir / "tensors" / f"{tag}.pt") if {"ours", "fla"} <= set(libs) else None,
        }

    shared_cache = r.workdir / "cache" / "shared"
    rows: dict = {}
    try:
        # 1. baselines: copy bandwidth (once) and SDPA per shape
        if "sdpa" in libs or not args.no_floor:
            for i, shape in enumerate(shapes):
                sstr = _ops.shape_str(shape)
                spec = {"kind": "baseline", "shape": sstr, "shape_t": list(shape), "seed": seed,
                        "quick": args.quick, "device": device, "tag": f"sdpa_{sstr}", "dtype": args.dtype,
                        "fake": args.fake,
                        "copy_bw": i == 0 and not args.no_floor, "sdpa": "sdpa" in libs,
                        "result": str(r.workdir / "res" / f"sdpa_{sstr}.json")}
                cdir = shared_cache if args.skip_first_call else r.workdir / "cache" / f"sdpa_{sstr}"
                res = r.run_one(spec, cdir)
                report["baseline"][sstr] = res
                if i == 0 and res.get("copy_tbs"):
                    report["copy_tbs"] = res["copy_tbs"]
                _progress(f"sdpa {sstr}", res)
                save()

        # 2. ours, then fla
        for lib in ("ours", "fla"):
            if lib not in libs:
                continue
            tasks = [(op, shape, mode) for op in ops for shape in shapes for mode in modes]
            if lib == "fla" and args.fla_jobs > 1:
                prep = []
                for op, shape, mode in tasks:
                    s = spec_for(lib, op, shape, mode, True, False)
                    prep.append((s, r.workdir / "cache" / s["tag"]))
                pres = r.run_parallel(prep, args.fla_jobs)
                for (op, shape, mode), (_, cdir), p in zip(tasks, prep, pres, strict=True):
                    key = (op, _ops.shape_str(shape), mode)
                    failed = p.get("errors", {}).get("fwd")
                    if failed or p.get("missing") or p.get("skipped") or p.get("ended"):
                        res = p
                    else:
                        m = spec_for(lib, op, shape, mode, False, True)
                        m["tag"] += "_measure"
                        m["result"] = m["result"].replace(".json", "_measure.json")
                        res = r.run_one(m, cdir)
                        for k in ("first_fwd_s", "first_bwd_s"):
                            if k in p:
                                res[k] = p[k]
                        res.setdefault("errors", {}).update(
                            {f"first_{k}": v for k, v in p.get("errors", {}).items()})
                        res["first_call_concurrent"] = args.fla_jobs
                        if args.skip_first_call:
                            res.pop("first_fwd_s", None)
                            res.pop("first_bwd_s", None)
                    rows.setdefault(key, {})[lib] = res
                    _progress(f"{lib} {op} {mode} {key[1]}", res)
                    report["rows"] = _rows_list(rows)
                    save()
            else:
                for op, shape, mode in tasks:
                    key = (op, _ops.shape_str(shape), mode)
                    s = spec_for(lib, op, shape, mode, not args.skip_first_call, True)
                    cdir = shared_cache if args.skip_first_call else r.workdir / "cache" / s["tag"]
                    res = r.run_one(s, cdir)
                    if args.warm_call and not res.get("ended") and not res.get("skipped"):
                        res.update(warm_call(r, spec_for(lib, op, shape, mode, True, False), cdir))
                    rows.setdefault(key, {})[lib] = res
                    _progress(f"{lib} {op} {mode} {key[1]}", res)
                    report["rows"] = _rows_list(rows)
                    save()
            report["rows"] = _rows_list(rows)
            save()
    except SystemExit as e:
        report["notes"].append(f"run stopped early: {e}")
    finally:
        r.kill_all()
        if args.autotune_cache:
            report["autotune_cache_added"] = copy_autotune_results(r.workdir / "cache", Path(args.autotune_cache))
            if report["autotune_cache_seeded"]:
                report["notes"].append(f"fla autotune results seeded from {args.autotune_cache} "
                                       f"({report['autotune_cache_seeded']} files): fla first calls exclude autotune")
        # 3. compare and summarise
        for (_op, _shape, _mode), d in rows.items():
            if "ours" in d and "fla" in d:
                d["ours_vs_fla"] = compare_saved(d["ours"], d["fla"])
        report["rows"] = _rows_list(rows)
        _derive(report)
        save()
        if not args.keep_tensors:
            for f in (r.workdir / "tensors").glob("*.pt"):
                f.unlink()
    return report


def _rows_list(rows: dict) -> list:
    return [{"op": k[0], "shape": k[1], "mode": k[2], **v} for k, v in rows.items()]


def _derive(report: dict) -> None:
    """Floors (ms) from the copy bandwidth and each row's byte counts; fla/ours ratios."""
    bw = report.get("copy_tbs")
    for row in report["rows"]:
        src = next((row[lib] for lib in ("ours", "fla") if lib in row and row[lib].get("bytes_in")), None)
        if bw and src:
            bi, bo = src["bytes_in"], src["bytes_out"]
            row["floor_fwd_ms"] = round((bi + bo) / (bw * 1e12) * 1e3, 4)
            # backward: inputs and do read again, one gradient per input written
            row["floor_fwdbwd_ms"] = round((3 * bi + 2 * bo) / (bw * 1e12) * 1e3, 4)
        for k in ("fwd_ms", "fwdbwd_ms"):
            a, b = row.get("ours", {}).get(k), row.get("fla", {}).get(k)
            if a and b:
                row[f"ratio_{k}"] = round(b / a, 3)
            floor = row.get("floor_" + k)
            if a and floor:
                row[f"floor_ratio_{k}"] = round(a / floor, 2)  # ours over the floor: issue 7 asks <= 3 (fwd)


# ---------------------------------------------------------------------------------------------
# table


def _fmt(x, nd=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if abs(x) >= 100 or nd == 0:
            return f"{x:.0f}"
        if abs(x) < 1e-2 and x != 0:
            return f"{x:.{max(nd - 1, 1)}e}"
        t = f"{x:.{nd}f}"
        return t.rstrip("0").rstrip(".") if "." in t else t
    return str(x)


class _Notes:
    """Footnotes: one per distinct reason, listing the cells it explains."""

    def __init__(self):
        self.by_why: dict[str, list[str]] = {}

    def mark(self, why: str, what: str) -> str:
        whats = self.by_why.setdefault(why, [])
        if what not in whats:
            whats.append(what)
        return f"[{list(self.by_why).index(why) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i + 1}] {why}  ({', '.join(whats)})" for i, (why, whats) in enumerate(self.by_why.items())]


def phase_error(res: dict, phase: str) -> str | None:
    """The error a worker recorded that left phase 'fwd' or 'fwd_bwd' without a time: that phase's own,
    its first call's, or the forward's (a failed forward leaves no backward); None if none."""
    errs = res.get("errors")
    if not isinstance(errs, dict):
        return None
    return errs.get(phase) or errs.get("first_" + phase) or errs.get("fwd") or errs.get("first_fwd")


def _why(res: dict, phase: str) -> str | None:
    """Why a result has no number for phase 'fwd' / 'fwd_bwd' / 'first'."""
    if res.get("missing"):
        return f"missing: {res['missing']}"
    if phase == "first":
        errs = res.get("errors", {})
        e = errs.get("first_fwd") or (errs.get("fwd") if not res.get("first_call_concurrent") else None)
    else:
        e = phase_error(res, phase)
    return e or res.get("ended")


def _cell(res: dict | None, key: str, notes: _Notes, what: str, nd=3) -> str:
    """A number, or a footnote mark for why there is none."""
    if res is None:
        return "-"
    if res.get(key) is not None:
        return _fmt(res[key], nd)
    if res.get("skipped"):
        return "skip"
    why = _why(res, "fwd" if key == "fwd_ms" else "fwd_bwd")
    if why and "no plan for" in why:  # the planner has no launch config for this dtype / head dim / arch
        return "no plan" + notes.mark(why, what)
    return notes.mark(why, what) if why else "-"


def _first_cell(res: dict | None, notes: _Notes, what: str, enabled: bool) -> str:
    """First fwd + first bwd seconds; '(fwd)': the backward failed or never ran; '*': concurrent."""
    if res is None:
        return "-"
    a, b = res.get("first_fwd_s"), res.get("first_bwd_s")
    if a is None:
        if res.get("skipped"):
            return "skip"
        why = _why(res, "first") if enabled else None
        return notes.mark(why, what) if why else "-"
    v = _fmt(a + (b or 0.0))
    if res.get("first_call_concurrent"):
        v += "*"
    if b is None:
        v += "(fwd)"
    return v


def render_table(report: dict) -> str:
    notes = _Notes()
    first_on = bool(report.get("first_call"))
    lines = []
    bw = report.get("copy_tbs")
    v = report.get("versions", {})
    lines.append(f"bench_ops  device={v.get('gpu', report.get('device'))}  torch={v.get('torch')}  "
                 f"triton={v.get('triton')}  fla={v.get('fla')}  copy={_fmt(bw)} TB/s  "
                 f"seed={report.get('seed')}"
                 f"{'  FAKE' if report.get('fake') else ''}{'  quick' if report.get('quick') else ''}")
    hdr = ["op", "shape", "fwd ours", "fwd fla", "fla/ours", "f+b ours", "f+b fla", "fla/ours",
           "floor f", "ours/floor", "floor f+b", "ours/floor", "1st ours s", "1st fla s", "peakMB ours",
           "peakMB fla"]
    body = []
    for row in report.get("rows", []):
        o, f = row.get("ours"), row.get("fla")
        name = row["op"] + ("" if row["mode"] == "chunk" else f"/{row['mode']}")
        if report.get("g_gamma") and row["op"] == "simple_gla":
            name += "(g_gamma)"
        c1 = _first_cell(o, notes, f"ours {name} 1st", first_on)
        c2 = _first_cell(f, notes, f"fla {name} 1st", first_on)
        body.append([
            name, row["shape"],
            _cell(o, "fwd_ms", notes, f"ours {name} fwd"), _cell(f, "fwd_ms", notes, f"fla {name} fwd"),
            _fmt(row.get("ratio_fwd_ms"), 2),
            _cell(o, "fwdbwd_ms", notes, f"ours {name} f+b"), _cell(f, "fwdbwd_ms", notes, f"fla {name} f+b"),
            _fmt(row.get("ratio_fwdbwd_ms"), 2),
            _fmt(row.get("floor_fwd_ms")), _fmt(row.get("floor_ratio_fwd_ms"), 2),
            _fmt(row.get("floor_fwdbwd_ms")), _fmt(row.get("floor_ratio_fwdbwd_ms"), 2),
            c1, c2,
            _fmt((o or {}).get("peak_mb"), 0) if o else "-", _fmt((f or {}).get("peak_mb"), 0) if f else "-",
        ])
    for sstr, b in report.get("baseline", {}).items():
        if b.get("fwd_ms") is None and not b.get("errors", {}).get("sdpa") and not b.get("ended"):
            continue  # the worker only measured the copy bandwidth
        body.append(["sdpa causal", sstr, _cell(b, "fwd_ms", notes, "sdpa fwd"), "", "",
                     _cell(b, "fwdbwd_ms", notes, "sdpa f+b"), "", "", "", "", "", "",
                     _first_cell(b, notes, "sdpa 1st", True), "", _fmt(b.get("peak_mb"), 0), ""])
    lines += _grid(hdr, body)
    lines.append("times: ms, do_bench median; fla/ours > 1 means ours is faster (issue 7: >= 1); "
                 "floor: bytes in+out once over the measured copy bandwidth, ours/floor: ours over it "
                 "(issue 7: fwd <= 3); 1st: first fwd + first bwd in a fresh process and an empty "
                 "Triton cache (* = fla first calls run concurrently, --fla-jobs)")
    # correctness
    chdr = ["op", "shape", "o vs fla", "grads vs fla (max)", "worst", "ours vs ref", "fla vs ref",
            "ref slice"]
    cbody = []
    for row in report.get("rows", []):
        c = row.get("ours_vs_fla") or {}
        grads = {k: v for k, v in c.items() if k.startswith("d")}
        worst = (max(grads, key=lambda k: grads[k] if grads[k] == grads[k] else float("inf"))
                 if grads else None)
        o, f = row.get("ours") or {}, row.get("fla") or {}
        name = row["op"] + ("" if row["mode"] == "chunk" else f"/{row['mode']}")
        cbody.append([name, row["shape"], _fmt(c.get("o"), 2) if c else (c.get("error", "-") if c else "-"),
                      _fmt(grads[worst], 2) if worst else "-", worst or "-",
                      _fmt(o.get("ref_slice_err"), 2), _fmt(f.get("ref_slice_err"), 2),
                      o.get("ref_slice") or f.get("ref_slice") or "-"])
    lines.append("")
    lines += _grid(chdr, cbody)
    lines.append("errors: ||a-b||/||b|| (b = fla, or our float64 reference on the slice); "
                 "bf16 expect 1e-3..1e-2")
    for row in report.get("rows", []):
        o = row.get("ours") or {}
        if "warm_first_fwd_s" in o or "warm_error" in o:
            total = o.get("warm_first_fwd_s", 0.0) + o.get("warm_first_bwd_s", 0.0)
            lines.append(f"warm Triton cache, ours {row['op']} {row['shape']}: first fwd + bwd {total:.2f} s "
                         f"(issue 7: < 2 s; torch's first-backward import, done before: "
                         f"{o.get('warm_torch_autograd_init_s', '-')} s)"
                         f"{'; ' + str(o['warm_error']) if 'warm_error' in o else ''}")
    for n in report.get("notes", []):
        lines.append(f"note: {n}")
    lines += notes.lines()
    return "\n".join(lines)


def _grid(hdr: list, body: list) -> list:
    cols = zip(hdr, *body, strict=True) if body else ([h] for h in hdr)
    w = [max(len(str(x)) for x in col) for col in cols]
    fmt = "  ".join(f"{{:<{n}}}" if i < 2 else f"{{:>{n}}}" for i, n in enumerate(w))
    out = [fmt.format(*hdr), "  ".join("-" * n for n in w)]
    out += [fmt.format(*[str(x) for x in r]) for r in body]
    return out


# ---------------------------------------------------------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _versions() -> dict:
    """Versions without initialising CUDA in this (parent) process."""
    from importlib import metadata

    v: dict = {"python": sys.version.split()[0]}
    for pkg, key in (("torch", "torch"), ("triton", "triton"), ("fla-core", "fla")):
        try:
            v[key] = metadata.version(pkg)
        except Exception:
            v[key] = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            v["gpu"] = out.stdout.strip().splitlines()[0].split(",")[0].strip()
            v["driver"] = out.stdout.strip().splitlines()[0].split(",")[1].strip()
    except Exception:
        pass
    return v


def _progress(what: str, res: dict) -> None:
    keys = ("first_fwd_s", "first_bwd_s", "fwd_ms", "fwdbwd_ms", "peak_mb", "ref_slice_err",
            "missing", "skipped", "ended", "errors", "worker_s")
    print(f"[bench] {what}: " + json.dumps({k: res[k] for k in keys if res.get(k)}, default=str), flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="linear_attn,simple_gla,gla",
                   help=f"comma-separated, from: {','.join(_ops.OPS)}")
    p.add_argument("--shapes", default="4x4096x16x128",
                   help=f"comma-separated BxTxHxD or BxTxHxKxV, or a preset: "
                        f"{', '.join(f'{k} = {chr(44).join(v)}' for k, v in _ops.SHAPE_PRESETS.items())}")
    p.add_argument("--modes", default="chunk", help="chunk and/or fused_recurrent")
    p.add_argument("--libs", default="sdpa,ours,fla", help="subset of sdpa,ours,fla")
    p.add_argument("--out", default=None, help="JSON result path (written after every worker)")
    p.add_argument("--table", default=None, help="also write the final table to this file")
    p.add_argument("--quick", action="store_true", help="short do_bench (5 ms warm-up, 20 ms repeats)")
    p.add_argument("--skip-first-call", action="store_true",
                   help="no fresh-cache first-call measurement (workers share one Triton cache)")
    p.add_argument("--g-gamma", action="store_true", help="simple_gla with a per-head g_gamma instead of g")
    p.add_argument("--gate-lower-bound", type=float, default=None,
                   help="pass this gate bound (ours: gate_lower_bound, fla: lower_bound) where the op takes one; "
                        "the DPLR inputs of _ops.py have gates >= -0.6065")
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="multiply every per-token log gate (_ops.make_inputs): a timing A/B of gate-dependent paths")
    p.add_argument("--warm-call", action="store_true",
                   help="after each measured op of ours, time the first call of one more fresh process on the "
                        "Triton cache it left (compiled plan; imports and torch's first-backward import excluded)")
    p.add_argument("--fla-jobs", type=int, default=1,
                   help="run fla's first calls (compile + autotune) this many at a time, then time alone")
    p.add_argument("--autotune-cache", default=None, metavar="DIR",
                   help="seed fla workers' Triton caches with the autotune results in DIR and copy this run's "
                        "results back into it (carry DIR between device calls)")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per worker process")
    p.add_argument("--budget-s", type=float, default=1e9, help="wall budget for the whole run")
    p.add_argument("--seed", type=int, default=None, help="default: fresh random")
    p.add_argument("--device", default=None, help="default: cuda if available else cpu")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="inputs' dtype (default bfloat16; float32 with --fake on a CPU)")
    p.add_argument("--no-ref-slice", action="store_true", help="skip the reference check on a slice")
    p.add_argument("--no-floor", action="store_true",
                   help="skip the copy-bandwidth measurement (and so the floor columns)")
    p.add_argument("--keep-tensors", action="store_true", help="keep the saved outputs in the workdir")
    p.add_argument("--workdir", default=None, help="scratch dir (default: a new one under /tmp)")
    p.add_argument("--fake", action="store_true", help="CPU stand-ins for every op: tests this script only")
    p.add_argument("--render", default=None, metavar="JSON", help="only print the tables of a saved result")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        (worker_baseline if spec["kind"] == "baseline" else worker_op)(spec)
        return 0
    if args.render:
        print(render_table(json.loads(Path(args.render).read_text())))
        return 0
    report = run(args)
    _ops.print_table(render_table(report), args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
