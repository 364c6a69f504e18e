"""Stage 2: syntax tree → typed IR. Resolves names, checks shapes and roles, reports with positions."""

from __future__ import annotations

import difflib
import hashlib
import keyword
import math
import sys
from dataclasses import replace

from fla_gen import syntax as S
from fla_gen.errors import Pos, SpecErrorFactory
from fla_gen.ir import (
    Apply,
    CheckedSpec,
    FlagInfo,
    Heads,
    InputInfo,
    Lit,
    Node,
    OptionInfo,
    ParamInfo,
    Ref,
    TransformInfo,
    Ty,
    widest,
)

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
# Functions a param default or rotary_dim may use: they are evaluated on the host (fla_gen.emit.render_scalar).
HOST_FN = ("exp", "log")
# Head dims at which host scalars (param defaults, rotary_dim) are evaluated at build time, so that a default
# that divides by zero or overflows is refused here rather than at every call: the planner's head-dim buckets.
SAMPLE_HEAD_DIMS = (16, 32, 64, 128, 256)

# ----------------------------------------------------------------- the name policy
# A spec's names become Python identifiers of the generated package: inputs, params, the state and its head
# dims are arguments and locals of the public ops (templates/package/op_module.py.jinja), of the transforms
# (transforms.py.jinja) and of the reference (reference.py.jinja); the op names functions and the package a
# directory that Python imports. Names that would not compile or would shadow what that code reads are refused.
PYTHON_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
# Builtins that the generated functions whose arguments and locals are spec names call.
USED_BUILTINS = frozenset({"any", "bool", "enumerate", "float", "int", "isinstance", "len", "list", "max", "min",
                           "object", "range", "slice", "sum", "tuple", "zip", "ValueError"})
# Module-level names of the generated op modules that the public functions read, and their own arguments
# and locals; the reference's arguments and locals; the transforms' arguments and locals.
GENERATED_NAMES = frozenset({
    # imports of the op, transforms and reference modules
    "torch", "triton", "tl", "math", "launch", "select_plan", "select_bounded_plan", "OpSignature",
    "backward_outputs", "call_op", "chunk_tables", "define_op", "forward_outputs", "varlen_bounds", "shapes_only",
    "TensorArg", "check_gates_respect_bound", "validate_call", "validate_gate_lower_bound", "rope_positions",
    "validate_flags", "validate_guarded_inputs", "validate_options", "groups", "call_device", "flags",
    "rope_reference", "validate_rope", "cdiv", "next_power_of_2", "row_tile", "tile_of_one_token",
    # the plan tables and the launchers of the kernel templates
    "CHUNK_PLANS", "RECURRENT_PLANS", "BOUNDED_CHUNK_PLANS", "chunk_fwd", "chunk_bwd", "fused_recurrent_fwd",
    "fused_recurrent_bwd",
    # the public ops' own arguments and locals
    "self", "call", "plan", "positions", "rope_dims", "o", "final_state", "initial_state", "output_final_state",
    "cu_seqlens", "cu_seqlens_cpu", "gate_lower_bound", "seqlen_offsets", "cp_context",
    # context parallelism (fla_gen/runtime/context_parallel.py), imported by the chunk op
    "ContextParallelOp", "CPContext", "run_context_parallel",
    # the reference's locals
    "dtype", "device", "segments", "bounds", "outputs", "finals", "n", "rows", "bos", "eos", "batch", "steps",
    "t",
    # the layout dims
    "B", "T", "H", "N",
})
# Module names a package must not take: the generated code imports them, and a package directory named like
# one would shadow it for any program that puts the output root on sys.path.
IMPORTED_MODULES = frozenset({"torch", "triton", "numpy", "jinja2", "lark", "fla_gen", "generated"})


def _name_problem(kind: str, name: str) -> str:
    """Why ``name`` cannot name a ``kind`` (op, package, input, state, param, dim or output); '' if it can."""
    if name in PYTHON_KEYWORDS:
        return f"'{name}' is a Python keyword and cannot name the {kind}"
    if name.startswith("_"):
        return f"'{name}' starts with '_', which the generated code keeps for its own names; the {kind} cannot " \
               f"take it"
    if kind == "op" or kind == "output":  # the op only prefixes names (chunk_<op>); the output names no variable
        return ""
    if kind == "package":
        if name in IMPORTED_MODULES or name in sys.stdlib_module_names:
            return f"package '{name}' would shadow the module '{name}' that Python code imports"
        return ""
    if name in USED_BUILTINS or name in GENERATED_NAMES:
        what = "a Python builtin" if name in USED_BUILTINS else "a name"
        return f"'{name}' is {what} that the generated code uses; the {kind} cannot take it"
    if name == "scale" and kind != "param":
        return "'scale' is the ops' output scale argument; only a 'param' can be named 'scale'"
    return ""
# The keyword arguments every generated op already has: an `option` cannot redeclare them.
OP_KEYWORDS = ("initial_state", "output_final_state", "cu_seqlens", "cu_seqlens_cpu", "gate_lower_bound",
               "seqlen_offsets", "cp_context")
# `option` values written as names, and what they mean in Python.
OPTION_WORDS = {"true": True, "false": False, "none": None}


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean '{close[0]}'?" if close else ""


class _Checker:
    def __init__(self, spec: S.SpecAST) -> None:
        self.spec = spec
        self.err = SpecErrorFactory(spec.path, spec.source)
        self.names: dict[str, Ref] = {}
        self.inputs: dict[str, InputInfo] = {}
        # While checking a transform: the input it rebinds (the only per-token value it may read), and its guard.
        self.transform_target: str | None = None
        self.transform_guard: str | None = None

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
        self._name_ok("op", ops[0].name, ops[0].pos)
        if packages:
            self._name_ok("package", packages[0].name, packages[0].pos)
        else:
            problem = _name_problem("package", ops[0].name)
            if problem:
                raise self.err(ops[0].pos, f"the op names its package: {problem}",
                               "add a line 'package NAME' with another name")
        self.op = ops[0].name
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
        self.key_dim, self.value_dim = key_dim, value_dim
        self._name_ok("state", state.name, state.pos)
        for d, p in zip(state.dims, state.dim_pos, strict=True):
            self._name_ok("head dim", d, p)
            if d == state.name:
                raise self.err(p, f"the head dim '{d}' has the state's name")
        self._declare(state.name, Ref(state.name, "state", Ty(state.dims, "state"), state.pos), state.pos)
        for d, axis in ((key_dim, "K"), (value_dim, "V")):
            self.names.setdefault(d, Ref(d, "dim", Ty((), "const"), state.pos, axis))

        flags = tuple(self._flag(s) for s in stmts if isinstance(s, S.FlagDecl))
        input_decls = [s for s in stmts if isinstance(s, S.InputDecl)]
        declared = tuple(self._input(s, key_dim, value_dim) for s in input_decls)
        self._check_value_heads(declared, input_decls, value_dim)
        inputs = tuple(i for i in declared if i.guard is None)
        guarded_inputs = tuple(i for i in declared if i.guard is not None)
        for earlier, later in zip(inputs, inputs[1:], strict=False):
            if earlier.optional and not later.optional:
                raise self.err(later.pos, f"required input '{later.name}' follows optional input '{earlier.name}'",
                               "declare optional inputs (with '= 0') last, as Python arguments with defaults")
        params = tuple(self._param(s) for s in stmts if isinstance(s, S.ParamDecl))
        for decl in (*inputs, *params):
            fetch = decl.name.removesuffix("_t")
            if decl.name.endswith("_t") and fetch in self.inputs:
                raise self.err(decl.pos, f"'{decl.name}' is the name the reference gives to input '{fetch}' at "
                                         f"token t", f"rename '{decl.name}'")
        options = tuple(self._option(s) for s in stmts if isinstance(s, S.OptionDecl))
        transforms = self._transforms(stmts)
        for f in flags:
            if not any(tr.guard == f.name for tr in transforms):
                raise self.err(f.pos, f"'{f.name}' is declared but guards no transform",
                               f"add ' if {f.name}' after a 'transform' line, or remove the param")

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
        self._name_ok("output", out_stmt.name, out_stmt.pos)
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
        self._check_all_used((*inputs, *guarded_inputs), params, updates, out, transforms)
        text = self.spec.source.replace("\r\n", "\n")
        return CheckedSpec(
            path=self.spec.path, source=self.spec.source,
            source_hash=hashlib.sha256(text.encode()).hexdigest()[:16],
            op=ops[0].name, package=packages[0].name if packages else ops[0].name, inputs=inputs,
            state_name=state.name, key_dim=key_dim, value_dim=value_dim,
            params=params, updates=tuple(updates), output_name=out_stmt.name, output=out, transforms=transforms,
            flags=flags, options=options, guarded_inputs=guarded_inputs,
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
            guard = self._guard(s)
            if isinstance(s.expr, S.Call) and s.expr.func == "rope":
                info = replace(self._rope(s), guard=guard)
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
            self.transform_target, self.transform_guard = target, guard
            try:
                node = self.expr(s.expr)
            finally:
                self.transform_target = self.transform_guard = None
            want = self.inputs[target].ty
            if node.ty.dims != want.dims:
                raise self.err(s.expr.pos, f"the transform of '{target}' has type {node.ty.show()}, expected "
                                           f"{want.show()} (the shape of '{target}')")
            out.append(TransformInfo("map", (target,), node, s.pos, guard=guard))
        return tuple(out)

    def _guard(self, s: S.Transform) -> str | None:
        """The flag named after ``if`` in a transform line, checked to be a declared boolean param."""
        if s.guard is None:
            return None
        ref = self.names.get(s.guard)
        if ref is None or ref.role != "flag":
            what = "not declared" if ref is None else f"a {ref.role}, not a boolean param"
            flags = [n for n, r in self.names.items() if r.role == "flag"]
            raise self.err(s.guard_pos, f"the transform's guard '{s.guard}' is {what}",
                           _did_you_mean(s.guard, flags) or f"declare it with 'param {s.guard}: bool = false'")
        return s.guard

    def _flag(self, s: S.FlagDecl) -> FlagInfo:
        if s.type_name != "bool":
            raise self.err(s.type_pos, f"param '{s.name}' has type '{s.type_name}'; the only param type is 'bool'",
                           f"a number param is written without a type: 'param {s.name} = 1.0'")
        if s.value not in ("true", "false"):
            raise self.err(s.value_pos, f"a bool param's default is 'true' or 'false', got '{s.value}'")
        if s.requires is not None:
            ref = self.names.get(s.requires)
            if ref is None or ref.role != "flag" or s.requires == s.name:
                flags = [n for n, r in self.names.items() if r.role == "flag"]
                raise self.err(s.requires_pos, f"'{s.name}' requires '{s.requires}', which is not a boolean param "
                                               f"declared before it", _did_you_mean(s.requires, flags))
        self._declare(s.name, Ref(s.name, "flag", Ty((), "param"), s.pos), s.pos)
        return FlagInfo(s.name, s.value == "true", s.pos, s.requires)

    def _option(self, s: S.OptionDecl) -> OptionInfo:
        if s.name in OP_KEYWORDS:
            raise self.err(s.pos, f"'{s.name}' is an argument of every generated op; an option cannot redeclare it")
        value = s.value
        if isinstance(value, str):
            if value not in OPTION_WORDS:
                raise self.err(s.value_pos, f"option '{s.name}' = '{value}': an option's value is true, false, "
                                            f"none or a number")
            value = OPTION_WORDS[value]
        self._declare(s.name, Ref(s.name, "option", Ty((), "const"), s.pos), s.pos)
        return OptionInfo(s.name, value, s.pos)

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
        rotary = Ref(head_dim, "dim", Ty((), "const"), call.pos, "K" if head_dim == self.key_dim else "V")
        if "rotary_dim" in opts:
            v = opts["rotary_dim"].value
            rotary = self.expr(v)
            if rotary.ty.dims or rotary.ty.varies != "const":
                raise self.err(v.pos, "rotary_dim must be a number or an expression of head dims (e.g. K or K / 2)")
            if isinstance(rotary, Lit) and (rotary.value != int(rotary.value) or rotary.value <= 0
                                            or int(rotary.value) % 2):
                raise self.err(v.pos, f"rotary_dim must be a positive even integer, got {rotary.value:g}",
                               "channels rotate in pairs")
            self._host_scalar(rotary, v.pos, "rotary_dim")
            self._rotary_fits(rotary, head_dim, v.pos)
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

    def _name_ok(self, kind: str, name: str, pos: Pos) -> None:
        problem = _name_problem(kind, name)
        if not problem and kind not in ("op", "package", "output"):
            op = getattr(self, "op", "")
            transforms_class = "".join(p.capitalize() for p in op.split("_")) + "Transforms"
            # a grouped spec's pass may run as one class per head count (fla_gen.transforms.transform_parts)
            own = {f"chunk_{op}", f"fused_recurrent_{op}", f"{op}_reference", f"{op}_transforms",
                   f"{op}_transform_args", transforms_class, *(transforms_class + h.name for h in Heads)}
            if name in own:
                problem = f"'{name}' is a function of the generated package; the {kind} cannot take it"
        if problem:
            raise self.err(pos, problem, "choose another name")

    def _host_scalar(self, node: Node, pos: Pos, what: str) -> None:
        """Evaluate a scalar of numbers, head dims and params at every SAMPLE_HEAD_DIMS pair: host code computes
        it at call time, so a value that is not a finite number is refused here, at its line."""
        bad = _host_only(node)
        if bad is not None:
            raise self.err(bad.pos, f"{what} is computed on the host, which evaluates {', '.join(HOST_FN)}, "
                                    f"numbers, head dims and the operators + - * / **; '{bad.fn}' is not among them")
        for k in SAMPLE_HEAD_DIMS:
            for v in SAMPLE_HEAD_DIMS:
                problem = _evaluate(node, {self.key_dim: k, self.value_dim: v})
                if problem:
                    dims = "" if not _reads_dims(node) else f" at {self.key_dim}={k}, {self.value_dim}={v}"
                    raise self.err(pos, f"{what} is not a finite number{dims}: {problem}")

    def _rotary_fits(self, rotary: Node, head_dim: str, pos: Pos) -> None:
        """Refuse a rotary dim wider than the head dim it rotates at every head dim the kernels take (e.g. the
        model dim, 2 * K, or a number over 256): the rotary table would read past each row. A rotary dim that
        fits some head dims is checked against the actual head dim at call time."""
        widths = []
        for d in SAMPLE_HEAD_DIMS:
            env = {self.key_dim: d, self.value_dim: d}
            if _evaluate(rotary, env) == "":
                widths.append(_value(rotary, env) - d)
        if widths and min(widths) > 0:
            raise self.err(pos, f"rotary_dim is wider than the head dim {head_dim} it rotates at every head dim up "
                                f"to {SAMPLE_HEAD_DIMS[-1]}", f"rope rotates at most all {head_dim} channels of a "
                                f"head: use rotary_dim={head_dim} or less (the head dim, not the model dim)")

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
        if s.guard is not None:
            ref = self.names.get(s.guard)
            if ref is None or ref.role != "flag":
                flags = [n for n, r in self.names.items() if r.role == "flag"]
                raise self.err(s.guard_pos, f"input '{s.name}' is guarded by '{s.guard}', which is not a declared "
                                            f"boolean param", _did_you_mean(s.guard, flags)
                               or f"declare it with 'param {s.guard}: bool = false'")
            if per_token:
                raise self.err(s.pos, f"a guarded input is a per-head parameter of a transform, [H] or a vector "
                                      f"[H, {key_dim}] / [H, {value_dim}]; '{s.name}' is [{', '.join(dims)}]",
                               f"declare it as [{', '.join(dims[2:])}]")
        info = InputInfo(s.name, dims, per_token, rest[0] if rest else None, s.default is not None, s.pos,
                         heads, s.guard)
        if s.name in LAYOUT_DIMS:
            raise self.err(s.pos, f"'{s.name}' is a layout dim and cannot name an input")
        self._name_ok("input", s.name, s.pos)
        self._declare(s.name, Ref(s.name, "input", info.ty, s.pos), s.pos)
        self.inputs[s.name] = info
        return info

    def _per_head_vector_fits(self, info: InputInfo, pos: Pos) -> None:
        """A per-head vector ([H, D]) is one value per channel of a head: the transform that reads it must rebind
        a per-token vector over the same head dim D, whose rows it lines up with channel by channel."""
        if info.vec_dim is None:
            return
        target = self.inputs[self.transform_target]
        layout = f"[{info.dims[0]}, {info.vec_dim}]"
        if target.vec_dim is None:
            raise self.err(pos, f"the transform of '{target.name}', a scalar per token, reads '{info.name}', a "
                                f"per-head vector {layout}; a per-head vector is read only by the transform of a "
                                f"per-token vector over the same head dim", f"declare '{info.name}' as "
                                                                            f"[{info.dims[0]}]")
        if target.vec_dim != info.vec_dim:
            raise self.err(pos, f"the transform of '{target.name}', a vector over {target.vec_dim} per token, reads "
                                f"'{info.name}', a per-head vector over {info.vec_dim}; its channels must be "
                                f"those of '{target.name}'", f"declare '{info.name}' as "
                                                              f"[{info.dims[0]}, {target.vec_dim}]")

    def _param(self, s: S.ParamDecl) -> ParamInfo:
        self._name_ok("param", s.name, s.pos)
        default = self.expr(s.default)
        if default.ty.dims or default.ty.varies not in ("const", "param"):
            raise self.err(s.default.pos, f"the default of param '{s.name}' must be a scalar made of numbers "
                                          f"and head dims, got a {default.ty.varies} {default.ty.show()}")
        if _reads_params(default):
            raise self.err(s.default.pos, f"the default of param '{s.name}' reads another param; a default is "
                                          f"made of numbers and head dims")
        self._host_scalar(default, s.default.pos, f"the default of param '{s.name}'")
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
            if self.transform_target is None and ref.role == "input" and self.inputs[ref.name].guard is not None:
                raise self.err(e.pos, f"'{e.id}' is an input only when {self.inputs[ref.name].guard} is true; only "
                                      f"transforms guarded by it read it")
            if ref.role in ("flag", "option"):
                use = f"a transform's guard: '... if {e.id}'" if ref.role == "flag" else "only a keyword of the ops"
                raise self.err(e.pos, f"'{e.id}' is {'a boolean param' if ref.role == 'flag' else 'an option'}, "
                                      f"not a value; it is {use}")
            if self.transform_target is not None and ref.name != self.transform_target:
                info = self.inputs.get(ref.name)
                if info is None or info.per_token:
                    raise self.err(e.pos, f"the transform of '{self.transform_target}' reads '{e.id}'; a transform "
                                          f"reads only its own input, per-head [H] / [H, D] inputs and numbers")
                self._per_head_vector_fits(info, e.pos)
                if info.heads is Heads.HV and self.inputs[self.transform_target].heads is Heads.H:
                    raise self.err(e.pos, f"the transform of '{self.transform_target}' (on the query/key heads H) "
                                          f"reads '{e.id}' on the value heads HV; each of its heads would need "
                                          f"HV / H values", f"declare '{e.id}' as [H] or '{self.transform_target}' "
                                                            f"on HV")
                if info.guard is not None and info.guard != self.transform_guard:
                    raise self.err(e.pos, f"'{e.id}' is an input only when {info.guard} is true; only a transform "
                                          f"guarded by '{info.guard}' can read it",
                                   f"end the line with ' if {info.guard}'")
                if info.optional and info.guard is None:
                    raise self.err(e.pos, f"'{e.id}' is optional ('= 0'); a transform reads only given inputs")
            return Ref(ref.name, ref.role, ref.ty, e.pos, ref.axis)
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


def _host_only(n: Node) -> Apply | None:
    """The first operation of ``n`` that host code does not evaluate (see HOST_FN), or None."""
    if isinstance(n, Apply):
        if n.fn not in ("add", "sub", "mul", "div", "pow", "neg", *HOST_FN):
            return n
        return next((b for b in map(_host_only, n.args) if b is not None), None)
    return None


def _reads_dims(n: Node) -> bool:
    if isinstance(n, Ref):
        return n.role == "dim"
    return isinstance(n, Apply) and any(_reads_dims(a) for a in n.args)


def _reads_params(n: Node) -> bool:
    if isinstance(n, Ref):
        return n.role == "param"
    return isinstance(n, Apply) and any(_reads_params(a) for a in n.args)


def _value(n: Node, env: dict[str, float]) -> float:
    """The value of a host scalar that _evaluate found finite."""
    if isinstance(n, Lit):
        return n.value
    if isinstance(n, Ref):
        return float(env[n.name])
    a = [_value(x, env) for x in n.args]
    ops = {"neg": lambda: -a[0], "exp": lambda: math.exp(a[0]), "log": lambda: math.log(a[0]),
           "pow": lambda: a[0] ** a[1], "add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1],
           "mul": lambda: a[0] * a[1], "div": lambda: a[0] / a[1]}
    return float(ops[n.fn]())


def _evaluate(n: Node, env: dict[str, float]) -> str:
    """'' if the host scalar ``n`` is a finite real number with the dims of ``env``, else what goes wrong."""
    def value(m: Node) -> float:
        if isinstance(m, Lit):
            return m.value
        if isinstance(m, Ref):
            return float(env[m.name])
        a = [value(x) for x in m.args]
        if m.fn == "neg":
            return -a[0]
        if m.fn == "exp":
            return math.exp(a[0])
        if m.fn == "log":
            return math.log(a[0])
        if m.fn == "pow":
            r = a[0] ** a[1]
            if isinstance(r, complex):
                raise ValueError("a negative number to a fractional power")
            return r
        return {"add": a[0] + a[1], "sub": a[0] - a[1], "mul": a[0] * a[1]}.get(m.fn) if m.fn != "div" \
            else a[0] / a[1]

    try:
        r = value(n)
    except ZeroDivisionError:
        return "it divides by zero"
    except OverflowError:
        return "it overflows a float"
    except ValueError as e:
        return "log of a number <= 0" if "math domain" in str(e) else str(e)
    if not math.isfinite(r):
        return f"it is {r}"
    return ""


def check_spec(spec: S.SpecAST) -> CheckedSpec:
    """Resolve names and type every expression of a parsed spec.

    Raises:
        SpecError: unknown names, shape mismatches (e.g. ``K`` vs ``V``), misplaced roles.
    """
    return _Checker(spec).run()
