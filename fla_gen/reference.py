"""Derive the step-by-step reference of a spec: torch code that runs the declared statements
token by token, in whatever dtype it is given (float64 for tests), on CPU or GPU.

It is derived from the checked spec, not from the canonical form, so that it is an
independent oracle for the canonicalizer, the planner and the kernels alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from fla_gen.host_code import render_scalar
from fla_gen.ir import Apply, CheckedSpec, Lit, Node, Ref

_TORCH_FN = {"exp": "torch.exp", "log": "torch.log", "sigmoid": "torch.sigmoid",
             "softplus": "torch.nn.functional.softplus", "elu": "torch.nn.functional.elu",
             "silu": "torch.nn.functional.silu"}
# l2norm's epsilon, inside the square root as in fla's l2norm: x / sqrt(sum(x^2) + eps).
L2NORM_EPS = 1e-6


def _expand(code: str, node: Node, to_dims: tuple[str, ...]) -> str:
    """Insert broadcast axes so a value of ``node``'s dims lines up with ``to_dims``.

    Per-token values are ``[B, H, *dims]``; a vector over the key dim K becomes ``[..., K, 1]``
    inside a [K, V] matrix and a vector over V ``[..., 1, V]``.
    """
    dims = node.ty.dims
    if dims == to_dims or isinstance(node, Lit):  # a Python number broadcasts by itself
        return code
    if not dims:
        return f"{code}[{', '.join(['...'] + ['None'] * len(to_dims))}]"
    if len(dims) == 1 and len(to_dims) == 2:
        return f"{code}[..., :, None]" if dims[0] == to_dims[0] else f"{code}[..., None, :]"
    raise AssertionError(f"cannot broadcast {dims} to {to_dims}")


@dataclass(frozen=True)
class TorchExpr:
    """Renders typed IR as a torch expression over per-token locals named ``<input>_t``."""

    state_name: str
    whole: bool = False  # render inputs as whole tensors (transforms) instead of per-token locals

    def render(self, n: Node) -> str:
        if isinstance(n, Lit):
            return repr(float(n.value))
        if isinstance(n, Ref):
            if n.role == "input":
                return n.name if self.whole else f"{n.name}_t"
            return n.name  # the state, a param (a 0-d tensor) or a head dim (an int)
        assert isinstance(n, Apply)
        a = n.args
        r = [self.render(x) for x in a]
        to = n.ty.dims
        if n.fn in ("add", "sub", "mul"):
            op = {"add": "+", "sub": "-", "mul": "*"}[n.fn]
            return f"({_expand(r[0], a[0], to)} {op} {_expand(r[1], a[1], to)})"
        if n.fn == "div":
            return f"({r[0]} / {_expand(r[1], a[1], to)})"
        if n.fn == "pow":
            return f"({r[0]} ** {r[1]})"
        if n.fn == "neg":
            return f"(-{r[0]})"
        if n.fn == "transpose":
            return f"{r[0]}.transpose(-1, -2)"
        if n.fn == "outer":
            return f"({r[0]}[..., :, None] * {r[1]}[..., None, :])"
        if n.fn == "diag":
            return f"torch.diag_embed({r[0]})"
        if n.fn == "matmul":
            da, db = a[0].ty.dims, a[1].ty.dims
            if len(da) == 2 and len(db) == 1:
                return f"torch.einsum('...ij,...j->...i', {r[0]}, {r[1]})"
            if len(da) == 1 and len(db) == 2:
                return f"torch.einsum('...i,...ij->...j', {r[0]}, {r[1]})"
            if len(da) == 1 and len(db) == 1:
                return f"({r[0]} * {r[1]}).sum(-1)"
            return f"({r[0]} @ {r[1]})"
        if n.fn == "l2norm":
            return f"({r[0]} * torch.rsqrt(({r[0]} * {r[0]}).sum(-1, keepdim=True) + {L2NORM_EPS!r}))"
        if n.fn in _TORCH_FN:
            return f"{_TORCH_FN[n.fn]}({r[0]})"
        raise AssertionError(f"no torch rendering for {n.fn}")


@dataclass(frozen=True)
class ReferenceCode:
    """What the reference template needs: per-statement torch code and the input fetches."""

    token_fetches: tuple[tuple[str, str], ...]  # (local name, code) read at every token
    updates: tuple[str, ...]
    output: str
    transforms: tuple[str, ...] = ()  # statements on whole [B, T, H, ...] tensors, before the token loop


def derive_reference(spec: CheckedSpec) -> ReferenceCode:
    """Turn the checked spec's statements into torch code for one token step.

    The code reads locals ``<input>_t`` (``[B, H]`` for a scalar per token, ``[B, H, D]`` for a
    vector, ``[H]``/``[H, D]`` for a per-head constant), the state ``S`` as ``[B, H, K, V]``,
    params as 0-d tensors and head dims as ints. In a grouped spec H here is HV: the template repeats
    the H-head inputs to HV heads (``repeat_interleave``) before the token loop.
    """
    r = TorchExpr(spec.state_name)
    fetches = tuple(
        (f"{i.name}_t", f"{i.name}[rows, t]" if i.per_token else i.name) for i in spec.inputs
    )
    return ReferenceCode(fetches, tuple(r.render(u) for u in spec.updates), r.render(spec.output),
                         derive_transforms(spec))


def derive_transforms(spec: CheckedSpec) -> tuple[str, ...]:
    """The spec's transform lines as torch statements on whole tensors, in order.

    Inputs are whole tensors ([B, T, H, ...] per token, [H] per head); a rope line calls
    ``fla_gen.runtime.rotary.rope_reference`` with ``positions`` ([B, T]) and the rotary dim
    evaluated from the head-dim locals. A guarded line (``... if flag``) keeps its inputs unless the
    flag, a Python bool argument of the reference, is true.
    """
    r = TorchExpr(spec.state_name, whole=True)
    lines = []
    for tr in spec.transforms:
        if tr.kind == "rope":
            args = f"positions, int({render_scalar(tr.rotary_dim)}), {tr.base!r}, {tr.style == 'interleaved'}"
            lhs = ", ".join(tr.targets)
            rhs = ", ".join(f"rope_reference({t}, {args})" for t in tr.targets)
            if tr.guard is not None:
                rhs = f"({rhs}) if {tr.guard} else ({lhs})"
        else:
            lhs = tr.targets[0]
            rhs = r.render(tr.expr)
            if tr.guard is not None:
                rhs = f"{rhs} if {tr.guard} else {lhs}"
        lines.append(f"{lhs} = {rhs}")
    return tuple(lines)
