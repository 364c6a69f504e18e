"""The fused recurrent template renders every feature combination to valid Python (no kernel runs)."""

from __future__ import annotations

import ast
import itertools

import jinja2
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


def test_grouped_heads_refuse_inlined_transforms() -> None:
    inline = InlineTransforms(("pos",), "o_K = o_k", {})
    with pytest.raises(jinja2.UndefinedError, match="cannot_inline_transforms_into_grouped_heads"):
        render(KernelFeatures(TokenDecay.SCALAR, False, RankOne.DELTA, grouped=True), inline)
