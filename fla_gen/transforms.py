"""Lower a spec's ``transform`` lines to the body of one fused Triton kernel pair.

The forward kernel runs every transform of a tile of (token, head) rows in registers: it reads
each transformed input's raw rows once and writes the transformed rows once. The backward kernel
recomputes that forward (cheap, elementwise) and walks it in reverse, emitting the
vector-Jacobian product of each step, so it reads the raw rows and the recurrence's gradients
once and writes the inputs' gradients once; per-head inputs (A_log, dt_bias) get one fp32
partial per (token, head), a scalar or, for a per-head vector [H, D], D channels, summed over
tokens on the host (:func:`head_stores`).

The lowering is straight-line SSA: each IR node becomes one ``tN = ...`` statement over fp32
values, per row a scalar or a vector over a head dim (``K``/``V``, padded to a power of two and
masked by ``m_K``/``m_V``). Gradients follow the chain rule step by step (reverse mode). The same
statements are rendered for two layouts (:class:`Layout`): the transform kernels' tile of rows and
the recurrent kernels' single row (inlined on the decode path); only reductions and the rope
partner gather name an axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fla_gen.canonical import Recurrence
from fla_gen.host_code import render_scalar
from fla_gen.ir import Apply, CheckedSpec, Heads, Lit, Node, Ref, TransformInfo
from fla_gen.lower import Lowered, Slot, SlotSource, inputs_read
from fla_gen.reference import L2NORM_EPS


@dataclass(frozen=True)
class Layout:
    """How the lowered statements hold rows.

    The tile layout (transform kernels) holds BR rows: a vector is [BR, BD], a per-row scalar is
    [BR, 1], so scalars broadcast against vectors with no index and every op lowers as in one row;
    reductions run over axis 1 and keep it. The row layout (inline, decode path) holds one row:
    [BD] vectors and true scalars, reductions over axis 0.
    """

    axis: int
    keep_dims: bool

    def sum(self, x: str) -> str:
        """Code reducing the vector ``x`` over the head dim to a per-row scalar."""
        keep = ", keep_dims=True" if self.keep_dims else ""
        return f"tl.sum({x}, axis={self.axis}{keep})"

    def broadcast(self, x: str, dim: str) -> str:
        """Code of the per-row scalar ``x`` repeated over the head dim ``dim`` ("K" or "V")."""
        shape = f"[BR, B{dim}]" if self.keep_dims else f"[B{dim}]"
        return f"tl.broadcast_to({x}, {shape})"

    def gather(self, x: str, idx: str) -> str:
        """Code of ``x[idx]`` along the head dim (``idx`` has the shape of ``x``)."""
        return f"tl.gather({x}, {idx}, axis={self.axis})"

    def zero(self, dim: str = "") -> str:
        """Code of a per-row fp32 zero, a scalar or a vector over the head dim ``dim`` (the gradient of a per-head
        input a switched-off transform reads)."""
        if not dim:
            return "tl.zeros([BR, 1], dtype=tl.float32)" if self.keep_dims else "0.0"
        shape = f"[BR, B{dim}]" if self.keep_dims else f"[B{dim}]"
        return f"tl.zeros({shape}, dtype=tl.float32)"


TILE = Layout(axis=1, keep_dims=True)
ROW = Layout(axis=0, keep_dims=False)


@dataclass(frozen=True)
class RopeArgs:
    """One rope transform: its kernel arguments are ``rope<i>_dim`` (the rotary dim, an int at call
    time) and its constants; ``rotary_dim`` is host code of the head-dim locals (``call.K``)."""

    index: int
    targets: tuple[str, ...]
    interleaved: bool
    log2_base: float
    rotary_dim: str
    dim: str  # "K" or "V": the head dim it runs over


@dataclass(frozen=True)
class TransformKernel:
    """What the pass templates render: the spec's transforms and the lowering's derived slots.

    ``sources``: (input, "K" | "V" | "") per per-token input the pass reads, "" for a scalar per token;
    ``outputs``: (kernel argument, "K" | "V" | "") per slot the pass computes (fla_gen/lower.py: a
    transformed input, or a DERIVED slot), named by the kernel argument it feeds;
    ``heads``: per-head inputs the pass reads, [H] scalars or [H, D] vectors (each loaded as the D channels of the
    row's head, padded to BD and masked, like a row of a per-token vector); ``dims``: the head dims with vectors;
    ``fwd``: statements computing every output ``outs[name]`` from the loaded ``raw[name]``, the
    transforms in the spec's order, then the derived slots; ``bwd_fwd``: the same values as the backward
    kernel recomputes them, with norms ahead of rotations (:func:`norms_before_rotations`); ``bwd``:
    statements after ``bwd_fwd`` that accumulate gradients, from ``dy_<output>`` loaded into
    ``grads_in[output]``, into ``grads_out[name]`` (sources and per-head inputs). These are in the
    :data:`TILE` layout; ``row_fwd`` is ``fwd`` in the :data:`ROW` layout (same names).
    """

    op: str
    sources: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    heads: tuple[str, ...]
    dims: tuple[str, ...]
    ropes: tuple[RopeArgs, ...]
    fwd: tuple[str, ...]
    raw: dict
    outs: dict
    bwd: tuple[str, ...]
    grads_in: dict
    grads_out: dict
    fp32_outputs: tuple[str, ...]  # outputs stored as float32 (log gates)
    row_fwd: tuple[str, ...]
    bwd_fwd: tuple[str, ...]
    # the flags that guard transforms, in declaration order: constexpr kernel arguments flag_<name>
    flags: tuple[str, ...] = ()
    # (output, its input, the flags of the lines that rebind it) per output that passes through where the call
    # switches those lines off (:func:`switched_sources`); the kernel statements below honour it
    switched: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    # the forward kernel's output stores, the backward kernel's loads of the outputs' gradients and its stores of
    # the sources' gradients (each under its output's switches), then the per-head inputs' (head_stores)
    output_stores: tuple[str, ...] = ()
    grad_loads: tuple[str, ...] = ()
    grad_stores: tuple[str, ...] = ()


# Vector-Jacobian products of the elementwise functions, y = f(x), given the adjoint dy of y.
_UNARY_VJP = {
    "neg": "-{dy}",
    "exp": "{dy} * {y}",
    "log": "{dy} / {x}",
    "sigmoid": "{dy} * {y} * (1.0 - {y})",
    "softplus": "{dy} * tl.sigmoid({x})",
    "elu": "{dy} * tl.where({x} > 0.0, 1.0, tl.exp(tl.minimum({x}, 0.0)))",
    "silu": "{dy} * (tl.sigmoid({x}) * (1.0 + {x} * (1.0 - tl.sigmoid({x}))))",
}


class _Lowering:
    def __init__(self, rec: Recurrence, layout: Layout, key_rows: bool = False) -> None:
        spec = rec.spec
        self.rec = rec
        self.layout = layout
        # inside a grouped recurrent kernel (key_rows): inputs on the query/key heads H load their row
        # ``row_k`` and their per-head values at ``i_hk``; inputs on HV load ``row`` and ``i_h``
        self.key_rows = key_rows
        self.letter = {spec.key_dim: "K", spec.value_dim: "V"}
        self.n = 0
        self.lines: list[str] = []
        self.shape: dict[str, str] = {}  # var -> "K" | "V" | ""
        self.tape: list[tuple[str, str, tuple[str, ...], dict]] = []
        self.current: dict[str, str] = {}
        self.heads: dict[str, str] = {}
        # vectors loaded straight from a kernel argument: var -> (pointer, head dim letter); a rope of one
        # reads its partner channels with a second load instead of a tl.gather (rope_partner)
        self.loaded: dict[str, tuple[str, str]] = {}
        # while lowering a guarded transform line: its flag, and the vars created under it
        self.guard: str | None = None
        self.guarded: dict[str, str] = {}  # var -> the flag it was computed under

    def new(self, code: str, shape: str) -> str:
        v = f"t{self.n}"
        self.n += 1
        self.lines.append(f"{v} = {code}")
        self.shape[v] = shape
        if self.guard is not None:
            self.guarded[v] = self.guard
        return v

    def guarded_line(self, tr: TransformInfo, lower_line) -> None:
        """Lower one transform line under ``if flag_<guard>:`` (a constexpr kernel argument): the branch
        computes the targets' new values, the else branch keeps the old ones, both into fresh vars, and a
        ``guard`` tape entry lets :meth:`backward` put the line's vector-Jacobian products under the same
        branch."""
        prevs = {t: self.current[t] for t in tr.targets}
        first_line, first_entry = len(self.lines), len(self.tape)
        self.guard = tr.guard
        try:
            lower_line()
        finally:
            self.guard = None
        body = self.lines[first_line:]
        del self.lines[first_line:]
        results = {t: self.current[t] for t in tr.targets}
        sels = {}
        for t in tr.targets:
            sels[t] = f"t{self.n}"
            self.n += 1
            self.shape[sels[t]] = self.shape[prevs[t]]
        self.lines.append(f"if flag_{tr.guard}:")
        self.lines += ["    " + ln for ln in body] + [f"    {sels[t]} = {results[t]}" for t in tr.targets]
        self.lines.append("else:")
        self.lines += [f"    {sels[t]} = {prevs[t]}" for t in tr.targets]
        self.tape.append((sels[tr.targets[0]], "guard", tuple(prevs[t] for t in tr.targets),
                          {"flag": tr.guard, "first": first_entry, "sels": sels, "results": results, "prevs": prevs}))
        self.current.update(sels)

    def on_key_heads(self, name: str) -> bool:
        """Whether input ``name`` is read at the key-side head of a grouped kernel (see ``key_rows``)."""
        return self.key_rows and self.rec.spec.input(name).heads is Heads.H

    def record(self, fn: str, args: tuple[str, ...], code: str, shape: str, **extra) -> str:
        v = self.new(code, shape)
        self.tape.append((v, fn, args, extra))
        return v

    def lower(self, n: Node) -> str:
        if isinstance(n, Lit):
            return repr(float(n.value))
        if isinstance(n, Ref):
            if n.name in self.current:
                return self.current[n.name]
            if n.name in self.heads and self.guarded.get(self.heads[n.name], self.guard) != self.guard:
                raise ValueError(f"'{n.name}' is read by transforms under different guards (in {self.rec.spec.op}); "
                                 f"the fused transform kernels load a per-head input under one guard only")
            if n.name not in self.heads:
                head = "i_hk" if self.on_key_heads(n.name) else "i_h"
                vec = self.rec.spec.input(n.name).vec_dim
                if vec is None:
                    self.heads[n.name] = self.new(f"tl.load(p_{n.name} + {head}).to(tl.float32)", "")
                else:  # a per-head vector [H, D]: the head's D channels, as the row's own vector is loaded
                    d = self.letter[vec]
                    self.heads[n.name] = self.new(f"tl.load(p_{n.name} + {head} * {d} + o_{d}, mask=m_{d}, "
                                                  f"other=0.0).to(tl.float32)", d)
            return self.heads[n.name]
        assert isinstance(n, Apply)
        args = tuple(self.lower(a) for a in n.args)
        shapes = [self.shape.get(a, "") for a in args]
        shape = next((s for s in shapes if s), "")
        a = args[0]
        binary = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
        if n.fn in binary:
            return self.record(n.fn, args, f"{args[0]} {binary[n.fn]} {args[1]}", shape)
        code = {
            "neg": f"-{a}",
            "exp": f"tl.exp({a})",
            "log": f"tl.log({a})",
            "sigmoid": f"tl.sigmoid({a})",
            # log(1 + e^x) = x for x > 20 within fp32 rounding; avoids overflow of e^x.
            "softplus": f"tl.where({a} > 20.0, {a}, tl.log(1.0 + tl.exp(tl.minimum({a}, 20.0))))",
            "elu": f"tl.where({a} > 0.0, {a}, tl.exp(tl.minimum({a}, 0.0)) - 1.0)",
            "silu": f"{a} * tl.sigmoid({a})",
        }.get(n.fn)
        if code is not None:
            return self.record(n.fn, args, code, shape)
        if n.fn == "l2norm":
            m = self.new(f"tl.where(m_{shape}, {a}, 0.0)", shape)
            r = self.new(f"1.0 / tl.sqrt({self.layout.sum(f'{m} * {m}')} + {L2NORM_EPS!r})", "")
            return self.record("l2norm", (a,), f"{m} * {r}", shape, r=r)
        raise ValueError(f"the fused transform kernels cannot lower '{n.fn}' (in a transform of "
                         f"{self.rec.spec.op})")

    def rope_partner(self, x: str, j: int) -> str:
        """Code of x[rp_j], rope j's partner channels of the vector x.

        For a vector the kernel loaded from an argument it is a second load of that row at the partner
        offsets (the same cache lines, so no extra DRAM traffic); otherwise a tl.gather on the registers.
        The load measured faster: the forward transform kernel of gated_delta_rule_rope took 0.104 ms
        against 0.137 with the gather (16 rows of 4x4096x16x128 bf16 per program, 4 warps; 0.158 at 8 rows
        either way) on the H100, against 0.096 with no rope at all (the experiment is in git history at 0a80dc0).
        """
        if x in self.loaded:
            ptr, dim = self.loaded[x]
            return f"tl.load({ptr} + row * {dim} + rp{j}, mask=m_{dim}, other=0.0).to(tl.float32)"
        return self.layout.gather(x, f"rp{j}")

    def rope(self, x: str, j: int) -> str:
        shape = self.shape[x]
        return self.record("rope", (x,), f"{x} * rc{j} + rs{j} * {self.rope_partner(x, j)}", shape, j=j)

    def backward(self, adj: dict[str, str]) -> list[str]:
        """Reverse-mode statements for the recorded tape, given the adjoints of its outputs."""
        out: list[str] = []
        k = [0]
        indent = [""]

        def fresh(code: str) -> str:
            v = f"d{k[0]}"
            k[0] += 1
            out.append(f"{indent[0]}{v} = {code}")
            return v

        def add(var: str, contrib: str, from_shape: str) -> None:
            if var not in self.shape:
                return  # a literal
            if not self.shape[var] and from_shape:
                contrib = self.layout.sum(contrib)
            adj[var] = fresh(f"{adj[var]} + {contrib}" if var in adj else contrib)

        def guard(extra: dict, segment: list) -> None:
            """The VJPs of a guarded line under its flag; with the flag off each target's gradient passes
            to its old value, and per-head inputs the line reads get zero."""
            live = [t for t, sel in extra["sels"].items() if sel in adj]
            if not live:
                return
            before = dict(adj)
            out.append(f"{indent[0]}if flag_{extra['flag']}:")
            indent[0] += "    "
            for t in live:
                add(extra["results"][t], adj[extra["sels"][t]], self.shape[extra["sels"][t]])
            for entry in reversed(segment):
                step(*entry)
            joined = {}
            for t in live:  # one name per old value, assigned in both branches
                p = extra["prevs"][t]
                joined[p] = f"d{k[0]}"
                k[0] += 1
                out.append(f"{indent[0]}{joined[p]} = {adj.get(p, self.layout.zero())}")
            indent[0] = indent[0][:-4]
            out.append(f"{indent[0]}else:")
            for t in live:
                p, dy = extra["prevs"][t], before[extra["sels"][t]]
                out.append(f"{indent[0]}    {joined[p]} = {before[p] + ' + ' if p in before else ''}{dy}")
            for var, name in adj.items():  # per-head inputs: zero (or their earlier gradient) with the flag off
                if var in joined or before.get(var) == name:
                    continue
                if var not in self.guarded:
                    out.append(f"{indent[0]}    {name} = {before.get(var, self.layout.zero(self.shape[var]))}")
                elif var in self.heads.values():
                    out.append(f"{indent[0]}    {name} = {self.layout.zero(self.shape[var])}")
            adj.update(joined)

        def step(v, fn, args, extra) -> None:
            if v not in adj:
                return
            dy, s = adj[v], self.shape[v]
            a = args[0]
            if fn == "add":
                add(args[0], dy, s)
                add(args[1], dy, s)
            elif fn == "sub":
                add(args[0], dy, s)
                add(args[1], f"-{dy}", s)
            elif fn == "mul":
                add(args[0], f"{dy} * {args[1]}", s)
                add(args[1], f"{dy} * {args[0]}", s)
            elif fn == "div":
                add(args[0], f"{dy} / {args[1]}", s)
                add(args[1], f"-{dy} * {args[0]} / ({args[1]} * {args[1]})", s)
            elif fn == "broadcast":
                add(a, dy, s)
            elif fn in _UNARY_VJP:
                add(a, _UNARY_VJP[fn].format(dy=dy, x=a, y=v), s)
            elif fn == "l2norm":
                r = extra["r"]
                add(a, f"tl.where(m_{s}, {r} * ({dy} - {v} * {self.layout.sum(f'{dy} * {v}')}), 0.0)", s)
            elif fn == "rope":
                j = extra["j"]
                # the partner map is an involution: sum_i dy_i rs_i [rp_i = c] = (dy rs)[rp_c]; and a partner
                # shares its channel's angle with the sign of its sine flipped (rs 0 on pass-through
                # channels), so (dy rs)[rp] = -rs dy[rp]: a second load where dy is a gradient the kernel
                # loaded (the backward kernel 0.244 -> 0.214 ms at 4x4096x16x128, 8 rows per program; H100,
                # experiment in git history at 0a80dc0)
                if dy in self.loaded:
                    add(a, f"{dy} * rc{j} - rs{j} * {self.rope_partner(dy, j)}", s)
                else:
                    add(a, f"{dy} * rc{j} + {self.layout.gather(f'{dy} * rs{j}', f'rp{j}')}", s)
            else:
                raise AssertionError(fn)

        i = len(self.tape)
        while i > 0:
            i -= 1
            v, fn, args, extra = self.tape[i]
            if fn == "guard":
                guard(extra, self.tape[extra["first"]:i])
                i = extra["first"]
            else:
                step(v, fn, args, extra)
        return out


def _own_l2norm(tr: TransformInfo) -> str | None:
    """The target of ``x = l2norm(x)``, else None."""
    e = tr.expr
    if tr.kind == "map" and isinstance(e, Apply) and e.fn == "l2norm" and isinstance(e.args[0], Ref) \
            and e.args[0].name == tr.targets[0]:
        return tr.targets[0]
    return None


def norms_before_rotations(transforms: tuple[TransformInfo, ...]) -> tuple[TransformInfo, ...]:
    """The transform lines in the order the backward kernel lowers them: each ``x = l2norm(x)`` that
    directly follows a rope of x (no line between them touches x) moves ahead of that rope.

    l2norm(rope(x)) = rope(l2norm(x)) exactly, partial rotary included: a rotation keeps every pair's
    norm and the tail is unchanged, so the row norm (and its epsilon) is the same. Lowered norm-first,
    the backward kernel never needs rope's output (rope's vector-Jacobian product reads only dy and the
    angles), so it does one tl.gather per input instead of two: the backward of rope + l2norm at
    4x4096x16x128 bf16 took 0.340 ms against 0.112 (rope) + 0.134 (l2norm) alone on the H100
    (benchmarks/transform_breakdown.py, in git history at 0a80dc0).
    """
    out = list(transforms)
    for i in range(len(out)):
        x = _own_l2norm(out[i])
        if x is None:
            continue
        at = i
        while at > 0 and x not in out[at - 1].targets:
            at -= 1
        if at > 0 and out[at - 1].kind == "rope":
            out.insert(at - 1, out.pop(i))
    return tuple(out)


def pass_outputs(lowered: Lowered) -> tuple[Slot, ...]:
    """The slots the generated pass computes: DERIVED slots, and INPUT slots of a transformed input."""
    transformed = set(lowered.rec.spec.transformed)
    return tuple(s for s in lowered.slots if s.source is SlotSource.DERIVED
                 or (s.source is SlotSource.INPUT and s.input in transformed))


def plan_transforms(lowered: Lowered) -> TransformKernel | None:
    """The generated pass of a recurrence (its transforms and derived slots), or None when there is none.

    Raises:
        ValueError: a transform uses a function these kernels cannot lower.
    """
    if not pass_outputs(lowered):
        return None
    # The forward keeps the spec's order: norm-first measured 0.156 against 0.134 ms for the rope +
    # l2norm forward kernel (H100, benchmarks/transform_breakdown.py), while it saves the backward a gather.
    # The decode path (ROW, inlined in the recurrent kernel) keeps tl.gather too: with the partner load a
    # decode step took 0.1025 against 0.1007 ms at B = 64 and 0.0606 against 0.0558 at B = 8 (H100, same
    # process; the A/B is in git history at 0a80dc0).
    tile = _lower_transforms(lowered, TILE, norms_first=False, input_partners=True, switching=True)
    # ROW runs inside the recurrent kernel, which reads the key-side heads itself when the spec is grouped
    row = _lower_transforms(lowered, ROW, norms_first=False, key_rows=lowered.rec.spec.grouped)
    assert row.outs == tile.outs  # one tape: the layouts differ only in reductions and gathers
    # The backward kernel's recomputed forward keeps tl.gather (there, norm-first, the rope mostly applies to a
    # normalised row, not a loaded one); its rope VJP reads dy's partner with a second load.
    grads = _lower_transforms(lowered, TILE, norms_first=True, gradient_partners=True, switching=True)
    return replace(tile, row_fwd=row.fwd, bwd_fwd=grads.fwd, bwd=grads.bwd, grads_in=grads.grads_in,
                   grads_out=grads.grads_out, grad_loads=grads.grad_loads, grad_stores=grads.grad_stores)


def _lower_transforms(lowered: Lowered, layout: Layout, norms_first: bool, *, input_partners: bool = False,
                      gradient_partners: bool = False, key_rows: bool = False, switching: bool = False,
                      part: tuple[tuple[TransformInfo, ...], tuple[Slot, ...]] | None = None) -> TransformKernel:
    """The statements of one layout. ``input_partners`` / ``gradient_partners``: a rope of a loaded input row /
    the VJP of a rope of a loaded gradient reads the partner channels with a second load (rope_partner),
    else with tl.gather. ``key_rows``: the statements run in a grouped recurrent kernel (_Lowering).
    ``switching``: the statements of the pass's kernels, which leave a switched-off output's input unread
    (:func:`switched_sources`; the inline decode copy reads every input: it replaces the kernel's loads).
    ``part``: only these transform lines and outputs (:func:`transform_parts`), else all of them."""
    rec = lowered.rec
    spec = rec.spec
    low = _Lowering(rec, layout, key_rows)
    lines, outputs = part if part is not None else (spec.transforms, pass_outputs(lowered))
    switched = switched_sources(spec, lines, outputs)
    switch = {name: " or ".join(f"flag_{f}" for f in flags) for name, flags in switched.items()}
    needed = {t for tr in lines for t in tr.targets}
    for slot in outputs:
        needed |= {n for n in inputs_read(slot.expr) if spec.input(n).per_token}
    raw: dict[str, str] = {}
    sources = []
    for info in spec.inputs:
        if info.name not in needed:
            continue
        name = info.name
        shape = low.letter[info.vec_dim] if info.vec_dim else ""
        sources.append((name, shape))
        row = "row_k" if low.on_key_heads(name) else "row"
        if shape:
            code = f"tl.load(x_{name} + {row} * {shape} + o_{shape}, mask=m_{shape}, other=0.0).to(tl.float32)"
        else:
            code = f"tl.load(x_{name} + {row}).to(tl.float32)"
        raw[name] = low.new(code, shape)
        if switching and name in switch:  # read only where a line that rebinds it is on
            load = low.lines.pop()
            low.lines += [f"if {switch[name]}:", "    " + load, "else:", f"    {raw[name]} = 0.0"]
        low.current[name] = raw[name]
        if shape and input_partners:
            low.loaded[raw[name]] = (f"x_{name}", shape)
    ropes = []

    def lower_line(tr: TransformInfo) -> None:
        if tr.kind == "rope":
            j = len(ropes)
            dim = low.letter[spec.input(tr.targets[0]).vec_dim]
            ropes.append(RopeArgs(j, tr.targets, tr.style == "interleaved", math.log2(tr.base),
                                  f"int({render_scalar(tr.rotary_dim, 'call.')})", dim))
            low.lines.append(f"rc{j}, rs{j}, rp{j} = _rope_coefs(o_{dim}, b_pos, rope{j}_dim, {math.log2(tr.base)!r}, "
                             f"{tr.style == 'interleaved'})")
            if layout.keep_dims:  # a tile: coefficients may be one row shared by all (tl.gather wants full shape)
                low.lines.append(f"rp{j} = tl.broadcast_to(rp{j}, [BR, B{dim}])")
            for t in tr.targets:
                low.current[t] = low.rope(low.current[t], j)
        else:
            (t,) = tr.targets
            low.current[t] = low.lower(tr.expr)

    for tr in norms_before_rotations(lines) if norms_first else lines:
        if tr.guard is None:
            lower_line(tr)
        else:
            low.guarded_line(tr, lambda tr=tr: lower_line(tr))
    outs: dict[str, str] = {}
    for slot in outputs:
        var = low.current[slot.input] if slot.source is SlotSource.INPUT else low.lower(slot.expr)
        if slot.dims and not low.shape.get(var, ""):  # a per-token scalar stored over a head dim
            var = low.record("broadcast", (var,), layout.broadcast(var, slot.dims), slot.dims)
        outs[slot.arg] = var
    out_dims = tuple((s.arg, s.dims) for s in outputs)
    fwd = tuple(low.lines)
    grads_in = {name: f"dy{i}" for i, (name, _) in enumerate(out_dims)}
    if gradient_partners:
        # the backward kernel loads each output's gradient from dy_<name> (templates/kernels/_transforms.jinja)
        low.loaded.update({grads_in[name]: (f"dy_{name}", shape) for name, shape in out_dims if shape})
    adj: dict[str, str] = {}
    pre: list[str] = []
    for name, _ in out_dims:
        v = outs[name]
        if v in adj:  # two outputs of one value (or an input left unchanged) cannot share a var
            pre.append(f"{grads_in[name]}s = {adj[v]} + {grads_in[name]}")
            adj[v] = f"{grads_in[name]}s"
        else:
            adj[v] = grads_in[name]
    bwd = tuple(pre + low.backward(adj))
    grads_out = {name: adj.get(raw[name], "0.0") for name, _ in sources}
    grads_out.update({h: adj.get(v, "0.0") for h, v in low.heads.items()})
    stores = head_stores(spec, tuple(low.heads), grads_out, low.letter)
    dims = tuple(d for d in ("K", "V") if any(s == d for _, s in (*sources, *out_dims)))
    # an output's switch: that of the input it passes (an INPUT slot of a switchable input)
    out_switch = {s.arg: switch[s.input] for s in outputs
                  if switching and s.source is SlotSource.INPUT and s.input in switch}
    src_switch = switch if switching else {}
    output_stores = [_under(out_switch.get(name), [_row_store(f"y_{name}", f"{outs[name]}.to(y_{name}.dtype"
                                                                          f".element_ty)", d)])
                     for name, d in out_dims]
    grad_loads = [_under(out_switch.get(name), [f"{grads_in[name]} = {_row_load(f'dy_{name}', d)}"],
                         [f"{grads_in[name]} = 0.0"]) for name, d in out_dims]
    grad_stores = [_under(src_switch.get(name), [_row_store(f"dx_{name}", f"({grads_out[name]}).to(dx_{name}.dtype"
                                                                        f".element_ty)", d)]) for name, d in sources]
    return TransformKernel(
        op=spec.op, sources=tuple(sources), outputs=out_dims, heads=tuple(low.heads), dims=dims, ropes=tuple(ropes),
        fwd=fwd, raw=raw, outs=outs, bwd=bwd, grads_in=grads_in, grads_out=grads_out,
        fp32_outputs=tuple(s.arg for s in outputs if s.fp32), row_fwd=(), bwd_fwd=(),
        flags=tuple(f.name for f in spec.flags if any(tr.guard == f.name for tr in lines)),
        switched=tuple((s.arg, s.input, switched[s.input]) for s in outputs if s.arg in out_switch),
        output_stores=_flat(output_stores), grad_loads=_flat(grad_loads), grad_stores=_flat(grad_stores) + stores,
    )


def _row_load(ptr: str, dim: str) -> str:
    """Code loading the tile's rows of ``ptr`` ([rows] or [rows, D] for ``dim`` D) in fp32."""
    if dim:
        return f"tl.load({ptr} + row * {dim} + o_{dim}, mask=m_{dim}, other=0.0).to(tl.float32)"
    return f"tl.load({ptr} + row).to(tl.float32)"


def _row_store(ptr: str, value: str, dim: str) -> str:
    """Code storing ``value`` to the tile's rows of ``ptr`` ([rows] or [rows, D]), rows past the end masked."""
    if dim:
        return f"tl.store({ptr} + row * {dim} + o_{dim}, {value}, mask=m_r & m_{dim})"
    return f"tl.store({ptr} + row, {value}, mask=m_r)"


def _under(condition: str | None, body: list[str], otherwise: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``body`` as it is, or under ``if condition:`` (constexpr flags) with ``otherwise`` in the else branch."""
    if condition is None:
        return body
    out = [f"if {condition}:"] + ["    " + ln for ln in body]
    return out + (["else:"] + ["    " + ln for ln in otherwise] if otherwise else [])


def _flat(blocks: list[list[str]]) -> tuple[str, ...]:
    return tuple(ln for block in blocks for ln in block)


def switched_sources(spec: CheckedSpec, lines: tuple[TransformInfo, ...],
                     outputs: tuple[Slot, ...]) -> dict[str, tuple[str, ...]]:
    """The per-token inputs of a pass that only guarded lines rebind and that no derived output reads, each with
    the flags of those lines (in declaration order), left out where a switch would be always on.

    Where a call's flags switch all of an input's lines off, the input goes to the recurrence as given: the pass's
    kernels neither read it nor write its output (its gradient passes through likewise). Without this a call with
    one flag on would move every transformed input through the pass: Kimi Linear's call (l2norm on, the gate
    computed outside) would read and write its [B, T, H, K] gate in fp32 for nothing, about as much traffic as the
    l2norm of q and k itself. The switch of an input is left out where the kernel runs only with one of its
    flags on (every line guarded and no derived output: the op or the part then skips the whole pass) and the
    input's lines carry all of them."""
    derived = {n for s in outputs if s.source is not SlotSource.INPUT for n in inputs_read(s.expr)}
    kernel_flags = {tr.guard for tr in lines}
    bypassed = None not in kernel_flags and not derived
    out = {}
    for info in spec.inputs:
        touching = [tr for tr in lines if info.name in tr.targets]
        if not touching or info.name in derived or any(tr.guard is None for tr in touching):
            continue
        flags = {tr.guard for tr in touching}
        if bypassed and flags == kernel_flags:
            continue
        out[info.name] = tuple(f.name for f in spec.flags if f.name in flags)
    return out


def head_stores(spec: CheckedSpec, heads: tuple[str, ...], grads_out: dict[str, str],
                letter: dict[str, str]) -> tuple[str, ...]:
    """The backward kernel's stores of the per-head inputs' gradients, one fp32 partial per (token, head) row
    that the host sums over tokens (deterministic, no atomics): a [rows] partial for a per-head scalar, a [rows, D]
    one for a per-head vector [H, D] (the same size as the gradient of the per-token vector it is added to). A
    guarded input is None where its flag is off (the ops make no stand-in for it, and no partial): its store runs
    under that flag."""
    out: list[str] = []
    under = None  # the flag of the branch the last store went into
    for h in heads:
        info = spec.input(h)
        if info.vec_dim is None:
            store = f"tl.store(dp_{h} + row, {grads_out[h]}, mask=m_r)"
        else:
            d = letter[info.vec_dim]
            store = f"tl.store(dp_{h} + row * {d} + o_{d}, {grads_out[h]}, mask=m_r & m_{d})"
        if info.guard is not None and info.guard != under:
            out.append(f"if flag_{info.guard}:")
        out.append("    " + store if info.guard else store)
        under = info.guard
    return tuple(out)


@dataclass(frozen=True)
class TransformPart:
    """One kernel pair of a pass split by heads (:func:`transform_parts`).

    ``heads``: the heads of every input its lines read and write (None: the whole pass, one part);
    ``kernel``: its statements (``kernel.flags``: the flags of its lines only); ``rope_ids`` / ``flag_ids``:
    the positions of its ropes / flags among the whole pass's; ``bypass``: every line is guarded and no
    output is derived, so with all its flags off the part returns its inputs as they are.
    """

    heads: Heads | None
    kernel: TransformKernel
    rope_ids: tuple[int, ...]
    flag_ids: tuple[int, ...]
    bypass: bool


def _part_heads(lowered: Lowered, names: set[str]) -> frozenset[Heads]:
    """The heads of the inputs ``names`` (per-token and per-head alike)."""
    return frozenset(lowered.rec.spec.input(n).heads for n in names)


def transform_parts(lowered: Lowered) -> tuple[TransformPart, ...] | None:
    """The pass as kernel pairs that each walk one head count's [B * T * heads] rows: one part (the whole
    pass) unless the spec is grouped and its lines read inputs on both H and HV; then one part per head
    count, each line and output in the part of the inputs it reads and writes. () without a pass; None
    when a line or an output reads inputs on both (the op then repeats H-head inputs to HV on the host).

    A part runs on whatever head count its inputs have, so a split pass also serves an op that repeated
    its key-side inputs to HV heads (a kernel template that does not group heads)."""
    whole = plan_transforms(lowered)
    if whole is None:
        return ()
    spec = lowered.rec.spec
    everything = TransformPart(None, whole, tuple(range(len(whole.ropes))), tuple(range(len(whole.flags))), False)
    if not spec.grouped:
        return (everything,)
    outputs = pass_outputs(lowered)
    line_heads = [_part_heads(lowered, set(tr.targets) | (inputs_read(tr.expr) if tr.expr is not None else set()))
                  for tr in spec.transforms]
    out_heads = [_part_heads(lowered, inputs_read(s.expr)) for s in outputs]
    if any(len(h) != 1 for h in (*line_heads, *out_heads)):
        return None
    groups = sorted(set(line_heads) | set(out_heads), key=lambda h: [x.value for x in h])
    if len(groups) == 1:
        return (everything,)
    parts = []
    for group in groups:
        lines = tuple(tr for tr, h in zip(spec.transforms, line_heads, strict=True) if h == group)
        outs = tuple(s for s, h in zip(outputs, out_heads, strict=True) if h == group)
        tile = _lower_transforms(lowered, TILE, norms_first=False, input_partners=True, switching=True,
                                 part=(lines, outs))
        grads = _lower_transforms(lowered, TILE, norms_first=True, gradient_partners=True, switching=True,
                                  part=(lines, outs))
        kernel = replace(tile, bwd_fwd=grads.fwd, bwd=grads.bwd, grads_in=grads.grads_in, grads_out=grads.grads_out,
                         grad_loads=grads.grad_loads, grad_stores=grads.grad_stores)
        rope_ids = tuple(i for i, r in enumerate(whole.ropes) if r.targets in {tr.targets for tr in lines
                                                                               if tr.kind == "rope"})
        bypass = all(tr.guard for tr in lines) and all(s.source is SlotSource.INPUT for s in outs)
        parts.append(TransformPart(next(iter(group)), kernel, rope_ids,
                                   tuple(whole.flags.index(f) for f in kernel.flags), bypass))
    return tuple(parts)


@dataclass(frozen=True)
class InlineTransforms:
    """The transforms rendered inside a recurrent kernel's token loop, where the kernel loads its inputs.

    ``params``: extra kernel parameters (per-head pointers, positions, rotary dims); ``body``: statements
    at the top of the loop (after ``row``, the token's [B * T, HV] row, and in a grouped kernel ``row_k``,
    its [B * T, H] row, are set); ``values``: kernel input (``q``, ``k``, ``g``, ``beta``) → the fp32
    register value that replaces its load; ``flags``: the switches of guarded transform lines, constexpr
    kernel parameters ``flag_<name>``.
    """

    params: tuple[str, ...]
    body: str
    values: dict
    flags: tuple[str, ...] = ()


def inline_transforms(t: TransformKernel | None, lowered: Lowered, grouped_kernel: bool) -> InlineTransforms | None:
    """The inline form of the pass for a kernel that loads whole K rows per token (the fused recurrent
    forward kernels), or None when it cannot be inlined: a V vector among its outputs (those kernels tile
    V), an output that is not a transformed input passed in its slot's place (a derived slot reads
    inputs the kernel does not take), or a grouped spec whose kernel does not read the key-side heads
    itself (``grouped_kernel``; the inline loads index key-side inputs by the group's row)."""
    if t is None or any(d == "V" for _, d in t.outputs) or lowered.rec.spec.grouped != grouped_kernel:
        return None
    slots = {s.arg: s for s in lowered.slots}
    reads = {}
    for name, _ in t.outputs:
        s = slots[name]
        if s.source is not SlotSource.INPUT:
            return None
        reads[s.input] = name
    if set(reads) != {name for name, _ in t.sources}:
        return None
    params = tuple([f"p_{h}" for h in t.heads] + ["pos"] + [f"rope{r.index}_dim" for r in t.ropes])
    body = ["o_K = o_k", "m_K = m_k"] + [f"x_{src} = {reads[src]}" for src, _ in t.sources]
    if t.ropes:  # one position per token: row counts the value heads
        body.append(f"b_pos = tl.load(pos + row // {'HV' if grouped_kernel else 'H'}).to(tl.float32)")
    body += list(t.row_fwd)
    return InlineTransforms(params, "\n".join(body), {name: t.outs[name] for name, _ in t.outputs}, t.flags)
