"""Stage 2: syntax tree → typed IR. Resolves names, checks shapes and roles, reports with positions."""

from __future__ import annotations

import difflib
import hashlib

from fla_gen import syntax as S
from fla_gen.errors import Pos, SpecErrorFactory
from fla_gen.ir import Apply, CheckedSpec, Heads, InputInfo, Lit, Node, ParamInfo, Ref, TransformInfo, Ty, widest

# Layout dims: the batch, the tokens, the query/key heads H and the value heads HV (a multiple of H).
LAYOUT_DIMS = ("B", "T", "H", "HV")
_HEADS = {h.value: h for h in Heads}
# Elementwise functions: name → arity. Their result has the type of their argument.
ELEMENTWISE = {"exp": 1, "log": 1, "sigmoid": 1, "softplus": 1}
# Functions allowed only in a `transform` line (name → arity): l2norm is a full-row reduction.
TRANSFORM_FN = {"l2norm": 1, "elu": 1, "silu": 1}
ROPE_STYLES = ("neox", "interleaved")
ROPE_OPTIONS = ("style", "rotary_dim", "base")
# Functions with their own typing rules below.
STRUCTURAL = {"outer": 2, "diag": 1}
BINARY_FN = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul", "**": "pow"}


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean '{close[0]}'?" if close else ""


class _Checker:
    def __init__(self, spec: S.SpecAST) -> None:
        self.spec = spec
        self.err = SpecErrorFactory(spec.path, spec.source)
        self.names: dict[str, Ref] = {}
        self.inputs: dict[str, InputInfo] = {}
        # While checking a transform: the input it rebinds (the only per-token value it may read).
        self.transform_target: str | None = None

    # ----------------------------------------------------------------- declarations
    def run(self) -> CheckedSpec:
        stmts = self.spec.statements
        ops = [s for s in stmts if isinstance(s, S.OpDecl)]
        if not ops:
            raise self.err(Pos(1, 1), "the spec has no 'op NAME' line", "start the spec with e.g. 'op my_attn'")
        if len(ops) > 1:
            raise self.err(ops[1].pos, f"a second 'op' line (the op is already named '{ops[0].name}')")
        packages = [s for s in stmts if isinstance(s, S.PackageDecl)]
        if len(packages) > 1:
            raise self.err(packages[1].pos, f"a second 'package' line (already '{packages[0].name}')")
        states = [s for s in stmts if isinstance(s, S.StateDecl)]
        if not states:
            raise self.err(ops[0].pos, "the spec declares no state", "add e.g. 'state S: [K, V]'")
        if len(states) > 1:
            raise self.err(states[1].pos, "a second state; a spec has exactly one state matrix")
        state = states[0]
        if len(state.dims) != 2 or state.dims[0] == state.dims[1]:
            got = ", ".join(state.dims)
            raise self.err(state.pos, f"the state must be a matrix [K, V] of two head dims, got [{got}]")
        for d, p in zip(state.dims, state.dim_pos, strict=True):
            if d in LAYOUT_DIMS:
                raise self.err(p, f"'{d}' is a layout dim (B, T, H, HV); the state's dims are head dims such as K "
                                 f"and V")
        key_dim, value_dim = state.dims
        self._declare(state.name, Ref(state.name, "state", Ty(state.dims, "state"), state.pos), state.pos)
        for d in (key_dim, value_dim):
            self.names.setdefault(d, Ref(d, "dim", Ty((), "const"), state.pos))

        input_decls = [s for s in stmts if isinstance(s, S.InputDecl)]
        inputs = tuple(self._input(s, key_dim, value_dim) for s in input_decls)
        self._check_value_heads(inputs, input_decls, value_dim)
        for earlier, later in zip(inputs, inputs[1:], strict=False):
            if earlier.optional and not later.optional:
                raise self.err(later.pos, f"required input '{later.name}' follows optional input '{earlier.name}'",
                               "declare optional inputs (with '= 0') last, as Python arguments with defaults")
        params = tuple(self._param(s) for s in stmts if isinstance(s, S.ParamDecl))
        transforms = self._transforms(stmts)

        updates = []
        for s in stmts:
            if isinstance(s, S.Update):
                if s.target != state.name:
                    what = "an input" if any(i.name == s.target for i in inputs) else "not the state"
                    raise self.err(s.pos, f"'update {s.target}': '{s.target}' is {what}; only the state "
                                          f"'{state.name}' can be updated")
                node = self.expr(s.expr)
                if node.ty.dims != state.dims:
                    raise self.err(s.expr.pos if hasattr(s.expr, "pos") else s.pos,
                                   f"the update of '{state.name}' has type {node.ty.show()}, expected "
                                   f"[{key_dim}, {value_dim}] (the state's shape)")
                updates.append(node)
        if not updates:
            raise self.err(state.pos, f"the spec never updates the state '{state.name}'",
                           f"add e.g. 'update {state.name} = {state.name} + outer(k, v)'")
        outputs = [s for s in stmts if isinstance(s, S.Output)]
        if len(outputs) != 1:
            where = outputs[1].pos if outputs else ops[0].pos
            raise self.err(where, "a spec has exactly one 'output' line" if outputs else "the spec has no output",
                           "" if outputs else f"add e.g. 'output o = scale * {state.name}^T @ q'")
        out_stmt = outputs[0]
        if out_stmt.name in self.names:
            raise self.err(out_stmt.pos, f"output name '{out_stmt.name}' is already declared")
        first_update = next(s for s in stmts if isinstance(s, S.Update))
        if stmts.index(out_stmt) < stmts.index(first_update):
            raise self.err(out_stmt.pos, "the output comes before the state update; fla's convention is "
                                         "o_t = f(S_t), the state after token t")
        out = self.expr(out_stmt.expr)
        if out.ty.dims != (value_dim,):
            raise self.err(out_stmt.expr.pos, f"the output has type {out.ty.show()}, expected [{value_dim}] "
                                              f"(one value vector per token)",
                           f"e.g. 'output {out_stmt.name} = scale * {state.name}^T @ q'")
        self._check_all_used(inputs, params, updates, out, transforms)
        text = self.spec.source.replace("\r\n", "\n")
        return CheckedSpec(
            path=self.spec.path, source=self.spec.source,
            source_hash=hashlib.sha256(text.encode()).hexdigest()[:16],
            op=ops[0].name, package=packages[0].name if packages else ops[0].name, inputs=inputs,
            state_name=state.name, key_dim=key_dim, value_dim=value_dim,
            params=params, updates=tuple(updates), output_name=out_stmt.name, output=out, transforms=transforms,
        )

    # ----------------------------------------------------------------- transforms
    def _transforms(self, stmts) -> tuple[TransformInfo, ...]:
        first_update = next((i for i, s in enumerate(stmts) if isinstance(s, S.Update)), len(stmts))
        out: list[TransformInfo] = []
        roped: set[str] = set()
        for i, s in enumerate(stmts):
            if not isinstance(s, S.Transform):
                continue
            if i > first_update:
                raise self.err(s.pos, "a transform after the first update: transforms rebind inputs before the "
                                      "recurrence reads them", "move the 'transform' lines above the 'update' lines")
            for j, (name, p) in enumerate(zip(s.targets, s.target_pos, strict=True)):
                if name not in self.inputs:
                    hint = _did_you_mean(name, self.inputs)
                    raise self.err(p, f"'transform {name}': '{name}' is not a declared input", hint)
                if not self.inputs[name].per_token:
                    raise self.err(p, f"'{name}' is a per-head input; transforms rebind per-token inputs "
                                      f"[B, T, H, ...]", f"use '{name}' inside the transform of a per-token input")
                if name in s.targets[:j]:
                    raise self.err(p, f"'{name}' appears twice among the transform's targets")
                if self.inputs[name].optional:
                    raise self.err(p, f"'{name}' is optional ('= 0'); a transformed input must be given",
                                   f"drop '= 0' from the declaration of '{name}'")
            if isinstance(s.expr, S.Call) and s.expr.func == "rope":
                info = self._rope(s)
                for name, p in zip(s.targets, s.target_pos, strict=True):
                    if name in roped:
                        raise self.err(p, f"'{name}' is rotated twice; one rope per input")
                    roped.add(name)
                out.append(info)
                continue
            if len(s.targets) != 1:
                raise self.err(s.target_pos[1], "only rope(...) transforms several inputs at once",
                               f"write one 'transform {s.targets[0]} = ...' line per input")
            target = s.targets[0]
            self.transform_target = target
            try:
                node = self.expr(s.expr)
            finally:
                self.transform_target = None
            want = self.inputs[target].ty
            if node.ty.dims != want.dims:
                raise self.err(s.expr.pos, f"the transform of '{target}' has type {node.ty.show()}, expected "
                                           f"{want.show()} (the shape of '{target}')")
            out.append(TransformInfo("map", (target,), node, s.pos))
        return tuple(out)

    def _rope(self, s: S.Transform) -> TransformInfo:
        call = s.expr
        if call.late_positional is not None:
            raise self.err(call.late_positional, "a positional argument after a keyword argument")
        names = [a.id if isinstance(a, S.Name) else None for a in call.args]
        if tuple(names) != s.targets:
            where = next((a.pos for a, n, t in zip(call.args, names, s.targets, strict=False) if n != t), call.pos)
            targets = ", ".join(s.targets)
            raise self.err(where, "rope rotates its arguments in place: its arguments must be the transform's "
                                  "targets, in order", f"write 'transform {targets} = rope({targets}, ...)'")
        dims = {self.inputs[n].vec_dim for n in s.targets}
        if None in dims:
            bad = next(n for n in s.targets if self.inputs[n].vec_dim is None)
            raise self.err(s.target_pos[s.targets.index(bad)], f"rope rotates vectors; '{bad}' is a scalar per token")
        if len(dims) > 1:
            raise self.err(call.pos, "rope's inputs must share one head dim (the rotary table runs over it)")
        (head_dim,) = dims
        opts: dict[str, S.Kwarg] = {}
        for kw in call.kwargs:
            if kw.name not in ROPE_OPTIONS:
                hint = _did_you_mean(kw.name, ROPE_OPTIONS) or f"rope's options: {', '.join(ROPE_OPTIONS)}"
                raise self.err(kw.pos, f"unknown rope option '{kw.name}'", hint)
            if kw.name in opts:
                raise self.err(kw.pos, f"rope option '{kw.name}' is given twice")
            opts[kw.name] = kw
        style = "neox"
        if "style" in opts:
            v = opts["style"].value
            if not (isinstance(v, S.Name) and v.id in ROPE_STYLES):
                raise self.err(v.pos, "rope's style is 'neox' (rotate halves, GPT-NeoX) or 'interleaved' "
                                      "(rotate adjacent pairs, GPT-J)")
            style = v.id
        rotary = Ref(head_dim, "dim", Ty((), "const"), call.pos)
        if "rotary_dim" in opts:
            v = opts["rotary_dim"].value
            rotary = self.expr(v)
            if rotary.ty.dims or rotary.ty.varies != "const":
                raise self.err(v.pos, "rotary_dim must be a number or an expression of head dims (e.g. K or K / 2)")
            if isinstance(rotary, Lit) and (rotary.value != int(rotary.value) or rotary.value <= 0
                                            or int(rotary.value) % 2):
                raise self.err(v.pos, f"rotary_dim must be a positive even integer, got {rotary.value:g}",
                               "channels rotate in pairs")
        base = 10000.0
        if "base" in opts:
            v = opts["base"].value
            if not isinstance(v, S.Num) or v.value <= 1:
                raise self.err(v.pos, "rope's base must be a number greater than 1 (e.g. 10000)")
            base = v.value
        return TransformInfo("rope", s.targets, None, s.pos, style, rotary, base)

    def _check_all_used(self, inputs, params, updates, out, transforms=()) -> None:
        used: set[str] = set()

        def walk(n: Node) -> None:
            if isinstance(n, Ref):
                used.add(n.name)
            elif isinstance(n, Apply):
                for a in n.args:
                    walk(a)

        for n in (*updates, out):
            walk(n)
        recurrence_uses = set(used)
        for tr in transforms:  # a transform's own target must still feed the recurrence
            if tr.expr is not None:
                walk(tr.expr)
            for name in tr.targets:
                if name not in recurrence_uses:
                    raise self.err(tr.pos, f"'{name}' is transformed but the recurrence never reads it")
        for decl in (*inputs, *params):
            if decl.name not in used:
                raise self.err(decl.pos, f"'{decl.name}' is declared but never used")

    def _declare(self, name: str, ref: Ref, pos: Pos) -> None:
        if name in self.names:
            raise self.err(pos, f"'{name}' is declared twice")
        self.names[name] = ref

    def _check_value_heads(self, inputs: tuple[InputInfo, ...], decls: list[S.InputDecl], value_dim: str) -> None:
        """In a grouped spec (an input on HV) the state and the output live on the value heads HV, so an
        input over the value dim must too: an H-head one would be read by HV / H state heads at once."""
        grouped = next((i for i in inputs if i.heads is Heads.HV), None)
        if grouped is None:
            return
        for info, decl in zip(inputs, decls, strict=True):
            if info.heads is Heads.H and info.vec_dim == value_dim:
                where = decl.dim_pos[2 if info.per_token else 0]
                layout = "[B, T, HV, ...]" if info.per_token else "[HV, ...]"
                raise self.err(where, f"'{info.name}' is over the value dim {value_dim} on the query/key heads H, "
                                      f"but '{grouped.name}' is on the value heads HV, so the state lives on HV "
                                      f"heads", f"declare '{info.name}' as {layout}")

    def _input(self, s: S.InputDecl, key_dim: str, value_dim: str) -> InputInfo:
        dims = s.dims
        if dims[:2] == ("B", "T") and len(dims) > 2 and dims[2] in _HEADS:
            per_token, heads, rest, rest_pos = True, _HEADS[dims[2]], dims[3:], s.dim_pos[3:]
        elif dims[:1] and dims[0] in _HEADS:
            per_token, heads, rest, rest_pos = False, _HEADS[dims[0]], dims[1:], s.dim_pos[1:]
        else:
            where = s.dim_pos[2] if dims[:2] == ("B", "T") and len(dims) > 2 else s.dim_pos[0]
            raise self.err(where, f"input '{s.name}' must be laid out [B, T, H, ...] / [B, T, HV, ...] (per token, "
                                  f"on the query/key heads H or the value heads HV) or [H, ...] / [HV, ...] (per "
                                  f"head), got [{', '.join(dims)}]")
        if len(rest) > 1:
            raise self.err(rest_pos[1], f"input '{s.name}' has more than one head dim; inputs are scalars or "
                                        f"vectors per token and head")
        for d, p in zip(rest, rest_pos, strict=True):
            if d not in (key_dim, value_dim):
                hint = _did_you_mean(d, (key_dim, value_dim))
                raise self.err(p, f"unknown head dim '{d}': the state is [{key_dim}, {value_dim}], so head dims are "
                                  f"{key_dim} and {value_dim}", hint)
        if s.default is not None and s.default != 0.0:
            raise self.err(s.pos, f"input '{s.name}' has default {s.default:g}; only '= 0' (absent means zeros) "
                                  f"is supported")
        info = InputInfo(s.name, dims, per_token, rest[0] if rest else None, s.default is not None, s.pos, heads)
        if s.name in LAYOUT_DIMS:
            raise self.err(s.pos, f"'{s.name}' is a layout dim and cannot name an input")
        self._declare(s.name, Ref(s.name, "input", info.ty, s.pos), s.pos)
        self.inputs[s.name] = info
        return info

    def _param(self, s: S.ParamDecl) -> ParamInfo:
        default = self.expr(s.default)
        if default.ty.dims or default.ty.varies not in ("const", "param"):
            raise self.err(s.default.pos, f"the default of param '{s.name}' must be a scalar made of numbers "
                                          f"and head dims, got a {default.ty.varies} {default.ty.show()}")
        self._declare(s.name, Ref(s.name, "param", Ty((), "param"), s.pos), s.pos)
        return ParamInfo(s.name, default, s.pos)

    # ----------------------------------------------------------------- expressions
    def expr(self, e: S.Expr) -> Node:
        if isinstance(e, S.Num):
            return Lit(e.value, Ty((), "const"), e.pos)
        if isinstance(e, S.Name):
            if e.id not in self.names:
                hint = _did_you_mean(e.id, [n for n, r in self.names.items() if r.role != "dim"])
                raise self.err(e.pos, f"unknown name '{e.id}'", hint or "declare it with 'input' or 'param'")
            ref = self.names[e.id]
            if self.transform_target is not None and ref.name != self.transform_target:
                info = self.inputs.get(ref.name)
                if info is None or info.per_token or info.vec_dim is not None:
                    raise self.err(e.pos, f"the transform of '{self.transform_target}' reads '{e.id}'; a transform "
                                          f"reads only its own input, per-head [H] inputs and numbers")
                if info.heads is Heads.HV and self.inputs[self.transform_target].heads is Heads.H:
                    raise self.err(e.pos, f"the transform of '{self.transform_target}' (on the query/key heads H) "
                                          f"reads '{e.id}' on the value heads HV; each of its heads would need "
                                          f"HV / H values", f"declare '{e.id}' as [H] or '{self.transform_target}' "
                                                            f"on HV")
                if info.optional:
                    raise self.err(e.pos, f"'{e.id}' is optional ('= 0'); a transform reads only given inputs")
            return Ref(ref.name, ref.role, ref.ty, e.pos)
        if isinstance(e, S.Neg):
            x = self.expr(e.operand)
            return Apply("neg", (x,), x.ty, e.pos)
        if isinstance(e, S.Transpose):
            x = self.expr(e.operand)
            if len(x.ty.dims) != 2:
                raise self.err(e.pos, f"'^T' needs a matrix, got {x.ty.show()}",
                               "for a k v^T product write outer(k, v)")
            return Apply("transpose", (x,), Ty((x.ty.dims[1], x.ty.dims[0]), x.ty.varies), e.pos)
        if isinstance(e, S.BinOp):
            return self._binary(BINARY_FN[e.op], self.expr(e.left), self.expr(e.right), e)
        if isinstance(e, S.Call):
            return self._call(e)
        raise AssertionError(f"unhandled syntax node {e!r}")

    def _binary(self, fn: str, a: Node, b: Node, e: S.BinOp) -> Node:
        da, db = a.ty.dims, b.ty.dims
        varies = widest(a.ty.varies, b.ty.varies)
        bad = f"'{e.op}' cannot combine {a.ty.show()} with {b.ty.show()}"
        if fn in ("add", "sub"):
            # A scalar broadcasts over a vector (g + g_gamma); matrices add only to matrices.
            if da == db or (len(da) + len(db) == 1):
                return Apply(fn, (a, b), Ty(da or db, varies), e.pos)
            raise self.err(e.pos, bad, "both sides need the same shape")
        if fn == "mul":
            if not da or not db:
                return Apply(fn, (a, b), Ty(da or db, varies), e.pos)
            if da == db and len(da) == 1:
                return Apply(fn, (a, b), Ty(da, varies), e.pos)
            vec, mat = (a, b) if len(da) == 1 else (b, a)
            if len(vec.ty.dims) == 1 and len(mat.ty.dims) == 2 and vec.ty.dims[0] in mat.ty.dims:
                return Apply(fn, (vec, mat), Ty(mat.ty.dims, varies), e.pos)
            hint = "for a matrix product use '@'" if len(da) == 2 and len(db) == 2 else ""
            raise self.err(e.pos, bad, hint)
        if fn == "div":
            if db:
                raise self.err(e.pos, f"{bad}: only division by a scalar is defined")
            return Apply(fn, (a, b), Ty(da, varies), e.pos)
        if fn == "pow":
            if da or db:
                raise self.err(e.pos, f"{bad}: '**' is defined on scalars only")
            return Apply(fn, (a, b), Ty((), varies), e.pos)
        # matmul: the inner dims must agree.
        if not da or not db:
            raise self.err(e.pos, f"{bad}: '@' needs vectors or matrices", "to scale, use '*'")
        if da[-1] != db[0]:
            raise self.err(e.pos, f"{bad}: inner dims {da[-1]} and {db[0]} differ",
                           "transpose a matrix with '^T'" if len(da) == 2 else "")
        return Apply(fn, (a, b), Ty(da[:-1] + db[1:], varies), e.pos)

    def _call(self, e: S.Call) -> Node:
        if e.func == "rope":
            raise self.err(e.pos, "rope(...) is a transform: write it as the whole right side of a line "
                                  "'transform q, k = rope(q, k)'")
        if e.kwargs:
            raise self.err(e.kwargs[0].pos, f"'{e.func}' takes no keyword arguments")
        if e.func in TRANSFORM_FN and self.transform_target is None:
            raise self.err(e.pos, f"'{e.func}' is a per-token transform: use it in a 'transform' line",
                           f"e.g. 'transform q = {e.func}(q)'")
        arity = ELEMENTWISE.get(e.func, STRUCTURAL.get(e.func, TRANSFORM_FN.get(e.func)))
        if arity is None:
            hint = _did_you_mean(e.func, [*ELEMENTWISE, *STRUCTURAL, *TRANSFORM_FN, "rope"])
            known = ", ".join([*ELEMENTWISE, *STRUCTURAL, *TRANSFORM_FN, "rope"])
            raise self.err(e.pos, f"unknown function '{e.func}'", hint or f"known functions: {known}")
        if len(e.args) != arity:
            raise self.err(e.pos, f"'{e.func}' takes {arity} argument{'s' if arity > 1 else ''}, got {len(e.args)}")
        args = tuple(self.expr(a) for a in e.args)
        varies = widest(*(a.ty.varies for a in args))
        if e.func == "l2norm" and len(args[0].ty.dims) != 1:
            raise self.err(e.pos, f"l2norm() normalizes a vector, got {args[0].ty.show()}")
        if e.func in ELEMENTWISE or e.func in TRANSFORM_FN:
            if args[0].ty.varies == "state":
                raise self.err(e.pos, f"'{e.func}' of the state: the update must be linear in the state")
            return Apply(e.func, args, Ty(args[0].ty.dims, varies), e.pos)
        if e.func == "outer":
            a, b = args
            if len(a.ty.dims) != 1 or len(b.ty.dims) != 1:
                which = e.args[0] if len(a.ty.dims) != 1 else e.args[1]
                got = a.ty if len(a.ty.dims) != 1 else b.ty
                raise self.err(which.pos, f"outer() takes two vectors, got {got.show()}")
            return Apply("outer", args, Ty(a.ty.dims + b.ty.dims, varies), e.pos)
        (a,) = args  # diag
        if len(a.ty.dims) != 1:
            raise self.err(e.args[0].pos, f"diag() takes a vector, got {a.ty.show()}")
        return Apply("diag", args, Ty(a.ty.dims * 2, varies), e.pos)


def check_spec(spec: S.SpecAST) -> CheckedSpec:
    """Resolve names and type every expression of a parsed spec.

    Raises:
        SpecError: unknown names, shape mismatches (e.g. ``K`` vs ``V``), misplaced roles.
    """
    return _Checker(spec).run()
