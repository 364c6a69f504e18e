"""Stage 1: spec text → syntax tree (``grammars/fla.lark``, LALR), with positioned errors."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token

from fla_gen import syntax as S
from fla_gen.errors import Pos, SpecError, SpecErrorFactory, UsageError
from fla_gen.resources import data_dir

GRAMMAR_PATH = data_dir("grammars") / "fla.lark"

# How the grammar's terminal names read to a user in "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_NL": "end of line",
    "$END": "end of file",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COLON": "':'",
    "COMMA": "','",
    "EQUAL": "'='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "AT": "'@'",
    "POW": "'**'",
    "TRANSPOSE": "'^T'",
    "OP": "'op'",
    "INPUT": "'input'",
    "STATE": "'state'",
    "PARAM": "'param'",
    "UPDATE": "'update'",
    "OUTPUT": "'output'",
    "TRANSFORM": "'transform'",
}


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
        # Building the LALR tables takes ~0.3 s, most of the time to an error; lark keeps them in a file in the
        # temp dir keyed by the grammar's hash and carries on without it if that file cannot be written.
        cache=True,
    )


def _pos(meta_or_token) -> Pos:
    return Pos(getattr(meta_or_token, "line", 1) or 1, getattr(meta_or_token, "column", 1) or 1)


# Input limits. A spec is a dozen short lines; these bounds are orders of magnitude above any real one
# and keep every later stage (recursive over expressions) far from Python's recursion limit and from
# work that grows faster than the input.
MAX_SPEC_BYTES = 64 * 1024  # the largest shipped spec is under 1 KB; lark parses ~50 KB/s on two idle cores
MAX_EXPR_DEPTH = 64  # nested operations in one expression (a sum of n terms nests n - 1 deep)
MAX_EXPR_NODES = 512  # names, numbers, operators and calls in one statement's expression
MAX_STATEMENTS = 256

_EXPR_RULES = frozenset({"number", "name", "call", "kwarg", "add", "sub", "mul", "div", "matmul", "pow", "neg",
                         "transpose"})


def _binary(op: str):
    def build(meta, items):
        return S.BinOp(op, items[0], items[2], _pos(items[1]))

    return build


def _number(meta, items) -> S.Num:
    return S.Num(float(items[0]), _pos(items[0]))


def _call(meta, items) -> S.Call:
    func, rest = items[0], [a for a in items[1:] if a is not None]
    args = tuple(a for a in rest if not isinstance(a, S.Kwarg))
    kwargs = tuple(a for a in rest if isinstance(a, S.Kwarg))
    first_kw = next((i for i, a in enumerate(rest) if isinstance(a, S.Kwarg)), len(rest))
    late = next((a.pos for a in rest[first_kw:] if not isinstance(a, S.Kwarg)), None)
    return S.Call(str(func), args, _pos(func), kwargs, late)


def _input_decl(meta, items) -> S.InputDecl:
    items = list(items)
    name, (dims, dim_pos) = items[0], items[1]
    guard = items.pop() if isinstance(items[-1], Token) and len(items) > 2 else None
    default = items[2] if len(items) > 2 else None
    return S.InputDecl(str(name), dims, dim_pos, default, _pos(meta), None if guard is None else str(guard),
                       None if guard is None else _pos(guard))


def _transform_decl(meta, items) -> S.Transform:
    items = list(items)
    # a trailing guard arrives as the NAME token that the `guard` rule returns, after the expression
    guard = items.pop() if len(items) > 2 and isinstance(items[-1], Token) and not isinstance(items[-2], Token) \
        else None
    names = items[:-1]
    return S.Transform(tuple(str(n) for n in names), tuple(_pos(n) for n in names), items[-1], _pos(meta),
                       None if guard is None else str(guard), None if guard is None else _pos(guard))


def _flag_decl(meta, items) -> S.FlagDecl:
    name, type_name, value, *requires = items
    other = requires[0] if requires else None
    return S.FlagDecl(str(name), str(type_name), str(value), _pos(meta), _pos(type_name), _pos(value),
                      None if other is None else str(other), None if other is None else _pos(other))


def _option_decl(meta, items) -> S.OptionDecl:
    name, value = items
    if isinstance(value, Token):
        return S.OptionDecl(str(name), str(value), _pos(meta), _pos(value))
    return S.OptionDecl(str(name), value, _pos(meta), _pos(name))


# Lark rule name -> builder of the fla_gen.syntax value from the node's meta and converted children.
_BUILDERS = {
    "start": lambda meta, items: tuple(items),
    "op_decl": lambda meta, items: S.OpDecl(str(items[0]), _pos(meta)),
    "package_decl": lambda meta, items: S.PackageDecl(str(items[0]), _pos(meta)),
    "shape": lambda meta, items: (tuple(str(t) for t in items), tuple(_pos(t) for t in items)),
    "default": lambda meta, items: items[0],
    "signed_number": lambda meta, items: float(items[0]),
    "negative_number": lambda meta, items: -float(items[0]),
    "input_decl": _input_decl,
    "state_decl": lambda meta, items: S.StateDecl(str(items[0]), *items[1], _pos(meta)),
    "param_decl": lambda meta, items: S.ParamDecl(str(items[0]), items[1], _pos(meta)),
    "update": lambda meta, items: S.Update(str(items[0]), items[1], _pos(meta)),
    "output": lambda meta, items: S.Output(str(items[0]), items[1], _pos(meta)),
    "transform_decl": _transform_decl,
    "flag_decl": _flag_decl,
    "requires": lambda meta, items: items[0],
    "option_decl": _option_decl,
    "guard": lambda meta, items: items[0],
    "kwarg": lambda meta, items: S.Kwarg(str(items[0]), items[1], _pos(items[0])),
    "number": _number,
    "name": lambda meta, items: S.Name(str(items[0]), _pos(items[0])),
    "call": _call,
    "add": _binary("+"),
    "sub": _binary("-"),
    "mul": _binary("*"),
    "div": _binary("/"),
    "matmul": _binary("@"),
    "pow": _binary("**"),
    "neg": lambda meta, items: S.Neg(items[0], _pos(meta)),
    "transpose": lambda meta, items: S.Transpose(items[0], _pos(items[1])),
}


def _to_syntax(tree: lark.Tree, path: str, source: str) -> tuple[S.Statement, ...]:
    """Lark's tree -> the frozen dataclasses of ``fla_gen.syntax``, with an explicit stack (a left-associated
    sum of thousands of terms is a tree thousands deep), enforcing the expression limits on the way.

    Each converted node carries (depth, size) of its expression; statements reset both."""
    err = SpecErrorFactory(path, source)
    values: list = []
    sizes: list[tuple[int, int]] = []
    stack: list[tuple[object, bool]] = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if not isinstance(node, lark.Tree):
            values.append(node)
            sizes.append((0, 0))
            continue
        if not expanded:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children))
            continue
        n = len(node.children)
        items = values[len(values) - n:] if n else []
        kids = sizes[len(sizes) - n:] if n else []
        if n:
            del values[-n:], sizes[-n:]
        value = _BUILDERS[node.data](node.meta, items)
        if node.data in _EXPR_RULES:
            depth = 1 + max((d for d, _ in kids), default=0)
            size = 1 + sum(c for _, c in kids)
            if depth > MAX_EXPR_DEPTH:
                raise err(value.pos,
                          f"expression nested more than {MAX_EXPR_DEPTH} operations deep",
                          "split it over several lines (e.g. several 'update' lines) or use parentheses")
            if size > MAX_EXPR_NODES:
                raise err(value.pos, f"expression longer than {MAX_EXPR_NODES} names, numbers and operators")
            if node.data == "number" and not math.isfinite(value.value):
                raise err(value.pos, f"number {items[0]} is out of range (it overflows a float)")
            sizes.append((depth, size))
        else:
            sizes.append((0, 0))
        values.append(value)
    (statements,) = values
    if len(statements) > MAX_STATEMENTS:
        raise err(statements[MAX_STATEMENTS].pos, f"more than {MAX_STATEMENTS} statements in one spec")
    return statements


def _expected_words(expected: set[str] | frozenset[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, t.lower()) for t in expected})
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "_NL":
        return "end of line"
    return f"{token.value!r}"


def parse_spec(source: str, path: str = "<spec>") -> S.SpecAST:
    """Parse spec text into a syntax tree.

    A leading UTF-8 byte-order mark is dropped (editors on Windows write one).

    Raises:
        SpecError: with ``path:line:col``, the offending line, a caret and what was expected; also for a
            spec over the input limits (MAX_SPEC_BYTES, MAX_EXPR_DEPTH, MAX_EXPR_NODES, MAX_STATEMENTS).
    """
    source = source.removeprefix("\ufeff")
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(path, "", Pos(1, 1), f"spec is {size} bytes, over the limit of {MAX_SPEC_BYTES} bytes")
    source_for_parser = source if source.endswith("\n") else source + "\n"
    try:
        tree = _parser().parse(source_for_parser)
    except lark.exceptions.UnexpectedCharacters as e:
        bad = source_for_parser[e.pos_in_stream] if e.pos_in_stream < len(source_for_parser) else "?"
        raise SpecError(
            path, source, Pos(e.line, e.column), f"unexpected character {bad!r}",
            f"expected {_expected_words(e.allowed)}" if e.allowed else "",
        ) from None
    except lark.exceptions.UnexpectedToken as e:
        token = e.token
        line, col = token.line or 1, token.column or 1
        if token.type == "$END":
            lines = source.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
        elif token.type == "_NL":
            # Lark places a newline token at the line break; point just past the line's text.
            prev = source_for_parser[: token.start_pos].splitlines() or [""]
            line, col = len(prev), len(prev[-1].rstrip("\r")) + 1
        raise SpecError(
            path, source, Pos(line, col), f"unexpected {_describe_token(token)}",
            f"expected {_expected_words(e.expected)}",
        ) from None
    except lark.exceptions.UnexpectedEOF as e:
        lines = source.splitlines() or [""]
        raise SpecError(
            path, source, Pos(len(lines), len(lines[-1]) + 1), "unexpected end of file",
            f"expected {_expected_words(e.expected)}",
        ) from None
    return S.SpecAST(path, source, _to_syntax(tree, path, source))


def read_spec(path: str | Path, display: str | None = None) -> S.SpecAST:
    """Read and parse a spec file (the only stage besides the writer that touches files).

    ``display`` is the name used in diagnostics and generated headers (default: ``path``).

    Raises:
        UsageError: the file is missing, a directory or unreadable (a mistake on the command line).
        SpecError: the file is too large, not UTF-8, or a malformed spec.
    """
    name = display or Path(path).as_posix()
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{name}: is a directory, not a spec file")
        if p.exists() and not p.is_file():
            raise UsageError(f"{name}: is not a regular file")
        with p.open("rb") as f:  # at most one byte past the limit: a spec is a dozen lines
            data = f.read(MAX_SPEC_BYTES + 1)
            if len(data) > MAX_SPEC_BYTES:
                size = max(p.stat().st_size, len(data))
                raise SpecError(name, "", Pos(1, 1), f"spec is {size} bytes, over the limit of {MAX_SPEC_BYTES} bytes")
    except FileNotFoundError:
        raise UsageError(f"{name}: no such spec file") from None
    except OSError as e:
        raise UsageError(f"{name}: cannot read the spec ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        shown = data.decode("utf-8", "replace")
        raise SpecError(name, shown, Pos(line, col), f"spec is not UTF-8 text ({e.reason})") from None
    return parse_spec(text, name)
