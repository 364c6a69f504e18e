#!/usr/bin/env python3
"""Session 9: the SASS instructions in the main loop of the fused walk (fwd_fused), with and without a gate,
compiled for sm90 on this machine (no GPU needed): Triton's build of the kernel that the public op launches with
the given config (fla_gen.aot), dumped with Triton's bundled cuobjdump. The loop is the span of the longest
backward branch.

    python benchmarks/experiments/s9_fused_forward/sass_loop_count.py
"""

from __future__ import annotations

import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from fla_gen import aot  # noqa: E402
from fla_gen.runtime.dispatch import forced_arch, overridden_plans  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402
from tests.support import recurrence  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
CASES = [("linear_attn", (32, 4, 3)), ("simple_gla", (32, 4, 3)), ("linear_attn", (64, 4, 3)),
         ("simple_gla", (64, 4, 3))]
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)")


def fused_walk_sass(op: str, block_v: int, warps: int, stages: int, head_dim: int = 128) -> str:
    """The sm90 SASS of op's fwd_fused at [head_dim, block_v], as the public op launches it."""
    pkg = importlib.import_module(f"generated.{op}")
    x = sample_inputs(recurrence(op), 2, 128, 2, head_dim, head_dim, torch.bfloat16, seed=0)
    override = {"fwd_fused": {"block_v": block_v, "num_warps": warps, "num_stages": stages}}
    with forced_arch("sm90"), overridden_plans(override):
        launches = aot.capture_launches(lambda: getattr(pkg, f"chunk_{op}")(*x.values()))
    launch = next(item for item in launches if "fused" in item.kernel.fn.__name__)
    compiled, _ = aot.compile_specialization(launch.kernel, aot.specialize(launch, 90), 90)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([CUOBJDUMP, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout


def loop_opcodes(sass: str) -> collections.Counter:
    """Opcode counts (without modifiers) inside the span of the longest backward branch."""
    instructions = [(int(m.group(1), 16), m.group(2), m.group(3))
                    for m in map(INSTRUCTION.match, sass.splitlines()) if m]
    spans = []
    for address, opcode, operands in instructions:
        target = re.search(r"0x([0-9a-f]+)", operands)
        if opcode.startswith("BRA") and target and int(target.group(1), 16) < address:
            spans.append((int(target.group(1), 16), address))
    start, end = max(spans, key=lambda span: span[1] - span[0])
    return collections.Counter(opcode.split(".")[0] for address, opcode, _ in instructions if start <= address <= end)


def main() -> int:
    for op, config in CASES:
        counts = loop_opcodes(fused_walk_sass(op, *config))
        print(f"{op} {list(config)}: {sum(counts.values())} instructions in the loop")
        print("   ", " ".join(f"{name}:{n}" for name, n in counts.most_common(30)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
