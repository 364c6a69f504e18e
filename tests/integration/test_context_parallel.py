"""Context parallelism (fla_gen/runtime/context_parallel.py): every shipped chunk op, run over 2 and 4 gloo
processes on a packed batch whose sequences span ranks, equals the same op run in one process on the whole
batch (outputs and the gradients of every input), in Triton's interpreter. Plus the pure parts (the local
offsets, the merge) against hand-computed cases, and the refusals.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import astuple, dataclass, field
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from fla_gen.runtime.context_parallel import (
    CPContext,
    PrePass,
    check_global_cu_seqlens,
    choose_pre_pass,
    local_sequences,
    merge_states,
)

TOLERANCE = 1e-4  # fp32 in the interpreter; measured: up to 1e-5 (sums of per-head gradients over ranks)


@dataclass(frozen=True)
class Case:
    """One op at world size R on a packed batch [1, T, ...] with global offsets ``cu``."""

    package: str
    cu: tuple[int, ...]
    K: int = 16
    V: int = 16
    H: int = 2
    HV: int | None = None  # value heads of a grouped op
    kwargs: dict = field(default_factory=dict)  # extra keywords of both calls (flags, seqlen_offsets)
    split: bool = False  # force the two-call pre-pass (as if the op had no plan at width K + V)
    variant: bool = False  # a spec of tests/variants, built by the test (VARIANT_DIR on sys.path)

    @property
    def name(self) -> str:
        return f"{self.package}-K{self.K}V{self.V}" + ("-split" if self.split else "") + \
            ("".join(f"-{k}" for k in self.kwargs))


# World 2, T = 64 (32 tokens a rank): sequence [10, 52) spans the rank boundary.
CU_2 = (0, 10, 52, 64)
CASES_2 = (
    Case("linear_attn", CU_2),
    Case("simple_gla", CU_2),
    Case("gla", CU_2, V=32),  # K != V
    Case("delta_rule", CU_2),
    Case("gated_delta_rule", CU_2, HV=4),  # grouped value heads, HV = 2 H
    Case("gated_delta_rule_rope", CU_2, kwargs={"seqlen_offsets": (3, 0, 5)}),
    Case("kda", CU_2),
    Case("dplr", CU_2),
    Case("rwkv7", CU_2),
)
# World 4, T = 128 (32 a rank): a sequence ends exactly on the boundary of ranks 0 and 1, [40, 120) spans ranks
# 1, 2 and 3 (rank 2 holds one piece of it: its transition M enters the merge).
CU_4 = (0, 20, 32, 40, 120, 128)
CASES_4 = (
    Case("gated_delta_rule", CU_4, HV=4, kwargs={"use_qk_l2norm_in_kernel": True}),
    Case("kda", CU_4, HV=4, kwargs={"use_qk_l2norm_in_kernel": True}),  # grouped value heads, HV = 2 H
    Case("gla", CU_4, K=16, V=32),
    Case("rwkv7", CU_4, kwargs={"gate_lower_bound": -0.7}),
    Case("simple_gla", CU_4),
    Case("delta_rule", CU_4, split=True),  # no decay: the transition M carries the most
    Case("ssd", CU_4, variant=True),  # Mamba-2: the values dt * v are derived, and widened to [0 | dt * v]
)


def _recurrence(case: Case):
    from fla_gen.cli import compile_spec
    from tests.support import VARIANTS_DIR, recurrence

    return compile_spec(VARIANTS_DIR / f"{case.package}.fla")[0] if case.variant else recurrence(case.package)


def _build_variants(cases: tuple[Case, ...], directory: Path) -> None:
    """Build the variant specs of ``cases`` into ``directory`` (once, before the ranks import them)."""
    from fla_gen.cli import compile_spec
    from fla_gen.write import write_files
    from tests.support import VARIANTS_DIR

    for case in cases:
        if case.variant:
            write_files(compile_spec(VARIANTS_DIR / f"{case.package}.fla")[1], directory)


def _inputs(case: Case, T: int) -> dict[str, torch.Tensor]:
    from fla_gen.canonical import GateKind
    from fla_gen.sample import log_gate_inputs, sample_inputs

    rec = _recurrence(case)
    x = sample_inputs(rec, 1, T, case.H, case.K, case.V, torch.float32, seed=7, HV=case.HV)
    # Long memory, as GLA's layers parameterize it (logsigmoid / 16): with sample_inputs' decays (~0.5 a token)
    # the state a rank hands on after 32 tokens is ~1e-9 of what it received, and a wrong transition M would pass.
    for name, kind in log_gate_inputs(rec).items():
        if kind is not GateKind.HEAD:
            x[name] = x[name] / 16
    if case.package == "rwkv7":  # RWKV-7's decay w = -exp(-0.5) sigmoid(.), so that gate_lower_bound holds
        x["w"] = -0.6065 / 16 * torch.sigmoid(torch.randn(x["w"].shape, generator=torch.Generator().manual_seed(1)))
    return x


def _chunk_op(case: Case):
    import importlib

    pkg = importlib.import_module(case.package if case.variant else f"generated.{case.package}")
    return getattr(pkg, next(n for n in pkg.__all__ if n.startswith("chunk_")))


def _kwargs(case: Case) -> dict:
    out = dict(case.kwargs)
    if "seqlen_offsets" in out:
        out["seqlen_offsets"] = torch.tensor(out["seqlen_offsets"], dtype=torch.int64)
    return out


def _single_process(case: Case, T: int) -> dict[str, torch.Tensor]:
    """The op on the whole batch in this process: o, do and the gradient of every input."""
    from tests.support import poisoned_allocations

    x = {n: t.requires_grad_() for n, t in _inputs(case, T).items()}
    cu = torch.tensor(case.cu, dtype=torch.int64)
    with poisoned_allocations():
        o, _ = _chunk_op(case)(**x, cu_seqlens=cu, cu_seqlens_cpu=cu, **_kwargs(case))
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(o, list(x.values()), do)
    return {"o": o.detach(), "do": do, **{f"d{n}": g for n, g in zip(x, grads, strict=True)}}


def _worker(rank: int, world: int, init_file: str, cases: tuple[Case, ...], out_dir: str) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton (inherited from pytest too)
    sys.path.insert(0, str(Path(out_dir, "variants")))
    import torch.distributed as dist

    from fla_gen.runtime import build_cp_context
    from fla_gen.runtime import context_parallel as cp
    from fla_gen.sample import relative_error
    from tests.support import poisoned_allocations

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    # The single-process references, one case per rank at a time, then shared.
    refs = [None] * len(cases)
    for i, case in enumerate(cases):
        if i % world == rank:
            refs[i] = _single_process(case, case.cu[-1])
    for i in range(len(cases)):
        box = [refs[i]]
        dist.broadcast_object_list(box, src=i % world)
        refs[i] = box[0]
    for case, ref in zip(cases, refs, strict=True):
        T = case.cu[-1]
        size = T // world
        ctx = build_cp_context(torch.tensor(case.cu, dtype=torch.int32))
        mine = slice(rank * size, (rank + 1) * size)
        x = {n: (t[:, mine] if t.dim() >= 3 else t).contiguous().requires_grad_() for n, t in _inputs(case, T).items()}
        covers = cp.plan_covers
        if case.split:
            cp.plan_covers = lambda *args: False
        try:
            with poisoned_allocations():
                o, final = _chunk_op(case)(**x, cp_context=ctx, **_kwargs(case))
            grads = torch.autograd.grad(o, list(x.values()), ref["do"][:, mine])
        finally:
            cp.plan_covers = covers
        errors = {"o": relative_error(o, ref["o"][:, mine]), "final_state_is_none": float(final is not None)}
        for (n, t), g in zip(x.items(), grads, strict=True):
            if t.dim() >= 3:
                errors[f"d{n}"] = relative_error(g, ref[f"d{n}"][:, mine])
            else:  # a per-head input: every rank holds the gradient of its own tokens
                dist.all_reduce(g)
                errors[f"d{n}"] = relative_error(g, ref[f"d{n}"])
        results[case.name] = errors
    # a layer: the short convolution reads the inputs of the rank before, masked to the same sequence
    results["layer"] = _layer_errors(rank, world, LAYER_CU[world])
    # the context of the ops' batch, field by field
    ctx = build_cp_context(torch.tensor(cases[0].cu))
    results["context"] = [ctx.cu_seqlens.tolist(), list(ctx.sequence_ids), list(ctx.position_offsets),
                          list(ctx.continues), list(ctx.carries), str(ctx.cu_seqlens.dtype)]
    # the context's own checks
    messages = []
    for bad in ([0, 10, 63], [0, 40, 30, 64], [1, 64]):
        try:
            build_cp_context(torch.tensor(bad))
        except ValueError as e:
            messages.append(str(e))
    results["messages"] = messages
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# The layer's batch: at world 2 the sequence [30, 50) starts 2 tokens before rank 1 (its convolution of width 4
# reads 2 rows of rank 0 and one zero row); at world 4 the offsets of the ops.
LAYER_CU = {2: (0, 30, 50, 64), 4: CU_4}


def _layer_errors(rank: int, world: int, cu: tuple[int, ...]) -> dict[str, float]:
    """A GatedLayer (simple GLA, convolution width 4) in context parallel against the same layer in one process:
    outputs, input gradients and every parameter's gradient (summed over the ranks)."""
    import torch.distributed as dist

    import generated.simple_gla
    from fla_gen.layers import layer_for
    from fla_gen.runtime import build_cp_context
    from fla_gen.sample import relative_error

    torch.manual_seed(0)
    layer = layer_for(generated.simple_gla, hidden_size=32, num_heads=2, head_k_dim=16, conv_size=4)
    T = cu[-1]
    x = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(4), requires_grad=True)
    dy = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(5))
    params = list(layer.parameters())
    y, _ = layer(x, cu_seqlens=torch.tensor(cu))
    ref = torch.autograd.grad(y, [x, *params], dy)
    size = T // world
    mine = slice(rank * size, (rank + 1) * size)
    x_local = x.detach()[:, mine].clone().requires_grad_()
    y_local, _ = layer(x_local, cp_context=build_cp_context(torch.tensor(cu)))
    grads = torch.autograd.grad(y_local, [x_local, *params], dy[:, mine])
    errors = {"y": relative_error(y_local, y[:, mine]), "dx": relative_error(grads[0], ref[0][:, mine])}
    for (name, _), g, g_ref in zip(layer.named_parameters(), grads[1:], ref[1:], strict=True):
        dist.all_reduce(g)
        errors[f"d{name}"] = relative_error(g, g_ref)
    return errors


def _run(world: int, cases: tuple[Case, ...], tmp_path: Path) -> list[dict]:
    _build_variants(cases, tmp_path / "variants")
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), cases, str(tmp_path)), nprocs=world)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


# build_cp_context's fields on each rank, by hand: local offsets, global sequence of each local one, its tokens
# on earlier ranks; per rank of the group, whether the first sequence continues, whether the rank carries one
# piece of a sequence begun earlier.
CONTEXTS = {
    2: [[[0, 10, 32], [0, 1], [0, 0]], [[0, 20, 32], [1, 2], [22, 0]]],
    4: [[[0, 20, 32], [0, 1], [0, 0]], [[0, 8, 32], [2, 3], [0, 0]], [[0, 32], [3], [24]],
        [[0, 24, 32], [3, 4], [56, 0]]],
}
CHAINS = {2: [[False, True], [False, False]], 4: [[False, False, True, True], [False, False, True, False]]}


@pytest.mark.parametrize("world,cases", [(2, CASES_2), (4, CASES_4)], ids=["world2", "world4"])
def test_context_parallel_equals_single_process(world, cases, tmp_path):
    results = _run(world, cases, tmp_path)
    for rank, res in enumerate(results):
        assert res["context"] == [*CONTEXTS[world][rank], *CHAINS[world], "torch.int64"], f"rank {rank}"
    worst = max(e for res in results for case in cases for k, e in res[case.name].items() if k.startswith(("o", "d")))
    print(f"world {world}: largest relative error {worst:.1e}")
    for rank, res in enumerate(results):
        for case in cases:
            errors = res[case.name]
            assert errors.pop("final_state_is_none") == 0.0, f"{case.name} rank {rank}: final_state must be None"
            assert len(errors) >= 4, errors  # o and the gradients of q, k, v at least
            bad = {k: e for k, e in errors.items() if not e <= TOLERANCE}
            assert not bad, f"{case.name} on rank {rank} of {world}: relative errors {bad}"
        layer = res["layer"]
        assert "dconv" in layer and len(layer) > 6, layer
        bad = {k: e for k, e in layer.items() if not e <= TOLERANCE}
        assert not bad, f"layer on rank {rank} of {world}: relative errors {bad}"
        assert len(res["messages"]) == 3
        assert "multiple of the group size" in res["messages"][0]
        assert "non-decreasing" in res["messages"][1]
        assert "must start at 0" in res["messages"][2]


# ----------------------------------------------------------------------------- pure parts


def test_local_sequences_hand_computed():
    # rank 0 and 1 of [0, 10, 52, 64] at 32 tokens a rank: [10, 52) spans the boundary
    assert astuple(local_sequences([0, 10, 52, 64], 0, 32)) == ((0, 10, 32), (0, 1), (0, 0), False, True)
    assert astuple(local_sequences([0, 10, 52, 64], 32, 64)) == ((0, 20, 32), (1, 2), (22, 0), True, False)
    # a boundary exactly on the rank's start: nothing continues
    assert astuple(local_sequences([0, 32, 64], 32, 64)) == ((0, 32), (1,), (0,), False, False)
    # one piece of a sequence that spans three ranks; the empty sequence [10, 10) is skipped
    assert astuple(local_sequences([0, 10, 10, 100, 128], 32, 64)) == ((0, 32), (2,), (22,), True, True)
    # the empty sequence at the start of a rank
    assert astuple(local_sequences([0, 32, 32, 64], 32, 64)) == ((0, 32), (2,), (0,), False, False)


def test_merge_follows_the_chain():
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(4, 2, 3, 3, generator=gen)
    C = torch.randn(4, 2, 3, 5, generator=gen)
    # one sequence over ranks 0..3: rank 3 starts from M2 (M1 C0 + C1) + C2
    continues, carries = (False, True, True, True), (False, True, True, True)
    expected = M[2] @ (M[1] @ C[0] + C[1]) + C[2]
    assert torch.allclose(merge_states(M, C, continues, carries, 3), expected, atol=1e-6)
    assert torch.allclose(merge_states(M, C, continues, carries, 1), C[0])
    assert merge_states(M, C, continues, carries, 0) is None
    # rank 2 starts a sequence that goes on to rank 3 (rank 2 holds two pieces): rank 3 reads C2 alone
    continues, carries = (False, True, True, True), (False, True, False, True)
    assert torch.equal(merge_states(M, C, continues, carries, 3), C[2])
    # a boundary on rank 3's start: nothing reaches it
    assert merge_states(M, C, (False, True, True, False), (False, True, True, False), 3) is None


def test_pre_pass_choice():
    assert choose_pre_pass(carries=True, continued=False, joint_width_planned=True) is PrePass.NONE
    assert choose_pre_pass(carries=False, continued=True, joint_width_planned=True) is PrePass.CONTRIBUTION
    assert choose_pre_pass(carries=True, continued=True, joint_width_planned=True) is PrePass.JOINT
    assert choose_pre_pass(carries=True, continued=True, joint_width_planned=False) is PrePass.SPLIT


@pytest.mark.parametrize("bounds,words", [
    ([0], "at least 2 entries"), ([3, 64], "start at 0"), ([0, 40, 30, 64], "non-decreasing"),
    ([0, 63], "multiple of the group size 2"), ([0, 0], "positive multiple"),
])
def test_global_offsets_are_checked(bounds, words):
    with pytest.raises(ValueError, match=words):
        check_global_cu_seqlens(bounds, 2)


# ----------------------------------------------------------------------------- refusals (no process group needed)


def _context(world: int = 2, tokens: int = 64) -> CPContext:
    """Rank 0's context of one sequence over ``world`` ranks, built by hand (errors come before any collective)."""
    local = torch.tensor([0, tokens // world], dtype=torch.int64)
    return CPContext(group=None, rank=0, world_size=world, tokens=tokens, cu_seqlens=local, cu_seqlens_cpu=local,
                     sequence_ids=(0,), position_offsets=(0,), continues=(False,) + (True,) * (world - 1),
                     carries=(False,) + (True,) * (world - 1))


@pytest.mark.parametrize("extra,error,words", [
    ({"initial_state": torch.zeros(1, 2, 16, 16)}, ValueError, "initial_state is not supported with cp_context"),
    ({"output_final_state": True}, ValueError, "output_final_state=True is not supported with cp_context"),
    ({"cu_seqlens": torch.tensor([0, 32])}, ValueError, "cu_seqlens must be None with cp_context"),
    ({"cu_seqlens_cpu": torch.tensor([0, 32])}, ValueError, "cu_seqlens_cpu must be None with cp_context"),
    ({"cp_context": object()}, TypeError, "cp_context must be a CPContext"),
])
def test_bad_arguments_with_cp_context(extra, error, words):
    from fla_gen.sample import sample_inputs
    from tests.support import generated, recurrence

    x = sample_inputs(recurrence("gla"), 1, 32, 2, 16, 16, torch.float32, seed=0)
    with pytest.raises(error, match=words):
        generated("gla").chunk_gla(**x, **{"cp_context": _context(), **extra})


def test_token_count_must_match_the_context():
    from fla_gen.sample import sample_inputs
    from tests.support import generated, recurrence

    x = sample_inputs(recurrence("gla"), 1, 30, 2, 16, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="v holds 30 tokens but the cp_context splits 64 tokens over 2 ranks"):
        generated("gla").chunk_gla(**x, cp_context=_context())
    x = sample_inputs(recurrence("gla"), 2, 32, 2, 16, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="B must be 1"):
        generated("gla").chunk_gla(**x, cp_context=_context())


def test_decode_op_takes_no_cp_context():
    from fla_gen.sample import sample_inputs
    from tests.support import generated, recurrence

    x = sample_inputs(recurrence("gla"), 1, 32, 2, 16, 16, torch.float32, seed=0)
    with pytest.raises(TypeError, match="cp_context"):
        generated("gla").fused_recurrent_gla(**x, cp_context=_context())


def test_derived_values_refuse_cp_context(tmp_path):
    from fla_gen.sample import sample_inputs
    from tests.support import VARIANTS_DIR, built_package

    spec = (VARIANTS_DIR / "gla_l2norm_gated_value.fla").read_text()
    with built_package(spec, tmp_path, "gla_l2norm_gated_value") as (rec, pkg):
        x = sample_inputs(rec, 1, 32, 2, 16, 16, torch.float32, seed=0)
        with pytest.raises(ValueError, match=r"cp_context is not supported by this op: its kernels' values are "
                                             r"\(sigmoid\(u\) \* v\)"):
            pkg.chunk_gla_l2norm_gated_value(**x, cp_context=_context())


def test_build_cp_context_needs_torch_distributed():
    from fla_gen.runtime import build_cp_context

    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        build_cp_context(torch.tensor([0, 64]))


@pytest.mark.parametrize("extra,words", [
    ({"use_cache": True}, "use_cache=True is not supported with cp_context"),
    ({"cu_seqlens": torch.tensor([0, 32])}, "cu_seqlens must be None with cp_context"),
    ({"past_state": object()}, "past_state must be None with cp_context"),
    ({"x": torch.randn(2, 32, 32)}, r"x must be this rank's slice \[1, 32, D\] of the packed batch, got \[2, 32, 32\]"),
    ({"x": torch.randn(1, 30, 32)}, r"x must be this rank's slice \[1, 32, D\]"),
])
def test_layer_refuses_decoding_with_cp_context(extra, words):
    import generated.simple_gla
    from fla_gen.layers import layer_for

    layer = layer_for(generated.simple_gla, hidden_size=32, num_heads=2, head_k_dim=16)
    with pytest.raises(ValueError, match=words):
        layer(**{"x": torch.randn(1, 32, 32), "cp_context": _context(), **extra})


def test_example_script_under_torchrun():
    """examples/train_context_parallel.py (the README's training loop) under torchrun, 2 gloo ranks: its own check
    against the layer in one process, and the loss it prints."""
    import subprocess

    root = Path(__file__).resolve().parents[2]

    def torchrun() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(root / "examples" / "train_context_parallel.py"), "--device", "cpu", "--steps", "2", "--tokens",
             "96", "--layers", "2"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"},
        )

    run = torchrun()
    if run.returncode != 0 and _aborted_in_teardown(run):
        run = torchrun()  # once: a second teardown abort, or any other failure, fails the test
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    errors = [float(e) for e in re.findall(r"largest relative error against one process (\S+)", run.stdout)]
    assert len(errors) == 2 and max(errors) < TOLERANCE, run.stdout
    assert len(re.findall(r"step \d: loss \d", run.stdout)) == 2, run.stdout


def _aborted_in_teardown(run) -> bool:
    """Whether a torchrun of the example did all its work (both ranks' checks and every step's loss printed)
    and then a rank aborted as its process exited: gloo under torch 2.13 can end a rank with SIGABRT
    ("terminate called without an active exception") after destroy_process_group. It happened once in
    CI's 2-core run and not in 13 runs on this machine, up to three at a time."""
    finished = (len(re.findall(r"largest relative error against one process", run.stdout)) == 2
                and len(re.findall(r"step \d: loss \d", run.stdout)) == 2)
    return finished and "terminate called without an active exception" in run.stderr
