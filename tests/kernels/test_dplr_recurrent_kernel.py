"""The fused recurrent kernels (templates/kernels/fused_recurrent.jinja) of the DPLR features on their own.

The template is rendered and imported as a module (no spec or package needed), its launchers run in
Triton's interpreter, and o, the final state and every gradient are compared with autograd through a
float64 torch loop of the recurrence

    S_t = diag(exp(g_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,    o_t = scale * S_t^T q_t.

A second test compiles both kernels for sm80 and sm90 ahead of time (subprocess, no interpreter).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fla_gen.emit import TEMPLATES_DIR, _environment
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.runtime.plan_types import LaunchConfig, Plan
from fla_gen.sample import relative_error
from tests.support import KERNEL_MODULE_HEADER, REPO_ROOT, poisoned_allocations

TEMPLATE = "kernels/fused_recurrent.jinja"


def render(op: str, token_gate: str | None) -> str:
    """The template's Python source for a general rank-1 term with a per-channel gate (token_gate
    "channel") or none, with the imports a generated module puts above it."""
    env = _environment(str(TEMPLATES_DIR), trim=False)
    decay = TokenDecay.CHANNEL if token_gate == "channel" else TokenDecay.NONE
    features = KernelFeatures(decay, False, RankOne.GENERAL)
    return KERNEL_MODULE_HEADER + env.get_template(TEMPLATE).render(op=op, features=features, inline=None)


def load_module(tmp_dir: Path, token_gate: str | None):
    """Import the rendered template from a file (@triton.jit reads its kernels' source from there)."""
    name = f"dplr_kernels_{token_gate or 'nogate'}"
    path = tmp_dir / f"{name}.py"
    path.write_text(render("dplr_test", token_gate))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dplr_kernels")
    return {tg: load_module(root, tg) for tg in ("channel", None)}


def make_plan(K: int, fwd_bv: int, bwd_bv: int, chunk_size: int) -> Plan:
    cfg = {"recurrent_fwd": LaunchConfig(K, fwd_bv, 4, 1), "recurrent_bwd": LaunchConfig(K, bwd_bv, 4, 1)}
    return Plan("test", "any", K, chunk_size, "test", tuple(cfg.items()))


# --------------------------------------------------------------------------------------------------
# Inputs and the float64 reference
# --------------------------------------------------------------------------------------------------


def sample(B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype, gated: bool, seed: int) -> dict:
    """RWKV-7-like inputs, so the recurrence is stable: a = -khat, b = eta * khat with |khat| = 1 and
    eta in (0, 1) (then I + b a^T contracts along khat), log decays g in (-inf, -0.5); q, k, v ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    khat = F.normalize(randn(B, T, H, K), dim=-1)
    eta = torch.sigmoid(randn(B, T, H, 1))
    x = {"q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, H, V), "a": -khat, "b": khat * eta}
    x = {n: t.to(dtype) for n, t in x.items()}
    x["g"] = (-F.softplus(randn(B, T, H, K)) - 0.5) if gated else None
    return x


def reference(x: dict, scale: float, h0: torch.Tensor | None, cu_seqlens: list[int] | None):
    """o [B, T, H, V] and the final states [N, H, K, V], float64, by the plain token loop."""
    q, k, v, a, b = (x[n].double() for n in "qkvab")
    g = None if x["g"] is None else x["g"].double()
    B, T, H, K = q.shape
    bounds = [(i, 0, T) for i in range(B)] if cu_seqlens is None else [
        (0, s, e) for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)
    ]
    o = torch.zeros(*v.shape, dtype=torch.float64)
    finals = []
    for n, (i, start, end) in enumerate(bounds):
        S = torch.zeros(H, K, v.shape[-1], dtype=torch.float64) if h0 is None else h0[n].double()
        for t in range(start, end):
            w = torch.einsum("hk,hkv->hv", a[i, t], S)
            decayed = S if g is None else S * g[i, t].exp()[..., None]
            S = decayed + b[i, t][..., None] * w[:, None, :] + k[i, t][..., None] * v[i, t][:, None, :]
            o[i, t] = scale * torch.einsum("hk,hkv->hv", q[i, t], S)
        finals.append(S)
    return o, torch.stack(finals)


@contextlib.contextmanager
def single_thread():
    """One torch thread: the reference's many tiny float64 ops are dominated by thread hand-offs
    on a busy CPU (seconds instead of ~0.1 s per case)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    token_gate: str | None  # template variant
    use_g: bool  # g passed (vs None) when token_gate == "channel"
    varlen: bool
    states: bool  # initial_state and dht given (else both None, dh0 None)
    fwd_bv: int = 16  # V = 48: three V blocks forward, two backward (partials summed, the last ragged)
    bwd_bv: int = 32


CASES = {
    "fp32-varlen": Case(torch.float32, "channel", True, True, True),
    "fp16-varlen": Case(torch.float16, "channel", True, True, True),
    "fp32-dense-one-v-block": Case(torch.float32, "channel", True, False, True, 64, 64),
    "fp32-varlen-g-none": Case(torch.float32, "channel", False, True, True),
    "fp32-dense-no-states": Case(torch.float32, "channel", True, False, False),
    "fp32-varlen-template-no-gate": Case(torch.float32, None, False, True, True),
}
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (5e-3, 1e-2)}  # (forward, gradients)


@pytest.mark.parametrize("name", list(CASES))
def test_fused_recurrent_dplr_matches_float64_reference(kernels: dict, name: str) -> None:
    case = CASES[name]
    mod = kernels[case.token_gate]
    H, K, V, BT = 2, 32, 48, 16
    # T = 70 is not a multiple of the segment length BT; varlen: an empty and a length-1 sequence
    B, T, cu = (1, 70, [0, 0, 1, 31, 70]) if case.varlen else (2, 37, None)
    N = len(cu) - 1 if cu else B
    x = sample(B, T, H, K, V, case.dtype, case.token_gate == "channel" and case.use_g, seed=len(name))
    gen = torch.Generator().manual_seed(1)
    h0 = torch.randn(N, H, K, V, generator=gen) if case.states else None
    dht = torch.randn(N, H, K, V, generator=gen) if case.states else None
    do = torch.randn(B, T, H, V, generator=gen).to(case.dtype)
    scale = K**-0.5
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    plan = make_plan(K, case.fwd_bv, case.bwd_bv, BT)
    gated = case.token_gate == "channel"
    gate = (x["g"],) if gated else ()

    with poisoned_allocations():
        o, ht, saved = mod.fused_recurrent_fwd(
            x["q"], x["k"], x["v"], *gate, x["a"], x["b"], scale, h0, True, cu_seqlens, plan
        )
        grads = mod.fused_recurrent_bwd(
            x["q"], x["k"], x["v"], *gate, x["a"], x["b"], saved, scale, h0, do, dht, cu_seqlens, plan
        )
    names = ["q", "k", "v", *(["g"] if gated else []), "a", "b"]
    got = dict(zip([*names, "h0"], grads, strict=True))

    # reference gradients by autograd through the float64 loop, from the same (rounded) inputs
    leaves = {n: x[n].double().requires_grad_() for n in names if x[n] is not None}
    h0_ref = None if h0 is None else h0.double().requires_grad_()
    wrt = {**leaves, **({"h0": h0_ref} if h0_ref is not None else {})}
    with single_thread():
        o_ref, ht_ref = reference({**x, **leaves, "g": leaves.get("g")}, scale, h0_ref, cu)
        loss = (o_ref * do.double()).sum() + (0 if dht is None else (ht_ref * dht.double()).sum())
        ref = dict(zip(wrt, torch.autograd.grad(loss, list(wrt.values())), strict=True))

    tol_fwd, tol_grad = TOL[case.dtype]
    assert o.dtype == case.dtype and ht.dtype == torch.float32
    errors = {"o": relative_error(o, o_ref), "ht": relative_error(ht, ht_ref)}
    for n in names:
        if x[n] is None:
            assert got[n] is None, n
            continue
        assert got[n].shape == x[n].shape and got[n].dtype == x[n].dtype, n
        errors[f"d{n}"] = relative_error(got[n], ref[n])
    if h0 is None:
        assert got["h0"] is None
    else:
        assert got["h0"].dtype == torch.float32
        errors["dh0"] = relative_error(got["h0"], ref["h0"])
    bad = {n: e for n, e in errors.items() if e > (tol_fwd if n in ("o", "ht") else tol_grad)}
    assert not bad, f"{name}: {errors}"


# --------------------------------------------------------------------------------------------------
# Ahead-of-time compile for real GPUs (no GPU needed): subprocess without TRITON_INTERPRET
# --------------------------------------------------------------------------------------------------

AOT_CALL = """
import torch
from fla_gen.runtime.plan_types import LaunchConfig, Plan
import dplr_aot_kernels as mod

# the planner's recurrent configs for head dim 128 (whole K; BV 64 forward, 32 backward)
PLAN = Plan("aot", "bf16", 128, 64, "aot", (
    ("recurrent_fwd", LaunchConfig(128, 64, 4, 1)), ("recurrent_bwd", LaunchConfig(128, 32, 4, 1))))


def launches():
    B, T, H, K, V = 1, 192, 2, 128, 128
    x = [torch.randn(B, T, H, d, dtype=torch.bfloat16) for d in (K, K, V)]
    g = torch.randn(B, T, H, K)
    a, b = (torch.randn(B, T, H, K, dtype=torch.bfloat16) for _ in range(2))
    h0, dht = torch.zeros(3, H, K, V), torch.zeros(3, H, K, V)
    cu = torch.tensor([0, 64, 100, 192], dtype=torch.int32)
    o, ht, saved = mod.fused_recurrent_fwd(*x, g, a, b, 1.0, h0, True, cu, PLAN)
    mod.fused_recurrent_bwd(*x, g, a, b, saved, 1.0, h0, torch.randn_like(x[2]), dht, cu, PLAN)
"""


def test_kernels_compile_ahead_of_time_for_sm80_and_sm90(tmp_path: Path) -> None:
    (tmp_path / "dplr_aot_kernels.py").write_text(render("dplr_aot", "channel"))
    (tmp_path / "dplr_aot_call.py").write_text(textwrap.dedent(AOT_CALL))
    out = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "fla_gen.aot", "--call", "dplr_aot_call:launches", "--caps", "80,90",
         "--json", str(out), "--jobs", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), console
    reports = json.loads(out.read_text())["reports"]
    kernels = {(r["kernel"], r["cap"]) for r in reports}
    assert kernels == {(f"dplr_aot_recurrent_{s}_kernel", c) for s in ("fwd", "bwd") for c in (80, 90)}, console
    for r in reports:
        assert r["error"] is None and not r["problems"], r
        # the [128, BV] fp32 state blocks must stay in registers
        assert r["spill_stores"] in (0, None) and r["spill_loads"] in (0, None), console
    print(console)
