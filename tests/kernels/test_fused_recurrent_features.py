"""The fused recurrent template (templates/kernels/fused_recurrent.jinja) on feature combinations that no
shipped spec has, in Triton's interpreter.

1. Spec level: a tiny spec per combination is compiled with the compiler API into a package under a tmp
   dir and imported; fused_recurrent_<op> (with the features the lowering gives it) is compared with the
   spec's derived float64 reference (forward, final state, every gradient, with an initial state),
   allocations poisoned with NaN.
2. The template on its own, for feature combinations as given (the lowering folds some of them to what
   the chunk kernels take, e.g. KDA to a general rank-1 term), with and without grouped value heads: the
   launchers are compared with a float64 torch loop of the normal form that repeats q, k, a, b over the
   value heads of a group.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fla_gen.cli import compile_spec
from fla_gen.emit import TEMPLATES_DIR, _environment
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.runtime.dispatch import overridden_plans
from fla_gen.runtime.plan_types import LaunchConfig, Plan
from fla_gen.sample import relative_error
from fla_gen.verify import TOLERANCE, verify_op
from fla_gen.write import write_files
from tests.support import KERNEL_MODULE_HEADER, poisoned_allocations

HEADER = """\
op {op}
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
"""
TAIL = """\
state S: [K, V]
param scale = K ** -0.5
{updates}
output o = scale * S^T @ q
"""
DELTA = "update S = S + beta * outer(k, v - S^T @ k)"
SPLIT_V = {"recurrent_fwd": {"block_v": 16}, "recurrent_bwd": {"block_v": 16}}

# name -> (extra inputs, update statements)
SPECS = {
    # KDA decode: the delta rule on a per-channel decayed state
    "kda": (["g: [B, T, H, K]", "beta: [B, T, H]"], ["update S = exp(g) * S", DELTA]),
    "kda_head": (["g: [B, T, H, K]", "g_gamma: [H]", "beta: [B, T, H]"], ["update S = exp(g + g_gamma) * S", DELTA]),
    "delta_head": (["g_gamma: [H]", "beta: [B, T, H]"], ["update S = exp(g_gamma) * S", DELTA]),
    "delta_scalar_head": (["g: [B, T, H]", "g_gamma: [H]", "beta: [B, T, H]"],
                          ["update S = exp(g + g_gamma) * S", DELTA]),
    "dplr_scalar": (["a: [B, T, H, K]", "b: [B, T, H, K]", "g: [B, T, H]"],
                    ["update S = exp(g) * S + outer(b, S^T @ a) + outer(k, v)"]),
    "dplr_head": (["a: [B, T, H, K]", "b: [B, T, H, K]", "g_gamma: [H]"],
                  ["update S = exp(g_gamma) * S + outer(b, S^T @ a) + outer(k, v)"]),
    "dplr_channel_head": (["a: [B, T, H, K]", "b: [B, T, H, K]", "g: [B, T, H, K]", "g_gamma: [H]"],
                          ["update S = exp(g + g_gamma) * S + outer(b, S^T @ a) + outer(k, v)"]),
    "gla_head": (["g: [B, T, H, K]", "g_gamma: [H]"], ["update S = exp(g + g_gamma) * S + outer(k, v)"]),
}
# Grouped value heads: v, the gates, beta on HV heads, q, k, a, b on H (the kernels read head hv // (HV / H)).
GROUPED_SPECS = {
    "grouped_dplr": (["a: [B, T, H, K]", "b: [B, T, H, K]", "g: [B, T, HV, K]"],
                     ["update S = exp(g) * S + outer(b, S^T @ a) + outer(k, v)"]),
    "grouped_retention": (["g: [B, T, HV]", "g_gamma: [HV]"], ["update S = exp(g + g_gamma) * S + outer(k, v)"]),
}


def build_package(root: Path, name: str):
    """Compile SPECS[name] into root/<op>/ and import it (the op is named after the test spec)."""
    inputs, updates = {**SPECS, **GROUPED_SPECS}[name]
    op = f"fr_{name}"
    header = HEADER.replace("input v: [B, T, H, V]", "input v: [B, T, HV, V]") if name in GROUPED_SPECS else HEADER
    src = header.format(op=op) + "".join(f"input {i}\n" for i in inputs) + TAIL.format(updates="\n".join(updates))
    spec_path = root / f"{op}.fla"
    spec_path.write_text(src)
    rec, files = compile_spec(spec_path)
    write_files(files, root)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return rec, importlib.import_module(rec.spec.package)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fused_recurrent_specs")
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = build_package(root, name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(SPECS))
def test_new_combination_matches_reference(packages, name: str) -> None:
    rec, pkg = packages(name)
    # V = 32 in 16-wide blocks: two V blocks, so the launchers' sums of per-block partials are exercised
    with overridden_plans(SPLIT_V):
        result = verify_op(pkg, rec, "fused_recurrent", torch.float32, B=2, T=20, H=2, K=16, V=32,
                           guard=poisoned_allocations)
    assert not result.failures(), result.errors


@pytest.mark.parametrize("name", ["kda", "dplr_scalar", "delta_head"])
def test_new_combination_varlen(packages, name: str) -> None:
    rec, pkg = packages(name)
    result = verify_op(pkg, rec, "fused_recurrent", torch.float32, B=1, T=23, H=2, K=16, V=32,
                       cu_seqlens=[0, 5, 6, 23], guard=poisoned_allocations)
    assert not result.failures(), result.errors


@pytest.mark.parametrize("name", list(GROUPED_SPECS))
def test_grouped_spec_matches_reference(packages, name: str) -> None:
    rec, pkg = packages(name)
    # the kernels group the heads themselves: q and k reach the launcher on H heads
    assert "repeat_interleave" not in Path(pkg.fused_recurrent.__file__).read_text()
    with overridden_plans(SPLIT_V):
        result = verify_op(pkg, rec, "fused_recurrent", torch.float32, B=1, T=19, H=2, HV=4, K=16, V=32,
                           cu_seqlens=[0, 6, 6, 19], guard=poisoned_allocations)
    assert not result.failures(), result.errors


# --------------------------------------------------------------------------------------------------
# The rendered template on its own: unfolded combinations and grouped value heads
# --------------------------------------------------------------------------------------------------


GROUPED = {
    # unfolded combinations (the lowering folds them for the chunk kernels)
    "kda": KernelFeatures(TokenDecay.CHANNEL, False, RankOne.DELTA),
    "kda_head": KernelFeatures(TokenDecay.CHANNEL, True, RankOne.DELTA),
    "delta_head": KernelFeatures(TokenDecay.NONE, True, RankOne.DELTA),
    "delta_scalar_head": KernelFeatures(TokenDecay.SCALAR, True, RankOne.DELTA),
    "general_channel_head": KernelFeatures(TokenDecay.CHANNEL, True, RankOne.GENERAL),
    # grouped value heads
    "grouped_gated_scalar_head": KernelFeatures(TokenDecay.SCALAR, True, RankOne.NONE, grouped=True),
    "grouped_gated_channel": KernelFeatures(TokenDecay.CHANNEL, False, RankOne.NONE, grouped=True),
    "grouped_delta_scalar": KernelFeatures(TokenDecay.SCALAR, False, RankOne.DELTA, grouped=True),
    "grouped_delta_channel_head": KernelFeatures(TokenDecay.CHANNEL, True, RankOne.DELTA, grouped=True),
    "grouped_general_channel": KernelFeatures(TokenDecay.CHANNEL, False, RankOne.GENERAL, grouped=True),
}


def load_kernels(root: Path, name: str):
    """Render the template for GROUPED[name] and import it from a file (@triton.jit reads the source)."""
    env = _environment(str(TEMPLATES_DIR), trim=False)
    source = env.get_template("kernels/fused_recurrent.jinja").render(op=f"grouped_{name}", features=GROUPED[name],
                                                                      inline=None)
    path = root / f"grouped_{name}.py"
    path.write_text(KERNEL_MODULE_HEADER + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_plan(K: int, block_v: int) -> Plan:
    cfg = {"recurrent_fwd": LaunchConfig(K, block_v, 4, 1), "recurrent_bwd": LaunchConfig(K, block_v, 4, 1)}
    return Plan("test", "any", K, 8, "test", tuple(cfg.items()))


def grouped_inputs(f: KernelFeatures, B: int, T: int, H: int, HV: int, K: int, V: int, seed: int) -> dict:
    """Inputs in the sampling ranges of fla_gen.sample: unit-norm q, k for a rank-1 part, logsigmoid
    gates, retention-like per-head gates, beta in (0, 1), a = -k̂, b = η k̂ (RWKV-7's form)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {"q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, HV, V)}
    if f.rank1 is not RankOne.NONE:
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    if f.token_decay is not TokenDecay.NONE:
        x["g"] = F.logsigmoid(randn(B, T, HV, K) if f.channel_decay else randn(B, T, HV))
    if f.head_decay:
        x["g_gamma"] = torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(HV, dtype=torch.float64))).float()
    if f.delta:
        x["beta"] = torch.sigmoid(randn(B, T, HV))
    if f.general:
        khat = F.normalize(randn(B, T, H, K), dim=-1)
        x["a"], x["b"] = -khat, khat * torch.sigmoid(randn(B, T, H, 1))
    return x


def loop_reference(f: KernelFeatures, x: dict, h0: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The normal form token by token in the inputs' dtype; q, k, a, b are repeated over each group."""
    HV = x["v"].shape[2]
    r = HV // x["q"].shape[2]
    rep = {n: x[n].repeat_interleave(r, dim=2) for n in ("q", "k", "a", "b") if n in x}
    S, outs = h0, []
    for t in range(x["v"].shape[1]):
        lg = torch.zeros(1, dtype=h0.dtype)
        if "g" in x:
            lg = x["g"][:, t, :, :, None] if f.channel_decay else x["g"][:, t, :, None, None]
        if "g_gamma" in x:
            lg = lg + x["g_gamma"][None, :, None, None]
        q, k, v = rep["q"][:, t], rep["k"][:, t], x["v"][:, t]
        if f.general:
            w = torch.einsum("nhkv,nhk->nhv", S, rep["a"][:, t])
        S = torch.exp(lg) * S
        if f.delta:
            u = x["beta"][:, t, :, None] * (v - torch.einsum("nhkv,nhk->nhv", S, k))
            S = S + k[..., None] * u[..., None, :]
        elif f.general:
            S = S + rep["b"][:, t][..., None] * w[..., None, :] + k[..., None] * v[..., None, :]
        else:
            S = S + k[..., None] * v[..., None, :]
        outs.append(scale * torch.einsum("nhkv,nhk->nhv", S, q))
    return torch.stack(outs, 1), S


@pytest.fixture(scope="module")
def grouped_kernels(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("fused_recurrent_grouped")
    return {name: load_kernels(root, name) for name in GROUPED}


@pytest.mark.parametrize("name", list(GROUPED))
def test_template_matches_float64_loop(grouped_kernels: dict, name: str) -> None:
    f = GROUPED[name]
    B, T, H, K, V = 2, 12, 2, 16, 32
    HV = 2 * H if f.grouped else H
    x = grouped_inputs(f, B, T, H, HV, K, V, seed=7)
    h0 = torch.randn(B, HV, K, V)
    scale = K ** -0.5
    mod = grouped_kernels[name]
    plan = make_plan(K, 16)
    args = [x[n] for n in f.kernel_args]
    with poisoned_allocations():
        o, ht, saved = mod.fused_recurrent_fwd(*args, scale, h0, True, None, plan)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    with poisoned_allocations():
        grads = mod.fused_recurrent_bwd(*args, saved, scale, h0, do, dht, None, plan)

    leaves = {n: x[n].double().requires_grad_(True) for n in f.kernel_args}
    ref_h0 = h0.double().requires_grad_(True)
    ref_o, ref_ht = loop_reference(f, leaves, ref_h0, scale)
    ref_grads = torch.autograd.grad((ref_o * do.double()).sum() + (ref_ht * dht.double()).sum(),
                                    [*leaves.values(), ref_h0])
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    errors.update({f"d{n}": relative_error(g, r)
                   for n, g, r in zip([*f.kernel_args, "initial_state"], grads, ref_grads, strict=True)})
    tol_fwd, tol_grad = TOLERANCE[torch.float32]
    bad = {n: e for n, e in errors.items() if not e <= (tol_fwd if n in ("o", "final_state") else tol_grad)}
    assert not bad, errors
