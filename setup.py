"""Packaging beyond pyproject.toml: the grammar and the templates ship inside the fla_gen package.

The repository keeps them at its top (grammars/, templates/); a wheel installs them as package data under
fla_gen/_data/, where fla_gen.resources looks first. Mapping them as data-only packages (package_dir) keeps
one copy in the repository and needs no build step.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
DATA = {"grammars": "*.lark", "templates": "*.jinja"}

data_packages = {}
for top, pattern in DATA.items():
    for directory in [ROOT / top, *sorted(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
        if any(directory.glob(pattern)):
            rel = directory.relative_to(ROOT)
            data_packages[".".join(("fla_gen", "_data", *rel.parts))] = (rel.as_posix(), pattern)

setup(
    packages=find_packages(include=["fla_gen*", "generated*"]) + list(data_packages),
    package_dir={name: path for name, (path, _) in data_packages.items()},
    package_data={"fla_gen": ["py.typed"], **{name: [pattern] for name, (_, pattern) in data_packages.items()}},
)
