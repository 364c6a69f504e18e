"""Train a tiny 2-layer model built on a generated op to do associative recall, and watch the loss fall.

Each sequence lists key-value pairs, then asks for some of the keys again; the model must answer each
query key with the value that followed it (multi-query associative recall, Arora et al. 2023, "Zoology").
Only the answers are scored. A recurrence that stores k vᵀ in its state can solve it; the loss starts
at ln(vocabulary) and falls as the layers learn to write and read their state.

    python examples/train_recall.py --device cpu        # Triton's interpreter: a tiny model, ~70 s
    python examples/train_recall.py --device cuda --op generated.gated_delta_rule --steps 500 --batch 64 \
        --pairs 16 --queries 16 --keys 64 --values 64 --dim 128 --heads 2 --head-dim 64 --lr 3e-3 --compile
    python examples/train_recall.py --op /tmp/out/myop  # any generated package: a module name or a directory

On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1 is set before Triton is imported).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Config:
    """One training run. The defaults are the CPU size: ~70 s in the interpreter on one core (the
    interpreter's cost grows with the number of sequences x chunks, so the batch stays small)."""

    op: str = "generated.simple_gla"
    device: str = "cpu"
    steps: int = 60
    batch: int = 8
    pairs: int = 3
    queries: int = 3
    keys: int = 6
    values: int = 6
    dim: int = 32
    heads: int = 1
    head_dim: int = 16
    lr: float = 2e-2
    seed: int = 0
    log_every: int = 10
    compile: bool = False


def load_package(op: str):
    """A generated package by module name (``generated.gla``) or by directory (``/tmp/out/myop``)."""
    path = Path(op)
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(f"_recall_{path.name}", path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module(op)


def recall_batch(cfg: Config, generator, device):
    """Token ids [B, T] and targets [B, T] (-100 where nothing is scored).

    Layout: k1 v1 k2 v2 ... kP vP q1 q2 ... qQ; each q is one of the P keys and its target is the value
    that followed it. Keys use ids [0, keys), values [keys, keys + values): the model must look up.
    """
    import torch

    B, P, Q = cfg.batch, cfg.pairs, cfg.queries
    keys = torch.stack([torch.randperm(cfg.keys, generator=generator)[:P] for _ in range(B)])
    vals = cfg.keys + torch.randint(0, cfg.values, (B, P), generator=generator)
    pick = torch.randint(0, P, (B, Q), generator=generator)
    context = torch.stack([keys, vals], -1).reshape(B, 2 * P)
    tokens = torch.cat([context, keys.gather(1, pick)], 1)
    targets = torch.full_like(tokens, -100)
    targets[:, 2 * P:] = vals.gather(1, pick)
    return tokens.to(device), targets.to(device)


def build_model(cfg: Config, pkg):
    """Embedding, two blocks of [RMSNorm, recurrent layer, RMSNorm, MLP] with residuals, a head."""
    import torch
    from torch import nn

    from fla_gen.layers import layer_for

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(cfg.dim), nn.RMSNorm(cfg.dim)
            self.mix = layer_for(pkg, cfg.dim, cfg.heads, cfg.head_dim)
            self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

        def forward(self, x):
            x = x + self.mix(self.norm1(x))[0]
            return x + self.mlp(self.norm2(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.keys + cfg.values, cfg.dim)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.norm = nn.RMSNorm(cfg.dim)
            self.head = nn.Linear(cfg.dim, cfg.keys + cfg.values)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(cfg.seed)
    return Model()


def train(cfg: Config) -> list[float]:
    """Train and return the loss of every step (cross-entropy on the answers, in nats)."""
    if cfg.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported (by the package)
    import torch

    pkg = load_package(cfg.op)
    model = build_model(cfg, pkg).to(cfg.device)
    step_fn = torch.compile(model, fullgraph=True) if cfg.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    generator = torch.Generator().manual_seed(cfg.seed)
    losses = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        tokens, targets = recall_batch(cfg, generator, cfg.device)
        logits = step_fn(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if cfg.log_every and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            with torch.no_grad():
                answered = targets != -100
                accuracy = (logits.argmax(-1)[answered] == targets[answered]).float().mean().item()
            print(f"step {step:4d}  loss {loss.item():.3f}  recall accuracy {accuracy:.2f}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    defaults = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in vars(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action="store_true", help=f"(default {value})")
        else:
            p.add_argument(flag, type=type(value), default=value, help=f"(default {value})")
    cfg = Config(**vars(p.parse_args(argv)))
    print(f"{cfg}\nchance loss ln({cfg.keys + cfg.values}) = {math.log(cfg.keys + cfg.values):.3f}; "
          f"guessing among the values only: ln({cfg.values}) = {math.log(cfg.values):.3f}")
    losses = train(cfg)
    head, tail = losses[: max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10):]
    print(f"mean loss of the first tenth {sum(head) / len(head):.3f}, of the last tenth {sum(tail) / len(tail):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
