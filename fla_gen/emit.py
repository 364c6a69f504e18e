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
from fla_gen.ir import Apply, Lit, Node, Ref
from fla_gen.plan import Algorithm, bind_kernel_inputs, gate_bound_for_chunk, plan_table, select_algorithms
from fla_gen.reference import derive_reference
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


def _arg_role(rec: Recurrence, name: str) -> str:
    """What an input is to the recurrence, for code that builds the inputs (fla_gen.layers): query,
    key, value, gate (a log-space decay), rank1_read / rank1_write (a and b of a general rank-1 term
    b (a^T S)) or other (e.g. the delta rule's beta)."""
    roles = {rec.query.input: "query", rec.write[0].input: "key", rec.write[1].input: "value"}
    roles.update({t.input: "gate" for t in rec.decay})
    if rec.family == "general_rank1":
        roles.update({rec.low_rank.w.input: "rank1_read", rec.low_rank.u.input: "rank1_write"})
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


def _common_context(rec: Recurrence) -> dict:
    spec = rec.spec
    args = []
    for i in spec.inputs:
        layout = ("BTH" if i.per_token else "H") + {spec.key_dim: "K", spec.value_dim: "V", None: ""}[i.vec_dim]
        dim_names = {"K": spec.key_dim, "V": spec.value_dim}
        args.append({
            "name": i.name,
            "layout": layout,
            "optional": i.optional,
            # Gates, and per-head parameters of transforms (A_log, dt_bias), may stay float32 with 16-bit inputs.
            "gate": any(t.input == i.name for t in rec.decay) or (not i.per_token and any(
                t.expr is not None and _reads(t.expr, i.name) for t in spec.transforms)),
            "doc": _arg_doc(rec, i.name, layout),
            "role": _arg_role(rec, i.name),
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
        "key_input": rec.query.input,
        "value_input": rec.write[1].input,
        "state": spec.state_name,
        "family": rec.family,
    }


def _kernel_bindings(rec: Recurrence) -> tuple[list[str], list[str], list[bool]]:
    """The launcher's positional tensors (fixed names), the public expressions passed for them, and
    which of them may be None."""
    bound = bind_kernel_inputs(rec)
    optional = {i.name for i in rec.spec.inputs if i.optional}
    exprs = [f"None if {x} is None else {x}.contiguous()" if x in optional else f"{x}.contiguous()"
             for x in bound.inputs]
    return list(bound.names), exprs, [x in optional for x in bound.inputs]


def _kernel_scale(rec: Recurrence) -> str:
    if not rec.query.coef:
        return "1.0"
    return " * ".join(f"float({render_scalar(c, 'call.')})" for c in rec.query.coef)


def _op_module(rec: Recurrence, algo: Algorithm, common: dict, chunked: bool) -> str:
    op = rec.spec.op
    public = f"chunk_{op}" if chunked else f"fused_recurrent_{op}"
    launch_args, launch_values, launch_optional = _kernel_bindings(rec)
    transforms = plan_transforms(rec)
    inline = None
    if not chunked:  # the fused recurrent forwards load whole K rows per token: they can inline
        inline = inline_transforms(transforms, bind_kernel_inputs(rec))
    transform_block, transform_imports = _transform_block(rec, transforms, inline, launch_values)
    ctx = dict(common)
    ctx.update({
        "public_name": public,
        "mode_doc": ("the chunked algorithm, for training and prefill." if chunked
                     else "the token-by-token kernel, for decoding."),
        "algorithm": algo.name,
        "kernel_names": [f"{op}_{k.stage}_kernel" for k in algo.kernels],
        "kernel_template_path": algo.template,
        "kernels_source": _environment(str(TEMPLATES_DIR), trim=False).get_template(algo.template).render(
            op=op, token_gate=rec.token_gate.kind if rec.token_gate else None, head_gate=rec.head_gate is not None,
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
        "kernel_scale": _kernel_scale(rec),
        "params": [
            {"name": p.name, "default_code": render_scalar(p.default, "call."),
             "default_doc": render_scalar(p.default)}
            for p in rec.spec.params
        ],
        "token_gate": rec.token_gate.kind if rec.token_gate else None,
        "head_gate": rec.head_gate is not None,
        # the gate input whose lower bound selects BOUNDED_CHUNK_PLANS, or None
        "bounded_gate": rec.token_gate.input if chunked and algo.bounded_chunk_size and rec.token_gate else None,
        "bounded_chunk": algo.bounded_chunk_size,
        "bounded_limit": f"{gate_bound_for_chunk(algo.bounded_chunk_size):.2f}" if algo.bounded_chunk_size else "",
        "transform_block": transform_block,
        "transform_imports": transform_imports,
        "has_rope": any(t.kind == "rope" for t in rec.spec.transforms),
    })
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


def _transform_block(rec: Recurrence, t: TransformKernel | None, inline: InlineTransforms | None,
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
        key = rec.query.input
        tensors = ", ".join([i.name for i in rec.spec.inputs] + ["initial_state"])
        heads = "".join(f"{h}.contiguous(), " for h in t.heads)
        lines += [
            f"if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ({tensors}))):",
            "    # No autograd: the recurrent kernel applies the transforms where it loads its inputs.",
            f"    positions, rope_dims = {t.op}_transform_args(call, {offsets}, cu_seqlens, {key}.device)",
            f"    plan = select_plan(RECURRENT_PLANS, {key}.device, call.dtype, max(call.K, call.V))",
            f"    o, final_state, _ = fused_recurrent_fwd({', '.join(launch_values)}, {_kernel_scale(rec)},",
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
    common = _common_context(rec)
    chunk_algo, recurrent_algo = select_algorithms(rec)
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
         **_plan_rows(plan_table(rec, chunk_algo))},
        {"name": "RECURRENT_PLANS", "doc": f"{recurrent_algo.name}: the decode kernels",
         **_plan_rows(plan_table(rec, recurrent_algo))},
    ]
    if chunk_algo.bounded_chunk_size:
        plans_ctx["tables"].append(
            {"name": "BOUNDED_CHUNK_PLANS", "doc": f"{chunk_algo.name} for calls with gate_lower_bound >= the plan's "
             f"gate_bound (tensor-core pairwise decays)",
             **_plan_rows(plan_table(rec, chunk_algo, bounded=True))})
    pkg = rec.spec.package
    transforms = plan_transforms(rec)
    extra = () if transforms is None else (
        GeneratedFile(f"{pkg}/transforms.py", _transforms_module(rec, transforms, common)),)
    return extra + (
        GeneratedFile(f"{pkg}/__init__.py", env.get_template("package/__init__.py.jinja").render(common)),
        GeneratedFile(f"{pkg}/chunk.py", _op_module(rec, chunk_algo, common, chunked=True)),
        GeneratedFile(f"{pkg}/fused_recurrent.py", _op_module(rec, recurrent_algo, common, chunked=False)),
        GeneratedFile(f"{pkg}/plans.py", env.get_template("package/plans.py.jinja").render(plans_ctx)),
        GeneratedFile(f"{pkg}/reference.py", env.get_template("package/reference.py.jinja").render(ref_ctx)),
    )
