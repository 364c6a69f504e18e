"""The typed IR that the checker produces: every expression node carries its per-token type."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fla_gen.errors import Pos

# How a value varies, from least to most: a literal or dim, a call-time scalar, a per-head
# constant, a per-token value, and the recurrent state itself.
VARIES_ORDER = ("const", "param", "head", "token", "state")


@dataclass(frozen=True)
class Ty:
    """The type of a value at one token of one head.

    ``dims`` is its shape inside a head: ``()`` a scalar, ``("K",)`` a vector over the key dim,
    ``("K", "V")`` a matrix. ``varies`` is one of ``VARIES_ORDER``.
    """

    dims: tuple[str, ...]
    varies: str

    def show(self) -> str:
        return "scalar" if not self.dims else "[" + ", ".join(self.dims) + "]"


def widest(*varies: str) -> str:
    """The most variable of several ``varies`` tags (a token value times a constant varies by token)."""
    return max(varies, key=VARIES_ORDER.index)


@dataclass(frozen=True)
class Ref:
    """A name: ``role`` is ``input``, ``state``, ``param`` or ``dim``. A ``dim`` also names its ``axis``,
    ``K`` (the state's rows) or ``V`` (its columns), whatever the spec calls it: generated host code reads
    the size from the call's shape under that name (``call.K``)."""

    name: str
    role: str
    ty: Ty
    pos: Pos
    axis: str = ""


@dataclass(frozen=True)
class Lit:
    value: float
    ty: Ty
    pos: Pos


@dataclass(frozen=True)
class Apply:
    """An operator or function: ``fn`` is one of ``add sub mul div matmul pow neg transpose``
    or a function name (``exp``, ``outer``, ...)."""

    fn: str
    args: tuple[Node, ...]
    ty: Ty
    pos: Pos


Node = Ref | Lit | Apply


class Heads(Enum):
    """The heads an input lives on: the query/key heads H, or the value heads HV (a multiple of H).

    With grouped value heads (fla's GVA, e.g. Qwen3-Next: H = 16, HV = 32) value head hv reads
    query/key head hv // (HV / H); the state and the output live on HV.
    """

    H = "H"
    HV = "HV"


@dataclass(frozen=True)
class InputInfo:
    """One declared input tensor.

    ``per_token``: laid out ``[B, T, H, ...]`` (else ``[H, ...]``, a per-head constant);
    ``vec_dim``: its trailing head dim (``K``/``V``) or None for a scalar per token/head;
    ``optional``: declared with ``= 0`` (absent means zeros); ``heads``: H (``[B, T, H, ...]``,
    ``[H, ...]``) or HV (``[B, T, HV, ...]``, ``[HV, ...]``).
    ``guard``: declared ``if FLAG``: a keyword argument (after the flags), refused when given with the flag
    off, required with it on unless optional; kept out of ``CheckedSpec.inputs`` (``guarded_inputs``).
    """

    name: str
    dims: tuple[str, ...]
    per_token: bool
    vec_dim: str | None
    optional: bool
    pos: Pos
    heads: Heads = Heads.H
    guard: str | None = None  # a keyword input that only transforms guarded by this flag read

    @property
    def ty(self) -> Ty:
        return Ty((self.vec_dim,) if self.vec_dim else (), "token" if self.per_token else "head")


@dataclass(frozen=True)
class ParamInfo:
    name: str
    default: Node
    pos: Pos


@dataclass(frozen=True)
class FlagInfo:
    """A boolean call-time param (``param NAME: bool = false``): it switches the transforms it guards."""

    name: str
    default: bool
    pos: Pos
    requires: str | None = None  # another flag that must be true whenever this one is


@dataclass(frozen=True)
class OptionInfo:
    """``option NAME = value``: a keyword the ops accept with only ``value`` (a bool, None or a number)."""

    name: str
    value: bool | float | None
    pos: Pos


@dataclass(frozen=True)
class TransformInfo:
    """One ``transform`` line: per-token inputs rebound before the recurrence reads them.

    ``kind`` ``map``: one target, ``expr`` its new value, in which a Ref to the target is its current
    value (after earlier transforms) and other Refs are per-head inputs, [H] scalars or, in the transform of a
    per-token vector over a head dim D, [H, D] vectors over that dim; numbers otherwise.
    ``kind`` ``rope``: rotary embedding of each target ([B, T, H, D]) at its token's position;
    ``style`` ``neox`` (rotate halves) or ``interleaved`` (rotate pairs), the first ``rotary_dim``
    channels rotate (a scalar of head dims and numbers), the rest pass through; ``base`` the
    frequency base (inverse frequencies base^(-2i/rotary_dim), Su et al., 2021).
    ``guard``: the flag (a boolean param) that switches the line on at call time; None: always on.
    """

    kind: str
    targets: tuple[str, ...]
    expr: Node | None
    pos: Pos
    style: str = "neox"
    rotary_dim: Node | None = None
    base: float = 10000.0
    guard: str | None = None


@dataclass(frozen=True)
class CheckedSpec:
    """A spec whose names resolve and whose expressions are well typed."""

    path: str
    source: str
    source_hash: str
    op: str
    package: str  # generated/<package>/: the `package` line, else the op's name
    inputs: tuple[InputInfo, ...]
    state_name: str
    key_dim: str
    value_dim: str
    params: tuple[ParamInfo, ...]
    updates: tuple[Node, ...]
    output_name: str
    output: Node
    transforms: tuple[TransformInfo, ...] = ()
    flags: tuple[FlagInfo, ...] = ()
    options: tuple[OptionInfo, ...] = ()
    guarded_inputs: tuple[InputInfo, ...] = ()

    def input(self, name: str) -> InputInfo:
        return next(i for i in (*self.inputs, *self.guarded_inputs) if i.name == name)

    @property
    def grouped(self) -> bool:
        """Whether some input lives on value heads HV: then the state [N, HV, K, V] and o [B, T, HV, V]
        do too, and inputs on H are shared by HV / H consecutive value heads."""
        return any(i.heads is Heads.HV for i in self.inputs)

    @property
    def transformed(self) -> tuple[str, ...]:
        """The inputs some transform rebinds, in declaration order."""
        names = {t for tr in self.transforms for t in tr.targets}
        return tuple(i.name for i in self.inputs if i.name in names)
