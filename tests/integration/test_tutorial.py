"""docs/tutorial.md runs: its ```bash and ```python blocks, in order, in a fresh directory.

The blocks become one Python script (bash blocks through subprocess, python blocks inline, so later
blocks see earlier variables) run in a subprocess with the repository importable and the kernels in
Triton's interpreter. A block that fails fails the test with the tutorial's own output.
"""

import os
import re
import subprocess
import sys

from tests.support import REPO_ROOT

TUTORIAL = REPO_ROOT / "docs" / "tutorial.md"
_BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def tutorial_script(text: str) -> str:
    """The tutorial's runnable blocks as one Python script."""
    lines = ["import subprocess"]
    for kind, body in _BLOCK.findall(text):
        if kind == "bash":
            lines.append(f"subprocess.run({body!r}, shell=True, check=True, executable='/bin/bash')")
        else:
            lines.append(body)
    return "\n".join(lines) + "\n"


def test_tutorial_blocks_are_found():
    kinds = [kind for kind, _ in _BLOCK.findall(TUTORIAL.read_text())]
    assert kinds.count("bash") >= 3 and kinds.count("python") >= 3, kinds


def test_tutorial_runs(tmp_path):
    script = tmp_path / "tutorial.py"
    script.write_text(tutorial_script(TUTORIAL.read_text()))
    path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "graph breaks: 0" in proc.stdout
    assert (tmp_path / "build" / "retention" / "chunk.py").is_file()
    assert not (REPO_ROOT / "generated" / "retention").exists()
