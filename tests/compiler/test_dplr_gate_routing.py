"""The general rank-1 (DPLR) family with a per-token scalar and/or per-head gate: planned onto the DPLR
kernels, which render their one-gate-per-token path; a per-channel gate with a per-head one is refused."""

from __future__ import annotations

import pytest

from fla_gen.cli import compile_spec, load_recurrence
from fla_gen.lower import SlotSource, lower
from fla_gen.plan import select_algorithms

_SPEC = """op {op}

input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input a: [B, T, H, K]
input b: [B, T, H, K]
{gates}
state S: [K, V]

update S = {decay} * S + outer(b, S^T @ a) + outer(k, v)
output o = S^T @ q
"""


def _write(tmp_path, op: str, gates: str, decay: str):
    path = tmp_path / f"{op}.fla"
    path.write_text(_SPEC.format(op=op, gates=gates, decay=decay))
    return path


@pytest.mark.parametrize(("gates", "decay"), [
    ("input g: [B, T, H]\n", "exp(g)"),
    ("input g_gamma: [H]\n", "exp(g_gamma)"),
    ("input g: [B, T, H]\ninput g_gamma: [H]\n", "exp(g + g_gamma)"),
])
def test_scalar_and_head_gates_plan_onto_the_dplr_kernels(tmp_path, gates, decay):
    path = _write(tmp_path, "dplr_gates", gates, decay)
    chunk, recurrent = select_algorithms(load_recurrence(path))
    assert (chunk.name, recurrent.name) == ("chunk_dplr", "fused_recurrent")
    _, files = compile_spec(path)
    source = next(f.text for f in files if f.path.endswith("/chunk.py"))
    # one gate per token: [BT] rows and [BT, BT] pair decays, no factored / entry-wise choice
    assert "b_Ein = tl.where(m_in" in source and "FACTOR_SPAN" not in source
    bound = " + ".join(n for n in ("g", "g_gamma") if f"input {n}:" in gates)
    assert f"every entry of {bound} is known to be >=" in source


def test_channel_gate_with_head_gate_folds_the_head_gate(tmp_path):
    """The DPLR kernels take no per-head gate beside a per-channel one: the lowering derives one per-channel
    gate g + g_gamma (the generated pass) instead of refusing."""
    path = _write(tmp_path, "dplr_channel_head", "input g: [B, T, H, K]\ninput g_gamma: [H]\n", "exp(g + g_gamma)")
    lowered = lower(load_recurrence(path))
    assert lowered.features.channel_decay and not lowered.features.head_decay
    assert lowered.slot("g").source is SlotSource.DERIVED
    assert select_algorithms(lowered.features)[0].name == "chunk_dplr"
