"""Which precision every launch asks of tl.dot: "ieee" for fp32 inputs, "tf32" for 16-bit ones (launch.dot_precision).

The interpreter computes every dot in full precision whatever the launch asks, so a kernel that got "tf32" for fp32
inputs would still match the reference on a CPU; only the launch arguments show the choice. Every shipped spec's
chunk op runs forward and backward on sm80's and sm90's plans (their paths differ: sm90 takes the fused walks)."""

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from fla_gen.runtime.dispatch import forced_arch
from fla_gen.sample import sample_inputs
from tests.support import SPECS, generated, grads_of, recurrence


def _precisions_asked(monkeypatch) -> list[tuple[str, str]]:
    """(kernel, DOT_PRECISION) of every interpreted launch that passes one, from now on."""
    asked = []
    run = InterpretedFunction.run

    def recording(self, *args, **kwargs):
        if "DOT_PRECISION" in kwargs:
            asked.append((self.fn.__name__, kwargs["DOT_PRECISION"]))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording)
    return asked


@pytest.mark.parametrize("arch", ["sm80", "sm90"])
@pytest.mark.parametrize(("dtype", "expected"), [(torch.float32, "ieee"), (torch.float16, "tf32")],
                         ids=["fp32", "fp16"])
@pytest.mark.parametrize("op", [p.stem for p in SPECS])
def test_every_dot_precision_follows_the_input_dtype(op, dtype, expected, arch, monkeypatch):
    """op: the spec file's stem (its package); the chunk op is named after the spec's op line."""
    rec = recurrence(op)
    chunk = getattr(generated(op), f"chunk_{rec.spec.op}")
    x = sample_inputs(rec, 1, 40, 2, 16, 16, dtype, seed=5)
    asked = _precisions_asked(monkeypatch)
    with forced_arch(arch):
        grads_of(chunk, {n: t.requires_grad_(t.is_floating_point()) for n, t in x.items()}, ())
    assert asked, f"chunk_{op} launched no kernel that takes DOT_PRECISION"
    assert {p for _k, p in asked} == {expected}, sorted(set(asked))
