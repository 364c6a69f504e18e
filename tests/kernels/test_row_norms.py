"""Switched l2norms of q and k applied inside the chunk kernels on a call without autograd (RowNorms).

gated_delta_rule's `use_qk_l2norm_in_kernel` guards `q = l2norm(q)` and `k = l2norm(k)`. Without autograd the
chunk op hands both to fwd_wu, the fused walk and fwd_o (NORM_Q / NORM_K: row scales of the products), and the
pass does not touch q and k; with autograd the pass runs as before. Both are checked against the float64
reference on the raw inputs, through the fused walk and the split forward (fwd_h + fwd_o), dense, packed with an
empty sequence, with grouped value heads, in fp32 and fp16, outputs poisoned with NaN first; and, for the
lowering, which specs' lines qualify.
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.lower import lower
from fla_gen.parse import parse_spec
from fla_gen.runtime.dispatch import forced_arch, overridden_plans
from fla_gen.sample import relative_error
from fla_gen.transforms import RowNorms, row_norms
from fla_gen.verify import TOLERANCE
from tests.support import built_package, generated, poisoned_allocations, recurrence

OP = "gated_delta_rule"
H, K, V = 2, 32, 16
# With the H100's plans, pinning fwd_fused runs the forward as one walk, pinning fwd_o as fwd_h + fwd_o
# (launch.fused_walk_tile); each case checks that its kernels ran.
PATHS = {"fused": ({"fwd_fused": {"block_v": 32}}, "fwd_fused"), "split": ({"fwd_o": {"num_warps": 4}}, "fwd_o")}


@contextlib.contextmanager
def forward_path(module, path: str):
    """Run the chunk forward of ``module`` (a generated chunk module) through ``path``; assert that it did."""
    overrides, stage = PATHS[path]
    kernels = {name: getattr(module, name) for name in vars(module) if name.endswith("_fwd_fused_kernel")
               or name.endswith("_fwd_o_kernel")}
    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            launched.append(self.name)
            return kernels[self.name][grid]

    for name in kernels:
        setattr(module, name, Recorder(name))
    try:
        with forced_arch("sm90"), overridden_plans(overrides):
            yield
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)
    assert launched and all(name.endswith(f"_{stage}_kernel") for name in launched), launched


def raw_inputs(B: int, T: int, groups: int, seed: int) -> dict:
    """q and k far from unit norm (the norms must matter), g a log decay, beta as logits, on HV = groups * H."""
    gen = torch.Generator().manual_seed(seed)
    HV = groups * H
    return {"q": 3 * torch.randn(B, T, H, K, generator=gen), "k": 0.5 * torch.randn(B, T, H, K, generator=gen),
            "v": torch.randn(B, T, HV, V, generator=gen), "g": F.logsigmoid(torch.randn(B, T, HV, generator=gen)),
            "beta": torch.randn(B, T, HV, generator=gen)}


def forbid_key_side_pass(monkeypatch):
    """Make the pass's kernel pair over the q / k heads raise: the norms must come from the chunk kernels."""
    transforms = generated(OP).transforms

    def forbidden(*args, **kwargs):
        raise AssertionError("the pass normalised q and k")

    monkeypatch.setattr(transforms.GatedDeltaRuleTransformsH, "apply", forbidden)


@pytest.mark.parametrize("path", ["fused", "split"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_no_grad_chunk_applies_l2norm_in_kernels(monkeypatch, path, packed, groups):
    pkg = generated(OP)
    B, T = (1, 45) if packed else (2, 37)
    cu = torch.tensor([0, 20, 20, 45], dtype=torch.int32) if packed else None
    N = 3 if packed else B
    x = raw_inputs(B, T, groups, seed=groups + 2 * packed)
    h0 = torch.randn(N, groups * H, K, V)
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True}
    ref_o, ref_ht = pkg.gated_delta_rule_reference(*(t.double() for t in x.values()), initial_state=h0.double(),
                                                   output_final_state=True, cu_seqlens=cu, **flags)
    forbid_key_side_pass(monkeypatch)
    with torch.no_grad(), poisoned_allocations(), forward_path(pkg.chunk, path):
        o, ht = pkg.chunk_gated_delta_rule(*x.values(), initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                           **flags)
    tol, _ = TOLERANCE[torch.float32]
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    assert all(e <= tol for e in errors.values()), errors


def test_no_grad_equals_the_pass_in_fp16():
    """fp16: the kernels' norms (fp32 scales on the raw rows) against the pass's (rows rounded to fp16 after the
    norm) and the float64 reference; the two paths differ by rounding only."""
    pkg = generated(OP)
    x = {n: t.half() if n != "g" else t for n, t in raw_inputs(2, 40, 2, seed=9).items()}
    with torch.no_grad(), poisoned_allocations():
        o_kernels, _ = pkg.chunk_gated_delta_rule(*x.values(), use_qk_l2norm_in_kernel=True,
                                                  use_beta_sigmoid_in_kernel=True)
    leaves = [t.clone().requires_grad_(True) for t in x.values()]
    with poisoned_allocations():
        o_pass, _ = pkg.chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True,
                                               use_beta_sigmoid_in_kernel=True)
    ref_o, _ = pkg.gated_delta_rule_reference(*(t.double() for t in x.values()), use_qk_l2norm_in_kernel=True,
                                              use_beta_sigmoid_in_kernel=True)
    tol, _ = TOLERANCE[torch.float16]
    assert o_kernels.dtype == torch.float16
    assert relative_error(o_kernels, ref_o) <= tol
    assert relative_error(o_pass, ref_o) <= tol
    assert relative_error(o_kernels, o_pass.detach()) <= tol


def test_autograd_keeps_the_pass(monkeypatch):
    """With a gradient to compute the pass normalises q and k (the backward reads the normalised tensors)."""
    forbid_key_side_pass(monkeypatch)
    x = {n: t.requires_grad_(True) for n, t in raw_inputs(1, 20, 1, seed=4).items()}
    with pytest.raises(AssertionError, match="the pass normalised"):
        generated(OP).chunk_gated_delta_rule(*x.values(), use_qk_l2norm_in_kernel=True)


KEY_NORM_DELTA = """op key_norm_delta
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H]
input beta: [B, T, H]
state S: [K, V]
param scale = K ** -0.5
param normalize_keys: bool = false
transform k = l2norm(k) if normalize_keys
update S = exp(g) * S
update S = S + beta * outer(k, v - S^T @ k)
output o = scale * S^T @ q
"""


@pytest.mark.parametrize("path", ["fused", "split"])
def test_key_norm_alone(tmp_path, path):
    """A gated delta rule whose flag normalises k only: NORM_K alone, q read as given."""
    with built_package(KEY_NORM_DELTA, tmp_path, "key_norm_delta") as (rec, pkg):
        assert row_norms(lower(rec)) == RowNorms(query=(), key=("normalize_keys",))
        gen = torch.Generator().manual_seed(5)
        x = {"q": torch.randn(2, 33, H, K, generator=gen), "k": 2 * torch.randn(2, 33, H, K, generator=gen),
             "v": torch.randn(2, 33, H, V, generator=gen), "g": F.logsigmoid(torch.randn(2, 33, H, generator=gen)),
             "beta": torch.rand(2, 33, H, generator=gen)}
        h0 = torch.randn(2, H, K, V, generator=gen)
        ref_o, ref_ht = pkg.key_norm_delta_reference(*(t.double() for t in x.values()), initial_state=h0.double(),
                                                     output_final_state=True, normalize_keys=True)
        with torch.no_grad(), poisoned_allocations(), forward_path(pkg.chunk, path):
            o, ht = pkg.chunk_key_norm_delta(*x.values(), initial_state=h0, output_final_state=True,
                                             normalize_keys=True)
        tol, _ = TOLERANCE[torch.float32]
        errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
        assert all(e <= tol for e in errors.values()), errors


def test_without_a_decay_the_pass_normalises(tmp_path, monkeypatch):
    """The undecayed rendering has no exponent for the log scales: the same flag runs the pass, without autograd
    too, and the op still matches the reference."""
    spec = KEY_NORM_DELTA.replace("input g: [B, T, H]\n", "").replace("update S = exp(g) * S\n", "")
    with built_package(spec, tmp_path, "key_norm_delta") as (rec, pkg):
        lowered = lower(rec)
        from fla_gen.emit import kernel_row_norms
        from fla_gen.plan import select_algorithms

        assert row_norms(lowered) is not None
        assert kernel_row_norms(lowered, select_algorithms(lowered.features)[0], lowered.features) is None
        assert not hasattr(pkg.chunk, "key_norm_delta_row_norms_kernel")
        gen = torch.Generator().manual_seed(6)
        x = {"q": torch.randn(1, 20, H, K, generator=gen), "k": 2 * torch.randn(1, 20, H, K, generator=gen),
             "v": torch.randn(1, 20, H, V, generator=gen), "beta": torch.rand(1, 20, H, generator=gen)}
        ref_o, _ = pkg.key_norm_delta_reference(*(t.double() for t in x.values()), normalize_keys=True)
        with torch.no_grad(), poisoned_allocations():
            o, _ = pkg.chunk_key_norm_delta(*x.values(), normalize_keys=True)
        assert relative_error(o, ref_o) <= TOLERANCE[torch.float32][0]


def _spec_with(lines: str) -> str:
    """A gated delta rule spec with the transform ``lines`` and a bool param for each flag they name."""
    flags = dict.fromkeys(line.rsplit(" if ", 1)[1] for line in lines.splitlines() if " if " in line)
    params = "\n".join(f"param {f}: bool = false" for f in flags)
    return f"""op row_norm_probe
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H]
input beta: [B, T, H]
state S: [K, V]
{params}
{lines}
update S = exp(g) * S
update S = S + beta * outer(k, v - S^T @ k)
output o = S^T @ q
"""


@pytest.mark.parametrize("lines,expected", [
    ("transform q = l2norm(q) if on\ntransform k = l2norm(k) if on", RowNorms(("on",), ("on",))),
    ("transform q = l2norm(q) if on\ntransform k = l2norm(k) if other", RowNorms(("on",), ("other",))),
    # the flag also switches a line the kernels do not take over: the pass keeps all of it
    ("transform q = l2norm(q) if on\ntransform beta = sigmoid(beta) if on", None),
    # an unswitched norm: the pass has no switch to leave it out
    ("transform k = l2norm(k)", None),
    # another line on k before the norm: the kernels would normalise raw rows
    ("transform k = 2 * k if other\ntransform k = l2norm(k) if on", None),
    ("transform beta = sigmoid(beta) if on", None),
])
def test_which_lines_the_kernels_take(lines, expected):
    rec = canonicalize(check_spec(parse_spec(_spec_with(lines), "row_norm_probe.fla")))
    assert row_norms(lower(rec)) == expected


def test_shipped_specs():
    """The gated delta rule's flag qualifies; KDA's lines do too, but its per-channel kernels take no row norms
    (emit.kernel_row_norms), and the rope spec normalises rotated rows."""
    from fla_gen.emit import kernel_row_norms
    from fla_gen.plan import select_algorithms

    flag = ("use_qk_l2norm_in_kernel",)
    for op, taken in (("gated_delta_rule", RowNorms(flag, flag)), ("kda", None), ("gated_delta_rule_rope", None)):
        lowered = lower(recurrence(op))
        chunk_algo, _ = select_algorithms(lowered.features)
        assert kernel_row_norms(lowered, chunk_algo, lowered.features) == taken, op
