"""Stage 4: Recurrence → Lowered: bind the normal form's slots to what the kernels read.

The canonical form proves that the update is

    S_t = (D_t + u_t w_tᵀ) S_{t-1} + x_t y_tᵀ,        o_t = c · S_tᵀ q_t,

with every vector, the log decay log D_t and the scalars around them per-token elementwise
expressions of the inputs. The kernels read fixed arguments (q, k, v, g, g_gamma, beta, a, b: the
``kernel_args`` of a KernelFeatures). Lowering decides, for each argument, where its value comes from:

- ``INPUT``: a declared input (after the spec's transforms), read directly by the kernels;
- ``DERIVED``: a per-token expression (``dt * v``, ``sigmoid(i) * k``, ``-softplus(-f)``), computed
  with the spec's transforms by one generated pass per direction (fla_gen/transforms.py), whose
  backward differentiates the expression symbolically;
- ``HOST``: a per-head or call-time expression (``log(0.9)``, ``-exp(A_log)``), a few numbers computed
  by torch on the host, differentiable by torch's autograd.

and which kernel features the recurrence needs. The rank-1 part is the delta rule (u = -β k and
w = D k: the WY kernels) when the vectors say so after scalar factors are moved between them; any
other rank-1 part is the general (DPLR) form, which holds every instance. A decay kind that a chunk
algorithm does not take is folded into the next kind up (a per-head decay into a per-token one, a
per-token scalar into per-channel), as a derived gate: what the kernels take is data
(``CHUNK_DECAYS``), not a branch per op. No op name appears here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fla_gen.canonical import Recurrence, ScaledVector
from fla_gen.errors import Pos
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.ir import Apply, Lit, Node, Ref, Ty, widest


class SlotSource(Enum):
    """Where a kernel argument's value comes from."""

    INPUT = "input"  # a declared input, read directly (transformed first if the spec transforms it)
    DERIVED = "derived"  # a per-token expression, computed by the generated pass
    HOST = "host"  # a per-head or call-time expression, computed by torch on the host


@dataclass(frozen=True)
class Slot:
    """One kernel argument: its name (q, k, v, g, g_gamma, beta, a, b), the expression it holds, where
    it comes from, and its layout: ``dims`` "K", "V" or "" (a scalar per token or head), ``per_token``
    [B, T, H, ...] (else [H]), ``fp32`` for log gates (kept in float32 whatever the inputs' dtype)."""

    arg: str
    expr: Node
    source: SlotSource
    dims: str
    per_token: bool
    fp32: bool

    @property
    def input(self) -> str | None:
        """The declared input an INPUT slot reads."""
        return self.expr.name if self.source is SlotSource.INPUT else None


@dataclass(frozen=True)
class Lowered:
    """A recurrence bound to kernel arguments.

    ``slots``: one per ``features.kernel_args``, in that order; ``scale``: the output's call-time
    scalar factors (numbers and params), multiplied into the kernels' ``scale``; ``notes``: one line
    per decision that a reader of ``fla-gen plan`` should see (what was derived or folded, and why).
    """

    rec: Recurrence
    features: KernelFeatures
    slots: tuple[Slot, ...]
    scale: tuple[Node, ...]
    notes: tuple[str, ...]

    def slot(self, arg: str) -> Slot:
        return next(s for s in self.slots if s.arg == arg)

    @property
    def derived(self) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.source is SlotSource.DERIVED)

    @property
    def host(self) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.source is SlotSource.HOST)

    @property
    def gate_inputs(self) -> frozenset[str]:
        """Declared inputs that the gate slots read (kept in float32 where they are log gates)."""
        names: set[str] = set()
        for s in self.slots:
            if s.arg in ("g", "g_gamma"):
                names |= inputs_read(s.expr)
        return frozenset(names)


# Decay features each chunk algorithm takes (fla_gen/plan.py ALGORITHMS); the fused_recurrent kernel
# takes every combination. A kind outside the set is folded into the next one up (lower()).
CHUNK_DECAYS: dict[tuple[RankOne, bool], frozenset[TokenDecay]] = {
    # (rank-1 kind, with a per-head decay) -> per-token decay kinds
    (RankOne.NONE, False): frozenset(TokenDecay),
    (RankOne.NONE, True): frozenset(TokenDecay),
    # per channel: chunk_delta's per-channel kernels (plan.py chunk_delta_channel), the delta rule of KDA
    (RankOne.DELTA, False): frozenset(TokenDecay),
    (RankOne.DELTA, True): frozenset(),
    (RankOne.GENERAL, False): frozenset(TokenDecay),
    (RankOne.GENERAL, True): frozenset({TokenDecay.NONE, TokenDecay.SCALAR}),
}


# ----------------------------------------------------------------------------- expressions


def _key(n: Node) -> tuple:
    """A structural key of an expression (positions ignored), for equality of subexpressions."""
    if isinstance(n, Lit):
        return ("lit", n.value)
    if isinstance(n, Ref):
        return ("ref", n.name)
    return (n.fn, *(_key(a) for a in n.args))


def inputs_read(n: Node) -> set[str]:
    """The declared inputs an expression reads."""
    if isinstance(n, Ref):
        return {n.name} if n.role == "input" else set()
    if isinstance(n, Apply):
        return set().union(*(inputs_read(a) for a in n.args))
    return set()


def _mul(a: Node, b: Node, pos: Pos) -> Node:
    return Apply("mul", (a, b), Ty(a.ty.dims or b.ty.dims, widest(a.ty.varies, b.ty.varies)), pos)


def _add(a: Node, b: Node, pos: Pos) -> Node:
    return Apply("add", (a, b), Ty(a.ty.dims or b.ty.dims, widest(a.ty.varies, b.ty.varies)), pos)


def _neg(a: Node) -> Node:
    if isinstance(a, Lit):
        return Lit(-a.value, a.ty, a.pos)
    return Apply("neg", (a,), a.ty, a.pos)


def _scaled(factors: list[Node], base: Node) -> Node:
    """base times the scalar factors, -1 factors folded into a sign, 1 factors dropped."""
    sign = 1.0
    kept = []
    for f in factors:
        if isinstance(f, Lit) and abs(f.value) == 1.0:
            sign *= f.value
        else:
            kept.append(f)
    out = base
    for f in reversed(kept):
        out = _mul(f, out, base.pos)
    return _neg(out) if sign < 0 else out


def _product(factors: list[Node], pos: Pos) -> Node:
    """The product of scalar factors (1 for none), -1 factors folded into a sign."""
    sign = -1.0 if sum(isinstance(f, Lit) and f.value == -1.0 for f in factors) % 2 else 1.0
    kept = [f for f in factors if not (isinstance(f, Lit) and abs(f.value) == 1.0)]
    if not kept:
        return Lit(sign, Ty((), "const"), pos)
    return _scaled([Lit(sign, Ty((), "const"), pos), *kept[:-1]], kept[-1])


def _remove(pool: list[Node], item: Node) -> bool:
    """Remove one factor structurally equal to ``item`` from ``pool``; False if there is none."""
    k = _key(item)
    for i, f in enumerate(pool):
        if _key(f) == k:
            del pool[i]
            return True
    return False


def _sum_terms(n: Node) -> list[Node]:
    if isinstance(n, Apply) and n.fn == "add":
        return _sum_terms(n.args[0]) + _sum_terms(n.args[1])
    if isinstance(n, Apply) and n.fn == "sub":
        return _sum_terms(n.args[0]) + [_neg(t) for t in _sum_terms(n.args[1])]
    return [n]


def _sum(terms: list[Node], pos: Pos) -> Node:
    out = terms[0]
    for t in terms[1:]:
        out = _add(out, t, pos)
    return out


# ----------------------------------------------------------------------------- slots


# Slots laid out per head ([H]); every other slot is per token ([B, T, H, ...]).
_PER_HEAD_SLOTS = ("g_gamma",)


def _slot(arg: str, expr: Node, dims: str, fp32: bool = False) -> Slot:
    per_token = arg not in _PER_HEAD_SLOTS
    same_layout = (expr.ty.varies == "token") == per_token and len(expr.ty.dims) == len(dims)
    if isinstance(expr, Ref) and expr.role == "input" and same_layout:
        source = SlotSource.INPUT
    elif expr.ty.varies in ("const", "param", "head"):
        source = SlotSource.HOST
    else:
        source = SlotSource.DERIVED
    return Slot(arg, expr, source, dims, per_token, fp32)


def _vector(sv: ScaledVector) -> Node:
    return _scaled(list(sv.coef), sv.expr)


@dataclass(frozen=True)
class _Decay:
    """The log gate split by how it varies: per head (incl. numbers and params), per token, per channel."""

    head: list[Node]
    scalar: list[Node]
    channel: list[Node]


def _split_decay(rec: Recurrence) -> _Decay:
    if rec.log_gate is None:
        return _Decay([], [], [])
    head, scalar, channel = [], [], []
    for t in _sum_terms(rec.log_gate):
        if t.ty.dims:
            channel.append(t)
        elif t.ty.varies in ("const", "param", "head"):
            head.append(t)
        else:
            scalar.append(t)
    return _Decay(head, scalar, channel)


def _match_delta(rec: Recurrence) -> tuple[Node, Node, Node] | None:
    """(k, v, beta) when the rank-1 part and the write are the delta rule on the decayed state,
    S_t = (I - β k kᵀ) D_t S_{t-1} + β k vᵀ, after moving scalar factors between the vectors; else None.

    With u = c_u κ, w = c_w ω, x = c_x κ', y = c_y ν: κ = κ' (the same key expression), ω = κ with the
    state's per-channel decay factors applied (the read sees the decayed state), c_u c_w holds the state's
    scalar decay factors (a scalar decay commutes with the update), β = -c_u c_w / (those factors), and
    c_x c_y = β times the factors that then scale v.
    """
    lr = rec.low_rank
    x, y = rec.write
    kappa = x.expr
    if _key(lr.u.expr) != _key(kappa):
        return None
    key_dim = rec.spec.key_dim
    vector_factors = [f for f in rec.decay_factors if f.ty.dims == (key_dim,)]
    scalar_factors = [f for f in rec.decay_factors if not f.ty.dims]
    omega = lr.w.expr
    while isinstance(omega, Apply) and omega.fn == "mul" and omega.args[0].ty.dims and \
            _remove(vector_factors, omega.args[0]):
        omega = omega.args[1]
    if vector_factors or _key(omega) != _key(kappa):
        return None
    # a scalar decay commutes with the rank-1 term: its factors may sit on u or on w (the decay applied
    # before or after the delta step), and β is what remains of both
    beta_factors = list(lr.u.coef) + list(lr.w.coef)
    if not all(_remove(beta_factors, f) for f in scalar_factors):
        return None
    if not _remove(beta_factors, Lit(-1.0, Ty((), "const"), kappa.pos)):
        beta_factors.append(Lit(-1.0, Ty((), "const"), kappa.pos))
    rest = list(x.coef) + list(y.coef)  # scalars move freely between the two vectors of the write
    if not all(_remove(rest, f) for f in beta_factors if not (isinstance(f, Lit) and f.value == 1.0)):
        return None
    value = _scaled(rest, y.expr)
    return kappa, value, _product(beta_factors, kappa.pos)


def lower(rec: Recurrence) -> Lowered:
    """Bind a canonical recurrence to kernel arguments and pick its kernel features.

    Returns a Lowered whose slots follow ``features.kernel_args``: q [B, T, H, K], k [B, T, H, K],
    v [B, T, H, V], then as present g ([B, T, H] or [B, T, H, K], fp32), g_gamma [H] (fp32),
    beta [B, T, H], a and b [B, T, H, K].
    """
    spec = rec.spec
    notes: list[str] = []
    scale = tuple(c for c in rec.query.coef if c.ty.varies in ("const", "param"))
    query = _scaled([c for c in rec.query.coef if c.ty.varies not in ("const", "param")], rec.query.expr)

    # the rank-1 part and the write
    x, y = rec.write
    vectors: dict[str, Node]
    if rec.low_rank is None:
        rank1 = RankOne.NONE
        factors = list(x.coef) + list(y.coef)
        vectors = {"k": x.expr, "v": _scaled(factors, y.expr)}
        if factors:
            notes.append("the write term's scalar factors scale v")
    elif (delta := _match_delta(rec)) is not None:
        rank1 = RankOne.DELTA
        k, v, beta = delta
        vectors = {"k": k, "v": v, "beta": beta}
    else:
        rank1 = RankOne.GENERAL
        vectors = {"k": _vector(x), "v": _vector(y), "a": _vector(rec.low_rank.w), "b": _vector(rec.low_rank.u)}
        if rec.low_rank.u.expr is not None and _key(rec.low_rank.u.expr) == _key(x.expr):
            notes.append("the rank-1 part is not the delta rule on the decayed state (u = -beta k, w = D k): "
                         "general rank-1 (DPLR) kernels")

    # the decay, folded up to what the chunk algorithm takes
    decay = _split_decay(rec)
    head = bool(decay.head)
    token = TokenDecay.CHANNEL if decay.channel else (TokenDecay.SCALAR if decay.scalar else TokenDecay.NONE)
    if rank1 is RankOne.DELTA and not CHUNK_DECAYS[(rank1, False)] >= {token}:
        notes.append(f"the delta chunk kernels take no {token.value} decay: general rank-1 (DPLR) kernels "
                     f"with a = D k and b = -beta k")
        rank1 = RankOne.GENERAL
        vectors = {"k": _vector(x), "v": _vector(y), "a": _vector(rec.low_rank.w), "b": _vector(rec.low_rank.u)}
    scalar_terms, channel_terms, head_terms = list(decay.scalar), list(decay.channel), list(decay.head)
    if head and token not in CHUNK_DECAYS[(rank1, True)]:
        notes.append(f"the per-head decay is folded into the per-token gate: the {rank1.value} chunk kernels take "
                     f"no per-head decay with a {token.value} one")
        scalar_terms += head_terms
        head_terms, head = [], False
        token = TokenDecay.CHANNEL if channel_terms else TokenDecay.SCALAR
    supported = CHUNK_DECAYS[(rank1, head)]
    if token is TokenDecay.SCALAR and token not in supported:
        notes.append(f"the per-token decay is broadcast over the key channels: the {rank1.value} chunk kernels "
                     f"take a per-channel decay or none")
        token = TokenDecay.CHANNEL
    if token is TokenDecay.CHANNEL and token not in supported:
        raise LoweringError(f"the {rank1.value} chunk kernels take no per-channel decay")
    pos = rec.log_gate.pos if rec.log_gate is not None else spec.updates[0].pos
    gates: dict[str, Slot] = {}
    if token is TokenDecay.CHANNEL:
        # a per-token scalar among the terms broadcasts over K where the slot is stored
        gates["g"] = _slot("g", _sum(channel_terms + scalar_terms, pos), "K", fp32=True)
    elif token is TokenDecay.SCALAR:
        gates["g"] = _slot("g", _sum(scalar_terms, pos), "", fp32=True)
    if head:
        gates["g_gamma"] = _slot("g_gamma", _sum(head_terms, pos), "", fp32=True)

    features = KernelFeatures(token, head, rank1)
    slots = []
    for arg in features.kernel_args:
        if arg in gates:
            slots.append(gates[arg])
        elif arg == "q":
            slots.append(_slot("q", query, "K"))
        else:
            expr = vectors[arg]
            dims = "" if arg == "beta" else ("V" if arg == "v" else "K")
            slots.append(_slot(arg, expr, dims))
    return Lowered(rec, features, tuple(slots), scale, tuple(notes))


class LoweringError(ValueError):
    """A recurrence in the normal form that no kernel takes yet."""


def render_expr(n: Node) -> str:
    """An expression as the spec would write it, for messages and ``fla-gen plan``."""
    if isinstance(n, Lit):
        return f"{n.value:g}"
    if isinstance(n, Ref):
        return n.name
    a = [render_expr(x) for x in n.args]
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "matmul": "@"}
    if n.fn in binary:
        return f"({a[0]} {binary[n.fn]} {a[1]})"
    if n.fn == "neg":
        return f"-{a[0]}"
    return f"{n.fn}({', '.join(a)})"


def explain(lowered: Lowered, key_size: int, value_size: int, element_bytes: int) -> list[str]:
    """Lines for ``fla-gen plan``: the kernel features, where each kernel argument comes from, and the
    bytes per token and head that the derived tensors add to a forward (written by the pass, read by the
    kernels; the backward moves as many again through their gradients)."""
    f = lowered.features
    decay = f.token_decay.value + (" + per head" if f.head_decay else "")
    lines = [f"features: decay {decay}; rank-1 {f.rank1.value}; {f.family.value} chunk kernels"
             + ("; grouped value heads" if f.grouped else "")]
    transformed = set(lowered.rec.spec.transformed)
    extra = 0
    for s in lowered.slots:
        if s.source is SlotSource.INPUT:
            where = f"input {s.input}" + (", transformed by the pass" if s.input in transformed else "")
        elif s.source is SlotSource.DERIVED:
            size = {"K": key_size, "V": value_size, "": 1}[s.dims]
            nbytes = 2 * size * (4 if s.fp32 else element_bytes)
            extra += nbytes
            where = f"derived by the pass: {render_expr(s.expr)} (+{nbytes} B per token and head)"
        else:
            where = f"computed on the host: {render_expr(s.expr)}"
        lines.append(f"  {s.arg:<8} {where}")
    if lowered.scale:
        lines.append(f"  scale    x {' * '.join(render_expr(c) for c in lowered.scale)}")
    if extra:
        lines.append(f"derived tensors: +{extra} B per token and head in the forward")
    lines += [f"note: {n}" for n in lowered.notes]
    return lines
