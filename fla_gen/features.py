"""The typed feature record that selects and switches the kernel templates.

A lowered recurrence (fla_gen/lower.py) is, for the kernels, a set of features of the normal form

    S_t = (D_t + u_t w_tᵀ) S_{t-1} + x_t y_tᵀ,        o_t = scale · S_tᵀ q_t

and nothing else: how the state decays (D), what its rank-1 part is, and whether value heads are
grouped over fewer query/key heads. The templates switch shared blocks on these features (as fla's
kernels switch on ``USE_G`` / ``USE_GK``); no template or compiler module knows an op by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class TokenDecay(Enum):
    """The per-token part of the state's log decay g_t (D_t = diag(exp(g_t)))."""

    NONE = "none"  # no per-token decay
    SCALAR = "scalar"  # one log gate per token and head, [B, T, H]
    CHANNEL = "channel"  # one log gate per token, head and key channel, [B, T, H, K]


class RankOne(Enum):
    """The transition's rank-1 part u wᵀ."""

    NONE = "none"  # S_t = D_t S_{t-1} + k vᵀ (linear attention, retention, GLA)
    # u = -β k and w = D_t k: S_t = (I - β k kᵀ) D_t S_{t-1} + β k vᵀ, the delta rule on the decayed
    # state (DeltaNet, Gated DeltaNet, KDA); kernels take k, v and β [B, T, H]
    DELTA = "delta"
    GENERAL = "general"  # S_t = D_t S_{t-1} + b (aᵀ S_{t-1}) + k vᵀ (DPLR, RWKV-7); kernels take a and b


class Family(Enum):
    """The chunk algorithm: one per rank-1 kind, the gated one split by how its decay is applied."""

    GATED_SCALAR = "gated_scalar"  # no rank-1 part, decay none / scalar / per head: [BT, BT] decay masks
    GATED_CHANNEL = "gated_channel"  # no rank-1 part, per-channel decay: sub-chunked pairwise decays
    DELTA = "delta"  # WY / UT transform
    GENERAL = "general"  # DPLR


@dataclass(frozen=True)
class KernelFeatures:
    """What the kernels of one recurrence must do.

    ``token_decay``: the per-token log gate's kind; ``head_decay``: a per-head constant log gate
    g_gamma [H] added to it; ``rank1``: the transition's rank-1 part; ``grouped``: q and k have H heads
    while v, the gates, β, the state and o have HV = r·H (program (n, hv) reads q/k head hv // r).
    """

    token_decay: TokenDecay
    head_decay: bool
    rank1: RankOne
    grouped: bool = False

    @property
    def any_decay(self) -> bool:
        return self.token_decay is not TokenDecay.NONE or self.head_decay

    @property
    def carries_state_unchanged(self) -> bool:
        """Without a decay or a rank-1 part the transition is the identity: S_t = S_{t-1} + k_t v_t^T, and a
        state crosses any stretch of tokens unchanged (what enters a segment is the plain sum of the earlier
        segments' states from zero)."""
        return not self.any_decay and self.rank1 is RankOne.NONE

    @property
    def gradients_are_forward_walks(self) -> bool:
        """Without a decay or a rank-1 part, S_t = S_{t-1} + k_t v_t^T and o_t = scale * S_t^T q_t are bilinear, and
        their gradients are the same recurrence with the tensors' roles exchanged: dq is the forward of (do, v, k),
        dv and dk the forward of (k, q, do) and (v, do, q) run last token first. A decay would have to run backwards
        in those reversed walks."""
        return self.carries_state_unchanged

    @property
    def scalar_decay(self) -> bool:
        return self.token_decay is TokenDecay.SCALAR

    @property
    def channel_decay(self) -> bool:
        return self.token_decay is TokenDecay.CHANNEL

    @property
    def delta(self) -> bool:
        return self.rank1 is RankOne.DELTA

    @property
    def general(self) -> bool:
        return self.rank1 is RankOne.GENERAL

    @property
    def family(self) -> Family:
        if self.rank1 is RankOne.DELTA:
            return Family.DELTA
        if self.rank1 is RankOne.GENERAL:
            return Family.GENERAL
        return Family.GATED_CHANNEL if self.channel_decay else Family.GATED_SCALAR

    @property
    def kernel_args(self) -> tuple[str, ...]:
        """The tensors the launchers take, in order: q, k, v, then g, g_gamma, beta, a, b as present."""
        args = ["q", "k", "v"]
        if self.token_decay is not TokenDecay.NONE:
            args.append("g")
        if self.head_decay:
            args.append("g_gamma")
        if self.rank1 is RankOne.DELTA:
            args.append("beta")
        if self.rank1 is RankOne.GENERAL:
            args += ["a", "b"]
        return tuple(args)

    @property
    def token_gate(self) -> str | None:
        """The per-token decay's kind as the templates' ``token_gate`` variable: None, "scalar", "channel"."""
        return None if self.token_decay is TokenDecay.NONE else self.token_decay.value
