"""Stage 1: spec text → syntax tree (``grammars/fla.lark``, LALR), with positioned errors."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args

from fla_gen import syntax as S
from fla_gen.errors import Pos, SpecError

GRAMMAR_PATH = Path(__file__).resolve().parent.parent / "grammars" / "fla.lark"

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
    "IF": "'if'",
    "OPTION": "'option'",
    "REQUIRES": "'requires'",
}


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _pos(meta_or_token) -> Pos:
    return Pos(getattr(meta_or_token, "line", 1) or 1, getattr(meta_or_token, "column", 1) or 1)


@v_args(meta=True)
class _ToSyntax(Transformer):
    """Turns Lark's tree into the frozen dataclasses of ``fla_gen.syntax``."""

    def start(self, meta, items):
        return tuple(items)

    def op_decl(self, meta, items):
        return S.OpDecl(str(items[0]), _pos(meta))

    def package_decl(self, meta, items):
        return S.PackageDecl(str(items[0]), _pos(meta))

    def shape(self, meta, items):
        return tuple(str(t) for t in items), tuple(_pos(t) for t in items)

    def default(self, meta, items):
        return items[0]

    def signed_number(self, meta, items):
        return float(items[0])

    def negative_number(self, meta, items):
        return -float(items[0])

    def input_decl(self, meta, items):
        name, (dims, dim_pos) = items[0], items[1]
        guard = items.pop() if isinstance(items[-1], Token) and len(items) > 2 else None
        default = items[2] if len(items) > 2 else None
        return S.InputDecl(str(name), dims, dim_pos, default, _pos(meta), None if guard is None else str(guard),
                           None if guard is None else _pos(guard))

    def state_decl(self, meta, items):
        dims, dim_pos = items[1]
        return S.StateDecl(str(items[0]), dims, dim_pos, _pos(meta))

    def param_decl(self, meta, items):
        return S.ParamDecl(str(items[0]), items[1], _pos(meta))

    def flag_decl(self, meta, items):
        name, type_name, value, *requires = items
        other = requires[0] if requires else None
        return S.FlagDecl(str(name), str(type_name), str(value), _pos(meta), _pos(type_name), _pos(value),
                          None if other is None else str(other), None if other is None else _pos(other))

    def requires(self, meta, items):
        return items[0]

    def option_decl(self, meta, items):
        name, value = items
        if isinstance(value, Token):
            return S.OptionDecl(str(name), str(value), _pos(meta), _pos(value))
        return S.OptionDecl(str(name), value, _pos(meta), _pos(name))

    def guard(self, meta, items):
        return items[0]

    def update(self, meta, items):
        return S.Update(str(items[0]), items[1], _pos(meta))

    def output(self, meta, items):
        return S.Output(str(items[0]), items[1], _pos(meta))

    def transform_decl(self, meta, items):
        # a trailing guard arrives as the NAME token that the `guard` rule returns, after the expression
        guard = items.pop() if len(items) > 2 and isinstance(items[-1], Token) and not isinstance(items[-2], Token) \
            else None
        names = items[:-1]
        return S.Transform(tuple(str(n) for n in names), tuple(_pos(n) for n in names), items[-1], _pos(meta),
                           None if guard is None else str(guard), None if guard is None else _pos(guard))

    def kwarg(self, meta, items):
        return S.Kwarg(str(items[0]), items[1], _pos(items[0]))

    def number(self, meta, items):
        return S.Num(float(items[0]), _pos(items[0]))

    def name(self, meta, items):
        return S.Name(str(items[0]), _pos(items[0]))

    def call(self, meta, items):
        func, rest = items[0], [a for a in items[1:] if a is not None]
        args = tuple(a for a in rest if not isinstance(a, S.Kwarg))
        kwargs = tuple(a for a in rest if isinstance(a, S.Kwarg))
        first_kw = next((i for i, a in enumerate(rest) if isinstance(a, S.Kwarg)), len(rest))
        late = next((a.pos for a in rest[first_kw:] if not isinstance(a, S.Kwarg)), None)
        return S.Call(str(func), args, _pos(func), kwargs, late)

    def _binary(op):  # noqa: N805 - a factory used in the class body
        def build(self, meta, items):
            return S.BinOp(op, items[0], items[2], _pos(items[1]))

        return build

    add = _binary("+")
    sub = _binary("-")
    mul = _binary("*")
    div = _binary("/")
    matmul = _binary("@")
    pow = _binary("**")

    def neg(self, meta, items):
        return S.Neg(items[0], _pos(meta))

    def transpose(self, meta, items):
        return S.Transpose(items[0], _pos(items[1]))


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

    Raises:
        SpecError: with ``path:line:col``, the offending line, a caret and what was expected.
    """
    if not source.endswith("\n"):
        source_for_parser = source + "\n"
    else:
        source_for_parser = source
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
    statements = _ToSyntax().transform(tree)
    return S.SpecAST(path, source, statements)


def read_spec(path: str | Path, display: str | None = None) -> S.SpecAST:
    """Read and parse a spec file (the only stage besides the writer that touches files).

    ``display`` is the name used in diagnostics and generated headers (default: ``path``).
    """
    name = display or Path(path).as_posix()
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as e:
        raise SpecError(name, "", Pos(1, 1), f"spec is not UTF-8 text ({e.reason})") from None
    return parse_spec(text, name)
