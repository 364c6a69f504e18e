"""Stage 2: syntax tree → typed IR. Resolves names, checks shapes and roles, reports with positions."""

from __future__ import annotations

import difflib
import hashlib

from fla_gen import syntax as S
from fla_gen.errors import Pos, SpecErrorFactory
from fla_gen.ir import Apply, CheckedSpec, InputInfo, Lit, Node, ParamInfo, Ref, Ty, widest

LAYOUT_DIMS = ("B", "T", "H")
# Elementwise functions: name → arity. Their result has the type of their argument.
ELEMENTWISE = {"exp": 1, "log": 1, "sigmoid": 1, "softplus": 1}
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
                raise self.err(p, f"'{d}' is a layout dim (B, T, H); the state's dims are head dims such as K and V")
        key_dim, value_dim = state.dims
        self._declare(state.name, Ref(state.name, "state", Ty(state.dims, "state"), state.pos), state.pos)
        for d in (key_dim, value_dim):
            self.names.setdefault(d, Ref(d, "dim", Ty((), "const"), state.pos))

        inputs = tuple(self._input(s, key_dim, value_dim) for s in stmts if isinstance(s, S.InputDecl))
        for earlier, later in zip(inputs, inputs[1:], strict=False):
            if earlier.optional and not later.optional:
                raise self.err(later.pos, f"required input '{later.name}' follows optional input '{earlier.name}'",
                               "declare optional inputs (with '= 0') last, as Python arguments with defaults")
        params = tuple(self._param(s) for s in stmts if isinstance(s, S.ParamDecl))

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
        self._check_all_used(inputs, params, updates, out)
        text = self.spec.source.replace("\r\n", "\n")
        return CheckedSpec(
            path=self.spec.path, source=self.spec.source,
            source_hash=hashlib.sha256(text.encode()).hexdigest()[:16],
            op=ops[0].name, package=packages[0].name if packages else ops[0].name, inputs=inputs,
            state_name=state.name, key_dim=key_dim, value_dim=value_dim,
            params=params, updates=tuple(updates), output_name=out_stmt.name, output=out,
        )

    def _check_all_used(self, inputs, params, updates, out) -> None:
        used: set[str] = set()

        def walk(n: Node) -> None:
            if isinstance(n, Ref):
                used.add(n.name)
            elif isinstance(n, Apply):
                for a in n.args:
                    walk(a)

        for n in (*updates, out):
            walk(n)
        for decl in (*inputs, *params):
            if decl.name not in used:
                raise self.err(decl.pos, f"'{decl.name}' is declared but never used")

    def _declare(self, name: str, ref: Ref, pos: Pos) -> None:
        if name in self.names:
            raise self.err(pos, f"'{name}' is declared twice")
        self.names[name] = ref

    def _input(self, s: S.InputDecl, key_dim: str, value_dim: str) -> InputInfo:
        dims = s.dims
        if dims[:3] == LAYOUT_DIMS:
            per_token, rest, rest_pos = True, dims[3:], s.dim_pos[3:]
        elif dims[:1] == ("H",):
            per_token, rest, rest_pos = False, dims[1:], s.dim_pos[1:]
        else:
            raise self.err(s.dim_pos[0], f"input '{s.name}' must be laid out [B, T, H, ...] (per token) or "
                                         f"[H, ...] (per head), got [{', '.join(dims)}]")
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
        info = InputInfo(s.name, dims, per_token, rest[0] if rest else None, s.default is not None, s.pos)
        if s.name in LAYOUT_DIMS:
            raise self.err(s.pos, f"'{s.name}' is a layout dim and cannot name an input")
        self._declare(s.name, Ref(s.name, "input", info.ty, s.pos), s.pos)
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
        arity = ELEMENTWISE.get(e.func, STRUCTURAL.get(e.func))
        if arity is None:
            hint = _did_you_mean(e.func, [*ELEMENTWISE, *STRUCTURAL])
            known = ", ".join([*ELEMENTWISE, *STRUCTURAL])
            raise self.err(e.pos, f"unknown function '{e.func}'", hint or f"known functions: {known}")
        if len(e.args) != arity:
            raise self.err(e.pos, f"'{e.func}' takes {arity} argument{'s' if arity > 1 else ''}, got {len(e.args)}")
        args = tuple(self.expr(a) for a in e.args)
        varies = widest(*(a.ty.varies for a in args))
        if e.func in ELEMENTWISE:
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
