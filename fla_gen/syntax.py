"""The syntax tree of a spec: frozen dataclasses with source positions, as written by the user."""

from __future__ import annotations

from dataclasses import dataclass

from fla_gen.errors import Pos


@dataclass(frozen=True)
class Num:
    value: float
    pos: Pos


@dataclass(frozen=True)
class Name:
    id: str
    pos: Pos


@dataclass(frozen=True)
class Kwarg:
    """``name=value`` inside a call (the options of ``rope``)."""

    name: str
    value: Expr
    pos: Pos


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    pos: Pos
    kwargs: tuple[Kwarg, ...] = ()
    # Where the first keyword argument was followed by a positional one (an error the checker reports).
    late_positional: Pos | None = None


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / @ **
    left: Expr
    right: Expr
    pos: Pos


@dataclass(frozen=True)
class Neg:
    operand: Expr
    pos: Pos


@dataclass(frozen=True)
class Transpose:
    operand: Expr
    pos: Pos


Expr = Num | Name | Call | BinOp | Neg | Transpose


@dataclass(frozen=True)
class InputDecl:
    """``input NAME: [dims] (= default)? (if FLAG)?``: a tensor argument; a default makes it optional; a
    guard makes it a keyword argument that only the transforms guarded by that flag read."""

    name: str
    dims: tuple[str, ...]
    dim_pos: tuple[Pos, ...]
    default: float | None
    pos: Pos
    guard: str | None = None
    guard_pos: Pos | None = None


@dataclass(frozen=True)
class StateDecl:
    name: str
    dims: tuple[str, ...]
    dim_pos: tuple[Pos, ...]
    pos: Pos


@dataclass(frozen=True)
class ParamDecl:
    """``param NAME = expr``: a call-time scalar argument whose default is ``expr`` of the dims."""

    name: str
    default: Expr
    pos: Pos


@dataclass(frozen=True)
class FlagDecl:
    """``param NAME: TYPE = VALUE``: a call-time switch (``TYPE`` must be ``bool``, ``VALUE`` ``true`` or
    ``false``; the checker says so) that guards ``transform ... if NAME`` lines."""

    name: str
    type_name: str
    value: str
    pos: Pos
    type_pos: Pos
    value_pos: Pos
    requires: str | None = None  # ``... requires OTHER``: true only together with the flag OTHER
    requires_pos: Pos | None = None


@dataclass(frozen=True)
class OptionDecl:
    """``option NAME = VALUE``: a keyword argument the ops accept with only this value (``true``,
    ``false``, ``none`` or a number); any other value is refused at call time."""

    name: str
    value: str | float
    pos: Pos
    value_pos: Pos


@dataclass(frozen=True)
class Update:
    target: str
    expr: Expr
    pos: Pos


@dataclass(frozen=True)
class Output:
    name: str
    expr: Expr
    pos: Pos


@dataclass(frozen=True)
class Transform:
    """``transform q, k = expr``: rebinds per-token inputs to a function of themselves, before the
    recurrence reads them (``rope(q, k, ...)``, ``l2norm(q)``, ``-exp(A_log) * softplus(g + dt_bias)``)."""

    targets: tuple[str, ...]
    target_pos: tuple[Pos, ...]
    expr: Expr
    pos: Pos
    guard: str | None = None  # ``... if NAME``: the flag that switches the line on
    guard_pos: Pos | None = None


@dataclass(frozen=True)
class OpDecl:
    name: str
    pos: Pos


@dataclass(frozen=True)
class PackageDecl:
    """``package NAME``: the generated package's directory (default: the op's name)."""

    name: str
    pos: Pos


Statement = (OpDecl | PackageDecl | InputDecl | StateDecl | ParamDecl | FlagDecl | OptionDecl | Transform | Update
             | Output)


@dataclass(frozen=True)
class SpecAST:
    """A parsed spec: its statements in source order, with the file it came from."""

    path: str
    source: str
    statements: tuple[Statement, ...]
