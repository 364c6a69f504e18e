#!/usr/bin/env python3
"""The calls Qwen3-Next (Gated DeltaNet, grouped value heads, in-kernel l2norm) and Kimi Linear (KDA) make,
on a GPU: correctness against fla-core and the derived reference, speed against fla-core.

    python benchmarks/real_models.py                  # every check at the models' shapes
    python benchmarks/real_models.py --T 1024 --quick
    python benchmarks/real_models.py --only kda,kda-gva --gate-in-kernel   # KDA's gate computed in the call
    python benchmarks/real_models.py --only gdn --batches 4 --autotune-picks benchmarks/fla_picks
        # one shape; fla's autotune picks kept for the next run

Correctness (bf16 inputs): ours and fla against the derived reference run in float64 on the same inputs,
by ‖out − ref‖ / ‖ref‖, for o, the final state and (ours; fla's where its backward runs) every input gradient;
forwards dense (B=1, T) and packed through cu_seqlens (8 sequences, lengths drawn from 256 to 1024, seed 0);
gradients at B=1, T=512 and packed (4 sequences of 64 to 256): the reference's autograd graph holds a
float64 state per token.
Speed: forward (no autograd) and forward+backward of the chunk ops, over ``--rounds`` rounds after both were
warmed (compile, fla's autotune), each round ``--slices`` do_bench runs per library that alternate between ours
and fla (the first alternating too), a round's time the median of a library's slices; the ratio reported is the
worst round's fla / ours. Beside each wall time, the GPU's kernel time per call (torch.profiler: every kernel's
duration over 20 calls; ``--breakdown`` adds each kernel's share): a wall time well above it is a call the host
cannot keep the GPU busy for, which depends on the machine's CPU (fla-core's Qwen3-Next forward on the H200:
1.12-1.20 ms wall over 0.89 ms of kernels on one host, 0.91 ms wall on another). ``*_kernels_ms`` and
``*_fla_over_ours_kernels`` report it.
``*_peak_mb``: the memory a call allocates at its peak beyond the inputs (forward+backward: its gradients too).
The decode step (fused_recurrent, T=1, B=64, l2norm in the call, no autograd) is checked against the reference
and reported against the bytes it must move (the fp32 state read and written, the inputs and output) and the
copy bandwidth measured here: called eagerly (host overhead included: at B=64 the host is the bottleneck of both
libraries) and replayed from a CUDA graph (the GPU's work alone).
Inputs: q, k, v randn; g logsigmoid(randn) / 16 (per value head, or per head and key channel for KDA), fp32;
beta sigmoid(randn); the initial state 0.1 randn. With ``--gate-in-kernel`` KDA's g is raw (randn, fp32) and
the call computes g = -exp(A_log) softplus(g + dt_bias), with A_log = log(uniform(1, 16)) [HV] and dt_bias the
inverse softplus of uniform(1e-3, 1e-1) [HV * K] (Kimi Linear's initialisation in transformers).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _autotune import add_autotune_picks_argument, use_autotune_picks  # noqa: E402
from _ops import kernel_breakdown, timing_order  # noqa: E402


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float("inf") if not torch.isfinite(a).all() else ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(kind: str, B: int, T: int, H: int, HV: int, D: int, seed: int, gate_in_kernel: bool = False) -> dict:
    """The call's tensors: q, k [B, T, H, D]; v [B, T, HV, D]; g [B, T, HV] (or [B, T, HV, D] for KDA); beta
    [B, T, HV]; with ``gate_in_kernel`` (KDA) a raw g and A_log [HV], dt_bias [HV * D] as well."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, device="cuda", generator=gen)

    def uniform(lo, hi, *s):
        return lo + (hi - lo) * torch.rand(*s, device="cuda", generator=gen)

    g_shape = (B, T, HV, D) if kind == "kda" else (B, T, HV)
    x = {"q": randn(B, T, H, D).bfloat16(), "k": randn(B, T, H, D).bfloat16(), "v": randn(B, T, HV, D).bfloat16(),
         "g": F.logsigmoid(randn(*g_shape)) / 16, "beta": torch.sigmoid(randn(B, T, HV)).bfloat16()}
    if gate_in_kernel:
        dt = uniform(1e-3, 1e-1, HV * D)
        x.update(g=randn(*g_shape), A_log=uniform(1.0, 16.0, HV).log(), dt_bias=dt + torch.log(-torch.expm1(-dt)))
    return x


def switches(x: dict) -> dict:
    """The models' call-time switches: l2norm of q and k always; the gate in the call when x carries A_log."""
    return {"use_qk_l2norm_in_kernel": True, **({"use_gate_in_kernel": True} if "A_log" in x else {})}


def ours_and_fla(kind: str):
    import fla.ops.gated_delta_rule as fla_gdn
    import fla.ops.kda as fla_kda

    if kind == "kda":
        import generated.kda as pkg
        return pkg.chunk_kda, pkg.fused_recurrent_kda, pkg.kda_reference, fla_kda.chunk_kda, \
            fla_kda.fused_recurrent_kda
    import generated.gated_delta_rule as pkg
    return pkg.chunk_gated_delta_rule, pkg.fused_recurrent_gated_delta_rule, pkg.gated_delta_rule_reference, \
        fla_gdn.chunk_gated_delta_rule, fla_gdn.fused_recurrent_gated_delta_rule


def correctness(kind: str, x: dict, cu, N: int, gradients: bool, libs: tuple[str, ...] = ("ours", "fla")) -> dict:
    """Relative errors of ours and fla against the float64 reference (l2norm of q and k in the call); with
    ``gradients`` also every input gradient (the reference's autograd graph holds a state per token: keep T
    moderate there)."""
    ours, _, reference, fla_fn, _ = ours_and_fla(kind)
    HV, D = x["v"].shape[2], x["v"].shape[3]
    h0 = 0.1 * torch.randn(N, HV, D, D, device="cuda")
    kw = {**switches(x), "output_final_state": True, "cu_seqlens": cu}
    out = {}
    leaves = {n: t.detach().clone().requires_grad_(gradients) for n, t in {**x, "initial_state": h0}.items()}
    ref_leaves = {n: t.detach().double().requires_grad_(gradients) for n, t in leaves.items()}
    with torch.set_grad_enabled(gradients):
        o_ref, s_ref = reference(**ref_leaves, **kw)
    do = torch.randn_like(o_ref)
    if gradients:
        (o_ref * do).sum().backward()
    for name, fn in ((n, f) for n, f in (("ours", ours), ("fla", fla_fn)) if n in libs):
        for t in leaves.values():
            t.grad = None
        try:
            with torch.set_grad_enabled(gradients):
                o, s = fn(**leaves, **kw)
            errs = {"o": rel(o, o_ref), "final_state": rel(s, s_ref)}
        except Exception as e:  # fla refuses some calls (its gated backward on Hopper): say so
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        if not gradients:
            out[name] = errs
            continue
        try:
            (o.float() * do.float()).sum().backward()
            errs.update({f"d{n}": rel(t.grad, ref_leaves[n].grad) for n, t in leaves.items()})
        except Exception as e:
            errs["backward"] = f"{type(e).__name__}: {str(e)[:200]}"
        out[name] = errs
    return out


def speed(kind: str, x: dict, rounds: int, quick: bool, breakdown: bool = False, slices: int = 4) -> dict:
    from triton.testing import do_bench

    ours, _, _, fla_fn, _ = ours_and_fla(kind)
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    do = torch.randn_like(x["v"])
    warm, rep = (5, 20 / slices) if quick else (25, 100 / slices)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(**leaves, **switches(x))
        return run

    def forward_backward(fn):
        def run():
            fn(**leaves, **switches(x))[0].backward(do)
        return run

    result = {}
    for mode, make_fn in (("fwd", forward), ("fwdbwd", forward_backward)):
        runs = {}
        for name, fn in (("ours", ours), ("fla", fla_fn)):
            try:
                make_fn(fn)()
                make_fn(fn)()
                runs[name] = make_fn(fn)
            except Exception as e:
                result[f"{mode}_{name}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        # a round: each library in ``slices`` alternating slices (benchmarks/_ops.timing_order), its median
        sliced = {n: [[] for _ in range(rounds)] for n in runs}
        for r, name, _ in timing_order(list(runs), [[mode]] * len(runs), rounds, slices):
            sliced[name][r].append(float(do_bench(runs[name], warmup=warm, rep=rep,
                                                  grad_to_none=list(leaves.values()), return_mode="median")))
        times = {n: [statistics.median(ts) for ts in rounds_] for n, rounds_ in sliced.items()}
        for name, ts in times.items():
            result[f"{mode}_{name}_ms"] = sorted(ts)[len(ts) // 2]
            result[f"{mode}_{name}_rounds_ms"] = ts  # in the order run: where a worst round came from
            per_kernel = kernel_breakdown(runs[name], list(leaves.values()))
            result[f"{mode}_{name}_peak_mb"] = peak_mb(runs[name], list(leaves.values()))
            result[f"{mode}_{name}_kernels_ms"] = sum(per_kernel.values())
            if breakdown:
                result[f"{mode}_{name}_per_kernel_ms"] = {n: round(ms, 4) for n, ms in per_kernel.items()}
        if len(times) == 2:
            result[f"{mode}_fla_over_ours_worst"] = min(f / o for f, o in zip(times["fla"], times["ours"], strict=True))
            result[f"{mode}_fla_over_ours_kernels"] = \
                result[f"{mode}_fla_kernels_ms"] / result[f"{mode}_ours_kernels_ms"]
    return result


def peak_mb(run, grads) -> float:
    """The memory one ``run()`` allocates at its peak beyond what was allocated before it (MB): the op's
    temporaries, outputs and saved tensors, gradients included; not the inputs."""
    for t in grads:
        t.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def captured(step):
    """``step`` captured in a CUDA graph, as serving engines run their decode steps: the replay times the GPU
    work alone, without the host's Python and launch overhead (which an eager call at B=64 is bound by)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def decode(kind: str, B: int, H: int, HV: int, D: int, rounds: int, gate_in_kernel: bool = False) -> dict:
    from triton.testing import do_bench

    _, ours, reference, _, fla_fn = ours_and_fla(kind)
    x = make(kind, B, 1, H, HV, D, seed=1, gate_in_kernel=gate_in_kernel)
    h = 0.1 * torch.randn(B, HV, D, D, device="cuda")
    o_ref, h_ref = reference(**{n: t.double() for n, t in x.items()}, initial_state=h.double(),
                             output_final_state=True, **switches(x))
    big = torch.empty(2**28, dtype=torch.float32, device="cuda")
    copy_ms = float(do_bench(lambda: big.clone(), warmup=25, rep=100, return_mode="median"))
    bandwidth = 2 * big.numel() * 4 / (copy_ms * 1e-3)
    nbytes = 2 * h.numel() * 4 + sum(t.numel() * t.element_size() for t in x.values()) + x["v"].numel() * 2
    out = {"copy_TBps": bandwidth / 1e12, "floor_ms": nbytes / bandwidth * 1e3}
    for name, fn in (("ours", ours), ("fla", fla_fn)):
        def step(fn=fn):
            with torch.no_grad():
                fn(**x, initial_state=h, output_final_state=True, **switches(x))
        try:
            with torch.no_grad():
                o, h_new = fn(**x, initial_state=h, output_final_state=True, **switches(x))
            out[f"{name}_error_o"], out[f"{name}_error_final_state"] = rel(o, o_ref), rel(h_new, h_ref)
            step()
            ts = [float(do_bench(step, warmup=25, rep=100, return_mode="median")) for _ in range(rounds)]
            out[f"{name}_ms"] = max(ts)
            out[f"{name}_of_copy_bandwidth"] = out["floor_ms"] / max(ts)
            replay = captured(step)
            ts = [float(do_bench(replay, warmup=25, rep=100, return_mode="median")) for _ in range(rounds)]
            out[f"{name}_graph_ms"] = max(ts)
            out[f"{name}_graph_of_copy_bandwidth"] = out["floor_ms"] / max(ts)
        except Exception as e:
            out[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=4096, help="tokens per sequence of the dense check and the speed cells "
                                                      "(default: 4096; speed at B=1 and B=4)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of ours and fla (default: 3)")
    p.add_argument("--slices", type=int, default=4,
                   help="slices per round, alternating between ours and fla; a round is the median of its slices "
                        "(default: 4; benchmarks/run.py --help)")
    p.add_argument("--quick", action="store_true", help="shorter do_bench warm-up and repetitions")
    p.add_argument("--only", default="gdn,kda", help="comma-separated: gdn (Qwen3-Next: H=16, HV=32), kda (Kimi "
                                                     "Linear: H=HV=16), kda-gva (KDA with H=16, HV=32)")
    p.add_argument("--gate-in-kernel", action="store_true",
                   help="KDA: pass g raw with A_log and dt_bias (use_gate_in_kernel=True)")
    p.add_argument("--speed-only", action="store_true", help="skip the correctness checks")
    p.add_argument("--decode-only", action="store_true", help="only the decode step (its check and its time)")
    p.add_argument("--batches", default="1,4", help="comma-separated batch sizes of the speed cells (default: 1,4; "
                                                    "'' for none). One shape per process: run each B on its own")
    p.add_argument("--no-decode", action="store_true", help="skip the decode step")
    p.add_argument("--check-libs", default="ours,fla",
                   help="comma-separated: whose correctness to check against the reference (default: ours,fla; "
                        "fla's first call at a new shape autotunes for minutes)")
    p.add_argument("--breakdown", action="store_true",
                   help="with each speed cell's kernel time, every kernel's share of it (ms per call, by name)")
    add_autotune_picks_argument(p)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    # (kind, H, HV, D): Qwen3-Next, Kimi Linear, and KDA with fla's grouped value heads
    models = {"gdn": ("gdn", 16, 32, 128), "kda": ("kda", 16, 16, 128), "kda-gva": ("kda", 16, 32, 128)}
    unknown = [key for key in a.only.split(",") if key not in models]
    if unknown:
        p.error(f"--only: unknown model(s) {', '.join(unknown)}; choose from {', '.join(models)}")
    try:
        batches = [int(b) for b in a.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches: expected comma-separated integers, got {a.batches!r}")
    if any(b < 1 for b in batches):
        p.error(f"--batches: batch sizes must be >= 1, got {a.batches!r}")
    for name, value in (("--rounds", a.rounds), ("--slices", a.slices)):
        if value < 1:
            p.error(f"{name} must be at least 1, got {value}")
    check_libs = tuple(lib for lib in a.check_libs.split(",") if lib)
    if not check_libs or any(lib not in ("ours", "fla") for lib in check_libs):
        p.error(f"--check-libs: expected a comma-separated subset of ours,fla, got {a.check_libs!r}")
    rng = random.Random(0)
    lengths = [rng.randint(256, 1024) for _ in range(8)]
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(8)], dtype=torch.int32, device="cuda")
    short = [rng.randint(64, 256) for _ in range(4)]
    cu_short = torch.tensor([0] + [sum(short[:i + 1]) for i in range(4)], dtype=torch.int32, device="cuda")
    # the speed cells' shapes name the picks (fla's autotune keys leave B and T out: benchmarks/_autotune.py)
    use_autotune_picks(a.autotune_picks, f"real_models-{a.only}-B{a.batches}-T{a.T}"
                       + ("-gate-in-kernel" if a.gate_in_kernel else ""))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    report["triton"] = triton.__version__
    try:
        import fla
        report["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        print("fla-core is required (pip install fla-core)", file=sys.stderr)
        return 2
    for key in a.only.split(","):
        kind, H, HV, D = models[key]
        gate = a.gate_in_kernel and kind == "kda"
        key = f"{key}_gate_in_kernel" if gate else key
        checks = () if a.speed_only or a.decode_only else (
            (f"forward_dense_T{a.T}", 1, a.T, None, 1, False),
            (f"forward_varlen_{len(lengths)}", 1, int(cu[-1]), cu, len(lengths), False),
            ("gradients_dense_T512", 1, 512, None, 1, True),
            (f"gradients_varlen_{len(short)}", 1, int(cu_short[-1]), cu_short, len(short), True))
        for seed, (name, B, T, offsets, N, gradients) in enumerate(checks):
            report[f"{key}_{name}"] = correctness(kind, make(kind, B, T, H, HV, D, seed=seed, gate_in_kernel=gate),
                                                  offsets, N, gradients, check_libs)
            # one line per check as it finishes: a later check that hangs in fla's autotune loses none of them
            print(json.dumps({f"{key}_{name}": report[f"{key}_{name}"]}), flush=True)
        torch.cuda.empty_cache()
        for B, T in () if a.decode_only else ((b, a.T) for b in batches):
            report[f"{key}_speed_{B}x{T}x{H}x{HV}x{D}"] = speed(
                kind, make(kind, B, T, H, HV, D, seed=3, gate_in_kernel=gate), a.rounds, a.quick, a.breakdown,
                a.slices)
            print(json.dumps(report[f"{key}_speed_{B}x{T}x{H}x{HV}x{D}"]), flush=True)
        if not a.no_decode:
            report[f"{key}_decode_B64"] = decode(kind, 64, H, HV, D, a.rounds, gate)
            print(json.dumps(report[f"{key}_decode_B64"]), flush=True)
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
