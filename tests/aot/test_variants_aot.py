"""A few variants of the corpus (tests/variants/*.fla), compiled ahead of time for sm80, sm89, sm90 and sm100.

Each runs in a subprocess without TRITON_INTERPRET (real compiles need @triton.jit kernels): the variant is
built into a temporary ``generated/`` package that shadows the repository's, and fla_gen.aot_ops compiles
every kernel that chunk and fused_recurrent launch, forward and backward (dense on all four targets, varlen on
sm89 and sm90), with each target's plan at head dim 128, and dense at head dim 64 where a target's plan table
has a row for it (sm89 has no 128 row for every algorithm: shared memory). A compile error, shared memory
over the arch's limit or an MMA -> MMA layout conversion off Ampere fails the test, naming the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import AWAITING_LOWERING, REPO_ROOT, VARIANTS_DIR

# One of each kind of kernel the lowering composes: a per-channel decay with a delta rank-1 term (KDA), a decay
# that is an expression of three inputs with a scalar write factor (SSD), a general rank-1 term under a
# per-token scalar gate, a derived write key; and two that build without the lowering (per-channel plus
# per-head gate, a general rank-1 term without a gate).
AOT_VARIANTS = ("channel_gated_delta", "ssd", "dplr_scalar_gate", "derived_key", "channel_head_decay", "dplr_no_gate")

_SCRIPT = """
import json, sys
from pathlib import Path
out, spec, repo = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
sys.path[:0] = [str(out), repo]   # out/generated shadows the repository's generated/
from fla_gen.cli import compile_spec
from fla_gen.write import write_files
rec, files = compile_spec(spec)
write_files(files, out / "generated")
import generated
assert Path(generated.__file__).parent == out / "generated", generated.__file__
from fla_gen.aot_ops import compile_op_matrix
rows = []
for e in compile_op_matrix(rec, caps=(80, 89, 90, 100), head_dims=(128, 64)):
    r = e.report
    rows.append({"variant": e.variant, "kernel": r.kernel, "cap": r.cap, "shared_bytes": r.shared_bytes,
                 "spill_stores": r.spill_stores, "problems": list(e.problems)})
(out / "aot.json").write_text(json.dumps(rows))
"""


@pytest.mark.parametrize("variant", [v for v in AOT_VARIANTS if v not in AWAITING_LOWERING])
def test_variant_compiles_for_every_target(tmp_path, variant):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), str(VARIANTS_DIR / f"{variant}.fla"),
                           str(REPO_ROOT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "aot.json").read_text())
    problems = [f"sm{r['cap']} {r['variant']} {r['kernel']}: {'; '.join(r['problems'])}" for r in rows if r["problems"]]
    assert not problems, "\n".join(problems)
    assert {r["cap"] for r in rows} == {80, 89, 90, 100}, variant
    for cap in (80, 89, 90, 100):
        kernels = {r["kernel"] for r in rows if r["cap"] == cap}
        assert any("recurrent_fwd" in k for k in kernels) and any("recurrent_bwd" in k for k in kernels), (cap, kernels)
        assert len(kernels) >= 4, (cap, kernels)  # the chunk ops' forward and backward kernels besides
    assert {r["variant"] for r in rows if r["cap"] == 90} >= {"dense", "varlen", "dense_k64"}
