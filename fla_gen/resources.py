"""Where the grammar and the templates are: inside the installed package (``fla_gen/_data/``, put there by
setup.py when a wheel is built) or, in a source checkout, at the top of the repository."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# A source checkout: grammars/ and templates/ next to fla_gen/ (also an editable install).
SOURCE_ROOT = _PACKAGE.parent


def data_dir(name: str) -> Path:
    """The directory ``grammars`` or ``templates``: the installed copy if there is one, else the checkout's."""
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else SOURCE_ROOT / name


def source_checkout() -> Path | None:
    """The repository this fla_gen runs from (with specs/ and generated/), or None for an installed copy."""
    root = SOURCE_ROOT
    return root if (root / "specs").is_dir() and (root / "pyproject.toml").is_file() else None
