"""Bad input never reaches a kernel: every malformed call is a TypeError/ValueError that names
the argument, raised on the host before any launch (docs/design.md, "Input validation")."""

import math

import pytest
import torch

from tests.support import generated

B, T, H, K, V = 2, 16, 2, 8, 12


def base(op):
    g_shape = {"gla": (B, T, H, K), "simple_gla": (B, T, H)}
    args = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, H, V)}
    if op in g_shape:
        args["g"] = -torch.rand(g_shape[op])
    if op == "simple_gla":
        args["g_gamma"] = -torch.rand(H)
    if op == "gated_delta_rule":
        args["g"] = -torch.rand(B, T, H)
    if op == "kda":
        args["g"] = -torch.rand(B, T, H, K)
    if op.endswith("delta_rule") or op == "kda":
        args["beta"] = torch.rand(B, T, H)
    return args


def gate(**changes):
    """KDA's arguments with the gate computed in the kernel: raw g, A_log [HV] (here HV = H) and changes (dt_bias
    ...)."""
    return with_("kda", g=torch.randn(B, T, H, K), use_gate_in_kernel=True, **{"A_log": torch.zeros(H), **changes})


def grouped(HV, **changes):
    """gated_delta_rule's arguments with v, g and beta on HV value heads (q and k keep H)."""
    values = {"v": torch.randn(B, T, HV, V), "g": -torch.rand(B, T, HV), "beta": torch.rand(B, T, HV)}
    return with_("gated_delta_rule", **{**values, **changes})


def grouped_kda(HV, **changes):
    """kda's arguments with v, g (per key channel) and beta on HV value heads (q and k keep H)."""
    args = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, HV, V),
            "g": -torch.rand(B, T, HV, K), "beta": torch.rand(B, T, HV)}
    kwargs = {k: changes.pop(k) for k in list(changes) if k not in args}
    args.update(changes)
    return args, kwargs


def packed(op, cu):
    args = {k: (v[:1] if v.dim() > 1 else v) for k, v in base(op).items()}
    return args, {"cu_seqlens": torch.tensor(cu, dtype=torch.int32)}


def with_(op, **changes):
    args = base(op)
    kwargs = {k: changes.pop(k) for k in list(changes) if k not in args}
    args.update(changes)
    return args, kwargs


# (id, op, builder -> (tensor args, keyword args), exception type, words that must be in the message)
CASES = [
    ("beta missing", "delta_rule", lambda: with_("delta_rule", beta=None), TypeError,
     "beta must be a torch.Tensor, got None"),
    ("beta per channel", "gated_delta_rule", lambda: with_("gated_delta_rule", beta=torch.rand(B, T, H, K)),
     ValueError, "beta must be [B, T, HV]"),
    ("q is a list", "linear_attn", lambda: with_("linear_attn", q=[[1.0]]), TypeError, "q must be a torch.Tensor"),
    ("required gate missing", "gla", lambda: with_("gla", g=None), TypeError, "g must be a torch.Tensor, got None"),
    ("q has 3 dims", "linear_attn", lambda: with_("linear_attn", q=torch.randn(B, T, K)), ValueError, "q must be"),
    ("k shorter in T", "linear_attn", lambda: with_("linear_attn", k=torch.randn(B, T - 1, H, K)), ValueError,
     "k has T = 15"),
    ("v has other heads", "gla", lambda: with_("gla", v=torch.randn(B, T, H + 1, V)), ValueError, "v has H = 3"),
    ("k has other K", "simple_gla", lambda: with_("simple_gla", k=torch.randn(B, T, H, K + 1)), ValueError,
     "k has K = 9"),
    ("gla gate per token only", "gla", lambda: with_("gla", g=torch.randn(B, T, H)), ValueError,
     "g must be [B, T, H, K]"),
    ("simple_gla gate per channel", "simple_gla", lambda: with_("simple_gla", g=torch.randn(B, T, H, K)),
     ValueError, "g must be [B, T, H]"),
    ("g_gamma wrong length", "simple_gla", lambda: with_("simple_gla", g_gamma=torch.randn(H + 2)), ValueError,
     "g_gamma has H = 4"),
    ("integer q", "linear_attn", lambda: with_("linear_attn", q=torch.ones(B, T, H, K, dtype=torch.int32)),
     TypeError, "q must be float16, bfloat16 or float32"),
    ("mixed input dtypes", "gla", lambda: with_("gla", k=torch.randn(B, T, H, K, dtype=torch.float16)), TypeError,
     "k is torch.float16 but q is torch.float32"),
    ("gate in a third dtype", "gla", lambda: with_("gla", g=-torch.rand(B, T, H, K, dtype=torch.float16)),
     TypeError, "gate g must be float32"),
    ("float64 inputs", "linear_attn", lambda: ({k: v.double() for k, v in base("linear_attn").items()}, {}), TypeError,
     "q must be float16, bfloat16 or float32"),
    ("head dim too large", "linear_attn", lambda: with_("linear_attn", q=torch.randn(B, T, H, 300),
                                                        k=torch.randn(B, T, H, 300)), ValueError, "K = 300"),
    ("scale NaN", "gla", lambda: with_("gla", scale=math.nan), ValueError, "scale must be finite"),
    ("scale inf", "simple_gla", lambda: with_("simple_gla", scale=math.inf), ValueError, "scale must be finite"),
    ("scale a string", "linear_attn", lambda: with_("linear_attn", scale="0.1"), TypeError, "scale must be a float"),
    ("scale a tensor", "linear_attn", lambda: with_("linear_attn", scale=torch.tensor(0.1)), TypeError,
     "scale must be a float"),
    ("output_final_state not bool", "gla", lambda: with_("gla", output_final_state="yes"), TypeError,
     "output_final_state must be a bool"),
    ("initial_state wrong shape", "gla", lambda: with_("gla", initial_state=torch.zeros(B, H, V, K)), ValueError,
     "initial_state must be [N, H, K, V] = [2, 2, 8, 12]"),
    ("initial_state bf16", "simple_gla",
     lambda: with_("simple_gla", initial_state=torch.zeros(B, H, K, V, dtype=torch.bfloat16)), TypeError,
     "initial_state must be float32"),
    ("empty T", "linear_attn", lambda: ({k: v[:, :0] for k, v in base("linear_attn").items()}, {}), ValueError,
     "empty dimension"),
    ("cu_seqlens float", "gla", lambda: (packed("gla", [0, T])[0], {"cu_seqlens": torch.tensor([0.0, T])}),
     TypeError, "cu_seqlens must be int32 or int64"),
    ("cu_seqlens 2-D", "gla", lambda: (packed("gla", [0, T])[0], {"cu_seqlens": torch.tensor([[0, T]])}),
     ValueError, "cu_seqlens must be 1-D"),
    ("cu_seqlens one entry", "gla", lambda: (packed("gla", [0, T])[0], {"cu_seqlens": torch.tensor([0])}),
     ValueError, "cu_seqlens must be 1-D [N + 1] with N >= 1"),
    ("cu_seqlens not from 0", "linear_attn", lambda: packed("linear_attn", [3, 8, T]), ValueError,
     "cu_seqlens must start at 0"),
    ("cu_seqlens decreasing", "simple_gla", lambda: packed("simple_gla", [0, 10, 6, T]), ValueError,
     "cu_seqlens must be non-decreasing"),
    ("cu_seqlens past T", "gla", lambda: packed("gla", [0, 10, T + 4]), ValueError, "cu_seqlens must end at T = 16"),
    ("cu_seqlens short of T", "gla", lambda: packed("gla", [0, 10]), ValueError, "cu_seqlens must end at T = 16"),
    ("cu_seqlens with B = 2", "linear_attn", lambda: (base("linear_attn"), {"cu_seqlens": torch.tensor([0, T])}),
     ValueError, "B = 1"),
    ("initial_state N != sequences", "gla",
     lambda: (packed("gla", [0, 5, T])[0], {"cu_seqlens": torch.tensor([0, 5, T]),
                                            "initial_state": torch.zeros(1, H, K, V)}), ValueError,
     "initial_state must be [N, H, K, V] = [2, 2, 8, 12] (N = number of sequences)"),
    ("cu_seqlens_cpu alone", "gla", lambda: (packed("gla", [0, T])[0], {"cu_seqlens_cpu": torch.tensor([0, T])}),
     ValueError, "cu_seqlens_cpu was given without cu_seqlens"),
    ("cu_seqlens_cpu disagrees", "gla",
     lambda: (packed("gla", [0, T])[0], {"cu_seqlens": torch.tensor([0, T]),
                                     "cu_seqlens_cpu": torch.tensor([0, 4, T], device="cpu")}),
     ValueError, "cu_seqlens_cpu has shape [3] but cu_seqlens has [2]"),
    ("value heads not a multiple of H", "gated_delta_rule", lambda: grouped(3), ValueError,
     "v has HV = 3 value heads but q has H = 2 heads; HV must be a multiple of H"),
    ("gate on other value heads than v", "gated_delta_rule", lambda: grouped(4, g=-torch.rand(B, T, 6)), ValueError,
     "g has HV = 6 (shape [2, 16, 6]) but v has HV = 4; expected g [B, T, HV]"),
    ("grouped initial_state on H heads", "gated_delta_rule",
     lambda: grouped(4, initial_state=torch.zeros(B, H, K, V)), ValueError,
     "initial_state must be [N, HV, K, V] = [2, 4, 8, 12]"),
    ("A_log missing with the gate on", "kda", lambda: with_("kda", use_gate_in_kernel=True), ValueError,
     "A_log is required when use_gate_in_kernel=True"),
    ("A_log with the gate off", "kda", lambda: with_("kda", A_log=torch.zeros(H)), ValueError,
     "A_log is given but use_gate_in_kernel is False"),
    ("dt_bias with the gate off", "kda", lambda: with_("kda", dt_bias=torch.zeros(H * K)), ValueError,
     "dt_bias is given but use_gate_in_kernel is False"),
    ("A_log per channel", "kda", lambda: gate(A_log=torch.zeros(H, K)), ValueError, "A_log must be [HV] (1 dims)"),
    ("A_log on other heads", "kda", lambda: gate(A_log=torch.zeros(H + 1)), ValueError,
     "A_log has HV = 3 (shape [3]) but v has HV = 2; expected A_log [HV]"),
    ("dt_bias flat of another length", "kda", lambda: gate(dt_bias=torch.zeros(H * K + 1)), ValueError,
     "dt_bias must be [HV, K] or flat [HV * K] = [16] (HV = 2, K = 8), got shape [17]"),
    ("dt_bias per head only", "kda", lambda: gate(dt_bias=torch.zeros(H)), ValueError,
     "dt_bias must be [HV, K] or flat [HV * K] = [16] (HV = 2, K = 8), got shape [2]"),
    ("dt_bias over other channels", "kda", lambda: gate(dt_bias=torch.zeros(H, K + 1)), ValueError,
     "dt_bias has K = 9 (shape [2, 9]) but q has K = 8; expected dt_bias [HV, K] or flat [HV * K]"),
    ("dt_bias on other heads", "kda", lambda: gate(dt_bias=torch.zeros(H + 1, K)), ValueError,
     "dt_bias has HV = 3 (shape [3, 8]) but v has HV = 2"),
    ("dt_bias per token", "kda", lambda: gate(dt_bias=torch.zeros(B, T, H, K)), ValueError,
     "dt_bias must be [HV, K] (2 dims) or flat [HV * K], got shape [2, 16, 2, 8]"),
    ("dt_bias float64", "kda", lambda: gate(dt_bias=torch.zeros(H * K, dtype=torch.float64)), TypeError,
     "dt_bias must be float16, bfloat16 or float32"),
    ("A_log in a third dtype", "kda", lambda: gate(A_log=torch.zeros(H, dtype=torch.bfloat16)), TypeError,
     "gate A_log must be float32 or torch.float32 (the inputs' dtype), got torch.bfloat16"),
    ("kda value heads not a multiple of H", "kda", lambda: grouped_kda(3), ValueError,
     "v has HV = 3 value heads but q has H = 2 heads; HV must be a multiple of H"),
    ("kda gate on the query/key heads", "kda", lambda: grouped_kda(4, g=-torch.rand(B, T, H, K)), ValueError,
     "g has HV = 2 (shape [2, 16, 2, 8]) but v has HV = 4; expected g [B, T, HV, K]"),
    ("kda gate per head only", "kda", lambda: grouped_kda(4, g=-torch.rand(B, T, 4)), ValueError,
     "g must be [B, T, HV, K]"),
    ("kda beta on the query/key heads", "kda", lambda: grouped_kda(4, beta=torch.rand(B, T, H)), ValueError,
     "beta has HV = 2 (shape [2, 16, 2]) but v has HV = 4; expected beta [B, T, HV]"),
    ("kda grouped initial_state on H heads", "kda", lambda: grouped_kda(4, initial_state=torch.zeros(B, H, K, V)),
     ValueError, "initial_state must be [N, HV, K, V] = [2, 4, 8, 12]"),
    ("tensor on another device", "linear_attn", lambda: with_("linear_attn", v=torch.empty(B, T, H, V, device="meta")),
     ValueError, "v is on meta but q is on"),
]


def call(op, mode, build):
    args, kwargs = build()
    fn = getattr(generated(op), f"{mode}_{op}")
    return fn(*args.values(), **kwargs)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize(("op", "build", "error", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_on_the_host(op, build, error, words, mode, monkeypatch):
    import triton
    import triton.runtime.interpreter
    import triton.runtime.jit

    def no_launch(*a, **k):
        raise AssertionError("a kernel was launched for a bad input")

    for cls in (triton.runtime.jit.JITFunction, triton.runtime.interpreter.InterpretedFunction):
        monkeypatch.setattr(cls, "run", no_launch, raising=False)
    with pytest.raises(error) as info:
        call(op, mode, build)
    message = str(info.value)
    assert words in message, message
    assert message.startswith(f"{mode}_{op}: "), message


def test_at_least_25_cases():
    assert len(CASES) >= 25


def test_a_valid_call_still_works_after_the_bad_ones():
    """After every refusal above (on a GPU: the CUDA context is not poisoned), a good call runs."""
    from fla_gen.verify import verify_op
    from tests.support import recurrence

    device = str(torch.empty(0).device)
    result = verify_op(generated("gla"), recurrence("gla"), "chunk", torch.float32, B=1, T=40, H=2, K=16, V=16,
                       device=device, cu_seqlens=[0, 7, 40])
    assert not result.failures(), result.errors


def test_a_call_with_the_shapes_of_an_accepted_one_is_still_checked():
    """validate_call skips the tensor checks of a dense call whose tensors match an accepted call's shapes, dtypes
    and devices: what differs from it (a dtype, a scalar, initial_state, a non-tensor) is refused all the same,
    with the message of a first call."""
    from fla_gen.runtime import validate

    op = generated("simple_gla")
    good = base("simple_gla")
    fn = op.chunk_simple_gla
    validate._ACCEPTED.clear()
    fn(*good.values())
    accepted = len(validate._ACCEPTED)
    assert accepted == 1
    bad = [
        ({"v": good["v"].double()}, {}, TypeError, "v must be float16, bfloat16 or float32"),
        ({"v": good["v"].half()}, {}, TypeError, "v is torch.float16 but q is torch.float32"),
        ({}, {"scale": math.nan}, ValueError, "scale must be finite"),
        ({}, {"output_final_state": 1}, TypeError, "output_final_state must be a bool"),
        ({}, {"initial_state": torch.zeros(B, H, K, K)}, ValueError, "initial_state must be [N, H, K, V]"),
        ({"g": good["g"].tolist()}, {}, TypeError, "g must be a torch.Tensor, got list"),
    ]
    for changes, kwargs, error, words in bad:
        with pytest.raises(error) as info:
            fn(*{**good, **changes}.values(), **kwargs)
        assert words in str(info.value), str(info.value)
    o, _ = fn(*good.values())
    assert o.shape == (B, T, H, V)
    assert len(validate._ACCEPTED) == accepted  # the refused calls were not remembered
