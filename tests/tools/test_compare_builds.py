"""benchmarks/compare_builds.py without a GPU: its arguments are checked before any CUDA call, and its in-process
plan-variant mode (``--variants``) runs the real op in Triton's interpreter with a stand-in timer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.interpreter import switch_on
from tests.support import assert_usage_error_before_cuda

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "compare_builds.py"


@pytest.mark.parametrize(("args", "named"), [
    ([], "--before is required"),
    (["--variants", "nope"], "--variants: 'nope' is not JSON"),
    (["--variants", '{"fwd_o": {"warps": 8}}'], "--variants: plan override of kernel 'fwd_o': unknown field"),
    (["--variants", '{"fwd_o": {"num_warps": 8}}', "--before", "."], "--variants times this build's plan variants"),
    (["--before", ".", "--shapes", "4x4096x16"], "--shapes"),
])
def test_bad_arguments_are_usage_errors(args, named):
    assert_usage_error_before_cuda(SCRIPT, args, named)


def test_variants_time_each_override_against_the_plan_in_one_process(monkeypatch):
    """linear_attn at 1x64x2x64 and 1x32x2x64, fp32 on the CPU: the plan and one variant (fwd_fused on 8 warps,
    which the interpreter ignores: the same output). The stand-in timer runs each timed call once and reports 1 ms
    under the plan, 2 ms under a variant, and the stand-in kernel timer 0.5 and 0.25 ms, so the table must show, at
    both shapes, worst plan/variant 1.000 and 0.500, and kernel times 0.500 (1.000) and 0.250 (2.000)."""
    switch_on()
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _ops
    import compare_builds

    from fla_gen.runtime.dispatch import active_plan_override

    def fake_bench(fn, **_kw):
        fn()
        return 1.0 if active_plan_override() is None else 2.0

    def fake_kernel_ms(fn, _leaves):
        fn()
        return 0.5 if active_plan_override() is None else 0.25

    monkeypatch.setattr(_ops, "kernel_ms", fake_kernel_ms)
    lines = compare_builds.time_variants(["linear_attn"], [(1, 64, 2, 64), (1, 32, 2, 64)],
                                         [{"fwd_fused": {"num_warps": 8}}], rounds=2, seed=0, device="cpu",
                                         dtype="float32", do_bench=fake_bench, kernels=True)
    assert len(lines) == 6, lines  # the header, then the plan and the variant per shape
    for plan_line, variant_line in (lines[2:4], lines[4:6]):
        plan_row, variant_row = plan_line.split(" | "), variant_line.split(" | ")
        assert plan_row[2:] == ["the plan", "0.0e+00", "1.000", "1.000", "0.500 (1.000)", "1.000", "1.000",
                                "0.500 (1.000) |"], lines
        assert variant_row[2:] == ['{"fwd_fused":{"num_warps":8}}', "0.0e+00", "2.000", "0.500", "0.250 (2.000)",
                                   "2.000", "0.500", "0.250 (2.000) |"], lines
    assert active_plan_override() is None
    # without kernel times (off CUDA, by default) no shape gets them, the second one included
    lines = compare_builds.time_variants(["linear_attn"], [(1, 64, 2, 64), (1, 32, 2, 64)],
                                         [{"fwd_fused": {"num_warps": 8}}], rounds=2, seed=0, device="cpu",
                                         dtype="float32", do_bench=fake_bench)
    assert all(line.split(" | ")[6] == "-" and line.endswith("| - |") for line in lines[2:]), lines


def test_gate_scale_multiplies_the_per_token_log_gates_only(monkeypatch):
    """--gate-scale reaches the strong-gate paths by scaling the per-token log gates (gla's g: logsigmoid(randn) / 16
    by default); every other input of the same seed is unchanged."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_builds

    import generated.gla as gla

    base = compare_builds._inputs(gla, (1, 16, 2, 8), 3, "cpu", "float32")
    scaled = compare_builds._inputs(gla, (1, 16, 2, 8), 3, "cpu", "float32", gate_scale=32.0)
    names = [name for name, *_ in gla.INPUTS]
    for name, a, b in zip(names, base, scaled, strict=True):
        if a is None:
            assert b is None, name
        elif name == "g":
            assert a.max() < 0 and bool(((32 * a - b).abs() <= 1e-5 * b.abs()).all()), name
        else:
            assert torch.equal(a, b), name


def _doubled_under_override(monkeypatch, compare_builds, fail: bool):
    """compare_builds' op lookup wrapped so that linear_attn's chunk op doubles its output (or raises) while a plan
    override is active: a stand-in for a variant that miscompiles."""
    from fla_gen.runtime.dispatch import active_plan_override

    real = compare_builds._chunk_op

    def chunk_op(op):
        pkg, fn = real(op)

        def wrapped(*args):
            o, ht = fn(*args)
            if active_plan_override() is None:
                return o, ht
            if fail:
                raise ValueError("stand-in device fault")
            return o * 2, ht
        return pkg, wrapped

    monkeypatch.setattr(compare_builds, "_chunk_op", chunk_op)


def test_a_variant_that_computes_something_else_is_marked(monkeypatch):
    switch_on()
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_builds

    _doubled_under_override(monkeypatch, compare_builds, fail=False)
    lines = compare_builds.time_variants(["linear_attn"], [(1, 32, 1, 16)], [{"fwd_fused": {"num_warps": 8}}],
                                         rounds=1, seed=0, device="cpu", dtype="float32",
                                         do_bench=lambda fn, **_kw: fn() or 1.0)
    assert lines[2].split(" | ")[3] == "0.0e+00", lines
    assert lines[3].split(" | ")[3] == "1.0e+00 **differs from the plan**", lines


def test_a_variant_that_fails_is_named(monkeypatch):
    switch_on()
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_builds

    _doubled_under_override(monkeypatch, compare_builds, fail=True)
    with pytest.raises(RuntimeError, match=r'linear_attn at 1x32x1x16: \{"fwd_fused":\{"num_warps":8\}\} failed: '
                                           r"ValueError: stand-in device fault"):
        compare_builds.time_variants(["linear_attn"], [(1, 32, 1, 16)], [{"fwd_fused": {"num_warps": 8}}],
                                     rounds=1, seed=0, device="cpu", dtype="float32",
                                     do_bench=lambda fn, **_kw: fn() or 1.0)


def test_builds_table_gives_the_worst_wall_pair_and_the_kernel_time_ratio(monkeypatch):
    """Two rounds a side: the wall columns keep the worst pair (round 2's 0.50 / 0.60 for the forward), the kernel
    columns the medians' ratio (0.133 -> 0.163: the after build's kernels slower while its wall medians look
    faster, as a slow host made them once); a side without kernel times (off CUDA) shows '-'."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_builds

    before = [{"gdn 1x16384x16x128": [0.60, 2.0, 0.133, 1.90]}, {"gdn 1x16384x16x128": [0.50, 2.1, 0.133, 1.90]}]
    after = [{"gdn 1x16384x16x128": [0.55, 2.0, 0.163, 1.95]}, {"gdn 1x16384x16x128": [0.60, 2.0, 0.163, 1.95]}]
    lines = compare_builds.builds_table(before, after)
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["gdn", "1x16384x16x128", "0.550", "0.575", "0.833", "0.133 -> 0.163 (0.816)",
                     "2.050", "2.000", "1.000", "1.900 -> 1.950 (0.974)"], cells
    assert lines[-1] == "worst before/after over every cell and round: 0.833"
    off_cuda = [{"gdn 1x16384x16x128": [0.6, 2.0, None, None]}]
    assert compare_builds.builds_table(off_cuda, off_cuda)[2].count("| - |") == 2
