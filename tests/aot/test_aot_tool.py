"""Tests of the ahead-of-time compile checker ``fla_gen.aot``.

The TTGIR parser, the ptxas-log parser and the checks are pure functions of text and are tested in
process. Everything that defines or compiles a Triton kernel runs in a subprocess whose environment
has no ``TRITON_INTERPRET`` (the suite may set it for the interpreter tests, and ``@triton.jit``
reads it when it decorates): the probe module below is written to a temporary directory and driven
through ``python -m fla_gen.aot`` or a small script. Compiles go to a fresh Triton cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from fla_gen.aot import (
    ARCH_LIMITS,
    CompiledKernelReport,
    check_report,
    encoding_aliases,
    mma_to_mma_conversions,
    parse_ptxas_log,
    tensor_encoding,
    tensor_types,
    uses_wgmma,
)

REPO = Path(__file__).resolve().parents[2]
CAPS = (80, 89, 90, 100)

# --------------------------------------------------------------------------------------------------
# The probe: kernels and host launchers, as a generated op would have them
# --------------------------------------------------------------------------------------------------

PROBE = """
import torch
import triton
import triton.language as tl


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    c = tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c.to(c_ptr.dtype.element_ty), mask=rm[:, None] < M)


@triton.jit
def chain_kernel(q_ptr, k_ptr, v_ptr, o_ptr, BT: tl.constexpr, D: tl.constexpr):
    # o = tril(q k^T) v: the first dot's result, cast to the input dtype, is an operand of the second.
    rt = tl.arange(0, BT)
    off = (tl.program_id(0) * BT + rt)[:, None] * D + tl.arange(0, D)[None, :]
    q = tl.load(q_ptr + off)
    k = tl.load(k_ptr + off)
    v = tl.load(v_ptr + off)
    s = tl.dot(q, tl.trans(k))
    s = tl.where(rt[:, None] >= rt[None, :], s, 0.0)
    o = tl.dot(s.to(v.dtype), v)
    tl.store(o_ptr + off, o.to(o_ptr.dtype.element_ty))


@triton.jit
def mixed_chain_kernel(a_ptr, b_ptr, x_ptr, y_ptr, o_ptr, BM: tl.constexpr):
    # A bf16 dot's accumulator continued by a tf32 dot: on Hopper the two wgmma layouts differ
    # (instrShape K = 16 vs 8), so the accumulator goes through an MMA -> MMA convert_layout.
    r = tl.arange(0, BM)
    off = r[:, None] * BM + r[None, :]
    acc = tl.dot(tl.load(a_ptr + off), tl.load(b_ptr + off))
    acc = tl.dot(tl.load(x_ptr + off), tl.load(y_ptr + off), acc)
    tl.store(o_ptr + off, acc)


@triton.autotune(
    configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)],
    key=["n"],
)
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * alpha, mask=offs < n)


@triton.jit(do_not_specialize=["n_dns"])
def args_kernel(x, y, z, n16, n17, one, big, f, flag, none_arg, n_dns, C: tl.constexpr, D: tl.constexpr = 3):
    tl.store(x + tl.arange(0, 16), tl.load(y + tl.arange(0, 16)))


def matmul(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, dtype=a.dtype)
    dot_kernel[(triton.cdiv(M, 64),)](a, b, c, M, N=N, K=K, BM=64, num_warps=4, num_stages=2)
    return c


def clean_ops():
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):  # the second bf16 call is deduplicated
        c = matmul(torch.randn(96, 64, dtype=dtype), torch.randn(64, 64, dtype=dtype))
        assert c.float().sum() is not None  # host code reads the "output" of a launch that never ran
    q, k, v = (torch.randn(128, 64, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    chain_kernel[(2,)](q, k, v, o, BT=64, D=64, num_warps=4, num_stages=2)
    x = torch.randn(1000)
    scale_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, torch.empty_like(x), 1000, 2.0)


def mixed_chain():
    a, b = (torch.randn(64, 64, dtype=torch.bfloat16) for _ in range(2))
    x, y, o = (torch.randn(64, 64) for _ in range(3))
    mixed_chain_kernel[(1,)](a, b, x, y, o, BM=64, num_warps=4, num_stages=2)


def many_args():
    base = torch.empty(64, dtype=torch.float32)
    args_kernel[(1,)](base, base[1:], base[4:].view(torch.int32), 32, 17, 1, 2**33, 0.5, True, None, 1,
                      C=7, num_warps=2)
"""

# Run in a subprocess: Triton's specialization of every kind of argument, and the capture errors.
SPECIALIZE_SCRIPT = """
import importlib.util, json, os, sys
import aot_probe
from fla_gen import aot

out = {}
(launch,) = aot.capture_launches(aot_probe.many_args)
spec = aot.specialize(launch, 90)
out["signature"] = spec.signature
out["constexprs"] = {str(list(k)): repr(v) for k, v in spec.constexprs.items()}
out["divisible"] = sorted(k[0] for k, v in spec.attrs.items() if ["tt.divisibility", 16] in v)
out["options"] = {k: spec.options[k] for k in ("num_warps", "num_stages")}
# Triton 3.6 packs the binder's output in JITFunction._pack_args: ours must agree with it exactly.
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import create_function_from_signature
backend = CUDABackend(GPUTarget("cuda", 90, 32))
kwargs = {**dict(launch.kwargs), "debug": False, "instrumentation_mode": ""}
binder = create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
bound, specialization, options = binder(*launch.args, **kwargs)
_, sig, consts, attrs = launch.kernel._pack_args(backend, kwargs, bound, specialization, options)
out["matches_triton"] = [sig == spec.signature, consts == spec.constexprs, attrs == spec.attrs]
# Kernels decorated under TRITON_INTERPRET=1 are refused with a clear error, and so is interpreter mode.
os.environ["TRITON_INTERPRET"] = "1"
loader = importlib.util.spec_from_file_location("aot_probe_interpreted", aot_probe.__file__)
interpreted = importlib.util.module_from_spec(loader)
loader.loader.exec_module(interpreted)
for name, env in (("interpreted_kernel", None), ("interpreter_mode", "1")):
    if env is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = env
    try:
        aot.capture_launches(interpreted.many_args)
        out[name] = "no error"
    except aot.AotCaptureError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the probe module and the specialization script."""
    root = tmp_path_factory.mktemp("aot_probe")
    (root / "aot_probe.py").write_text(textwrap.dedent(PROBE))
    (root / "specialize_probe.py").write_text(textwrap.dedent(SPECIALIZE_SCRIPT))
    return root


def compiled_mode_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess: no TRITON_INTERPRET, the probe and the repo importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(probe_dir), str(REPO), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(probe_dir / "triton-cache")
    env.update(extra)
    return env


def run_cli(probe_dir: Path, call: str, *flags: str, **extra_env: str) -> tuple[int, dict, str]:
    """``python -m fla_gen.aot --call aot_probe:<call>``; returns (exit code, JSON, console output)."""
    out_json = probe_dir / f"{call}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fla_gen.aot", "--call", f"aot_probe:{call}", "--json", str(out_json), *flags],
        cwd=probe_dir,
        env=compiled_mode_env(probe_dir, **extra_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    console = proc.stdout + proc.stderr
    assert out_json.exists(), console
    return proc.returncode, json.loads(out_json.read_text()), console


# --------------------------------------------------------------------------------------------------
# Compile matrix (subprocesses)
# --------------------------------------------------------------------------------------------------


def test_clean_kernels_compile_for_every_target_within_limits(probe_dir: Path) -> None:
    code, data, console = run_cli(probe_dir, "clean_ops", "--caps", ",".join(map(str, CAPS)), "--jobs", "2")
    assert code == 0, console
    assert data["problems"] == []
    reports = data["reports"]
    launches = sorted({(r["kernel"], r["launch"]) for r in reports})
    # dot bf16 + dot fp16 (the repeated bf16 call deduplicated), the dot chain, two autotune configs
    assert [k for k, _ in launches].count("dot_kernel") == 2, launches
    assert [k for k, _ in launches].count("chain_kernel") == 1, launches
    assert [k for k, _ in launches].count("scale_kernel") == 2, launches
    assert len(reports) == len(launches) * len(CAPS)
    for r in reports:
        assert r["error"] is None, r
        assert 0 <= r["shared_bytes"] <= ARCH_LIMITS[r["cap"]].max_shared_bytes, r
        assert r["mma_to_mma"] == [], r
        assert r["registers"] is not None and r["registers"] > 0, r
    for r in reports:
        if r["kernel"] in ("dot_kernel", "chain_kernel"):
            assert r["shared_bytes"] > 0, r
            assert r["num_warps"] == 4 and r["num_stages"] == 2, r
            # wgmma needs M >= 64 and warps in groups of four: both hold, so sm90 uses it (and only sm90)
            assert r["uses_wgmma"] == (r["cap"] == 90), r
    assert {r["num_warps"] for r in reports if r["kernel"] == "scale_kernel"} == {2, 4}


def test_mma_to_mma_conversion_fails_the_check_off_ampere(probe_dir: Path) -> None:
    # TRITON_INTERPRET=1 in the caller's environment: the CLI re-runs itself without it.
    code, data, console = run_cli(probe_dir, "mixed_chain", "--caps", "80,90", TRITON_INTERPRET="1")
    assert code == 1, console
    by_cap = {r["cap"]: r for r in data["reports"]}
    assert by_cap[80]["error"] is None and by_cap[90]["error"] is None
    assert by_cap[80]["mma_to_mma"] == [] and by_cap[80]["problems"] == []
    assert len(by_cap[90]["mma_to_mma"]) == 1 and "#mma1" in by_cap[90]["mma_to_mma"][0]
    assert len(data["problems"]) == 1 and "sm90" in data["problems"][0] and "MMA -> MMA" in data["problems"][0]


def test_specialization_is_the_one_triton_would_launch(probe_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "specialize_probe.py"],
        cwd=probe_dir,
        env=compiled_mode_env(probe_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    sig = out["signature"]
    assert sig == {
        "x": "*fp32",
        "y": "*fp32",
        "z": "*i32",
        "n16": "i32",
        "n17": "i32",
        "one": "constexpr",  # an int equal to 1 is specialized to a constexpr
        "big": "i64",  # ints beyond 32 bits
        "f": "fp32",  # Python floats are always fp32 scalars
        "flag": "u1",  # bools
        "none_arg": "constexpr",  # None is a constexpr
        "n_dns": "i32",  # do_not_specialize: 1 stays a runtime i32
        "C": "constexpr",
        "D": "constexpr",
    }
    assert out["constexprs"] == {"[5]": "1", "[9]": "None", "[11]": "7", "[12]": "3"}
    # tt.divisibility=16: the aligned tensor, the 16-byte-offset view, 32 and 2**33; not base[1:] nor 17
    assert out["divisible"] == [0, 2, 3, 6]
    assert out["options"] == {"num_warps": 2, "num_stages": 3}
    assert out["matches_triton"] == [True, True, True]
    assert "InterpretedFunction" in out["interpreted_kernel"]
    assert "interpreter mode" in out["interpreter_mode"]


# --------------------------------------------------------------------------------------------------
# TTGIR and ptxas parsing, checks (in process)
# --------------------------------------------------------------------------------------------------

TTGIR_HEAD = """\
#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>
#loc = loc("/tmp/k.py":4:0)
#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], instrShape = [16, 64, 16]}>
#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], instrShape = [16, 64, 8]}>
module attributes {"ttg.num-warps" = 4 : i32, ttg.target = "cuda:90"} {
"""
MMA_TO_MMA = "    %s_32 = ttg.convert_layout %s : tensor<64x64xf32, #mma> -> tensor<64x64xf32, #mma1> loc(#loc9)\n"
MMA_TO_BLOCKED = (
    "    %2 = ttg.convert_layout %s_33 : tensor<64x64xf32, #mma1> -> tensor<64x64xf32, #blocked> loc(#loc3)\n"
)
MMA_TO_OPERAND = (
    "    %7 = ttg.convert_layout %6 : tensor<64x64xbf16, #mma> -> "
    "tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> loc(#loc4)\n"
)


def test_detector_fires_on_a_conversion_between_two_mma_layouts() -> None:
    found = mma_to_mma_conversions(TTGIR_HEAD + MMA_TO_BLOCKED + MMA_TO_MMA + "}\n")
    assert found == ("%s_32 = ttg.convert_layout %s : tensor<64x64xf32, #mma> -> tensor<64x64xf32, #mma1>",)


def test_detector_ignores_conversions_that_leave_the_mma_layout() -> None:
    assert mma_to_mma_conversions(TTGIR_HEAD + MMA_TO_BLOCKED + MMA_TO_OPERAND + "}\n") == ()
    assert mma_to_mma_conversions(TTGIR_HEAD + MMA_TO_MMA.replace("#mma1>", "#mma>") + "}\n") == ()


def test_detector_reads_inline_mma_encodings() -> None:
    v3 = "#ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [%s], instrShape = [16, 64, 16]}>"
    line = f"%3 = ttg.convert_layout %2 : tensor<64x32xf32, {v3 % '4, 1'}> -> tensor<64x32xf32, {v3 % '2, 2'}>"
    assert mma_to_mma_conversions(line) == (line,)
    assert mma_to_mma_conversions(line.replace("'2, 2'", "'4, 1'").replace("[2, 2]", "[4, 1]")) == ()


def test_detector_allows_conversions_between_two_mma_v2_layouts() -> None:
    """sm80/86/89 all use MMA v2 (mma.sync); Triton lowers v2 -> v2 there. Only other versions fail."""
    v2 = "#ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [%s], instrShape = [16, 8]}>"
    line = f"%3 = ttg.convert_layout %2 : tensor<64x32xf32, {v2 % '8, 1'}> -> tensor<64x32xf32, {v2 % '4, 2'}>"
    assert mma_to_mma_conversions(line) == ()
    v3 = v2.replace("versionMajor = 2", "versionMajor = 3")
    mixed = f"%3 = ttg.convert_layout %2 : tensor<64x32xf32, {v2 % '4, 1'}> -> tensor<64x32xf32, {v3 % '4, 1'}>"
    assert mma_to_mma_conversions(mixed) == (mixed,)


def test_type_parsing() -> None:
    assert encoding_aliases(TTGIR_HEAD)["#mma1"].endswith("instrShape = [16, 64, 8]}>")
    assert tensor_types("%a : tensor<16xf32> -> tensor<16x!tt.ptr<f32>, #blocked>") == [
        "tensor<16xf32>",
        "tensor<16x!tt.ptr<f32>, #blocked>",
    ]
    assert tensor_encoding("tensor<16xf32>") is None
    assert tensor_encoding("tensor<64xi32, #ttg.slice<{dim = 1, parent = #blocked}>>") == (
        "#ttg.slice<{dim = 1, parent = #blocked}>"
    )
    assert uses_wgmma("%1 = ttng.warp_group_dot %a, %b, %c") and uses_wgmma("", "wgmma.mma_async.sync")
    assert not uses_wgmma("%1 = tt.dot %a, %b, %c", "mma.sync.aligned.m16n8k16")


def test_ptxas_log_parsing() -> None:
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for k\n"
        "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 16 bytes cumulative stack size\n"
    )
    usage = parse_ptxas_log(log)
    assert (usage.registers, usage.spill_stores, usage.spill_loads) == (168, 8, 12)
    assert parse_ptxas_log("").registers is None


def test_arch_limits_are_the_documented_per_block_maxima() -> None:
    assert {cap: a.max_shared_bytes for cap, a in ARCH_LIMITS.items()} == {
        80: 166912,
        89: 101376,
        90: 232448,
        100: 232448,
    }
    assert [cap for cap, a in ARCH_LIMITS.items() if a.mma_to_mma_ok] == [80]


@pytest.mark.parametrize("cap", CAPS)
def test_check_report(cap: int) -> None:
    at_limit = CompiledKernelReport("k", "k[bf16]() w4s2", cap, shared_bytes=ARCH_LIMITS[cap].max_shared_bytes)
    assert check_report(at_limit) == []
    over = replace(at_limit, shared_bytes=at_limit.shared_bytes + 1)
    (problem,) = check_report(over)
    assert f"on sm{cap}" in problem and "exceeds" in problem
    converted = replace(at_limit, mma_to_mma=("%1 = ttg.convert_layout %0 : ... #mma> -> ... #mma1>",))
    assert len(check_report(converted)) == (0 if cap == 80 else 1)
    failed = CompiledKernelReport("k", "k[bf16]() w4s2", cap, error="CompilationError: boom")
    assert check_report(failed) == [f"k[bf16]() w4s2 on sm{cap}: compile failed: CompilationError: boom"]
