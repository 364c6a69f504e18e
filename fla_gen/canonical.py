"""Stage 3: typed IR → Recurrence, the DPLR normal form, by symbolic expansion.

Every supported update is an instance of

    S_t = (diag(α_t) + u_t w_tᵀ) S_{t-1} + x_t y_tᵀ,        o_t = c · S_tᵀ q_t

with α_t a positive decay (1 when there is none). The declared update statements are
expanded into a sum of terms, each a product of left factors (a scalar, a diagonal, or a
rank-1 matrix u wᵀ) applied to the previous state or to a write ``outer(x, y)``; the terms
are then sorted into the transition's diagonal part, its low-rank part and the write, and the
diagonal part's factors are taken to log space (exp(g) → g, sigmoid(f) → -softplus(-f), c > 0 →
log c). Which kernels run the result follows from that structure alone, never from the op's name:
the lowering (fla_gen/lower.py) decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from fla_gen.errors import Pos, SpecErrorFactory
from fla_gen.ir import Apply, CheckedSpec, Lit, Node, Ref, Ty, widest

# ----------------------------------------------------------------------------- normal form


class GateKind(Enum):
    """How a plain gate input varies: per token ([B, T, H]), per token and key channel ([B, T, H, K]),
    or per head ([H], constant over time)."""

    SCALAR = "scalar"
    CHANNEL = "channel"
    HEAD = "head"


class FactorKind(Enum):
    """A left factor of an expanded term: a scalar, a diagonal matrix diag(x), or a rank-1 matrix u wᵀ."""

    SCALAR = "scalar"
    DIAG = "diag"
    RANK1 = "rank1"


@dataclass(frozen=True)
class GateTerm:
    """One plain input inside the log gate, and how it varies."""

    input: str
    kind: GateKind


@dataclass(frozen=True)
class ScaledVector:
    """``coef · input``: a key or value input vector times a product of scalars (empty: 1)."""

    coef: tuple[Node, ...]
    input: str | None  # None when the vector is not a plain input times scalars
    expr: Node


@dataclass(frozen=True)
class LowRank:
    """The transition's rank-1 part u wᵀ."""

    u: ScaledVector
    w: ScaledVector


@dataclass(frozen=True)
class Recurrence:
    """A spec proven to be in the normal form.

    ``log_gate``: log α_t as an expression (None: α = 1), ``decay_factors`` the factors it came from;
    ``decay``: the log gate as plain gate inputs where it is a sum of them (g + g_gamma), else empty;
    ``low_rank``: None or u wᵀ; ``write``: x yᵀ; ``query``: the read vector q of o = coef · Sᵀ q, its
    scalar factors peeled off. Which kernels run it is the lowering's choice (fla_gen/lower.py).
    """

    spec: CheckedSpec
    decay: tuple[GateTerm, ...]
    low_rank: LowRank | None
    write: tuple[ScaledVector, ScaledVector]
    query: ScaledVector
    # log(decay) as an expression (a sum of terms; None: no decay), and the raw factors it came from
    log_gate: Node | None = None
    decay_factors: tuple[Node, ...] = ()

    @property
    def token_gate(self) -> GateTerm | None:
        return next((t for t in self.decay if t.kind is not GateKind.HEAD), None)

    @property
    def head_gate(self) -> GateTerm | None:
        return next((t for t in self.decay if t.kind is GateKind.HEAD), None)


# ----------------------------------------------------------------------------- expansion


@dataclass(frozen=True)
class _Factor:
    kind: FactorKind
    a: Node
    b: Node | None = None  # w of a rank-1 factor u wᵀ


@dataclass(frozen=True)
class _MatTerm:
    """factors[0] @ factors[1] @ ... @ tail; tail is the previous state (None) or outer(x, y)."""

    factors: tuple[_Factor, ...]
    tail: tuple[Node, Node] | None


@dataclass(frozen=True)
class _VecSum:
    """A value-dim vector Σ const + Σ S_prevᵀ w (for each w in reads)."""

    const: tuple[Node, ...]
    reads: tuple[Node, ...]


_SCALAR = Ty((), "const")


def _lit(value: float, pos: Pos) -> Lit:
    return Lit(value, _SCALAR, pos)


def _mul(a: Node, b: Node, pos: Pos) -> Node:
    dims = b.ty.dims if not a.ty.dims else a.ty.dims
    return Apply("mul", (a, b), Ty(dims, widest(a.ty.varies, b.ty.varies)), pos)


def _dot(a: Node, b: Node, pos: Pos) -> Node:
    return Apply("matmul", (a, b), Ty((), widest(a.ty.varies, b.ty.varies)), pos)


def _neg(a: Node, pos: Pos) -> Node:
    return Apply("neg", (a,), a.ty, pos)


def _coef_first(n: Apply) -> tuple[Node, Node]:
    """The (scalar or vector factor, matrix or vector) operands of a product, whichever side the spec wrote the
    factor on: ``S * exp(g)`` and ``exp(g) * S`` are one term, as are ``S^T @ q * scale`` and ``scale * S^T @ q``."""
    a, b = n.args
    if len(b.ty.dims) < len(a.ty.dims) or (len(a.ty.dims) == len(b.ty.dims) and b.ty.varies != "state"
                                           and a.ty.varies == "state"):
        return b, a
    return a, b


class _Expander:
    def __init__(self, spec: CheckedSpec) -> None:
        self.spec = spec
        self.err = SpecErrorFactory(spec.path, spec.source)
        identity = (_MatTerm((), None),)
        self.state: tuple[_MatTerm, ...] = identity

    def has_state(self, n: Node) -> bool:
        return n.ty.varies == "state"

    # Matrix-valued expressions (the state's shape) as sums of terms.
    def mat(self, n: Node) -> tuple[_MatTerm, ...]:
        if isinstance(n, Ref) and n.role == "state":
            return self.state
        if not self.has_state(n):
            return self.free_matrix(n)
        assert isinstance(n, Apply)
        fn, args = n.fn, n.args
        if fn in ("add", "sub"):
            right = self.mat(args[1])
            if fn == "sub":
                right = self.scale(right, _Factor(FactorKind.SCALAR, _lit(-1.0, n.pos)))
            return self.mat(args[0]) + right
        if fn == "neg":
            return self.scale(self.mat(args[0]), _Factor(FactorKind.SCALAR, _lit(-1.0, n.pos)))
        if fn == "mul":
            coef, m = _coef_first(n)
            if coef.ty.dims == ():
                return self.scale(self.mat(m), _Factor(FactorKind.SCALAR, coef))
            if coef.ty.dims[0] != self.spec.key_dim:
                raise self.err(n.pos, f"'*' scales the state's {coef.ty.dims[0]} columns; a transition scales "
                                      f"its rows: use a [{self.spec.key_dim}] vector (diag(x) @ S)")
            return self.scale(self.mat(m), _Factor(FactorKind.DIAG, coef))
        if fn == "div":
            inv = Apply("div", (_lit(1.0, n.pos), args[1]), args[1].ty, n.pos)
            return self.scale(self.mat(args[0]), _Factor(FactorKind.SCALAR, inv))
        if fn == "matmul":
            left, right = args
            if self.has_state(left):
                raise self.err(n.pos, "the state must be multiplied from the left (A @ S), by a matrix that "
                                      "does not depend on the state; the update must be linear in S")
            out: tuple[_MatTerm, ...] = ()
            for factors in self.left_operator(left):
                terms = self.mat(right)
                for f in reversed(factors):
                    terms = self.scale(terms, f)
                out += terms
            return out
        if fn == "outer":
            x, y = args
            if self.has_state(x):
                raise self.err(x.pos, "the first argument of outer() depends on the state; the update must "
                                      "be linear in S, with the state read as S^T @ w")
            vec = self.vec(y)
            terms = tuple(_MatTerm((), (x, c)) for c in vec.const)
            return terms + tuple(_MatTerm((_Factor(FactorKind.RANK1, x, w),), None) for w in vec.reads)
        if fn == "transpose":
            raise self.err(n.pos, "a transposed state cannot be updated; the update is A @ S + outer(x, y)")
        raise self.err(n.pos, f"'{fn}' of the state is not linear in S")

    def free_matrix(self, n: Node) -> tuple[_MatTerm, ...]:
        if isinstance(n, Apply) and n.fn == "outer":
            return (_MatTerm((), (n.args[0], n.args[1])),)
        if isinstance(n, Apply) and n.fn in ("add", "sub"):
            right = self.free_matrix(n.args[1])
            if n.fn == "sub":
                right = self.scale(right, _Factor(FactorKind.SCALAR, _lit(-1.0, n.pos)))
            return self.free_matrix(n.args[0]) + right
        if isinstance(n, Apply) and n.fn == "mul":
            coef, m = _coef_first(n)
            kind = FactorKind.SCALAR if not coef.ty.dims else FactorKind.DIAG
            return self.scale(self.free_matrix(m), _Factor(kind, coef))
        if isinstance(n, Apply) and n.fn == "div" and not n.args[1].ty.dims:
            inv = Apply("div", (_lit(1.0, n.pos), n.args[1]), n.args[1].ty, n.pos)
            return self.scale(self.free_matrix(n.args[0]), _Factor(FactorKind.SCALAR, inv))
        if isinstance(n, Apply) and n.fn == "neg":
            return self.scale(self.free_matrix(n.args[0]), _Factor(FactorKind.SCALAR, _lit(-1.0, n.pos)))
        if isinstance(n, Apply) and n.fn == "transpose" and isinstance(n.args[0], Apply) and n.args[0].fn == "outer":
            x, y = n.args[0].args  # (x yᵀ)ᵀ = y xᵀ
            return (_MatTerm((), (y, x)),)
        raise self.err(n.pos, "a matrix term that is neither outer(x, y) nor applied to the state")

    def left_operator(self, n: Node) -> list[tuple[_Factor, ...]]:
        """A state-free [K, K] matrix as a sum of factor products (diag, outer, their sums)."""
        if isinstance(n, Apply):
            if n.fn == "diag":
                return [(_Factor(FactorKind.DIAG, n.args[0]),)]
            if n.fn == "outer":
                return [(_Factor(FactorKind.RANK1, n.args[0], n.args[1]),)]
            if n.fn in ("add", "sub"):
                right = self.left_operator(n.args[1])
                if n.fn == "sub":
                    right = [(_Factor(FactorKind.SCALAR, _lit(-1.0, n.pos)),) + f for f in right]
                return self.left_operator(n.args[0]) + right
            if n.fn == "mul" and not n.args[0].ty.dims:
                return [(_Factor(FactorKind.SCALAR, n.args[0]),) + f for f in self.left_operator(n.args[1])]
            if n.fn == "matmul":
                return [a + b for a in self.left_operator(n.args[0]) for b in self.left_operator(n.args[1])]
        raise self.err(n.pos, "the matrix applied to the state must be built from diag(x), outer(u, w), "
                              "scalars and sums of them")

    @staticmethod
    def scale(terms: tuple[_MatTerm, ...], f: _Factor) -> tuple[_MatTerm, ...]:
        return tuple(_MatTerm((f,) + t.factors, t.tail) for t in terms)

    # Value-dim vectors that may read the state as Sᵀ w.
    def vec(self, n: Node) -> _VecSum:
        if not self.has_state(n):
            return _VecSum((n,), ())
        assert isinstance(n, Apply)
        if n.fn in ("add", "sub"):
            a, b = self.vec(n.args[0]), self.vec(n.args[1])
            if n.fn == "sub":
                b = _VecSum(tuple(_neg(c, n.pos) for c in b.const), tuple(_neg(w, n.pos) for w in b.reads))
            return _VecSum(a.const + b.const, a.reads + b.reads)
        if n.fn == "neg":
            a = self.vec(n.args[0])
            return _VecSum(tuple(_neg(c, n.pos) for c in a.const), tuple(_neg(w, n.pos) for w in a.reads))
        if n.fn == "div" and not n.args[1].ty.dims and not self.has_state(n.args[1]):
            inv = Apply("div", (_lit(1.0, n.pos), n.args[1]), n.args[1].ty, n.pos)
            a = self.vec(n.args[0])
            return _VecSum(tuple(_mul(inv, c, n.pos) for c in a.const), tuple(_mul(inv, w, n.pos) for w in a.reads))
        if n.fn == "mul" and not _coef_first(n)[0].ty.dims and not self.has_state(_coef_first(n)[0]):
            s, a = _coef_first(n)[0], self.vec(_coef_first(n)[1])
            return _VecSum(tuple(_mul(s, c, n.pos) for c in a.const), tuple(_mul(s, w, n.pos) for w in a.reads))
        if n.fn == "matmul":
            m, w = n.args
            if len(m.ty.dims) == 2 and self.has_state(m):
                terms = self.transposed(m)
            elif len(m.ty.dims) == 1 and self.has_state(w):  # row vector @ S == Sᵀ @ vector
                m, w = w, m
                terms = self.mat(m)
            else:
                raise self.err(n.pos, f"the state is read as {self.spec.state_name}^T @ w (a [{self.spec.value_dim}] "
                                      f"vector); this product is not of that form")
            if self.has_state(w):
                raise self.err(n.pos, "a product of the state with itself: the update must be linear in S")
            return self.read(terms, w, n.pos)
        raise self.err(n.pos, f"'{n.fn}' of a state read is not linear in S")

    def transposed(self, m: Node) -> tuple[_MatTerm, ...]:
        """Terms whose sum, transposed, is the [V, K] matrix ``m`` (e.g. ``scale * S^T``)."""
        if isinstance(m, Apply):
            if m.fn == "transpose":
                return self.mat(m.args[0])
            if m.fn == "mul" and not m.args[0].ty.dims:
                return self.scale(self.transposed(m.args[1]), _Factor(FactorKind.SCALAR, m.args[0]))
            if m.fn == "neg":
                return self.scale(self.transposed(m.args[0]), _Factor(FactorKind.SCALAR, _lit(-1.0, m.pos)))
        raise self.err(m.pos, f"the state is read as {self.spec.state_name}^T @ w; this matrix is not a "
                              f"(scaled) transposed state")

    def read(self, terms: tuple[_MatTerm, ...], w: Node, pos: Pos) -> _VecSum:
        """(Σ terms)ᵀ w: transposed factors applied to w, right to left."""
        const: tuple[Node, ...] = ()
        reads: tuple[Node, ...] = ()
        for t in terms:
            wt = w
            for f in t.factors:  # (F1 F2 ... T)ᵀ w = Tᵀ ... F2ᵀ F1ᵀ w: F1 acts first
                if f.kind in (FactorKind.SCALAR, FactorKind.DIAG):
                    wt = _mul(f.a, wt, pos)
                else:  # (u bᵀ)ᵀ w = b (u·w)
                    wt = _mul(_dot(f.a, wt, pos), f.b, pos)
            if t.tail is None:
                reads += (wt,)
            else:
                x, y = t.tail
                const += (_mul(_dot(x, wt, pos), y, pos),)
        return _VecSum(const, reads)


# ----------------------------------------------------------------------------- sorting terms


def _split_scaled(n: Node, coef: tuple[Node, ...] = ()) -> ScaledVector:
    """Peel scalar factors off a vector expression, on either side: β * (2 * k) and k * β * 2 → input k
    with the factors as coef."""
    if isinstance(n, Ref) and n.role == "input":
        return ScaledVector(coef, n.name, n)
    if isinstance(n, Apply) and n.fn == "mul":
        factor, vector = _coef_first(n)
        if not factor.ty.dims:
            return _split_scaled(vector, coef + (factor,))
    if isinstance(n, Apply) and n.fn == "neg":
        return _split_scaled(n.args[0], coef + (_lit(-1.0, n.pos),))
    return ScaledVector(coef, None, n)


class _Sorter:
    def __init__(self, spec: CheckedSpec, pos: Pos) -> None:
        self.spec = spec
        self.err = SpecErrorFactory(spec.path, spec.source)
        self.pos = pos

    def log_factor(self, n: Node) -> Node | None:
        """log(n) of a diagonal factor the compiler can prove positive, as an expression (None for the
        number 1): exp(x) -> x, sigmoid(x) -> -softplus(-x), a positive number c -> log(c), and products
        and quotients of those. Anything else is refused with the way to write it."""
        if isinstance(n, Lit):
            if n.value == 1.0:
                return None
            if n.value > 0:
                return _lit(math.log(n.value), n.pos)
            raise self.err(n.pos, f"the state's decay {n.value:g} is not positive; a decay multiplies the state by "
                                  f"a positive factor", "write it as exp(g) with g = log(decay)")
        if isinstance(n, Apply):
            if n.fn == "exp":
                return n.args[0]
            if n.fn == "sigmoid":  # log(sigmoid(x)) = -softplus(-x), finite for every x
                x = n.args[0]
                return _neg(Apply("softplus", (_neg(x, n.pos),), x.ty, n.pos), n.pos)
            if n.fn in ("mul", "div"):
                a, b = (self.log_factor(x) for x in n.args)
                if b is not None and n.fn == "div":
                    b = _neg(b, n.pos)
                if a is None or b is None:
                    return a if b is None else b
                dims = a.ty.dims or b.ty.dims
                return Apply("add", (a, b), Ty(dims, widest(a.ty.varies, b.ty.varies)), n.pos)
        raise self.err(n.pos, "the state's decay must be a factor the compiler can prove positive: exp(g), "
                              "sigmoid(f), a positive number, or a product of those",
                       "write a log-space gate as 'exp(g) * S' (decay = exp(g)), or a sigmoid gate as "
                       "'sigmoid(f) * S'")

    def decay(self, diag_terms: list[_MatTerm]) -> tuple[Node | None, tuple[Node, ...]]:
        """The log gate (a sum of expressions, None for no decay) and the raw decay factors."""
        if not diag_terms:
            raise self.err(self.pos, "the update drops the previous state: no term carries S over",
                           "e.g. 'update S = exp(g) * S + outer(k, v)'")
        if len(diag_terms) > 1:
            raise self.err(diag_terms[1].factors[0].a.pos if diag_terms[1].factors else self.pos,
                           "the state is carried over by two diagonal terms; merge them into one decay exp(g) * S")
        log_gate: Node | None = None
        factors = tuple(f.a for f in diag_terms[0].factors)
        for f in factors:
            term = self.log_factor(f)
            if term is None:
                continue
            if log_gate is None:
                log_gate = term
            else:
                dims = log_gate.ty.dims or term.ty.dims
                log_gate = Apply("add", (log_gate, term), Ty(dims, widest(log_gate.ty.varies, term.ty.varies)),
                                 term.pos)
        if log_gate is not None and log_gate.ty.dims not in ((), (self.spec.key_dim,)):
            raise self.err(log_gate.pos, f"the decay runs over {log_gate.ty.dims[0]}; a decay is a scalar or runs "
                                         f"over the key dim {self.spec.key_dim} (diag(x) @ S)")
        return log_gate, factors

    def low_rank(self, terms: list[_MatTerm]) -> LowRank | None:
        if not terms:
            return None
        if len(terms) > 1:
            raise self.err(self.pos, f"the transition has {len(terms)} low-rank terms; one (rank 1) is supported")
        (t,) = terms
        ranks = [i for i, f in enumerate(t.factors) if f.kind is FactorKind.RANK1]
        if len(ranks) > 1:
            raise self.err(self.pos, "a term applies two rank-1 factors to the state; one is supported")
        i = ranks[0]
        u, w = t.factors[i].a, t.factors[i].b
        for f in reversed(t.factors[:i]):  # factors left of u wᵀ scale u
            u = _mul(f.a, u, self.pos)
        for f in t.factors[i + 1:]:  # factors right of it act on S first: (u wᵀ) F = u (Fᵀ w)ᵀ
            w = _mul(f.a, w, self.pos)
        return LowRank(_split_scaled(u), _split_scaled(w))

    def write(self, terms: list[_MatTerm]) -> tuple[ScaledVector, ScaledVector]:
        if not terms:
            raise self.err(self.pos, "the update writes nothing into the state", "add a term such as outer(k, v)")
        if len(terms) > 1:
            raise self.err(self.pos, f"the update has {len(terms)} write terms outer(x, y); one is supported")
        (t,) = terms
        x, y = t.tail
        for f in reversed(t.factors):
            if f.kind is FactorKind.RANK1:
                raise self.err(self.pos, "a rank-1 matrix applied to a write term is not supported")
            x = _mul(f.a, x, self.pos)
        return _split_scaled(x), _split_scaled(y)


def canonicalize(spec: CheckedSpec) -> Recurrence:
    """Prove that the spec's update has the normal form.

    Raises:
        SpecError: naming the term that does not fit (not linear in S, two decays, ...).
    """
    ex = _Expander(spec)
    for update in spec.updates:
        ex.state = ex.mat(update)
    first = spec.updates[0].pos
    sorter = _Sorter(spec, first)
    diag_terms = [t for t in ex.state if t.tail is None and all(f.kind is not FactorKind.RANK1 for f in t.factors)]
    rank_terms = [t for t in ex.state if t.tail is None and any(f.kind is FactorKind.RANK1 for f in t.factors)]
    write_terms = [t for t in ex.state if t.tail is not None]
    low_rank = sorter.low_rank(rank_terms)
    write = sorter.write(write_terms)

    ex.state = (_MatTerm((), None),)  # the output reads S_t, the state after the update
    out = ex.vec(spec.output)
    err = SpecErrorFactory(spec.path, spec.source)
    if out.const or len(out.reads) != 1:
        raise err(spec.output.pos, f"the output must be c * {spec.state_name}^T @ q: one read of the state "
                                   "times scalars, nothing else")
    query = _split_scaled(out.reads[0])
    if query.expr.ty.varies == "state":
        raise err(spec.output.pos, f"the output must read the state once, c * {spec.state_name}^T @ q")

    log_gate, decay_factors = sorter.decay(diag_terms)
    return Recurrence(spec, _plain_gate_terms(spec, log_gate) or (), low_rank, write, query, log_gate, decay_factors)


def _sum_terms(n: Node) -> tuple[Node, ...]:
    """The additive terms of an expression (a - b as a + (-b))."""
    if isinstance(n, Apply) and n.fn == "add":
        return _sum_terms(n.args[0]) + _sum_terms(n.args[1])
    if isinstance(n, Apply) and n.fn == "sub":
        return _sum_terms(n.args[0]) + tuple(_neg(t, n.pos) for t in _sum_terms(n.args[1]))
    return (n,)


def _plain_gate_terms(spec: CheckedSpec, log_gate: Node | None) -> tuple[GateTerm, ...] | None:
    """The log gate as plain gate inputs (``g + g_gamma``), or None when a term is any other expression."""
    if log_gate is None:
        return ()
    terms = []
    for t in _sum_terms(log_gate):
        if not (isinstance(t, Ref) and t.role == "input"):
            return None
        info = spec.input(t.name)
        kind = (GateKind.CHANNEL if info.vec_dim else GateKind.SCALAR) if info.per_token else GateKind.HEAD
        if kind is GateKind.HEAD and info.vec_dim:
            return None
        terms.append(GateTerm(t.name, kind))
    token = [t for t in terms if t.kind is not GateKind.HEAD]
    head = [t for t in terms if t.kind is GateKind.HEAD]
    return tuple(terms) if len(token) <= 1 and len(head) <= 1 else None
