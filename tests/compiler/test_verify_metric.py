"""fla_gen.verify's errors: a per-head gradient (a sum over every token) is measured against its typical size,
not against one draw's cancellation, and a wrong one still fails; sample_inputs repeats under
torch.manual_seed without reseeding the caller's generator. Toy ops on the CPU, no kernels."""

import statistics

import torch

from fla_gen.sample import relative_error, sample_inputs
from fla_gen.verify import TOLERANCE, compare_with_reference
from tests.support import recurrence


class _PerTokenError(torch.autograd.Function):
    """The identity on p broadcast to every token ([B, T, H]), whose backward scales each token's gradient by
    (1 + e) with e = ``bias`` + ``noise`` * (a random sign): a gradient ``bias`` off, or rounded per token as a
    kernel's is (an error that scales with the contributions, not with their sum)."""

    @staticmethod
    def forward(ctx, p_tokens, bias, noise):
        ctx.bias, ctx.noise = bias, noise
        return p_tokens.view_as(p_tokens)

    @staticmethod
    def backward(ctx, grad):
        signs = torch.randint(0, 2, grad.shape, generator=torch.Generator().manual_seed(5)) * 2.0 - 1.0
        return grad * (1 + ctx.bias + ctx.noise * signs), None, None


def _toy(bias: float = 0.0, noise: float = 0.0):
    """o = x + p ([B, T, H, 1]: every token adds the per-head p), final state S0 + 1: dp is the sum over B and
    T of do, which cancels in some draws of do."""
    def op(x, p, initial_state=None, output_final_state=True, **_):
        o = (x + _PerTokenError.apply(p.expand_as(x), bias, noise)).unsqueeze(-1)
        return o, (initial_state + 1).float()
    return op


def _inputs(T: int = 8, H: int = 2):
    gen = torch.Generator().manual_seed(4)
    return {"x": torch.randn(1, T, H, generator=gen), "p": torch.randn(H, generator=gen),
            "initial_state": torch.randn(1, H, 3, 3, generator=gen)}


def test_relative_error_divides_by_the_larger_of_the_norm_and_the_scale():
    ref, out = torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.5])
    assert relative_error(out, ref) == 0.5 / 5
    assert relative_error(out, ref, scale=50.0) == 0.5 / 50
    assert relative_error(out, ref, scale=1.0) == 0.5 / 5
    assert relative_error(torch.tensor([float("nan"), 4.0]), ref, scale=50.0) == float("inf")


def test_a_wrong_per_head_gradient_fails_and_a_right_one_passes():
    torch.manual_seed(0)
    right = compare_with_reference(_toy(), _toy(), _inputs(), torch.float32, name="toy")
    assert right.errors["dp"] < 1e-6 and not right.failures()  # fp32 against float64
    # a typical draw's norm and this draw's are both of the right gradient: 10% off stays far over tolerance
    for seed in range(5):
        torch.manual_seed(seed)
        wrong = compare_with_reference(_toy(bias=0.1), _toy(), _inputs(), torch.float32, name="toy")
        assert 0.02 < wrong.errors["dp"] <= 0.1 + 1e-6, wrong.errors
        assert "dp" in wrong.failures()
        assert wrong.errors["dx"] < 1e-6  # per-token inputs are measured as before


def test_a_cancelled_per_head_gradient_is_measured_against_its_typical_size():
    # one head: dp = the sum over 4 tokens of do, each token's term off by +-1e-4, as rounding leaves it
    measured, against_this_draw = [], []
    signs = torch.randint(0, 2, (1, 4, 1), generator=torch.Generator().manual_seed(5)) * 2.0 - 1.0
    for seed in range(1000):
        torch.manual_seed(seed)
        result = compare_with_reference(_toy(noise=1e-4), _toy(), _inputs(T=4, H=1), torch.float32, name="toy")
        measured.append(result.errors["dp"])
        torch.manual_seed(seed)  # the same draw of do, dp by hand: its error against this draw's norm alone
        do = torch.randn(1, 4, 1, 1).squeeze(-1).double()
        against_this_draw.append(relative_error((do * (1 + 1e-4 * signs)).sum((0, 1)), do.sum((0, 1))))
    tol = TOLERANCE[torch.float16][1]
    assert sum(e > tol for e in against_this_draw) >= 3  # the hazard: draws that cancel 50x fail a tolerance ...
    assert max(measured) < tol / 2, sorted(measured)[-5:]  # ... that the typical size keeps
    assert statistics.median(measured) > 1e-5  # and the error is still seen


def test_sample_inputs_repeat_under_manual_seed_and_leave_the_generator_seeded():
    rec = recurrence("simple_gla")
    draws = []
    for _ in range(2):
        torch.manual_seed(11)
        x = sample_inputs(rec, 1, 5, 2, 4, 4, torch.float32)
        draws.append((x, torch.rand(3)))  # the generator continues from where the seed put it
    (a, after_a), (b, after_b) = draws
    assert all(torch.equal(a[n], b[n]) for n in a) and torch.equal(after_a, after_b)
    torch.manual_seed(12)
    assert not torch.equal(sample_inputs(rec, 1, 5, 2, 4, 4, torch.float32)["q"], a["q"])
