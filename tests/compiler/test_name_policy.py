"""The name policy: spec names that would collide with the generated code are refused at their line; the
policy's lists cover every name the generated functions read or bind (checked on the shipped packages)."""

import ast
import builtins

import pytest

from fla_gen.check import GENERATED_NAMES, USED_BUILTINS, check_spec
from fla_gen.errors import SpecError
from fla_gen.parse import parse_spec
from tests.support import REPO_ROOT, SPECS, recurrence

SPEC = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
update S = S + outer(k, v)
output o = S^T @ q
"""


def spec_names(op: str) -> set[str]:
    spec = recurrence(op).spec
    inputs = (*spec.inputs, *spec.guarded_inputs)
    return ({i.name for i in inputs} | {p.name for p in spec.params} | {f.name for f in spec.flags}
            | {o.name for o in spec.options} | {spec.state_name, spec.key_dim, spec.value_dim}
            | {f"{i.name}_t" for i in inputs})


def function_names(tree: ast.Module, function: str) -> set[str]:
    """Every name read or bound inside ``function`` (arguments, locals, globals and builtins it reads)."""
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    names = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
    own_scope = set()  # names bound by comprehensions live in the comprehension's own scope
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.comprehension):
            own_scope |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return names - own_scope


def refused_as_input(op: str, name: str) -> bool:
    text = SPEC.replace("op t", f"op {op}\npackage p").replace(
        "input q: [B, T, H, K]", f"input q: [B, T, H, K]\ninput {name}: [B, T, H]").replace(
        "S = S +", f"S = exp({name}) * S +")
    try:
        check_spec(parse_spec(text, "t.fla"))
    except SpecError as e:
        return e.pos.line == 4 and "never used" not in e.message
    return False


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_the_policy_covers_every_generated_name(path):
    """A name that a generated public function, reference or transform reads or binds, that is not the spec's
    own, must be refused as a spec name: else a spec could shadow it."""
    op = recurrence(path.stem).spec.op
    package = REPO_ROOT / "generated" / recurrence(path.stem).spec.package
    functions = {"chunk.py": f"chunk_{op}", "fused_recurrent.py": f"fused_recurrent_{op}",
                 "reference.py": f"{op}_reference", "transforms.py": f"{op}_transforms"}
    own = spec_names(path.stem)
    for module, function in functions.items():
        if not (package / module).exists():
            continue
        names = function_names(ast.parse((package / module).read_text()), function) - own
        uncovered = {n for n in names if not refused_as_input(op, n)}
        assert not uncovered, f"{module}:{function} uses {sorted(uncovered)}, which a spec could name"
        # and the builtins they call are in the policy
        assert {n for n in names if hasattr(builtins, n)} <= USED_BUILTINS | {"None", "True", "False"}


@pytest.mark.parametrize("kind, source", [
    ("input", SPEC.replace("input q: [B, T, H, K]", "input q: [B, T, H, K]\ninput {name}: [B, T, H]")),
    ("param", SPEC.replace("input q: [B, T, H, K]", "input q: [B, T, H, K]\nparam {name} = 1")),
    ("state", SPEC.replace("S", "{name}")),
    ("head dim", SPEC.replace("K", "{name}")),
])
@pytest.mark.parametrize("name", sorted(GENERATED_NAMES - {"B", "T", "H", "N"}) + ["class", "lambda", "match",
                                                                                   "__init__", "_private", "len"])
def test_a_reserved_name_is_refused_at_its_line(kind, source, name):
    text = source.replace("{name}", name)
    with pytest.raises(SpecError) as info:
        check_spec(parse_spec(text, "t.fla"))
    marker = "state " if kind == "head dim" else "{name}"  # head dims are checked on the state's line first
    line = next(i for i, ln in enumerate(source.splitlines(), 1) if marker in ln)
    err = info.value
    assert err.pos.line == line, err.render()
    assert any(w in err.message for w in ("keyword", "generated code uses", "Python builtin", "starts with '_'",
                                           "layout dim")), err.render()


@pytest.mark.parametrize("name", ["print", "input", "format", "o2", "Class", "decay_t", "q_", "lambda_", "K2"])
def test_an_unusual_but_allowed_name_checks(name):
    text = SPEC.replace("input q: [B, T, H, K]", f"input q: [B, T, H, K]\ninput {name}: [B, T, H]").replace(
        "S = S +", f"S = exp({name}) * S +")
    check_spec(parse_spec(text, "t.fla"))
