"""Python code for host-side scalars of a spec: call-time params, numbers and head dims.

A leaf module (it imports only the IR), so that every stage that renders a scalar (the emitter, the
reference, the generated pass) can use it without importing another stage.
"""

from __future__ import annotations

from fla_gen.ir import Apply, Lit, Node, Ref

_MATH_FN = {"exp": "math.exp", "log": "math.log"}


def render_scalar(n: Node, dim_prefix: str = "") -> str:
    """Python code for a call-time scalar (numbers, head dims, params): ``K ** -0.5``. With a ``dim_prefix``
    (``call.``) a head dim reads the call's shape by its axis (``call.K``), whatever the spec names it."""
    if isinstance(n, Lit):
        return repr(float(n.value)) if n.value != int(n.value) else str(int(n.value))
    if isinstance(n, Ref):
        if n.role == "dim":
            return f"{dim_prefix}{n.axis or n.name}" if dim_prefix else n.name
        return n.name
    assert isinstance(n, Apply)
    r = [render_scalar(a, dim_prefix) for a in n.args]
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
    if n.fn in binary:
        return f"{r[0]} {binary[n.fn]} {r[1]}" if n.fn == "pow" else f"({r[0]} {binary[n.fn]} {r[1]})"
    if n.fn == "neg":
        return f"-{r[0]}"
    if n.fn in _MATH_FN:
        return f"{_MATH_FN[n.fn]}({r[0]})"
    raise ValueError(f"'{n.fn}' cannot be evaluated on the host")
