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
from fla_gen.canonical import Recurrence
from fla_gen.features import RankOne
from fla_gen.ir import Apply, Lit, Node, Ref
from fla_gen.lower import Lowered, Slot, SlotSource, lower
from fla_gen.plan import Algorithm, bind_kernel_inputs, gate_bound_for_chunk, plan_table, select_algorithms
from fla_gen.reference import TorchExpr, derive_reference
from fla_gen.runtime.plan_types import STATE_ROW_BLOCKS, Plan
from fla_gen.transforms import InlineTransforms, TransformKernel, inline_transforms, plan_transforms

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"

def _layout_shape(layout: str) -> str:
    return "[" + ", ".join(layout) + "]"
_MATH_FN = {"exp": "math.exp", "log": "math.log"}


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


def render_scalar(n: Node, dim_prefix: str = "") -> str:
    """Python code for a call-time scalar (numbers, head dims, params): ``K ** -0.5``."""
    if isinstance(n, Lit):
        return repr(float(n.value)) if n.value != int(n.value) else str(int(n.value))
    if isinstance(n, Ref):
        return f"{dim_prefix}{n.name}" if n.role == "dim" else n.name
    assert isinstance(n, Apply)
    r = [render_scalar(a, dim_prefix) for a in n.args]
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
    if n.fn in binary:
        return f"{r[0]} {binary[n.fn]} {r[1]}" if n.fn == "pow" else f"({r[0]} {binary[n.fn]} {r[1]})"
    if n.fn == "neg":
        return f"-{r[0]}"
    if n.fn in _MATH_FN:
        return f"{_MATH_FN[n.fn]}({r[0]})"
    raise ValueError(f"'{n.fn}' cannot be evaluated on the host")


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
            "scalar": "log-space decay per token (decay = exp(g))",
            "channel": "log-space decay per token and key channel (decay = exp(g))",
            "head": "log-space decay per head, constant over time",
        }[t.kind]
    transforms = [t for t in rec.spec.transforms if name in t.targets]
    reads = [t for t in rec.spec.transforms if t.expr is not None and name not in t.targets
             and _reads(t.expr, name)]
    if transforms:
        roles[name] = f"{roles.get(name, 'input')}, raw: the spec transforms it first (see above)"
    elif reads:
        roles[name] = f"per-head parameter of the transform of {', '.join(t.targets[0] for t in reads)}"
    doc = f"{shape} {roles.get(name, 'input')}"
    if rec.spec.input(name).optional:
        doc += "; optional, None means zeros"
    return doc


def _reads(n: Node, name: str) -> bool:
    if isinstance(n, Ref):
        return n.name == name
    return isinstance(n, Apply) and any(_reads(a, name) for a in n.args)


_FAMILY_NAMES = {RankOne.NONE: "gated", RankOne.DELTA: "delta", RankOne.GENERAL: "general_rank1"}


def _common_context(lowered: Lowered) -> dict:
    rec = lowered.rec
    spec = rec.spec
    key_input = next(i.name for i in spec.inputs if i.per_token and i.vec_dim == spec.key_dim)
    value_input = next(i.name for i in spec.inputs if i.per_token and i.vec_dim == spec.value_dim)
    args = []
    for i in spec.inputs:
        layout = ("BTH" if i.per_token else "H") + {spec.key_dim: "K", spec.value_dim: "V", None: ""}[i.vec_dim]
        dim_names = {"K": spec.key_dim, "V": spec.value_dim}
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
        })
    return {
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
        "family": _FAMILY_NAMES[lowered.features.rank1],
    }


def _kernel_bindings(lowered: Lowered) -> tuple[list[str], list[str], list[bool]]:
    """The launcher's positional tensors (fixed names), the public expressions passed for them, and
    which of them may be None. A slot the lowering derives is the local ``_<arg>`` (_derived_block)."""
    optional = {i.name for i in lowered.rec.spec.inputs if i.optional}
    exprs, may_be_none = [], []
    for s in lowered.slots:
        x = s.input
        if x is None:
            exprs.append(f"_{s.arg}")
        elif x in optional:
            exprs.append(f"None if {x} is None else {x}.contiguous()")
        else:
            exprs.append(f"{x}.contiguous()")
        may_be_none.append(x in optional)
    return list(lowered.features.kernel_args), exprs, may_be_none


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
    slots = [s for s in lowered.slots if s.source is not SlotSource.INPUT]
    if not slots:
        return ""
    first = next(i.name for i in lowered.rec.spec.inputs if i.per_token and not i.optional)
    lines = [f"call_device = {first}.device",
             "# slots of the normal form that are expressions of the inputs (fla_gen/lower.py)"]
    lines += [f"_{s.arg} = {_slot_code(s, lowered)}" for s in slots]
    return "\n".join("    " + ln for ln in lines)


def _kernel_scale(lowered: Lowered) -> str:
    if not lowered.scale:
        return "1.0"
    return " * ".join(f"float({render_scalar(c, 'call.')})" for c in lowered.scale)


def _op_module(lowered: Lowered, algo: Algorithm, common: dict, chunked: bool) -> str:
    rec = lowered.rec
    features = lowered.features
    op = rec.spec.op
    public = f"chunk_{op}" if chunked else f"fused_recurrent_{op}"
    launch_args, launch_values, launch_optional = _kernel_bindings(lowered)
    transforms = plan_transforms(rec)
    derived_block = _derived_block(lowered)
    inline = None
    if not chunked and not derived_block:  # the fused recurrent forwards load whole K rows per token
        inline = inline_transforms(transforms, bind_kernel_inputs(rec))
    transform_block, transform_imports = _transform_block(lowered, transforms, inline, launch_values)
    ctx = dict(common)
    ctx.update({
        "public_name": public,
        "mode_doc": ("the chunked algorithm, for training and prefill." if chunked
                     else "the token-by-token kernel, for decoding."),
        "algorithm": algo.name,
        "kernel_names": [f"{op}_{k.stage}_kernel" for k in algo.kernels],
        "kernel_template_path": algo.template,
        "kernels_source": _environment(str(TEMPLATES_DIR), trim=False).get_template(algo.template).render(
            op=op, token_gate=features.token_gate, head_gate=features.head_decay, features=features,
            inline=inline,
        ).strip("\n"),
        "chunked": chunked,
        # The custom op fla_gen::<public> (fla_gen/runtime/torch_op.py) that the public function calls.
        "op_handle": f"_{public}_op",
        "plans_name": "CHUNK_PLANS" if chunked else "RECURRENT_PLANS",
        "fwd_launcher": "chunk_fwd" if chunked else "fused_recurrent_fwd",
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
        # the gate whose lower bound selects BOUNDED_CHUNK_PLANS, or None
        "bounded_gate": (lowered.slot("g").input or "g") if chunked and algo.bounded_chunk_size
        and features.token_gate else None,
        "bounded_chunk": algo.bounded_chunk_size,
        "bounded_limit": f"{gate_bound_for_chunk(algo.bounded_chunk_size):.2f}" if algo.bounded_chunk_size else "",
        "transform_block": transform_block,
        "transform_imports": transform_imports,
        "derived_block": derived_block,
        "has_rope": any(t.kind == "rope" for t in rec.spec.transforms),
    })
    return _environment(str(TEMPLATES_DIR)).get_template("package/op_module.py.jinja").render(ctx)


# Dtypes whose plans usually equal another dtype's (same element size): emitted as aliases when equal.
_DTYPE_ALIASES = (("fp16", "bf16"),)


def _plan_rows(plans: tuple[Plan, ...]) -> dict:
    """Split a plan table into the rows written out in full and the rows equal to another dtype's
    row but for the dtype (fp16 = bf16 unless a measured entry tells them apart), which the
    package rebuilds with ``same_plans_as``: {"plans": [...], "aliases": [{"dtype", "source", "unless"}]},
    ``unless`` the (arch, head dim) of the source rows that have no equal row of ``dtype``."""
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
    return {"plans": full, "aliases": aliases}
def _transforms_module(rec: Recurrence, t: TransformKernel, common: dict) -> str:
    ctx = dict(common)
    sizes = {d: next((f"targets[{i}].shape[-1]" for i, (_, s) in enumerate(t.targets) if s == d), "1")
             for d in ("K", "V")}
    lines = [ln for ln in _statement_lines(rec) if ln.startswith("transform")]
    ctx.update({
        "t": t,
        "transform_lines": lines,
        "fwd_pointers": ", ".join([f"x_{n}" for n, _ in t.targets] + [f"p_{h}" for h in t.heads]
                                  + [f"y_{n}" for n, _ in t.targets]),
        "bwd_pointers": ", ".join([f"x_{n}" for n, _ in t.targets] + [f"p_{h}" for h in t.heads]
                                  + [f"dy_{n}" for n, _ in t.targets] + [f"dx_{n}" for n, _ in t.targets]
                                  + [f"dp_{h}" for h in t.heads]),
        "all_inputs": [n for n, _ in t.targets] + list(t.heads),
        "first_target": t.targets[0][0],
        "k_size": sizes["K"],
        "v_size": sizes["V"],
        "function_class": "".join(p.capitalize() for p in rec.spec.op.split("_")) + "Transforms",
        "public_op": rec.spec.op,
    })
    return _environment(str(TEMPLATES_DIR)).get_template("package/transforms.py.jinja").render(ctx)


def _transform_block(lowered: Lowered, t: TransformKernel | None, inline: InlineTransforms | None,
                     launch_values: list[str]) -> tuple[str, str]:
    """The public op's lines that apply the transforms (indented 4) and what they import from
    ``.transforms``; empty without transforms. With ``inline`` (a kernel that applies them on load),
    a call without autograd launches that forward directly on the raw inputs."""
    if t is None:
        return "", ""
    targets = ", ".join(n for n, _ in t.targets)
    args = ", ".join([n for n, _ in t.targets] + list(t.heads))
    offsets = "seqlen_offsets" if t.ropes else "0"
    rope = ", seqlen_offsets=seqlen_offsets" if t.ropes else ""
    targets += "," if len(t.targets) == 1 else ""
    lines = []
    imports = [f"{t.op}_transforms"]
    if inline is not None:
        key = lowered.slot("q").input
        tensors = ", ".join([i.name for i in lowered.rec.spec.inputs] + ["initial_state"])
        heads = "".join(f"{h}.contiguous(), " for h in t.heads)
        lines += [
            f"if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ({tensors}))):",
            "    # No autograd: the recurrent kernel applies the transforms where it loads its inputs.",
            f"    positions, rope_dims = {t.op}_transform_args(call, {offsets}, cu_seqlens, {key}.device)",
            f"    plan = select_plan(RECURRENT_PLANS, {key}.device, call.dtype, max(call.K, call.V))",
            f"    o, final_state, _ = fused_recurrent_fwd({', '.join(launch_values)}, {_kernel_scale(lowered)},",
            "                                            initial_state, output_final_state, cu_seqlens, plan,",
            f"                                            transform_args=({heads}positions, *rope_dims))",
            "    return o, final_state",
        ]
        imports += [f"{t.op}_transform_args", "_rope_coefs"]
    lines.append(f"{targets} = {t.op}_transforms({args}, call=call{rope}, cu_seqlens=cu_seqlens)")
    return "\n".join("    " + ln for ln in lines), ", ".join(sorted(imports))


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
    plans_ctx = dict(common)
    plans_ctx["tables"] = [
        {"name": "CHUNK_PLANS", "doc": f"{chunk_algo.name}: the chunked kernels",
         **_plan_rows(plan_table(lowered.features, chunk_algo))},
        {"name": "RECURRENT_PLANS", "doc": f"{recurrent_algo.name}: the decode kernels",
         **_plan_rows(plan_table(lowered.features, recurrent_algo))},
    ]
    if chunk_algo.bounded_chunk_size:
        plans_ctx["tables"].append(
            {"name": "BOUNDED_CHUNK_PLANS", "doc": f"{chunk_algo.name} for calls with gate_lower_bound (tensor-core "
             f"pairwise decays; used when the bound is at least the plan's gate_bound)",
             **_plan_rows(plan_table(lowered.features, chunk_algo, bounded=True))})
    pkg = rec.spec.package
    transforms = plan_transforms(rec)
    extra = () if transforms is None else (
        GeneratedFile(f"{pkg}/transforms.py", _transforms_module(rec, transforms, common)),)
    return extra + (
        GeneratedFile(f"{pkg}/__init__.py", env.get_template("package/__init__.py.jinja").render(common)),
        GeneratedFile(f"{pkg}/chunk.py", _op_module(lowered, chunk_algo, common, chunked=True)),
        GeneratedFile(f"{pkg}/fused_recurrent.py", _op_module(lowered, recurrent_algo, common, chunked=False)),
        GeneratedFile(f"{pkg}/plans.py", env.get_template("package/plans.py.jinja").render(plans_ctx)),
        GeneratedFile(f"{pkg}/reference.py", env.get_template("package/reference.py.jinja").render(ref_ctx)),
    )
