"""The fused recurrent template renders every feature combination to valid Python (no kernel runs)."""

from __future__ import annotations

import ast
import itertools

import pytest

from fla_gen.emit import TEMPLATES_DIR, _environment
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.transforms import InlineTransforms

TEMPLATE = "kernels/fused_recurrent.jinja"
COMBINATIONS = [KernelFeatures(d, h, r, grouped=gr)
                for d, h, r, gr in itertools.product(TokenDecay, (False, True), RankOne, (False, True))]


def render(features: KernelFeatures, inline=None) -> str:
    return _environment(str(TEMPLATES_DIR), trim=False).get_template(TEMPLATE).render(
        op="x", features=features, inline=inline)


@pytest.mark.parametrize("features", COMBINATIONS, ids=str)
def test_every_combination_renders_to_python(features: KernelFeatures) -> None:
    source = render(features)
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(functions) == {"x_recurrent_fwd_kernel", "x_recurrent_bwd_kernel", "fused_recurrent_fwd",
                              "fused_recurrent_bwd"}
    # the launchers take the tensors of features.kernel_args first, in order
    for name in ("fused_recurrent_fwd", "fused_recurrent_bwd"):
        params = [a.arg for a in functions[name].args.args]
        assert tuple(params[:len(features.kernel_args)]) == features.kernel_args, name
    # without grouping, no key-side row and no value-head count: the kernels index as before
    assert ("row_k" in source) == features.grouped and ("HV" in source) == features.grouped


def test_grouped_kernels_take_inlined_switched_transforms() -> None:
    """A grouped forward kernel with inlined transforms: each switch is a constexpr parameter, the launcher
    passes it from transform_flags, and the inline body (which loads key-side rows at row_k) sits in the
    kernel's token loop."""
    load = "t0 = tl.load(q + row_k * K + o_K)"
    body = f"o_K = o_k\nif flag_norm:\n    {load}\nelse:\n    {load}"
    inline = InlineTransforms(("pos",), body, {"q": "t0"}, flags=("norm",))
    source = render(KernelFeatures(TokenDecay.SCALAR, False, RankOne.DELTA, grouped=True), inline)
    functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    kernel = [a.arg for a in functions["x_recurrent_fwd_kernel"].args.args]
    assert kernel[-2:] == ["TRANSFORM", "flag_norm"] and "pos" in kernel
    launcher = [a.arg for a in functions["fused_recurrent_fwd"].args.args]
    assert launcher[-2:] == ["transform_args", "transform_flags"]
    assert "flag_norm=transform_flags[0]," in source
    assert "b_q = t0 * scale" in source and "row_k = (bos + t) * H + i_hk" in source
