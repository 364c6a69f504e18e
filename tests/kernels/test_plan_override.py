"""Plan overrides (runtime/dispatch.py): a benchmark launches a generated op with other tiles, warps
and stages for one kernel without rebuilding. The interpreter honours the tiles (checked against
the float64 reference); warps and stages it ignores, so the launch arguments are recorded."""

import json

import pytest
import torch

from fla_gen.runtime import dispatch
from fla_gen.runtime import launch as launch_rules
from fla_gen.runtime.dispatch import OVERRIDE_ENV, overridden_plans, parse_plan_override
from tests.support import generated, poisoned_allocations

OP = "linear_attn"


class _Recorder:
    """Stands in for a @triton.jit kernel: records each launch's keyword arguments, then launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.launches.append(kwargs)
            return launch(*args, **kwargs)
        return call


def _inputs(B=1, T=40, H=2, K=32, V=32):
    q, k, v = (torch.randn(B, T, H, d, dtype=torch.float32) for d in (K, K, V))
    return [t.requires_grad_(True) for t in (q, k, v)], torch.randn(B, T, H, V)


def _record(monkeypatch, stage):
    module = __import__(f"generated.{OP}.chunk", fromlist=["chunk"])
    rec = _Recorder(getattr(module, f"{OP}_{stage}_kernel"))
    monkeypatch.setattr(module, f"{OP}_{stage}_kernel", rec)
    return rec


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_override_reaches_the_launchers_forward_and_backward(monkeypatch):
    pkg = generated(OP)
    fwd_o, bwd_dh = _record(monkeypatch, "fwd_o"), _record(monkeypatch, "bwd_dh")
    (q, k, v), do = _inputs()
    override = {"fwd_o": {"block_k": 16, "block_v": 16, "num_warps": 8, "num_stages": 1},
                "bwd_dh": {"block_v": 16, "num_stages": 2}}
    with overridden_plans(override), poisoned_allocations():
        o, _ = pkg.chunk_linear_attn(q, k, v)
    with poisoned_allocations():  # outside the override: the backward keeps the plan its forward selected
        o.backward(do)
    (launch,) = fwd_o.launches
    assert (launch["BK"], launch["BV"], launch["num_warps"], launch["num_stages"]) == (16, 16, 8, 1)
    (launch,) = bwd_dh.launches
    assert (launch["BV"], launch["num_stages"]) == (16, 2)

    ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o_ref, _ = pkg.linear_attn_reference(*ref_in)
    o_ref.backward(do.double())
    assert _rel(o, o_ref) < 1e-5
    for t, r in zip((q, k, v), ref_in, strict=True):
        assert _rel(t.grad, r.grad) < 1e-5

    fwd_o.launches.clear()
    pkg.chunk_linear_attn(q, k, v)  # the override ended with its block: the selected plan's fwd_o again
    cfg = dispatch.select_plan(pkg.plans.CHUNK_PLANS, q.device, q.dtype, q.shape[-1]).config("fwd_o")
    expected = (launch_rules.dot_tile(cfg.block_k, q.shape[-1]), cfg.num_warps)
    assert (fwd_o.launches[0]["BK"], fwd_o.launches[0]["num_warps"]) == expected != (16, 8)


def test_override_from_the_environment(monkeypatch):
    fwd_o = _record(monkeypatch, "fwd_o")
    monkeypatch.setenv(OVERRIDE_ENV, json.dumps({"fwd_o": {"block_v": 16, "num_warps": 2}}))
    (q, k, v), _ = _inputs()
    generated(OP).chunk_linear_attn(q, k, v)
    assert (fwd_o.launches[0]["BV"], fwd_o.launches[0]["num_warps"]) == (16, 2)
    with overridden_plans({"fwd_o": {"num_warps": 8}}):  # the context manager wins
        generated(OP).chunk_linear_attn(q, k, v)
    assert (fwd_o.launches[1]["BV"], fwd_o.launches[1]["num_warps"]) == (32, 8)


def test_override_pins_only_its_kernel():
    plan = next(iter(generated(OP).plans.CHUNK_PLANS.values()))
    with overridden_plans({"fwd_h": {"num_stages": 1}}):
        changed = dispatch.apply_plan_override(plan)
    assert changed.config("fwd_h").num_stages == 1 and changed.config("fwd_h").pinned
    assert changed.config("fwd_o") == plan.config("fwd_o") and not changed.config("fwd_o").pinned


@pytest.mark.parametrize("override, match", [
    ({"fwd_o": {"block_q": 16}}, "unknown field 'block_q'"),
    ({"fwd_o": {"block_v": 48}}, "power of two >= 16"),
    ({"fwd_o": {"num_warps": 0}}, "num_warps must be a positive int"),
    ({"fwd_o": {"num_warps": True}}, "num_warps must be a positive int"),
    ({"fwd_fused": {"reads_inverse": 1}}, "reads_inverse must be true or false"),
    ({"fwd_fused": {"inverse_min_group": 0}}, "inverse_min_group must be a positive int"),
    ({"fwd_o": {}}, "non-empty"),
    ({"fwd_oo": {"num_warps": 8}}, r"does not have; known: \['fwd_h', 'fwd_o'"),
])
def test_bad_overrides_are_refused_before_a_launch(monkeypatch, override, match):
    fwd_o = _record(monkeypatch, "fwd_o")
    (q, k, v), _ = _inputs()
    with pytest.raises(ValueError, match=match), overridden_plans(override):
        generated(OP).chunk_linear_attn(q, k, v)
    assert not fwd_o.launches


def test_bad_environment_override(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "{fwd_o: 1}")
    (q, k, v), _ = _inputs()
    with pytest.raises(ValueError, match=f"{OVERRIDE_ENV} is not JSON"):
        generated(OP).chunk_linear_attn(q, k, v)


def test_reads_inverse_override_means_every_group_size():
    """An experiment that sets reads_inverse gets it at every group size (inverse_min_group 1), unless it gives
    inverse_min_group too: a plan that reads the inverse only with grouped heads must not hide the override."""
    assert parse_plan_override({"fwd_fused": {"reads_inverse": True}}) == {
        "fwd_fused": {"reads_inverse": True, "inverse_min_group": 1}}
    assert parse_plan_override({"fwd_fused": {"reads_inverse": True, "inverse_min_group": 2}}) == {
        "fwd_fused": {"reads_inverse": True, "inverse_min_group": 2}}
