"""Call-time flags that switch a spec's guarded transforms, in Triton's interpreter.

generated.gated_delta_rule declares fla's `use_qk_l2norm_in_kernel`, `use_beta_sigmoid_in_kernel`,
`allow_neg_eigval` (2 sigmoid(beta)) and `use_gate_in_kernel` (with the keyword inputs A_log and dt_bias) as
flags guarding `transform` lines. Each op is compared with the float64 reference derived from the spec (the
same guards), and, independently of that reference, with the op on inputs transformed here in torch by fla's
formulas (x / sqrt(sum(x^2) + 1e-6) in fp32, 2 sigmoid, -exp(A_log) softplus(g + dt_bias)). Flags off run no
transform kernel at all. fla's other keywords (the spec's `option` lines) are refused unless they have their
one supported value.
"""

import pytest
import torch
import torch.nn.functional as F

from fla_gen.sample import relative_error
from fla_gen.verify import TOLERANCE, compare_with_reference
from tests.support import (
    assert_gradients_match_reference,
    built_package,
    generated,
    poisoned_allocations,
)

OP = "gated_delta_rule"
B, T, H, K, V = 2, 24, 2, 16, 16


def raw_inputs(seed: int) -> dict:
    """q, k unnormalized, beta as logits, g a log decay in (-inf, 0): the inputs of a call with both flags on."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": torch.randn(B, T, H, K, generator=gen),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": F.logsigmoid(torch.randn(B, T, H, generator=gen)),
        "beta": torch.randn(B, T, H, generator=gen),
    }


def fla_l2norm(x: torch.Tensor) -> torch.Tensor:
    """fla's l2norm (fla/modules/l2norm.py): x / sqrt(sum(x^2) + 1e-6), in fp32."""
    x32 = x.float()
    return (x32 / torch.sqrt((x32 * x32).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("l2norm,sigmoid,neg", [(True, True, False), (True, False, False), (False, True, True)])
def test_flags_match_reference(mode, l2norm, sigmoid, neg):
    pkg = generated(OP)
    x = raw_inputs(seed=3)
    if not l2norm:  # the recurrence needs unit keys: with the flag off, give them normalized
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    if not sigmoid:
        x["beta"] = torch.sigmoid(x["beta"])
    flags = {"use_qk_l2norm_in_kernel": l2norm, "use_beta_sigmoid_in_kernel": sigmoid, "allow_neg_eigval": neg}
    result = compare_with_reference(getattr(pkg, f"{mode}_{OP}"), getattr(pkg, f"{OP}_reference"),
                                    {**x, "initial_state": torch.randn(B, H, K, V)}, torch.float32,
                                    name=f"{mode}_{OP}", guard=poisoned_allocations, **flags)
    assert not result.failures(), f"over tolerance {result.failures()} (all {result.errors})"


def gate_params(seed: int) -> dict:
    """A_log and dt_bias per head, and a raw g, in Qwen3-Next's ranges: decays exp(g) mostly in (0.2, 1)."""
    gen = torch.Generator().manual_seed(seed)
    return {"A_log": torch.empty(H).uniform_(-3.0, 0.0, generator=gen), "dt_bias": torch.randn(H, generator=gen),
            "g": torch.randn(B, T, H, generator=gen)}


def assert_op_and_gradients_match_reference(mode: str, x: dict, keywords: tuple, flags: dict) -> None:
    """<mode>_gated_delta_rule against its float64 reference on inputs ``x`` (tests/support.py)."""
    pkg = generated(OP)
    assert_gradients_match_reference(getattr(pkg, f"{mode}_{OP}"), getattr(pkg, f"{OP}_reference"), x, keywords,
                                     **flags)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gate_in_kernel_matches_reference(mode, with_bias):
    """g raw and the gate from A_log (and dt_bias, or none: zeros), with every flag on; gradients of A_log and
    dt_bias included."""
    x = {**raw_inputs(seed=7), **gate_params(seed=7)}
    if not with_bias:
        del x["dt_bias"]
    x["initial_state"] = torch.randn(B, H, K, V)
    keywords = tuple(n for n in ("A_log", "dt_bias") if n in x)
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": True,
             "allow_neg_eigval": True}
    assert_op_and_gradients_match_reference(mode, x, keywords, flags)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_gate_keywords_follow_their_flag(mode):
    fn = getattr(generated(OP), f"{mode}_{OP}")
    x = raw_inputs(seed=0)
    with pytest.raises(ValueError, match="A_log is given but use_gate_in_kernel is False"):
        fn(*x.values(), A_log=torch.zeros(H))
    with pytest.raises(ValueError, match="dt_bias is given but use_gate_in_kernel is False"):
        fn(*x.values(), dt_bias=torch.zeros(H))
    with pytest.raises(ValueError, match="A_log is required when use_gate_in_kernel=True"):
        fn(*x.values(), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="A_log"):
        fn(*x.values(), use_gate_in_kernel=True, A_log=torch.zeros(H + 1))


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_flags_equal_torch_transforms_then_plain_op(mode):
    """Independent of the derived reference: flags on == fla's formulas applied in torch, flags off;
    outputs and the gradients of the raw q, k, g, beta and of A_log, dt_bias."""
    fn = getattr(generated(OP), f"{mode}_{OP}")
    x = {**raw_inputs(seed=5), **gate_params(seed=5)}
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    twins = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(*(leaves[n] for n in ("q", "k", "v", "g", "beta")), output_final_state=True,
               use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
               allow_neg_eigval=True, A_log=leaves["A_log"], dt_bias=leaves["dt_bias"])
    gate = -twins["A_log"].exp() * F.softplus(twins["g"] + twins["dt_bias"])
    o2, ht2 = fn(fla_l2norm(twins["q"]), fla_l2norm(twins["k"]), twins["v"], gate,
                 2 * torch.sigmoid(twins["beta"]), output_final_state=True)
    do = torch.randn_like(o)
    grads = torch.autograd.grad((o * do).sum() + ht.sum(), list(leaves.values()))
    grads2 = torch.autograd.grad((o2 * do).sum() + ht2.sum(), list(twins.values()))
    tol_fwd, tol_grad = TOLERANCE[torch.float32]
    assert (o - o2).norm() <= tol_fwd * o2.norm()
    assert (ht - ht2).norm() <= tol_fwd * ht2.norm()
    for name, a, b in zip(leaves, grads, grads2, strict=True):
        assert (a - b).norm() <= tol_grad * b.norm(), f"d{name}"


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_flags_off_run_no_transform_pass(mode, monkeypatch):
    module = getattr(generated(OP), "chunk" if mode == "chunk" else "fused_recurrent")

    def forbidden(*args, **kwargs):
        raise AssertionError("the transform pass ran with every flag off")

    monkeypatch.setattr(module, f"{OP}_transforms", forbidden)
    x = raw_inputs(seed=1)
    x["q"], x["k"], x["beta"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1), torch.sigmoid(x["beta"])
    with poisoned_allocations():
        o, _ = getattr(module, f"{mode}_{OP}")(*x.values())
    ref, _ = generated(OP).gated_delta_rule_reference(*(t.double() for t in x.values()))
    assert (o.double() - ref).norm() <= 1e-4 * ref.norm()
    if mode == "chunk":
        with pytest.raises(AssertionError, match="transform pass ran"):
            module.chunk_gated_delta_rule(*x.values(), use_qk_l2norm_in_kernel=True)
        return
    # decode without autograd: the recurrent kernel applies switched-on transforms itself, no pass
    module.fused_recurrent_gated_delta_rule(*x.values(), use_qk_l2norm_in_kernel=True)
    with pytest.raises(AssertionError, match="transform pass ran"):  # with autograd the pass runs
        module.fused_recurrent_gated_delta_rule(*(t.requires_grad_(True) for t in x.values()),
                                                use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2])
def test_decode_without_autograd_applies_every_flag_in_the_kernel(with_bias, groups, monkeypatch):
    """The decode path (no autograd, one kernel with the switched transforms inlined, q and k read at their
    key-side head when HV = groups * H) against the float64 reference; prefill then one token at a time."""
    module = generated(OP).fused_recurrent

    def forbidden(*args, **kwargs):
        raise AssertionError("the transform pass or a head repeat ran on the decode path")

    monkeypatch.setattr(module, f"{OP}_transforms", forbidden)
    gen = torch.Generator().manual_seed(11 + groups)
    HV = groups * H
    x = {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
         "v": torch.randn(B, T, HV, V, generator=gen), "g": torch.randn(B, T, HV, generator=gen),
         "beta": torch.randn(B, T, HV, generator=gen)}
    heads = {"A_log": torch.empty(HV).uniform_(-3.0, 0.0, generator=gen)}
    if with_bias:
        heads["dt_bias"] = torch.randn(HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": True,
             "allow_neg_eigval": True}
    o_ref, ht_ref = generated(OP).gated_delta_rule_reference(
        *(t.double() for t in x.values()), initial_state=h0.double(), output_final_state=True,
        **{n: t.double() for n, t in heads.items()}, **flags)
    split = T - 3
    with torch.no_grad(), poisoned_allocations(), monkeypatch.context() as m:
        m.setattr(torch.Tensor, "repeat_interleave", forbidden)
        o, state = module.fused_recurrent_gated_delta_rule(*(t[:, :split] for t in x.values()), initial_state=h0,
                                                           output_final_state=True, **heads, **flags)
        outs = [o]
        for i in range(split, T):
            o, state = module.fused_recurrent_gated_delta_rule(*(t[:, i:i + 1] for t in x.values()),
                                                               initial_state=state, output_final_state=True,
                                                               **heads, **flags)
            outs.append(o)
    tol_fwd, _ = TOLERANCE[torch.float32]
    errors = {"o": relative_error(torch.cat(outs, 1), o_ref), "final_state": relative_error(state, ht_ref)}
    assert all(e <= tol_fwd for e in errors.values()), errors


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("name,value", [
    ("state_v_first", True), ("transpose_state_layout", True), ("head_first", True),
    ("chunk_indices", torch.zeros(2, 2, dtype=torch.int64)), ("chunk_size", 32),
    ("gk", torch.zeros(B, T, H, K)), ("gv", torch.zeros(B, T, H, V)), ("chunk_size", True),
])
def test_unsupported_fla_keywords_are_refused(mode, name, value):
    x = raw_inputs(seed=0)
    with pytest.raises(ValueError, match=f"{name}=.* is not supported"):
        getattr(generated(OP), f"{mode}_{OP}")(*x.values(), **{name: value})


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_flag_must_be_bool_and_unknown_keywords_fail(mode):
    fn = getattr(generated(OP), f"{mode}_{OP}")
    x = raw_inputs(seed=0)
    with pytest.raises(TypeError, match="use_qk_l2norm_in_kernel must be a bool, got int"):
        fn(*x.values(), use_qk_l2norm_in_kernel=1)
    with pytest.raises(TypeError, match="use_qk_l2norm"):
        fn(*x.values(), use_qk_l2norm=True)  # a misspelt keyword is not swallowed
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"):
        fn(*x.values(), allow_neg_eigval=True)  # as fla: 2 sigmoid(beta) needs beta as logits


GUARDED_ROPE = """op guarded_rope
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H, K]
input w: [H]
state S: [K, V]
param rotate: bool = false
param gate: bool = true
input bias: [H] = 0 if gate
transform q, k = rope(q, k, style=neox, rotary_dim=K / 2) if rotate
transform k = l2norm(k)
transform g = -exp(w) * softplus(g + bias) if gate
update S = exp(g) * S + outer(k, v)
output o = S^T @ q
"""


@pytest.mark.parametrize("rotate,gate", [(True, True), (False, True), (True, False)])
def test_guards_of_another_family_match_reference(tmp_path, rotate, gate):
    """A gated (no rank-1) spec: a guarded rope ahead of an unguarded l2norm (which the backward kernel moves
    ahead of the rope), a per-head input read under a guard that is on by default and one outside it: every
    input's gradient against the derived reference, with cu_seqlens and rope offsets."""
    gen = torch.Generator().manual_seed(11)
    Tn, Hn, Kn, Vn = 21, 2, 16, 8
    x = {"q": torch.randn(1, Tn, Hn, Kn, generator=gen), "k": torch.randn(1, Tn, Hn, Kn, generator=gen),
         "v": torch.randn(1, Tn, Hn, Vn, generator=gen), "g": torch.randn(1, Tn, Hn, Kn, generator=gen),
         "w": torch.empty(Hn).uniform_(-3.0, 0.0, generator=gen)}
    if not gate:
        x["g"] = F.logsigmoid(x["g"])
    keywords = ()
    if gate:
        x["bias"] = torch.randn(Hn, generator=gen)
        keywords = ("bias",)
    x["initial_state"] = torch.randn(2, Hn, Kn, Vn, generator=gen)
    kw = {"cu_seqlens": torch.tensor([0, 9, 21], dtype=torch.int32), "seqlen_offsets": torch.tensor([3, 30]),
          "rotate": rotate, "gate": gate}
    with built_package(GUARDED_ROPE, tmp_path, "guarded_rope") as (_, pkg):
        for mode in ("chunk", "fused_recurrent"):
            grads, grads_r = assert_gradients_match_reference(getattr(pkg, f"{mode}_guarded_rope"),
                                                              pkg.guarded_rope_reference, x, keywords, **kw)
            if not gate:  # w is read only by the switched-off gate line
                assert not grads["w"].any() and not grads_r["w"].any(), mode


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_grouped_gate_in_kernel_with_autograd(mode):
    """HV = 2H value heads with A_log and dt_bias on the value heads ([HV], as Qwen3-Next's layer holds them):
    outputs and every gradient against the float64 reference."""
    gen = torch.Generator().manual_seed(21)
    HV = 2 * H
    x = {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
         "v": torch.randn(B, T, HV, V, generator=gen), "g": torch.randn(B, T, HV, generator=gen),
         "beta": torch.randn(B, T, HV, generator=gen), "initial_state": torch.randn(B, HV, K, V, generator=gen),
         "A_log": torch.empty(HV).uniform_(-3.0, 0.0, generator=gen), "dt_bias": torch.randn(HV, generator=gen)}
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": True}
    assert_op_and_gradients_match_reference(mode, x, ("A_log", "dt_bias"), flags)


@pytest.mark.parametrize("groups", [1, 2])
def test_pass_without_autograd_matches_reference(groups, monkeypatch):
    """Without autograd the pass launches its forward kernels directly, not through its autograd.Function (whose
    apply costs host time even where nothing is recorded): the chunk op with every flag on against the float64
    reference, HV = groups * H; with a gradient to compute, the Functions run."""
    transforms = generated(OP).transforms
    gen = torch.Generator().manual_seed(31 + groups)
    HV = groups * H
    x = {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
         "v": torch.randn(B, T, HV, V, generator=gen), "g": torch.randn(B, T, HV, generator=gen),
         "beta": torch.randn(B, T, HV, generator=gen)}
    heads = {"A_log": torch.empty(HV).uniform_(-3.0, 0.0, generator=gen), "dt_bias": torch.randn(HV, generator=gen)}
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": True,
             "allow_neg_eigval": True}
    o_ref, _ = generated(OP).gated_delta_rule_reference(*(t.double() for t in x.values()),
                                                        **{n: t.double() for n, t in heads.items()}, **flags)
    functions = [c for c in vars(transforms).values() if isinstance(c, type) and issubclass(c, torch.autograd.Function)]
    assert functions
    with monkeypatch.context() as m:
        for c in functions:
            m.setattr(c, "apply", lambda *a, **k: pytest.fail("an autograd.Function ran without autograd"))
        with torch.no_grad(), poisoned_allocations():
            o, _ = generated(OP).chunk_gated_delta_rule(*x.values(), **heads, **flags)
    assert relative_error(o, o_ref) <= TOLERANCE[torch.float32][0]
    applied = []
    for c in functions:
        monkeypatch.setattr(c, "apply", lambda *a, c=c, real=c.apply, **k: applied.append(c) or real(*a, **k))
    generated(OP).chunk_gated_delta_rule(*(t.requires_grad_(True) for t in x.values()), **heads, **flags)
    assert set(applied) == set(functions)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_keyword_inputs_of_switched_off_lines_are_not_made(mode, monkeypatch):
    """Qwen3-Next's call switches l2norm on and the gate transform off: A_log and dt_bias, read only by the gate
    line, get no stand-in zeros (each an allocation and a fill kernel), not even where the value-head kernels run
    for beta's sigmoid; with the gate on and no dt_bias, dt_bias alone gets zeros. Every gradient stays finite."""
    x = raw_inputs(seed=2)
    real_zeros = torch.zeros
    made = []

    def zeros(*size, **kwargs):
        made.append(size)
        return real_zeros(*size, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    fn = getattr(generated(OP), f"{mode}_{OP}")
    for flags in ({"use_qk_l2norm_in_kernel": True}, {"use_beta_sigmoid_in_kernel": True}):
        leaves = [t.clone().requires_grad_(True) for t in x.values()]
        with poisoned_allocations():
            o, _ = fn(*leaves, **flags)
            o.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in leaves)
        assert (H,) not in made, (flags, made)
    A_log = torch.zeros(H)
    made.clear()
    fn(*x.values(), use_gate_in_kernel=True, A_log=A_log)
    assert made == [(H,)], made


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_pass_keeps_each_inputs_dtype(op, monkeypatch):
    """fp16 q, k, v, beta with an fp32 gate, every switch on and HV = 2H, so that the pass splits into a key-head
    and a value-head kernel pair and the value-head one's first source is the fp32 gate: the recurrence gets g in
    fp32 and beta still in fp16 (an fp32 beta would compile the chunk kernels once more for it), and the output
    matches the float64 reference."""
    pkg = generated(op)
    gen = torch.Generator().manual_seed(51)
    HV = 2 * H
    gate = (B, T, HV, K) if op == "kda" else (B, T, HV)
    x = {"q": torch.randn(B, T, H, K, generator=gen).half(), "k": torch.randn(B, T, H, K, generator=gen).half(),
         "v": torch.randn(B, T, HV, V, generator=gen).half(), "g": torch.randn(*gate, generator=gen),
         "beta": torch.randn(B, T, HV, generator=gen).half()}
    heads = {"A_log": torch.empty(HV).uniform_(0.0, 2.0, generator=gen).log(),
             "dt_bias": 0.5 * torch.randn(*gate[2:], generator=gen) - 3.0}
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": True,
             "allow_neg_eigval": True}
    transforms = getattr(pkg.transforms, f"{op}_transforms")
    seen = []
    monkeypatch.setattr(pkg.chunk, f"{op}_transforms", lambda *a, **k: seen.append(transforms(*a, **k)) or seen[-1])
    with torch.no_grad(), poisoned_allocations():
        o, _ = getattr(pkg, f"chunk_{op}")(*x.values(), **heads, **flags)
    (_q, _k, _g, _beta), = seen
    assert (_q.dtype, _k.dtype, _g.dtype, _beta.dtype) == (torch.float16,) * 2 + (torch.float32, torch.float16)
    reference = getattr(pkg, f"{op}_reference")
    o_ref, _ = reference(*(t.double() for t in x.values()), **{n: t.double() for n, t in heads.items()}, **flags)
    assert relative_error(o, o_ref) <= TOLERANCE[torch.float16][0]
