"""Stage 5: Recurrence + plans → the files of ``generated/<op>/``, rendered from ``templates/``.

The emitter decides nothing about performance (the planner did); it gathers names and
strings for the templates and renders them. Output is deterministic: the same spec and
compiler give byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from fla_gen import __version__
from fla_gen.canonical import Recurrence
from fla_gen.ir import Apply, Lit, Node, Ref
from fla_gen.plan import Algorithm, bind_kernel_inputs, plan_table, select_algorithms
from fla_gen.reference import derive_reference

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
    return env


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
    rows = sorted({n.pos.line for n in (*rec.spec.updates, rec.spec.output)})
    return [src[r - 1].split("#")[0].strip() for r in rows]


def _arg_role(rec: Recurrence, name: str) -> str:
    """What an input is to the recurrence, for code that builds the inputs (fla_gen.layers): query,
    key, value, gate (a log-space decay) or other (e.g. the delta rule's beta)."""
    roles = {rec.query.input: "query", rec.write[0].input: "key", rec.write[1].input: "value"}
    roles.update({t.input: "gate" for t in rec.decay})
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
    doc = f"{shape} {roles.get(name, 'input')}"
    if rec.spec.input(name).optional:
        doc += "; optional, None means zeros"
    return doc


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
            "gate": any(t.input == i.name for t in rec.decay),
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
    })
    return _environment(str(TEMPLATES_DIR)).get_template("package/op_module.py.jinja").render(ctx)


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
    })
    plans_ctx = dict(common)
    plans_ctx["tables"] = [
        {"name": "CHUNK_PLANS", "doc": f"{chunk_algo.name}: the chunked kernels", "plans": plan_table(rec, chunk_algo)},
        {"name": "RECURRENT_PLANS", "doc": f"{recurrent_algo.name}: the decode kernels",
         "plans": plan_table(rec, recurrent_algo)},
    ]
    op = rec.spec.op
    return (
        GeneratedFile(f"{op}/__init__.py", env.get_template("package/__init__.py.jinja").render(common)),
        GeneratedFile(f"{op}/chunk.py", _op_module(rec, chunk_algo, common, chunked=True)),
        GeneratedFile(f"{op}/fused_recurrent.py", _op_module(rec, recurrent_algo, common, chunked=False)),
        GeneratedFile(f"{op}/plans.py", env.get_template("package/plans.py.jinja").render(plans_ctx)),
        GeneratedFile(f"{op}/reference.py", env.get_template("package/reference.py.jinja").render(ref_ctx)),
    )
