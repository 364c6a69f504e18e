"""Random inputs for a spec, in realistic ranges, for tests, `fla-gen run` and benchmarks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fla_gen.canonical import GateKind, Recurrence
from fla_gen.features import RankOne
from fla_gen.ir import Apply, Lit, Node, Ref
from fla_gen.lower import lower


def sample_inputs(rec: Recurrence, B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype,
                  device: str | torch.device = "cpu", seed: int | None = None,
                  HV: int | None = None) -> dict[str, torch.Tensor]:
    """One tensor per declared input of the spec, keyed by name: ``[B, T, H, ...]`` / ``[H, ...]`` inputs
    on the query/key heads, ``[B, T, HV, ...]`` / ``[HV, ...]`` ones on the value heads (HV defaults to H).

    Ranges: keys, queries and values ~ N(0, 1); per-token log gates logsigmoid(N(0, 1)) (decays
    in (0, 1), mean ~0.5, as in fla's tests); per-head log gates log(1 - 2^(-5 - h)), the
    retention decays (Sun et al., 2023); other per-token scalars sigmoid(N(0, 1)).
    Keys and queries of a rank-1 (delta) transition are L2-normalized, unless the spec transforms
    them (then it normalizes them itself, e.g. ``transform k = l2norm(k)``, unless the line is guarded by
    a flag: default calls leave it off); transformed per-token
    scalars (e.g. a beta under a sigmoid) are N(0, 1); a general rank-1 term b aᵀ gets a = -k̂,
    b = η k̂ (RWKV-7's form), signs chosen so that the transition's rank-1 part is -η k̂ k̂ᵀ whatever
    signs the spec writes around a and b. Roles come from the normal form: an input that is a whole term
    of the log gate (``exp(g) * S``, ``exp(g + g_gamma) * S``, ``exp(g) * exp(h) * S``) is a log gate; a
    per-token or per-head scalar read under ``sigmoid``, ``softplus`` or ``exp`` anywhere else (a
    ``sigmoid(f) * S`` decay, ``exp(-exp(A_log) * softplus(dt + dt_bias))``, ``sigmoid(b) * outer(...)``)
    is a pre-activation, N(0, 1), like a transformed scalar. Gates are float32; everything else ``dtype``.
    ``seed`` None: one drawn from torch's global generator, so torch.manual_seed repeats the draw (as it
    repeats torch.randn's) and the caller's generator is never reseeded.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else int(torch.randint(2**62, ())))
    spec = rec.spec
    gate_kind = log_gate_inputs(rec)
    rank1 = lower(rec).features.rank1
    # A rank-1 transition (I - beta k k^T) is a contraction only for unit-norm keys: normalize
    # the keys it reads and the queries, as delta-rule models do (Yang et al., 2024).
    unit_norm = {rec.query.input, rec.low_rank.u.input, rec.low_rank.w.input} if rec.low_rank else set()
    # A general rank-1 term b a^T is drawn as RWKV-7 parameterizes it (Peng et al., 2025): a = -k̂ and
    # b = η k̂, k̂ unit-norm and η in (0, 1) per token, so diag(α) + b a^T = diag(α) - η k̂ k̂^T contracts.
    rank1_pair = None
    if rank1 is RankOne.GENERAL and rec.low_rank.u.input and rec.low_rank.w.input:
        rank1_pair = (rec.low_rank.w.input, rec.low_rank.u.input)
    # inputs a transform always rewrites (a guarded line is off in a default call, so its inputs are drawn
    # as the recurrence reads them), and scalars the recurrence reads under an activation
    transformed = {t for tr in spec.transforms if tr.guard is None for t in tr.targets}
    transformed |= preactivation_inputs(rec) - set(gate_kind)
    unit_norm -= transformed
    HV = H if HV is None else HV
    dims = {"B": B, "T": T, "H": H, "HV": HV, spec.key_dim: K, spec.value_dim: V}
    out = {}
    for i in spec.inputs:
        shape = [dims[d] for d in i.dims]
        kind = gate_kind.get(i.name)
        if kind is GateKind.HEAD:
            heads = torch.arange(shape[0], dtype=torch.float64, device="cpu")
            x = torch.log1p(-torch.pow(2.0, -5.0 - heads)).float()
        elif kind is not None:
            x = F.logsigmoid(torch.randn(shape, generator=gen, device="cpu"))
        elif i.vec_dim is None and i.name in transformed:
            x = torch.randn(shape, generator=gen, device="cpu").to(dtype)
        elif i.vec_dim is None:
            x = torch.sigmoid(torch.randn(shape, generator=gen, device="cpu")).to(dtype)
        else:
            x = torch.randn(shape, generator=gen, device="cpu")
            x = F.normalize(x, dim=-1) if i.name in unit_norm else x
            x = x.to(dtype)
        out[i.name] = x.to(device)
    if rank1_pair is not None:
        a_name, b_name = rank1_pair
        shape = list(out[a_name].shape)
        direction = F.normalize(torch.randn(shape, generator=gen, device="cpu"), dim=-1)
        eta = torch.sigmoid(torch.randn(shape[:-1] + [1], generator=gen, device="cpu"))
        # u wᵀ = (c_u b)(c_w a)ᵀ: the numbers among c_u, c_w (e.g. -1 in 'v - S^T @ a') flip a's sign
        sign = math.prod(math.copysign(1.0, c.value) for c in (*rec.low_rank.u.coef, *rec.low_rank.w.coef)
                         if isinstance(c, Lit))
        out[a_name] = (-sign * direction).to(dtype).to(device)
        out[b_name] = (direction * eta).to(dtype).to(device)
    return out


def _added_terms(n: Node) -> list[Node]:
    """The terms an expression adds (those it subtracts left out: a log gate drawn there would grow the state)."""
    if isinstance(n, Apply) and n.fn == "add":
        return _added_terms(n.args[0]) + _added_terms(n.args[1])
    if isinstance(n, Apply) and n.fn == "sub":
        return _added_terms(n.args[0])
    return [n]


def log_gate_inputs(rec: Recurrence) -> dict[str, GateKind]:
    """Inputs that are whole terms of the log gate (log decay = g + g_gamma + ...), by kind: HEAD ([H]),
    SCALAR ([B, T, H]) or CHANNEL ([B, T, H, K])."""
    if rec.log_gate is None:
        return {}
    out = {}
    for t in _added_terms(rec.log_gate):
        if isinstance(t, Ref) and t.role == "input":
            info = rec.spec.input(t.name)
            out[t.name] = (GateKind.CHANNEL if info.vec_dim else GateKind.SCALAR) if info.per_token else GateKind.HEAD
    return out


_ACTIVATIONS = ("sigmoid", "softplus", "exp")


def preactivation_inputs(rec: Recurrence) -> set[str]:
    """Scalar inputs ([B, T, H] or [H]) read under sigmoid, softplus or exp in the updates or the output."""
    found: set[str] = set()

    def walk(n: Node, under: bool) -> None:
        if isinstance(n, Ref) and n.role == "input" and under and rec.spec.input(n.name).vec_dim is None:
            found.add(n.name)
        elif isinstance(n, Apply):
            for a in n.args:
                walk(a, under or n.fn in _ACTIVATIONS)

    for n in (*rec.spec.updates, rec.spec.output):
        walk(n, False)
    return found


def relative_error(out: torch.Tensor, ref: torch.Tensor, scale: float = 0.0) -> float:
    """‖out − ref‖ / max(‖ref‖, ``scale``) in float64; NaN anywhere gives inf. ``scale``: a typical norm of
    ``ref`` where this draw's may have cancelled (compare_with_reference's per-head gradients)."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return math.inf
    denom = max(ref64.norm().item(), scale)
    return (out64 - ref64).norm().item() / max(denom, 1e-30)
