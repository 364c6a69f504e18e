"""Context parallelism: one packed varlen batch split over the ranks of a process group.

Rank r of R holds tokens [r T_local, (r + 1) T_local) of a global [1, T_global] packed batch; a sequence
may span ranks. Every recurrence fla-gen accepts is linear in the state, S_t = A_t S_{t-1} + W_t, with
A_t [K, K] independent of v and the value columns of W_t reading only the matching columns of v. Over
the tokens of one rank, the last local sequence therefore ends at S_end = M S_in + C (M the product of
its A_t, C its final state from zero), and a call of the op itself computes both: values [0 | v]
(width K + V) and initial state [I | 0] give the final state [M | C]. The ranks all-gather their (M, C)
pairs, each merges the pairs of the ranks its first sequence comes from in fp32 into its initial state,
and runs the op on its tokens (docs/design.md, "Context parallelism"). fla's context parallelism
(fla/ops/cp/README.md: an all-gather of (S_ext, M) and an fp32 merge) is the source of the idea.

The gradients flow back through the same all-gather (its backward sums the gradients of every rank's
copy of each pair), so ``loss.backward()`` on every rank gives each rank the gradients of its tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import torch
import torch.distributed as dist

from fla_gen.runtime.dispatch import plan_covers
from fla_gen.runtime.plan_types import Plan
from fla_gen.runtime.validate import check_cu_seqlens_values


@dataclass(frozen=True)
class LocalSequences:
    """How one rank's tokens [start, end) of a packed batch split into (pieces of) sequences.

    ``cu_seqlens``: [N_local + 1] offsets of the non-empty pieces, relative to ``start``;
    ``sequence_ids``: the global sequence each piece belongs to; ``position_offsets``: how many tokens of
    that sequence lie before the piece (on earlier ranks); ``continues``: whether the first piece began
    on an earlier rank; ``continued``: whether the last piece goes on past ``end``.
    """

    cu_seqlens: tuple[int, ...]
    sequence_ids: tuple[int, ...]
    position_offsets: tuple[int, ...]
    continues: bool
    continued: bool


def local_sequences(cu_seqlens: Sequence[int], start: int, end: int) -> LocalSequences:
    """The pieces of the global sequences ``cu_seqlens`` [N + 1] (start 0, non-decreasing) that lie in the
    tokens [start, end), 0 <= start < end <= cu_seqlens[-1]; empty sequences are dropped."""
    bounds = sorted({start, end} | {c for c in cu_seqlens if start < c < end})
    ids = tuple(bisect.bisect_right(cu_seqlens, b) - 1 for b in bounds[:-1])
    offsets = tuple(b - cu_seqlens[i] for b, i in zip(bounds[:-1], ids, strict=True))
    edges = set(cu_seqlens)
    return LocalSequences(tuple(b - start for b in bounds), ids, offsets, start not in edges, end not in edges)


@dataclass(frozen=True, eq=False)
class CPContext:
    """The context of one context-parallel batch on this rank (built by :func:`build_cp_context`).

    group: the process group the batch is split over (None: the default group).
    rank, world_size: this rank's index in ``group`` and the group's size R.
    tokens: T_global, the packed batch's length (a multiple of R); each rank holds T_global / R tokens.
    cu_seqlens: [N_local + 1] int64 offsets of this rank's (pieces of) sequences, on the device of the
        global cu_seqlens; cu_seqlens_cpu: the same on the CPU.
    sequence_ids, position_offsets: per local sequence, its global index and how many of its tokens
        lie on earlier ranks (rope positions continue across ranks).
    continues: per rank, whether its first local sequence began on an earlier rank.
    carries: per rank, whether its last local sequence began on an earlier rank (the rank holds one
        piece of a sequence that started before it).
    """

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    tokens: int
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    sequence_ids: tuple[int, ...]
    position_offsets: tuple[int, ...]
    continues: tuple[bool, ...]
    carries: tuple[bool, ...]

    @property
    def tokens_per_rank(self) -> int:
        return self.tokens // self.world_size

    @property
    def continued(self) -> bool:
        """Whether the next rank's first sequence is this rank's last one."""
        return self.rank + 1 < self.world_size and self.continues[self.rank + 1]


def check_global_cu_seqlens(bounds: Sequence[int], world_size: int) -> None:
    """Raise ValueError unless ``bounds`` [N + 1] start at 0, never decrease and end at a positive multiple
    of ``world_size``."""
    if len(bounds) < 2:
        raise ValueError(f"build_cp_context: cu_seqlens needs at least 2 entries (one sequence), got {len(bounds)}")
    check_cu_seqlens_values("build_cp_context", bounds, bounds[-1])  # starts at 0, never decreases
    if bounds[-1] <= 0 or bounds[-1] % world_size:
        raise ValueError(f"build_cp_context: the batch's {bounds[-1]} tokens (cu_seqlens[-1]) must be a positive "
                         f"multiple of the group size {world_size}: every rank holds an equal slice")


def build_cp_context(cu_seqlens: torch.Tensor, group: dist.ProcessGroup | None = None) -> CPContext:
    """The context-parallel context of this rank for a packed batch.

    Args:
        cu_seqlens: [N + 1] int32/int64 offsets of the N sequences of the whole (global) packed batch
            [1, T_global], before it is split; T_global must be a multiple of the group size R. Rank r
            then holds tokens [r T_global / R, (r + 1) T_global / R).
        group: the process group the batch is split over; None means the default group
            (torch.distributed must be initialized).

    Returns:
        A frozen :class:`CPContext` with this rank's local cu_seqlens; pass it to a chunk op as
        ``cp_context`` (with the rank's slice of every per-token input) or to a layer's forward.

    Raises:
        TypeError, ValueError: a bad cu_seqlens or group, torch.distributed not initialized.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("build_cp_context: torch.distributed is not initialized (call "
                         "torch.distributed.init_process_group first, e.g. under torchrun)")
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"build_cp_context: cu_seqlens must be a tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"build_cp_context: cu_seqlens must be a 1-D int32/int64 tensor, got shape "
                         f"{list(cu_seqlens.shape)} and {cu_seqlens.dtype}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise ValueError("build_cp_context: this process is not a member of the group")
    bounds = [int(c) for c in cu_seqlens.detach().cpu().tolist()]  # once per batch (a sync with a GPU tensor)
    check_global_cu_seqlens(bounds, world)
    size = bounds[-1] // world
    pieces = [local_sequences(bounds, r * size, (r + 1) * size) for r in range(world)]
    mine = pieces[rank]
    local = torch.tensor(mine.cu_seqlens, dtype=torch.int64)
    return CPContext(
        group=group, rank=rank, world_size=world, tokens=bounds[-1],
        cu_seqlens=local.to(cu_seqlens.device), cu_seqlens_cpu=local,
        sequence_ids=mine.sequence_ids, position_offsets=mine.position_offsets,
        continues=tuple(p.continues for p in pieces),
        carries=tuple(p.continues and len(p.cu_seqlens) == 2 for p in pieces),
    )


# ----------------------------------------------------------------------------- the merge (pure)

def chain_start(continues: Sequence[bool], carries: Sequence[bool], rank: int) -> int | None:
    """The first rank whose (M, C) pair reaches ``rank``'s initial state, or None when ``rank``'s first
    sequence starts on it: the chain runs back through the ranks that carry one piece of the sequence."""
    if not continues[rank]:
        return None
    first = rank - 1
    while carries[first]:
        first -= 1
    return first


def merge_states(transitions: torch.Tensor, contributions: torch.Tensor, continues: Sequence[bool],
                 carries: Sequence[bool], rank: int) -> torch.Tensor | None:
    """The initial state of ``rank``'s first sequence from every rank's (M, C) pair, in float32.

    Args:
        transitions: [R, HV, K, K] M of each rank's last sequence (used only where the rank carries one).
        contributions: [R, HV, K, V] C of each rank's last sequence (its final state from zero).
        continues, carries: per rank, as in :class:`CPContext`.
        rank: the rank whose state is wanted.

    Returns:
        [HV, K, V] float32 S_in = M_{r-1} (... (M_{j+1} C_j + C_{j+1}) ...) + C_{r-1} over the chain
        j .. r - 1 of :func:`chain_start`, or None when the first sequence starts on ``rank``.
    """
    first = chain_start(continues, carries, rank)
    if first is None:
        return None
    state = contributions[first].float()
    for j in range(first + 1, rank):
        state = transitions[j].float() @ state + contributions[j].float()
    return state


# ----------------------------------------------------------------------------- collectives with autograd

class _AllGather(torch.autograd.Function):
    """[*] per rank -> [R, *] on every rank; the backward sums every rank's gradient of each slice.

    torch.distributed.nn.functional.all_gather does the same but is deprecated in torch 2.13; this one
    also stacks (one tensor out, not R).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        group = ctx.group
        grad = grad.contiguous()
        if dist.get_backend(group) == dist.Backend.GLOO:  # gloo has no reduce-scatter
            dist.all_reduce(grad, group=group)
            return grad[dist.get_rank(group)].clone(), None
        out = torch.empty_like(grad[0])
        dist.reduce_scatter_tensor(out, grad, group=group)
        return out, None


class _ZerosAfter(torch.autograd.Function):
    """Zeros of a given shape that depend on ``deps`` in the autograd graph (their gradient: zero).

    The all-gather's backward is a collective, so every rank must reach it, whatever the tensors the
    backward is asked for (``torch.autograd.grad`` runs only the nodes on a path to its inputs). A rank
    whose first sequence starts on it does not read the gathered pairs: its initial state is zeros after
    the gathered tensor (``materialize``: a defined zero gradient flows into the all-gather). A rank whose
    last sequence the next rank does not continue sends zeros after every input of the op, so the
    all-gather lies on the path to each of them.
    """

    @staticmethod
    def forward(ctx, shape: tuple[int, ...], materialize: bool, *deps: torch.Tensor) -> torch.Tensor:
        ctx.materialize = materialize
        ctx.dep_meta = [(d.shape, d.dtype, d.device) for d in deps]
        return deps[0].new_zeros(shape, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if not ctx.materialize:
            return (None, None, *(None for _ in ctx.dep_meta))
        return (None, None, *(torch.zeros(s, dtype=t, device=d) for s, t, d in ctx.dep_meta))


# ----------------------------------------------------------------------------- running an op

class PrePass(Enum):
    """How a rank computes the (M, C) pair of its last sequence."""

    NONE = "none"  # the next rank starts a new sequence: the pair is never read (zeros are sent)
    CONTRIBUTION = "contribution"  # the sequence starts on this rank: M is never read, C = one call with v
    JOINT = "joint"  # one call with values [0 | v] (width K + V) from [I | 0]: the final state is [M | C]
    SPLIT = "split"  # the op has no plan at width K + V: values 0 (width K) from I give M, v from 0 gives C


def choose_pre_pass(carries: bool, continued: bool, joint_width_planned: bool) -> PrePass:
    """The pre-pass of a rank: ``carries`` its last sequence began earlier, ``continued`` the next rank
    goes on with it, ``joint_width_planned`` the op has a plan at value width K + V."""
    if not continued:
        return PrePass.NONE
    if not carries:
        return PrePass.CONTRIBUTION
    return PrePass.JOINT if joint_width_planned else PrePass.SPLIT


@dataclass(frozen=True)
class ContextParallelOp:
    """What the context-parallel runner needs to know about a generated chunk op (emitted with it).

    name: the public function's name; value_input: the input the kernels read as their values v
    [B, T, HV, V], untouched (None when context parallelism is refused, ``refusal`` saying why);
    key_input: an input [B, T, H, K]; per_token_inputs: the inputs [B, T, ...], sliced per sequence;
    position_arg: the rope offsets argument (``seqlen_offsets``), or None without rope; plans: the op's
    chunk plan table, which says whether the width K + V of the joint pre-pass is planned.
    """

    name: str
    value_input: str | None
    key_input: str
    per_token_inputs: tuple[str, ...]
    position_arg: str | None
    plans: Mapping[tuple[str, str, int], Plan]
    refusal: str | None = None


def _check_call(spec: ContextParallelOp, ctx: object, args: Mapping[str, object], initial_state: object,
                output_final_state: object, cu_seqlens: object, cu_seqlens_cpu: object) -> torch.Tensor:
    """Refuse what context parallelism does not take, before any collective; returns the values v."""
    op = spec.name
    if not isinstance(ctx, CPContext):
        raise TypeError(f"{op}: cp_context must be a CPContext from fla_gen.runtime.build_cp_context, got "
                        f"{type(ctx).__name__}")
    if spec.refusal is not None:
        raise ValueError(f"{op}: cp_context is not supported by this op: {spec.refusal}")
    if initial_state is not None:
        raise ValueError(f"{op}: initial_state is not supported with cp_context (each rank's initial state comes "
                         f"from the ranks before it); pass None")
    if output_final_state:
        raise ValueError(f"{op}: output_final_state=True is not supported with cp_context; pass False")
    for name, value in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if value is not None:
            raise ValueError(f"{op}: {name} must be None with cp_context: the local offsets come from the context "
                             f"(build_cp_context takes the global cu_seqlens)")
    v = args[spec.value_input]
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError(f"{op}: {spec.value_input} must be a [B, T, HV, V] tensor with cp_context")
    if v.shape[0] != 1:
        raise ValueError(f"{op}: with cp_context the batch is one packed sequence per rank: B must be 1, got "
                         f"{spec.value_input} of shape {list(v.shape)}")
    if v.shape[1] * ctx.world_size != ctx.tokens:
        raise ValueError(f"{op}: {spec.value_input} holds {v.shape[1]} tokens but the cp_context splits "
                         f"{ctx.tokens} tokens over {ctx.world_size} ranks: each rank must pass its "
                         f"{ctx.tokens_per_rank} tokens")
    return v


def _rope_offsets(op: str, name: str, value: object, ctx: CPContext, pieces: slice,
                  device: torch.device) -> torch.Tensor:
    """[n] int64 rope offsets of the local sequences ``pieces``: the caller's offset of each global sequence
    (an int, or one per global sequence) plus its tokens on earlier ranks."""
    ids = list(ctx.sequence_ids[pieces])
    before = torch.tensor(ctx.position_offsets[pieces], dtype=torch.int64)
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise ValueError(f"{op}: with cp_context {name} must be an int or a [N] tensor, one per global sequence, "
                             f"got shape {list(value.shape)}")
        base = value.detach().cpu().to(torch.int64)
        if max(ids) >= base.shape[0]:
            raise ValueError(f"{op}: with cp_context {name} has {base.shape[0]} entries but the global batch has at "
                             f"least {max(ids) + 1} sequences (one offset per global sequence)")
        offsets = base[ids] + before
    elif isinstance(value, int) and not isinstance(value, bool):
        offsets = value + before
    else:
        raise TypeError(f"{op}: {name} must be an int or an int tensor, got {type(value).__name__}")
    return offsets.to(device)


def run_context_parallel(op: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], spec: ContextParallelOp,
                         ctx: object, args: dict[str, object], *, initial_state: object = None,
                         output_final_state: object = False, cu_seqlens: object = None,
                         cu_seqlens_cpu: object = None) -> tuple[torch.Tensor, None]:
    """Run the chunk op ``op`` on this rank's slice of a context-parallel batch.

    Args:
        op: the generated public chunk function (called with ``cp_context=None``).
        spec: what the op is (emitted next to it).
        ctx: the :class:`CPContext` of this batch.
        args: every argument of the call other than the five below, by name: the rank's inputs
            (per-token ones [1, T_local, ...]), params, flags and options as the caller passed them.
        initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu: must be None / False (refused
            otherwise: the context supplies the offsets and the initial states).

    Returns:
        (o [1, T_local, HV, V] for this rank's tokens, None).

    Every rank of the group must call it (it all-gathers), and every rank must run the backward of
    what it computed (the all-gather's backward is a collective too).
    """
    v = _check_call(spec, ctx, args, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)
    assert isinstance(ctx, CPContext)
    key = args[spec.key_input]
    K, HV, V = key.shape[-1], v.shape[2], v.shape[3]
    device = v.device
    local_cu, local_cu_cpu = ctx.cu_seqlens.to(device), ctx.cu_seqlens_cpu
    n_local = local_cu_cpu.shape[0] - 1
    last = int(local_cu_cpu[-2])  # the last local sequence is tokens [last, T_local)
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args.values())

    def call(tensors: dict[str, object], h0: torch.Tensor | None, final: bool, cu: torch.Tensor,
             cu_cpu: torch.Tensor, pieces: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        extra = {}
        if spec.position_arg is not None:
            extra[spec.position_arg] = _rope_offsets(spec.name, spec.position_arg, args[spec.position_arg], ctx,
                                                     pieces, device)
        return op(**{**tensors, **extra}, initial_state=h0, output_final_state=final, cu_seqlens=cu,
                  cu_seqlens_cpu=cu_cpu)

    # 1. pre-pass: the (M, C) pair of the last local sequence, [HV, K, K + V] fp32
    kind = choose_pre_pass(ctx.carries[ctx.rank], ctx.continued,
                           plan_covers(spec.plans, device, key.dtype, max(K, K + V)))
    if kind is PrePass.NONE:
        deps = [a for a in args.values() if isinstance(a, torch.Tensor) and a.requires_grad]
        pair = (_ZerosAfter.apply((HV, K, K + V), False, *deps) if needs_grad
                else torch.zeros(HV, K, K + V, dtype=torch.float32, device=device))
    else:
        tail = {n: (a[:, last:] if n in spec.per_token_inputs and isinstance(a, torch.Tensor) else a)
                for n, a in args.items()}
        length = v.shape[1] - last
        one_cu_cpu = torch.tensor([0, length], dtype=torch.int64)
        one = (one_cu_cpu.to(device), one_cu_cpu, slice(n_local - 1, n_local))
        vt = tail[spec.value_input]
        eye = torch.eye(K, dtype=torch.float32, device=device).expand(1, HV, K, K)
        if kind is PrePass.CONTRIBUTION:
            _, c = call(tail, None, True, *one)
            m = torch.zeros(1, HV, K, K, dtype=torch.float32, device=device)
        elif kind is PrePass.JOINT:
            wide = torch.cat([vt.new_zeros(*vt.shape[:3], K), vt], dim=-1)
            h0 = torch.cat([eye, eye.new_zeros(1, HV, K, V)], dim=-1)
            _, mc = call({**tail, spec.value_input: wide}, h0, True, *one)
            m, c = mc[..., :K], mc[..., K:]
        else:
            _, m = call({**tail, spec.value_input: vt.new_zeros(*vt.shape[:3], K)}, eye.contiguous(), True, *one)
            _, c = call(tail, None, True, *one)
        pair = torch.cat([m, c], dim=-1)[0]

    # 2. exchange the pairs and merge the chain that reaches this rank (fp32)
    gathered = _AllGather.apply(pair, ctx.group)  # [R, HV, K, K + V]
    state = merge_states(gathered[..., :K], gathered[..., K:], ctx.continues, ctx.carries, ctx.rank)
    if state is None:
        state = _ZerosAfter.apply((HV, K, V), True, gathered) if gathered.requires_grad else None

    # 3. main pass: the first local sequence starts from the merged state, the others from zero
    h0 = None
    if state is not None:
        h0 = torch.cat([state[None], state.new_zeros(n_local - 1, HV, K, V)]) if n_local > 1 else state[None]
    o, _ = call(args, h0, False, local_cu, local_cu_cpu, slice(0, n_local))
    return o, None


def previous_tokens(tail: torch.Tensor, ctx: CPContext) -> torch.Tensor:
    """The last W - 1 rows before this rank's first token that belong to its first sequence, from the rank
    before it (a short convolution's inputs across the rank boundary); zeros where they are not.

    Args:
        tail: [W - 1, C] this rank's last W - 1 rows (every rank passes its own: they are all-gathered).
        ctx: the batch's context; T_local must be >= W - 1.

    Returns:
        [W - 1, C] in ``tail``'s dtype: row i is token start - (W - 1) + i where that token is in the same
        sequence as the rank's first token, else zero. Differentiable (the gradient goes back to the rank
        that holds the rows), and every rank must call it and run its backward (collectives).
    """
    rows = tail.shape[0]
    if rows > ctx.tokens_per_rank:
        raise ValueError(f"a short convolution of width {rows + 1} needs {rows} tokens of the rank before, but each "
                         f"rank holds {ctx.tokens_per_rank}: use fewer ranks or a longer batch")
    gathered = _AllGather.apply(tail, ctx.group)  # [R, W - 1, C]
    if not ctx.continues[ctx.rank]:
        if gathered.requires_grad:
            return _ZerosAfter.apply(tuple(tail.shape), True, gathered).to(tail.dtype)
        return tail.new_zeros(tail.shape)
    before = ctx.position_offsets[0]  # tokens of the first sequence on earlier ranks (>= 1)
    keep = (torch.arange(rows, device=tail.device) >= rows - before)[:, None]
    return torch.where(keep, gathered[ctx.rank - 1], torch.zeros((), dtype=tail.dtype, device=tail.device))
