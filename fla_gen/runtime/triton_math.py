"""Device functions that the generated kernels share (imported into each generated module that uses them)."""

import triton
import triton.language as tl


@triton.jit
def exp_ftz(x):
    """exp(x) of an fp32 tensor, any shape, as ex2.approx.ftz.f32(x * log2(e)).

    tl.exp on fp32 lowers to a multiply and ex2.approx.f32 (Triton 3.6), whose denormal handling adds
    instructions around each MUFU.EX2; tl.exp2 lowers to the flush-to-zero form. The only values that differ are
    results below 2^-126 (0 here) and denormal arguments (read as 0). Every gate decay of the templates goes
    through it: GPU kernel time per call at 1x16384x16x128, bf16, H200 (compare_builds.py against tl.exp), gla's
    forward 0.602 -> 0.559 ms and forward+backward 2.029 -> 1.870, KDA's 3.372 -> 3.231, the gated delta rule's
    forward 0.499 -> 0.485; the scalar-gate walk alone 0.150 -> 0.136 ms.
    """
    return tl.exp2(x * 1.4426950408889634)
