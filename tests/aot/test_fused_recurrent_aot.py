"""The fused recurrent template's new feature combinations compile ahead of time for sm80 and sm90 (no GPU
needed: a subprocess without TRITON_INTERPRET runs fla_gen.aot on launches of the rendered kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fla_gen.emit import TEMPLATES_DIR, _environment
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from tests.support import KERNEL_MODULE_HEADER, REPO_ROOT

COMBOS = {
    "kda": KernelFeatures(TokenDecay.CHANNEL, False, RankOne.DELTA),
    "dplr_scalar_head": KernelFeatures(TokenDecay.SCALAR, True, RankOne.GENERAL),
    "delta_grouped": KernelFeatures(TokenDecay.SCALAR, True, RankOne.DELTA, grouped=True),
    "dplr_grouped": KernelFeatures(TokenDecay.CHANNEL, False, RankOne.GENERAL, grouped=True),
}

CALL = """
import importlib

import torch
from fla_gen.runtime.plan_types import LaunchConfig, Plan

# the planner's recurrent configs for head dim 128 (whole K; BV 64 forward, 32 backward)
PLAN = Plan("aot", "bf16", 128, 64, "aot", (
    ("recurrent_fwd", LaunchConfig(128, 64, 4, 1)), ("recurrent_bwd", LaunchConfig(128, 32, 4, 1))))
COMBOS = {combos!r}


def launches():
    B, T, H, K, V = 1, 192, 2, 128, 128
    for name, (args, channel) in COMBOS.items():
        mod = importlib.import_module(f"fr_aot_{{name}}")
        HV = 2 * H if "grouped" in name else H
        x = {{"q": torch.randn(B, T, H, K, dtype=torch.bfloat16), "k": torch.randn(B, T, H, K, dtype=torch.bfloat16),
             "v": torch.randn(B, T, HV, V, dtype=torch.bfloat16)}}
        shapes = {{"g": (B, T, HV, K) if channel else (B, T, HV), "g_gamma": (HV,), "beta": (B, T, HV),
                   "a": (B, T, H, K), "b": (B, T, H, K)}}
        for n in args[3:]:
            x[n] = torch.randn(*shapes[n], dtype=torch.float32 if n.startswith("g") else torch.bfloat16)
        h0, dht = torch.zeros(3, HV, K, V), torch.zeros(3, HV, K, V)
        cu = torch.tensor([0, 64, 100, 192], dtype=torch.int32)
        o, ht, saved = mod.fused_recurrent_fwd(*x.values(), 1.0, h0, True, cu, PLAN)
        mod.fused_recurrent_bwd(*x.values(), saved, 1.0, h0, torch.randn_like(x["v"]), dht, cu, PLAN)
"""


def test_new_combinations_compile_ahead_of_time(tmp_path: Path) -> None:
    env_j = _environment(str(TEMPLATES_DIR), trim=False)
    for name, f in COMBOS.items():
        source = env_j.get_template("kernels/fused_recurrent.jinja").render(op=f"fr_aot_{name}", features=f,
                                                                           inline=None)
        (tmp_path / f"fr_aot_{name}.py").write_text(KERNEL_MODULE_HEADER + source)
    combos = {n: (f.kernel_args, f.channel_decay) for n, f in COMBOS.items()}
    (tmp_path / "fr_aot_call.py").write_text(textwrap.dedent(CALL.format(combos=combos)))
    out = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "fla_gen.aot", "--call", "fr_aot_call:launches", "--caps", "80,90",
         "--json", str(out), "--jobs", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200,
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), console
    reports = json.loads(out.read_text())["reports"]
    kernels = {(r["kernel"], r["cap"]) for r in reports}
    assert kernels == {(f"fr_aot_{n}_recurrent_{s}_kernel", c) for n in COMBOS for s in ("fwd", "bwd")
                       for c in (80, 90)}, console
    for r in reports:
        assert r["error"] is None and not r["problems"], r
        # the decode kernels keep their [128, BV] fp32 state blocks in registers
        if "_fwd_" in r["kernel"]:
            assert r["spill_stores"] in (0, None) and r["spill_loads"] in (0, None), console
