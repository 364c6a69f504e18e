"""Train layers on long packed batches split over the ranks of a process group (context parallelism).

Every rank sees the same packed batch [1, T, D] with its cu_seqlens, builds the context once per batch, runs
a stack of layers on its own T / R tokens, and the ranks' parameter gradients are summed (as DDP would). On the
first step each rank also checks its output and its input gradient against the same model run in one process on
the whole batch, and prints the largest relative error.

    torchrun --nproc-per-node 4 examples/train_context_parallel.py                 # GPUs, NCCL
    torchrun --nproc-per-node 2 examples/train_context_parallel.py --device cpu    # gloo, Triton's interpreter

On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1 is set before Triton is imported).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="generated.gated_delta_rule", help="a generated package")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256, help="T, the packed batch's length (a multiple of R)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO_ROOT))

    import torch
    import torch.distributed as dist

    from fla_gen.layers import layer_for
    from fla_gen.runtime import build_cp_context
    from fla_gen.sample import relative_error

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same parameters on every rank
    package = importlib.import_module(args.op)
    layers = torch.nn.ModuleList(
        layer_for(package, hidden_size=args.dim, num_heads=args.heads, head_k_dim=args.head_dim)
        for _ in range(args.layers)).to(device)
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)

    def model(x: torch.Tensor, **kwargs) -> torch.Tensor:  # residual blocks; kwargs: cp_context or cu_seqlens
        for layer in layers:
            x = x + layer(x, **kwargs)[0]
        return x

    T_local = args.tokens // world
    for step in range(args.steps):
        # the same packed batch on every rank: random sequence lengths, so that sequences span ranks
        gen = torch.Generator().manual_seed(step)
        cuts = torch.randperm(args.tokens - 1, generator=gen)[:3].add(1).sort().values.tolist()
        cu_seqlens = torch.tensor([0, *cuts, args.tokens], device=device)
        x = torch.randn(1, args.tokens, args.dim, generator=gen).to(device)
        ctx = build_cp_context(cu_seqlens)  # once per batch
        x_local = x[:, rank * T_local:(rank + 1) * T_local].clone().requires_grad_()
        y_local = model(x_local, cp_context=ctx)
        loss = y_local.float().pow(2).mean()
        loss.backward()  # every rank runs its backward: the state exchange's backward is a collective
        if step == 0:  # the same layer on the whole batch in this process
            x_full = x.clone().requires_grad_()
            y_full = model(x_full, cu_seqlens=cu_seqlens)
            (dx_full,) = torch.autograd.grad(y_full.float().pow(2).mean() * world, x_full, retain_graph=False)
            mine = slice(rank * T_local, (rank + 1) * T_local)
            err = max(relative_error(y_local, y_full[:, mine]), relative_error(x_local.grad, dx_full[:, mine]))
            print(f"rank {rank}: largest relative error against one process {err:.1e}", flush=True)
        for p in layers.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        losses = torch.tensor([loss.item()], device=device)
        dist.all_reduce(losses)
        if rank == 0:
            print(f"step {step}: loss {losses.item() / world:.5f}", flush=True)
    # no rank tears its connections down while another still has the last all_reduce in flight
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
