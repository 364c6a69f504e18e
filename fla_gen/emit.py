"""Stage 5: Recurrence + plans → the files of ``generated/<op>/``, rendered from ``templates/``.

The emitter decides nothing about performance (the planner did); it gathers names and
strings for the templates and renders them. Output is deterministic: the same spec and
compiler give byte-identical files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from fla_gen import __version__
from fla_gen.canonical import GateKind, Recurrence
from fla_gen.host_code import render_scalar
from fla_gen.ir import Apply, CheckedSpec, Heads, InputInfo, Node, Ref
from fla_gen.lower import Lowered, Slot, SlotSource, inputs_read, lower, render_expr
from fla_gen.plan import (
    Algorithm,
    backward_walks_forward,
    decode_work,
    forward_walk_folds_scan,
    gate_bound_for_chunk,
    plan_table,
    select_algorithms,
)
from fla_gen.reference import TorchExpr, derive_reference
from fla_gen.resources import data_dir
from fla_gen.runtime.plan_types import STATE_ROW_BLOCKS, Plan
from fla_gen.transforms import (
    InlineTransforms,
    TransformKernel,
    TransformPart,
    inline_transforms,
    pass_outputs,
    plan_transforms,
    transform_parts,
)

TEMPLATES_DIR = data_dir("templates")
# Kernel templates that read query/key head hv // (HV / H) themselves (``features.grouped``): their ops pass
# q and k on H heads to the launchers. The others get a host-side fallback: the generated function repeats
# every H-head input to HV heads and runs the op ungrouped.
GROUPING_TEMPLATES: frozenset[str] = frozenset({"kernels/fused_recurrent.jinja", "kernels/chunk_delta.jinja"})
# Layout letters (fla_gen.runtime.validate): G stands for the value heads HV.
_LETTER_NAMES = {"G": "HV"}


def _layout_shape(layout: str) -> str:
    return "[" + ", ".join(_LETTER_NAMES.get(c, c) for c in layout) + "]"


@dataclass(frozen=True)
class GeneratedFile:
    """One file of a generated package: its path relative to the output root, and its text."""

    path: str
    text: str


@lru_cache(maxsize=4)
def _environment(templates_dir: str, trim: bool = True) -> jinja2.Environment:
    """Package templates trim block lines; kernel templates control whitespace themselves."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        trim_blocks=trim,
        lstrip_blocks=trim,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyrepr"] = repr
    env.filters["tuple_repr"] = lambda xs: repr(tuple(xs))
    env.globals["per_row_block"] = per_row_block
    return env


def per_row_block(*lines: str, start: int = 0) -> str:
    """Kernel code repeating ``lines`` for each row block j >= ``start`` of a [BK, BV] state held as
    [RB, BV] blocks (fla_gen/runtime/launch.py state_row_block): block 0 as written, block j > 0 under a
    compile-time ``if BK > j * RB:``. In each line ``{j}`` becomes the block index, ``{off}`` its row offset
    (`` + j * RB``, empty for block 0) and ``{offv}`` the same in a [K, V] state (`` + j * RB * V``); empty
    lines are left out. The result starts at column 0; the template indents it."""
    out: list[str] = []
    for j in range(start, STATE_ROW_BLOCKS):
        body = [ln.replace("{j}", str(j)).replace("{offv}", f" + {j} * RB * V" if j else "")
                .replace("{off}", f" + {j} * RB" if j else "") for ln in lines if ln]
        if j:
            out.append(f"if BK > {j} * RB:")
            out.extend("    " + b for b in body)
        else:
            out.extend(body)
    return "\n".join(out)


def _summary(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines) or "a linear-attention recurrence."


def _statement_lines(rec: Recurrence) -> list[str]:
    src = rec.spec.source.splitlines()
    rows = sorted({n.pos.line for n in (*rec.spec.transforms, *rec.spec.updates, rec.spec.output)})
    return [src[r - 1].split("#")[0].strip() for r in rows]


_SLOT_ROLES = {"q": "query", "k": "key", "v": "value", "g": "gate", "g_gamma": "gate", "a": "rank1_read",
               "b": "rank1_write"}


def _arg_role(lowered: Lowered, name: str) -> str:
    """What an input is to the recurrence, for code that builds the inputs (fla_gen.layers): query,
    key, value, gate (a log-space decay), rank1_read / rank1_write (a and b of a general rank-1 term
    b (a^T S)) or other (e.g. the delta rule's beta, or an input that a derived slot reads)."""
    roles = {s.input: _SLOT_ROLES[s.arg] for s in lowered.slots if s.input and s.arg in _SLOT_ROLES}
    return roles.get(name, "other")


def _arg_doc(rec: Recurrence, name: str, layout: str) -> str:
    shape = _layout_shape(layout)
    roles = {rec.query.input: "queries", rec.write[0].input: "keys", rec.write[1].input: "values"}
    for t in rec.decay:
        roles[t.input] = {
            GateKind.SCALAR: "log-space decay per token (decay = exp(g))",
            GateKind.CHANNEL: "log-space decay per token and key channel (decay = exp(g))",
            GateKind.HEAD: "log-space decay per head, constant over time",
        }[t.kind]
    transforms = [t for t in rec.spec.transforms if name in t.targets]
    reads = [t for t in rec.spec.transforms if t.expr is not None and name not in t.targets
             and _reads(t.expr, name)]
    if transforms and all(t.guard for t in transforms):
        when = " or ".join(sorted({t.guard for t in transforms}))
        roles[name] = f"{roles.get(name, 'input')}; transformed first when {when} (see above)"
    elif transforms:
        roles[name] = f"{roles.get(name, 'input')}, raw: the spec transforms it first (see above)"
    elif reads:
        roles[name] = f"per-head parameter of the transform of {', '.join(t.targets[0] for t in reads)}"
    doc = f"{shape} {roles.get(name, 'input')}"
    if rec.spec.grouped and rec.spec.input(name).heads is Heads.H:
        doc += "; each of its H heads serves HV / H consecutive value heads"
    if rec.spec.input(name).optional:
        doc += "; optional, None means zeros"
    return doc


def _flag_doc(rec: Recurrence, flag: str) -> list[str]:
    """What a flag switches on: the transform lines it guards, as written in the spec."""
    src = rec.spec.source.splitlines()
    return [src[t.pos.line - 1].split("#")[0].strip().removeprefix("transform ").rsplit(" if ", 1)[0]
            for t in rec.spec.transforms if t.guard == flag]


def _option_code(value: bool | float | None) -> str:
    """Python code of an option's value: None, True, False or a number (an int when whole)."""
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return repr(value)


def _option_type(value: bool | float | None) -> str:
    """The annotation of an option's keyword."""
    if value is None:
        return "object"
    if isinstance(value, bool):
        return "bool"
    return "int" if value == int(value) else "float"


def _reads(n: Node, name: str) -> bool:
    if isinstance(n, Ref):
        return n.name == name
    return isinstance(n, Apply) and any(_reads(a, name) for a in n.args)


def _common_context(lowered: Lowered) -> dict:
    rec = lowered.rec
    spec = rec.spec
    key_input = next(i.name for i in spec.inputs if i.per_token and i.vec_dim == spec.key_dim)
    value_input = next(i.name for i in spec.inputs if i.per_token and i.vec_dim == spec.value_dim)
    args = []
    for i in spec.inputs:
        heads = "G" if i.heads is Heads.HV else "H"
        vec = {spec.key_dim: "K", spec.value_dim: "V", None: ""}[i.vec_dim]
        layout = ("BT" + heads if i.per_token else heads) + vec
        dim_names = {"K": spec.key_dim, "V": spec.value_dim, **_LETTER_NAMES}
        args.append({
            "name": i.name,
            "layout": layout,
            "optional": i.optional,
            # Gates, and per-head parameters of transforms (A_log, dt_bias), may stay float32 with 16-bit inputs.
            "gate": i.name in lowered.gate_inputs or (not i.per_token and any(
                t.expr is not None and _reads(t.expr, i.name) for t in spec.transforms)),
            "doc": _arg_doc(rec, i.name, layout),
            "role": _arg_role(lowered, i.name),
            "zeros_shape": ", ".join(dim_names.get(c, c) for c in layout),
            # In a grouped spec: the dim along which an H-head input repeats to HV heads, else None.
            "group_dim": (2 if i.per_token else 0) if spec.grouped and i.heads is Heads.H else None,
        })
    guarded_args = [{
        "name": i.name, "guard": i.guard, "optional": i.optional,
        "layout": _guarded_layout(spec, i),
        # a per-head vector may come flat, [H * D], as fla passes dt_bias (fla_gen.runtime.validate.TensorArg)
        "flat": i.vec_dim is not None,
        # its shape in the reference, in the spec's names (its head dims are locals there)
        "ref_shape": ", ".join(i.dims),
        # in a grouped spec, on the query/key heads: repeated to the value heads where the H-head inputs are (a
        # flat vector as [H, D] first)
        "repeated": spec.grouped and i.heads is Heads.H,
        "doc": (f"{_guarded_shape_doc(i)} per-head parameter of the transform of "
                f"{', '.join(t.targets[0] for t in spec.transforms if t.expr is not None and _reads(t.expr, i.name))}"
                f"; only with {i.guard}=True, " + ("optional (None means zeros)" if i.optional else "then required")),
    } for i in spec.guarded_inputs]
    return {
        "guarded_args": guarded_args,
        "flags": [{"name": f.name, "default": f.default, "requires": f.requires,
                   "doc": "; ".join(_flag_doc(rec, f.name))} for f in spec.flags],
        "options": [{"name": o.name, "value": _option_code(o.value),
                     "type": _option_type(o.value)}
                    for o in spec.options],
        "version": __version__,
        "spec_path": Path(spec.path).as_posix(),
        "spec_hash": spec.source_hash,
        "op": spec.op,
        "summary": _summary(spec.source),
        "spec_statements": _statement_lines(rec),
        "args": args,
        "key_dim": spec.key_dim,
        "value_dim": spec.value_dim,
        "key_input": key_input,
        "value_input": value_input,
        "state": spec.state_name,
        "family": lowered.features.rank1.name,
        "grouped": spec.grouped,
        # the state's and the output's heads, for docstrings
        "state_heads": "HV" if spec.grouped else "H",
    }


def _guarded_layout(spec: CheckedSpec, i: InputInfo) -> str:
    """The validation layout of a guarded per-head input (fla_gen.runtime.validate): H or G (the value heads),
    then K or V for a vector."""
    heads = "G" if i.heads is Heads.HV else "H"
    return heads + {spec.key_dim: "K", spec.value_dim: "V", None: ""}[i.vec_dim]


def _guarded_shape_doc(i: InputInfo) -> str:
    """The shapes a guarded per-head input takes, for docstrings: ``[H]``, or ``[H, K]`` and its flat form."""
    if i.vec_dim is None:
        return f"[{i.dims[0]}]"
    return f"[{i.dims[0]}, {i.vec_dim}] (or flat [{i.dims[0]} * {i.vec_dim}])"


# Kernel arguments read at the query/key head of each value head when the kernels group heads.
_KEY_SIDE_ARGS = frozenset({"q", "k", "a", "b"})


def kernel_groups_heads(lowered: Lowered, algo: Algorithm) -> bool:
    """Whether the kernels of ``algo`` read the query/key head of each value head themselves: a grouped spec
    whose template is in GROUPING_TEMPLATES, whose key-side arguments (q, k, a, b) read only H-head inputs
    and whose other arguments read only HV-head inputs. Such kernels also run with H = HV (each group one
    head), which is how they take inputs the host repeated (:func:`host_repeats_heads`)."""
    spec = lowered.rec.spec
    if not spec.grouped or algo.template not in GROUPING_TEMPLATES:
        return False
    for s in lowered.slots:
        heads = {spec.input(n).heads for n in inputs_read(s.expr)}
        if heads - {Heads.H if s.arg in _KEY_SIDE_ARGS else Heads.HV}:
            return False
    return True


def host_repeats_heads(lowered: Lowered, algo: Algorithm) -> bool:
    """Whether a grouped op's autograd path repeats its H-head inputs to HV heads on the host: its kernels
    do not group heads, or its pass (templates/package/transforms.py.jinja) has a line or an output that
    reads inputs on both H and HV, so that it cannot run as one kernel pair per head count
    (:func:`fla_gen.transforms.transform_parts`). The decode path without autograd applies the transforms
    inside a grouping kernel and needs no repeat (:func:`_transform_block`)."""
    if not lowered.rec.spec.grouped:
        return False
    return not kernel_groups_heads(lowered, algo) or transform_parts(lowered) is None


def _kernel_bindings(lowered: Lowered) -> tuple[list[str], list[str], list[bool]]:
    """The launcher's positional tensors (fixed names), the public expressions passed for them, and
    which of them may be None. A slot the lowering derives is the local ``_<arg>`` (_derived_block)."""
    optional = {i.name for i in lowered.rec.spec.inputs if i.optional}
    transformed = set(lowered.rec.spec.transformed)
    exprs, may_be_none = [], []
    for s in lowered.slots:
        x = s.input
        if x is None or x in transformed:  # computed by the pass or on the host
            exprs.append(f"_{s.arg}")
        elif x in optional:
            exprs.append(f"None if {x} is None else {x}.contiguous()")
        else:
            exprs.append(f"{x}.contiguous()")
        may_be_none.append(x in optional)
    return list(lowered.features.kernel_args), exprs, may_be_none


def _raw_values(lowered: Lowered) -> list[str]:
    """The launch values of a kernel that applies the transforms itself (the inlined decode path): every
    INPUT slot's raw input."""
    return [f"{s.input}.contiguous()" if s.input else f"_{s.arg}" for s in lowered.slots]


def _slot_code(s: Slot, lowered: Lowered) -> str:
    """Torch code of a derived or host slot on whole tensors, in its kernel layout and dtype."""
    code = TorchExpr(lowered.rec.spec.state_name, whole=True).render(s.expr)
    dtype = "torch.float32" if s.fp32 else "call.dtype"
    if s.source is SlotSource.HOST:
        shape = "(call.H,)" if not s.per_token else "(call.B, call.T, call.H" + \
            (", call.K" if s.dims == "K" else ", call.V" if s.dims == "V" else "") + ")"
        # a per-head [H] value broadcast over a head dim: H lines up with the head axis, not with K or V
        # (expand aligns trailing dims; at H == K it would broadcast over the wrong axis without an error)
        heads = "[:, None]" if s.per_token and s.dims and s.expr.ty.varies == "head" else ""
        return f"torch.as_tensor({code}, dtype={dtype}, device=call_device){heads}.expand({shape}).contiguous()"
    if s.dims and not s.expr.ty.dims:  # a per-token scalar broadcast over a head dim
        size = "call.K" if s.dims == "K" else "call.V"
        return f"({code})[..., None].expand(call.B, call.T, call.H, {size}).to({dtype}).contiguous()"
    return f"({code}).to({dtype}).contiguous()"


def _derived_block(lowered: Lowered) -> str:
    """The public op's lines computing the slots the kernels do not read directly (indented 4), after the
    spec's transforms; empty when every slot is an input."""
    slots = lowered.host
    if not slots:
        return ""
    first = next(i.name for i in lowered.rec.spec.inputs if i.per_token and not i.optional)
    lines = [f"call_device = {first}.device",
             "# slots of the normal form that are per-head or call-time expressions (fla_gen/lower.py)"]
    lines += [f"_{s.arg} = {_slot_code(s, lowered)}" for s in slots]
    return "\n".join("    " + ln for ln in lines)


def _kernel_scale(lowered: Lowered) -> str:
    if not lowered.scale:
        return "1.0"
    return " * ".join(f"float({render_scalar(c, 'call.')})" for c in lowered.scale)


def _bounded_gate(lowered: Lowered) -> str | None:
    """The per-token log decay a ``gate_lower_bound`` bounds, in the spec's names: the token gate, plus
    the head gate where both are declared (``g + g_gamma``); None without a decay."""
    names = [(s.input or render_expr(s.expr)) for s in lowered.slots if s.arg in ("g", "g_gamma")]
    return " + ".join(names) or None


def _scales(n: Node, name: str) -> bool:
    """Whether ``n`` is the input ``name`` times scalars that do not read it: c * name, name / c, -name."""
    if isinstance(n, Ref):
        return n.name == name
    if not isinstance(n, Apply):
        return False
    if n.fn == "neg":
        return _scales(n.args[0], name)
    if n.fn in ("mul", "div"):
        a, b = n.args
        if _scales(a, name) and not _reads(b, name) and not b.ty.dims:
            return True
        return n.fn == "mul" and _scales(b, name) and not _reads(a, name) and not a.ty.dims
    return False


def context_parallel_values(lowered: Lowered) -> tuple[str | None, str | None]:
    """The input the context-parallel pre-pass widens, or None and why the chunk op cannot run
    context-parallel.

    The pre-pass (fla_gen/runtime/context_parallel.py) passes values [0 | v] (width K + V) and reads the zero
    columns' final state as the transition product: the kernels' values must be that input untouched, or
    it times per-token scalars (a derived ``dt * v``), so that zero columns stay zero and the other columns
    are the op's own values."""
    s = lowered.slot("v")
    spec = lowered.rec.spec
    value_inputs = [n for n in inputs_read(s.expr) if spec.input(n).vec_dim == spec.value_dim]
    if len(value_inputs) != 1 or not _scales(s.expr, value_inputs[0]):
        return None, (f"its kernels' values are {render_expr(s.expr)}, not one input times per-token scalars, "
                      f"so the pre-pass cannot widen them to [0 | v]")
    if value_inputs[0] in spec.transformed:
        return None, (f"its values input {value_inputs[0]!r} is transformed before the recurrence, so the "
                      f"pre-pass's zero values would not stay zero")
    return value_inputs[0], None


def _op_module(lowered: Lowered, algo: Algorithm, common: dict, chunked: bool) -> str:
    rec = lowered.rec
    features = lowered.features
    op = rec.spec.op
    public = f"chunk_{op}" if chunked else f"fused_recurrent_{op}"
    launch_args, launch_values, launch_optional = _kernel_bindings(lowered)
    transforms = plan_transforms(lowered)
    derived_block = _derived_block(lowered)
    groups_heads = kernel_groups_heads(lowered, algo)
    fused_walk = chunked and any(k.stage == "fwd_fused" for k in algo.kernels)
    if fused_walk and not algo.splits_sequences:
        # the call's PackedWalks come with its segment tables (runtime/torch_op.chunk_and_segment_tables)
        raise RuntimeError(f"algorithm {algo.name} has fwd_fused but no segment rule: its launcher would not get "
                           f"the call's PackedWalks")
    inline = None
    if not chunked and not derived_block:  # the fused recurrent forwards load whole K rows per token
        inline = inline_transforms(transforms, lowered, groups_heads)
    inline_block, transform_block, transform_imports = _transform_block(lowered, transforms, inline)
    cp_value_input, cp_refusal = context_parallel_values(lowered)
    ctx = dict(common)
    ctx.update({
        "public_name": public,
        "mode_doc": ("the chunked algorithm, for training and prefill." if chunked
                     else "the token-by-token kernel, for decoding."),
        "algorithm": algo.name,
        "kernel_names": [f"{op}_{k.stage}_kernel" for k in algo.kernels],
        "kernel_template_path": algo.template,
        "kernels_source": _environment(str(TEMPLATES_DIR), trim=False).get_template(algo.template).render(
            op=op, token_gate=features.token_gate, head_gate=features.head_decay,
            features=dataclasses.replace(features, grouped=groups_heads),
            transposed_backward=chunked and backward_walks_forward(algo, features),
            folds_scan=chunked and forward_walk_folds_scan(algo, features),
            inline=inline,
        ).strip("\n"),
        "chunked": chunked,
        # The custom op fla_gen::<public> (fla_gen/runtime/torch_op.py) that the public function calls.
        "op_handle": f"_{public}_op",
        "plans_name": "CHUNK_PLANS" if chunked else "RECURRENT_PLANS",
        "fwd_launcher": "chunk_fwd" if chunked else "fused_recurrent_fwd",
        "splits_sequences": algo.splits_sequences,
        # the forward launcher takes the call's launch.PackedWalks for fwd_fused's launch choice
        "fused_walk": fused_walk,
        "segment_rule": repr(algo.segment_rule) if algo.splits_sequences else None,
        "bwd_launcher": "chunk_bwd" if chunked else "fused_recurrent_bwd",
        "launch_args": launch_args,
        "launch_values": launch_values,
        "launch_optional": launch_optional,
        "kernel_scale": _kernel_scale(lowered),
        "params": [
            {"name": p.name, "default_code": render_scalar(p.default, "call."),
             "default_doc": render_scalar(p.default)}
            for p in rec.spec.params
        ],
        "token_gate": features.token_gate,
        "head_gate": features.head_decay,
        # the log gate whose lower bound selects BOUNDED_CHUNK_PLANS (the spec's names), or None, and the
        # launcher tensors the check reads: the per-token gate, then a per-head one added to it
        "bounded_gate": _bounded_gate(lowered) if chunked and algo.bounded_chunk_size else None,
        "bounded_gate_args": ", ".join([("g" if features.token_gate else "None")]
                                       + (["g_gamma"] if features.head_decay else [])),
        "bounded_chunk": algo.bounded_chunk_size,
        "bounded_limit": f"{gate_bound_for_chunk(algo.bounded_chunk_size):.2f}" if algo.bounded_chunk_size else "",
        "inline_block": inline_block,
        "transform_block": transform_block,
        "transform_imports": transform_imports,
        "derived_block": derived_block,
        "has_rope": any(t.kind == "rope" for t in rec.spec.transforms),
        "host_repeats_heads": host_repeats_heads(lowered, algo),
        # context parallelism (chunk ops only): the values input, or why the op refuses it
        "cp_value_input": cp_value_input,
        "cp_refusal": cp_refusal,
        "per_token_inputs": [i.name for i in rec.spec.inputs if i.per_token],
    })
    ctx["uses_exp_ftz"] = "exp_ftz(" in ctx["kernels_source"]
    # host scalars with exp or log (param defaults, the output's scale) call math.*
    ctx["needs_math"] = any("math." in code for code in (ctx["kernel_scale"], inline_block, transform_block,
                                                          *(p["default_code"] for p in ctx["params"])))
    return _environment(str(TEMPLATES_DIR)).get_template("package/op_module.py.jinja").render(ctx)


# Dtypes whose plans usually equal another dtype's (same element size): emitted as aliases when equal.
_DTYPE_ALIASES = (("fp16", "bf16"),)


def _plan_rows(plans: tuple[Plan, ...]) -> dict:
    """Split a plan table into the rows written out in full and the rows the package rebuilds from others:
    {"plans": [...], "arch_aliases": [{"arch", "source", "unless"}], "aliases": [{"dtype", "source", "unless"}]}.

    Dtype aliases: rows equal to another dtype's row but for the dtype (fp16 = bf16 unless a measured entry
    tells them apart), rebuilt with ``same_plans_as``; ``unless`` the (arch, head dim) of the source rows that
    have no equal row of ``dtype``. Arch aliases, rebuilt first (``same_arch_plans_as``): rows of one arch equal
    to an earlier arch's written row but for the arch (targets whose limits and measurements agree), from the
    earlier arch with the most equal rows; ``unless`` the (dtype, head dim) of that arch's written rows that are
    not copied."""
    by_key = {(p.arch, p.dtype, p.head_dim): p for p in plans}
    aliases, aliased = [], set()
    for dtype, source in _DTYPE_ALIASES:
        same = {(p.arch, p.head_dim) for p in plans if p.dtype == source
                and by_key.get((p.arch, dtype, p.head_dim)) == dataclasses.replace(p, dtype=dtype)}
        if same:
            unless = [(p.arch, p.head_dim) for p in plans if p.dtype == source and (p.arch, p.head_dim) not in same]
            aliases.append({"dtype": dtype, "source": source, "unless": unless})
            aliased |= {(a, dtype, hd) for a, hd in same}
    full = [p for p in plans if (p.arch, p.dtype, p.head_dim) not in aliased]
    written = {(p.arch, p.dtype, p.head_dim): p for p in full}
    arch_aliases, arch_aliased = [], set()
    archs = list(dict.fromkeys(p.arch for p in plans))
    for i, arch in enumerate(archs):
        rows = [p for p in full if p.arch == arch]
        best, best_same = None, set()
        for src in archs[:i]:
            if any(a["arch"] == src for a in arch_aliases):
                continue  # copy only from rows written in full
            same = {(p.dtype, p.head_dim) for p in rows
                    if written.get((src, p.dtype, p.head_dim)) == dataclasses.replace(p, arch=src)}
            if len(same) > len(best_same):
                best, best_same = src, same
        if best is None:
            continue
        unless = [(p.dtype, p.head_dim) for p in full if p.arch == best and (p.dtype, p.head_dim) not in best_same]
        arch_aliases.append({"arch": arch, "source": best, "unless": unless})
        arch_aliased |= {(arch, d, hd) for d, hd in best_same}
    full = [p for p in full if (p.arch, p.dtype, p.head_dim) not in arch_aliased]
    return {"plans": full, "arch_aliases": arch_aliases, "aliases": aliases}


def _pass_inputs(t: TransformKernel, guarded: frozenset[str]) -> list[str]:
    """The pass's tensors as its runner takes them: contiguous, and a ``guarded`` input None where it is None (its
    flag is off: no line that reads it runs, so the ops make no stand-in for it)."""
    return [f"None if {n} is None else {n}.contiguous()" if n in guarded else f"{n}.contiguous()"
            for n in [n for n, _ in t.sources] + list(t.heads)]


def _part_call(part: TransformPart, runner: str, slot_inputs: dict[str, str | None],
               guarded: frozenset[str]) -> list[str]:
    """The lines of the pass's public function that run one part of a split pass (its ``runner``, transforms.py.jinja
    ``_run_<heads>``) into ``_<output>`` locals; a bypassed part (:class:`fla_gen.transforms.TransformPart`) runs
    only where one of its flags is on."""
    t = part.kernel
    outs = _tuple_items([f"_{n}" for n, _ in t.outputs])
    ropes = f"({_tuple_items([f'rope_dims[{i}]' for i in part.rope_ids])})" if part.rope_ids else "()"
    flags = ", ".join(f'"flag_{f}": bool(flags[{i}])' for f, i in zip(t.flags, part.flag_ids, strict=True))
    flags = "{" + flags + "}, " if flags else ""
    inputs = ", ".join(_pass_inputs(t, guarded))
    run = f"{outs} = {runner}(positions, {ropes}, (call.K, call.V), {flags}{inputs})"
    if not part.bypass:
        return [run]
    given = _tuple_items([f"{slot_inputs[n]}.contiguous()" for n, _ in t.outputs])
    return [f"if {' or '.join(f'flags[{i}]' for i in part.flag_ids)}:", "    " + run, "else:", f"    {outs} = {given}"]


def _part_context(part: TransformPart, function_class: str, slot_inputs: dict[str, str | None],
                  guarded: frozenset[str]) -> dict:
    """What transforms.py.jinja renders for one kernel pair of the pass: its names (the whole pass keeps the
    unsuffixed ones), pointers, inputs and, in a split pass, the public function's lines that run it."""
    t = part.kernel
    suffix = "" if part.heads is None else part.heads.name
    return {
        "call_lines": (_part_call(part, "_run_" + suffix.lower(), slot_inputs, guarded) if part.heads is not None
                       else []),
        "t": t,
        "suffix": "" if part.heads is None else "_" + suffix.lower(),
        "class_name": function_class + suffix,
        "heads_doc": "" if part.heads is None else part.heads.value,
        "fwd_pointers": ", ".join([f"x_{n}" for n, _ in t.sources] + [f"p_{h}" for h in t.heads]
                                  + [f"y_{n}" for n, _ in t.outputs]),
        "bwd_pointers": ", ".join([f"x_{n}" for n, _ in t.sources] + [f"p_{h}" for h in t.heads]
                                  + [f"dy_{n}" for n, _ in t.outputs] + [f"dx_{n}" for n, _ in t.sources]
                                  + [f"dp_{h}" for h in t.heads]),
        "all_inputs": [n for n, _ in t.sources] + list(t.heads),
        "bypass": part.bypass,
        "switched": [([n for n, _ in t.outputs].index(out), [n for n, _ in t.sources].index(src),
                      tuple(f"flag_{f}" for f in flags)) for out, src, flags in t.switched],
        "dtype_sources": _dtype_sources(t, slot_inputs),
    }


def _dtype_sources(t: TransformKernel, slot_inputs: dict[str, str | None]) -> list[int]:
    """Per output of the pass's kernel pair, the source whose dtype it is stored in (where it is not fp32): the
    input it rebinds, else (a derived slot) the first source. A part of a split pass then keeps each input's
    dtype: its first source may be an fp32 gate, which beta's sigmoid must not turn into an fp32 beta (the
    chunk kernels would compile again for it)."""
    sources = [n for n, _ in t.sources]
    return [sources.index(slot_inputs[n]) if slot_inputs.get(n) in sources else 0 for n, _ in t.outputs]


def _transforms_module(lowered: Lowered, t: TransformKernel, common: dict) -> str:
    rec = lowered.rec
    ctx = dict(common)
    lines = [ln for ln in _statement_lines(rec) if ln.startswith("transform")]
    lines += [f"{s.arg} = {render_expr(s.expr)}" for s in pass_outputs(lowered) if s.source is SlotSource.DERIVED]
    function_class = "".join(p.capitalize() for p in rec.spec.op.split("_")) + "Transforms"
    # one kernel pair per head count where the lines of a grouped spec read inputs on both (no host repeat)
    parts = transform_parts(lowered) or (TransformPart(None, t, (), (), False),)
    slot_inputs = {s.arg: s.input for s in lowered.slots}
    guarded = frozenset(i.name for i in rec.spec.guarded_inputs)
    ctx.update({
        "t": t,
        "parts": [_part_context(p, function_class, slot_inputs, guarded) for p in parts],
        "returned": ", ".join(f"_{n}" for n, _ in t.outputs),
        "transform_lines": lines,
        "all_inputs": [n for n, _ in t.sources] + list(t.heads),
        "input_args": _pass_inputs(t, guarded),
        "first_source": t.sources[0][0],
        "function_class": function_class,
        "public_op": rec.spec.op,
    })
    return _environment(str(TEMPLATES_DIR)).get_template("package/transforms.py.jinja").render(ctx)


def _transform_block(lowered: Lowered, t: TransformKernel | None,
                     inline: InlineTransforms | None) -> tuple[str, str, str]:
    """The public op's lines that apply the transforms (indented 4): the decode path's direct launch, the
    pass, and what they import from ``.transforms``; empty without transforms. With ``inline`` (a kernel
    that applies them on load), a call without autograd launches that forward directly on the raw inputs,
    ahead of any host-side repeat of grouped heads (the kernel reads the key-side heads itself)."""
    if t is None:
        return "", "", ""
    spec = lowered.rec.spec
    outputs = _tuple_items([f"_{n}" for n, _ in t.outputs])
    args = ", ".join([n for n, _ in t.sources] + list(t.heads))
    offsets = "seqlen_offsets" if t.ropes else "0"
    rope = ", seqlen_offsets=seqlen_offsets" if t.ropes else ""
    imports = [f"{t.op}_transforms"]
    inline_lines = []
    if inline is not None:
        key = lowered.slot("q").input
        tensors = ", ".join([i.name for i in (*spec.inputs, *spec.guarded_inputs)] + ["initial_state"])
        guarded = {i.name for i in spec.guarded_inputs}
        # a guarded per-head input is None where its flag is off: the kernel never reads it then
        heads = "".join((f"None if {h} is None else {h}.contiguous(), " if h in guarded else f"{h}.contiguous(), ")
                        for h in t.heads)
        flags = ""
        if inline.flags:
            flags = f", transform_flags=({_tuple_items([f'bool({f})' for f in inline.flags])})"
        inline_lines += _stand_ins(spec, key)
        inline_lines += [
            f"if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ({tensors}))):",
            "    # No autograd: the recurrent kernel applies the transforms where it loads its inputs.",
            f"    positions, rope_dims = {t.op}_transform_args(call, {offsets}, cu_seqlens, {key}.device)",
            f"    plan = select_plan(RECURRENT_PLANS, {key}.device, call.dtype, max(call.K, call.V))",
            f"    o, final_state, _ = fused_recurrent_fwd({', '.join(_raw_values(lowered))}, {_kernel_scale(lowered)},",
            "                                            initial_state, output_final_state, cu_seqlens, plan,",
            f"                                            transform_args=({heads}positions, *rope_dims){flags})",
            "    return o, final_state",
        ]
        imports += [f"{t.op}_transform_args", "_rope_coefs"]
    if not t.flags:
        lines = [f"{outputs} = {t.op}_transforms({args}, call=call{rope}, cu_seqlens=cu_seqlens)"]
    else:
        # the decode path above has made them already
        body = _stand_ins(spec, t.sources[0][0]) if inline is None else []
        body.append(f"{outputs} = {t.op}_transforms({args}, call=call{rope}, cu_seqlens=cu_seqlens, "
                    f"flags=({_tuple_items(t.flags)}))")
        derived = any(s.source is SlotSource.DERIVED for s in pass_outputs(lowered))
        if all(tr.guard for tr in spec.transforms) and not derived:
            # every line is switched by a flag: with all of them off the inputs go to the recurrence as they are
            slots = {s.arg: s for s in lowered.slots}
            as_given = _tuple_items([f"{slots[name].input}.contiguous()" for name, _ in t.outputs])
            lines = [f"if {' or '.join(t.flags)}:"] + ["    " + ln for ln in body] + [
                "else:", f"    {outputs} = {as_given}"]
        else:
            lines = body
    return ("\n".join("    " + ln for ln in inline_lines), "\n".join("    " + ln for ln in lines),
            ", ".join(sorted(imports)))


def _stand_ins(spec: CheckedSpec, like: str) -> list[str]:
    """The public op's lines that give an optional guarded input zeros where its flag is on and it is absent (the
    kernels then read it). Where its flag is off it stays None: no line that reads it runs, so the op makes no
    stand-in (an allocation and a fill kernel each) and the backward kernel writes no partial gradient for it."""
    lines = []
    for i in spec.guarded_inputs:
        if i.optional:
            lines += [f"if {i.guard} and {i.name} is None:", f"    {i.name} = {_zeros(spec, i, like)}"]
    return lines


def _tuple_items(items: list[str] | tuple[str, ...]) -> str:
    """Python code of a tuple's items: ``a, b``, or ``a,`` for one item."""
    return ", ".join(items) + ("," if len(items) == 1 else "")


def _zeros(spec: CheckedSpec, i: InputInfo, like: str) -> str:
    """Torch code of float32 zeros for per-head input ``i`` ([H] or [HV], or a vector [H, K] ...), on the device of
    ``like``."""
    shape = ["call.HV" if i.heads is Heads.HV else "call.H"]
    if i.vec_dim is not None:
        shape.append("call.K" if i.vec_dim == spec.key_dim else "call.V")
    return f"torch.zeros({', '.join(shape)}, dtype=torch.float32, device={like}.device)"


def emit_package(rec: Recurrence) -> tuple[GeneratedFile, ...]:
    """Render every file of ``generated/<op>/`` for a canonical recurrence."""
    env = _environment(str(TEMPLATES_DIR))
    lowered = lower(rec)
    common = _common_context(lowered)
    chunk_algo, recurrent_algo = select_algorithms(lowered.features)
    ref = derive_reference(rec.spec)
    ref_ctx = dict(common)
    ref_ctx.update({
        "params": [{"name": p.name, "default": render_scalar(p.default)} for p in rec.spec.params],
        "fetches": ref.token_fetches,
        "updates": ref.updates,
        "output": ref.output,
        "transforms": ref.transforms,
        "has_rope": any(t.kind == "rope" for t in rec.spec.transforms),
    })
    ref_ctx["needs_math"] = any("math." in code for code in (*(p["default"] for p in ref_ctx["params"]),
                                                              *ref.transforms))
    plans_ctx = dict(common)
    plans_ctx["tables"] = [
        {"name": "CHUNK_PLANS", "doc": f"{chunk_algo.name}: the chunked kernels", "derived_from": None,
         **_plan_rows(plan_table(lowered.features, chunk_algo))},
        {"name": "RECURRENT_PLANS", "doc": f"{recurrent_algo.name}: the decode kernels", "derived_from": None,
         **_plan_rows(plan_table(lowered.features, recurrent_algo, decode=decode_work(rec)))},
    ]
    if chunk_algo.bounded_chunk_size:
        # the plans without a bound, each with the gate bound (plan_algorithm's bounded plan): written as that,
        # not row by row; planning the bounded table refuses an algorithm whose chunks would differ
        gate_bound = plan_table(lowered.features, chunk_algo, bounded=True)[0].gate_bound
        plans_ctx["tables"].append(
            {"name": "BOUNDED_CHUNK_PLANS", "doc": f"{chunk_algo.name} for calls with gate_lower_bound >= "
             f"{gate_bound:.4f}: CHUNK_PLANS, the gates' run-time check dropped",
             "derived_from": "CHUNK_PLANS", "gate_bound": gate_bound, "arch_aliases": [], "aliases": []})
    pkg = rec.spec.package
    transforms = plan_transforms(lowered)
    extra = () if transforms is None else (
        GeneratedFile(f"{pkg}/transforms.py", _transforms_module(lowered, transforms, common)),)
    return extra + (
        GeneratedFile(f"{pkg}/__init__.py", env.get_template("package/__init__.py.jinja").render(common)),
        GeneratedFile(f"{pkg}/chunk.py", _op_module(lowered, chunk_algo, common, chunked=True)),
        GeneratedFile(f"{pkg}/fused_recurrent.py", _op_module(lowered, recurrent_algo, common, chunked=False)),
        GeneratedFile(f"{pkg}/plans.py", env.get_template("package/plans.py.jinja").render(plans_ctx)),
        GeneratedFile(f"{pkg}/reference.py", env.get_template("package/reference.py.jinja").render(ref_ctx)),
    )
