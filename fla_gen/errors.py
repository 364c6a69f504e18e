"""Diagnostics for specs: every error names the file, line and column and shows a caret."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pos:
    """A 1-based line and column in a spec file."""

    line: int
    col: int


class SpecError(Exception):
    """A problem in a spec, reported as ``file:line:col: error: message`` with the line and a caret."""

    def __init__(self, path: str, source: str, pos: Pos, message: str, hint: str = "") -> None:
        self.path = path
        self.source = source
        self.pos = pos
        self.message = message
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        """The full diagnostic, several lines, ready to print."""
        lines = self.source.splitlines()
        text = lines[self.pos.line - 1] if 0 < self.pos.line <= len(lines) else ""
        caret = " " * (max(self.pos.col, 1) - 1) + "^"
        out = [
            f"{self.path}:{self.pos.line}:{self.pos.col}: error: {self.message}",
            f"    {text}",
            f"    {caret}",
        ]
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


class SpecErrorFactory:
    """Makes SpecErrors for one spec file, so each stage need not carry path and source around."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.source = source

    def __call__(self, pos: Pos, message: str, hint: str = "") -> SpecError:
        return SpecError(self.path, self.source, pos, message, hint)


class UsageError(Exception):
    """A mistake on the command line rather than in a spec (a missing file, an output path that is a file):
    reported as one line, exit status 3."""
