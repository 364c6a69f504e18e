#!/usr/bin/env python3
"""gated_delta_rule_rope's chunk forward with its transforms fused into the first kernel (fwd_wu) instead of
run as a pass of their own.

    python benchmarks/experiments/s11_prologue/prologue_wu.py [--shapes 4x4096x16x128,8x2048x32x64] [--out F]

Today the chunk op runs the generated transform kernel (rope, l2norm, sigmoid, the A_log / dt_bias gate) over
q, k, g and beta, then chunk_fwd: fwd_wu, then the state walk. The pass reads the raw inputs and writes the
transformed ones (session 8: +22-35% of the forward). fwd_wu is latency-bound (ncu, session 11: DRAM 43%,
SM 40%), so the pass's reads and writes might hide under it. Here each fwd_wu program first transforms its
chunk's rows (whole K per row: rope with the partner channel loaded a second time, then l2norm), writes them
where fwd_wu and the walk read them, and then runs the generated fwd_wu body unchanged (after a barrier, so
every thread sees the rows). The outputs a training forward would save are the same tensors, so the backward
would not change.

Two more variants: the prologue reading cos and the signed sin from per-call tables [B * T, K] instead of
computing the angles; and, where the walk runs, the prologue transforming only k, g and beta while the walk
transforms q where it loads it (load-site fusion: q is never written).

Timed, no autograd, do_bench medians, interleaved rounds: the public op (pass + chunk_fwd); the variants;
chunk_fwd alone on inputs transformed beforehand (what any fusion can at best reach). Checked: the variant's
o against the public op's. With ``--device cpu --dtype float32`` under TRITON_INTERPRET=1 it checks only.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "experiments")]

import _ops  # noqa: E402
from harness import add_run_options, jit_from_source, timer, warm_up_clocks, write_record  # noqa: E402

import generated.gated_delta_rule_rope.chunk as chunk  # noqa: E402
import generated.gated_delta_rule_rope.transforms as transforms  # noqa: E402
from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import forced_arch, select_plan  # noqa: E402
from fla_gen.runtime.validate import validate_call  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402

# The prologue: the generated transform kernel's statements (transforms.py, forward), on the BT rows of one
# chunk and one head instead of BR flat rows.
PROLOGUE = '''
@triton.jit
def _transform_chunk(x_q, x_k, x_g, x_beta, p_A_log, p_dt_bias, pos, rope0_dim, cos_t, sin_t, y_q, y_k, y_g, y_beta,
                     t0, rows_left, i_h, H, K: tl.constexpr, BT: tl.constexpr, BKF: tl.constexpr,
                     TABLES: tl.constexpr, WRITE_Q: tl.constexpr):
    # 16 rows at a time: fwd_wu runs on 2 warps, and a whole [64, 128] fp32 tile would be 128 registers a thread
    for rb in range(0, BT // 16):
        o_i = rb * 16 + tl.arange(0, 16)
        m_t = o_i < rows_left
        row = ((t0 + o_i) * H + i_h).to(tl.int64)
        o_K = tl.arange(0, BKF)[None, :]
        m = m_t[:, None] & (o_K < K)
        b_pos = tl.load(pos + t0 + o_i, mask=m_t, other=0).to(tl.float32)[:, None]
        t1k = tl.load(x_k + row[:, None] * K + o_K, mask=m, other=0.0).to(tl.float32)
        if TABLES:
            # cos and the signed sin per (token, channel), computed once per call for all heads
            o_tok = (t0 + o_i).to(tl.int64)[:, None] * K + o_K
            rc0 = tl.load(cos_t + o_tok, mask=m, other=1.0)
            rs0 = tl.load(sin_t + o_tok, mask=m, other=0.0)
            first = o_K < rope0_dim // 2
            rp0 = tl.where(o_K < rope0_dim, tl.where(first, o_K + rope0_dim // 2, o_K - rope0_dim // 2), o_K)
        else:
            rc0, rs0, rp0 = _rope_coefs(o_K, b_pos, rope0_dim, 13.287712379549449, False)
        t5 = t1k * rc0 + rs0 * tl.load(x_k + row[:, None] * K + rp0, mask=m, other=0.0).to(tl.float32)
        t9 = tl.where(m, t5, 0.0)
        t11 = t9 * (1.0 / tl.sqrt(tl.sum(t9 * t9, axis=1, keep_dims=True) + 1e-06))
        t2 = tl.load(x_g + row, mask=m_t, other=0.0).to(tl.float32)
        t3 = tl.load(x_beta + row, mask=m_t, other=0.0).to(tl.float32)
        t15 = -tl.exp(tl.load(p_A_log + i_h).to(tl.float32))
        t17 = t2 + tl.load(p_dt_bias + i_h).to(tl.float32)
        t19 = t15 * tl.where(t17 > 20.0, t17, tl.log(1.0 + tl.exp(tl.minimum(t17, 20.0))))
        if WRITE_Q:  # else the walk transforms q where it loads it
            t0q = tl.load(x_q + row[:, None] * K + o_K, mask=m, other=0.0).to(tl.float32)
            t4 = t0q * rc0 + rs0 * tl.load(x_q + row[:, None] * K + rp0, mask=m, other=0.0).to(tl.float32)
            t6 = tl.where(m, t4, 0.0)
            t8 = t6 * (1.0 / tl.sqrt(tl.sum(t6 * t6, axis=1, keep_dims=True) + 1e-06))
            tl.store(y_q + row[:, None] * K + o_K, t8.to(y_q.dtype.element_ty), mask=m)
        tl.store(y_k + row[:, None] * K + o_K, t11.to(y_k.dtype.element_ty), mask=m)
        tl.store(y_g + row, t19.to(y_g.dtype.element_ty), mask=m_t)
        tl.store(y_beta + row, tl.sigmoid(t3).to(y_beta.dtype.element_ty), mask=m_t)

@triton.jit
def _q_at_load(x_q, cos_t, sin_t, rope0_dim, t0, i_h, o_i, o_k, m_t, m_k, H, K: tl.constexpr):
    # the walk's q tile transformed where it is loaded: rope from the tables, then l2norm over the whole row
    m = m_t[:, None] & m_k[None, :]
    base = x_q + t0 * H * K + i_h * K + o_i[:, None] * (H * K)
    x = tl.load(base + o_k[None, :], mask=m, other=0.).to(tl.float32)
    first = o_k < rope0_dim // 2
    rp = tl.where(o_k < rope0_dim, tl.where(first, o_k + rope0_dim // 2, o_k - rope0_dim // 2), o_k)
    xp = tl.load(base + rp[None, :], mask=m, other=0.).to(tl.float32)
    o_tok = (t0 + o_i).to(tl.int64)[:, None] * K + o_k[None, :]
    y = tl.where(m, x * tl.load(cos_t + o_tok, mask=m, other=1.0) + tl.load(sin_t + o_tok, mask=m, other=0.0) * xp, 0.0)
    y = y * (1.0 / tl.sqrt(tl.sum(y * y, axis=1, keep_dims=True) + 1e-06))
    return y.to(x_q.dtype.element_ty)
'''


def walk_kernel():
    """The generated walk (fwd_fused) with q transformed at its load from the raw q and the rotary tables."""
    src = inspect.getsource(chunk.gated_delta_rule_rope_fwd_fused_kernel.fn)
    src = src.replace("def gated_delta_rule_rope_fwd_fused_kernel(\n",
                      "def walk_loadsite_kernel(\n    x_q, cos_t, sin_t, rope0_dim,\n")
    load = ("b_q = tl.load(q + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :], "
            "mask=m_t[:, None] & m_k[None, :], other=0.)")
    assert src.count(load) == 1, "the generated walk changed: find its q load"
    src = src.replace(load, "b_q = _q_at_load(x_q, cos_t, sin_t, rope0_dim, t0, i_h, o_i, o_k, m_t, m_k, H, K)")
    rope = inspect.getsource(transforms._rope_coefs.fn)
    return jit_from_source(rope + PROLOGUE + "\n\n" + src, "walk_loadsite_kernel")


def prologue_kernel():
    """fwd_wu with the prologue: its generated source, renamed, with the raw inputs added as arguments and the
    prologue called (then a barrier) once the chunk's first token t0 is known."""
    src = inspect.getsource(chunk.gated_delta_rule_rope_fwd_wu_kernel.fn)
    src = src.replace("def gated_delta_rule_rope_fwd_wu_kernel(\n",
                      "def fwd_wu_prologue_kernel(\n"
                      "    x_q, x_k, x_g, x_beta, p_A_log, p_dt_bias, pos, rope0_dim, cos_t, sin_t,\n")
    anchor = "    t0 = bos + i_tc * BT\n"
    assert src.count(anchor) == 1, "the generated fwd_wu changed: find the line that computes t0"
    call = ("    _transform_chunk(x_q, x_k, x_g, x_beta, p_A_log, p_dt_bias, pos, rope0_dim, cos_t, sin_t,\n"
            "                     q, k, g, beta, t0, T_seq - i_tc * BT, i_h, H, K, BT, BKF, TABLES, WRITE_Q)\n"
            "    tl.debug_barrier()\n")
    src = src.replace(anchor, anchor + call)
    src = src.replace("    IS_VARLEN: tl.constexpr,\n):",
                      "    IS_VARLEN: tl.constexpr,\n    BKF: tl.constexpr,\n    TABLES: tl.constexpr,\n"
                      "    WRITE_Q: tl.constexpr,\n):")
    assert "WRITE_Q: tl.constexpr,\n):" in src
    rope = inspect.getsource(transforms._rope_coefs.fn)
    return jit_from_source(rope + PROLOGUE + "\n\n" + src, "fwd_wu_prologue_kernel")  # both keep their decorators


def run_shape(shape, args, bench, kernel, walk) -> dict:
    """One shape: the three forwards' outputs compared, then timed interleaved."""
    dtype = getattr(torch, args.dtype)
    B, T, H, K, V = shape
    rec = load_recurrence(ROOT / "specs" / "gated_delta_rule_rope.fla")
    x = sample_inputs(rec, B, T, H, K, V, dtype, args.device, seed=0)
    q, k, v, g, beta, A_log, dt_bias = (x[i.name] for i in rec.spec.inputs)
    scale = K ** -0.5
    call = validate_call("prologue", chunk._ARGS, (q, k, v, g, beta, A_log, dt_bias), params=(("scale", scale),),
                         initial_state=None, output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None)
    plan = select_plan(chunk.CHUNK_PLANS, q.device, q.dtype, max(K, V))
    with torch.no_grad():
        pre = transforms.gated_delta_rule_rope_transforms(q, k, g, beta, A_log, dt_bias, call=call)

    def public():
        with torch.no_grad():
            return chunk.chunk_gated_delta_rule_rope(q, k, v, g, beta, A_log, dt_bias, scale=scale)[0]

    def op_alone():
        with torch.no_grad():
            return chunk.chunk_fwd(*pre[:2], v, *pre[2:], scale, None, False, None, None, None, plan)[0]

    def rope_tables(positions, R):
        """cos and the signed sin per (token, channel) [B * T, K] fp32 for a neox rope of rotary dim R."""
        o = torch.arange(K, device=q.device)
        inv = 10000.0 ** (-2.0 * (o % (R // 2)).float() / R)
        angle = positions.float()[:, None] * inv[None, :]
        rot = o < R
        cos = torch.where(rot, torch.cos(angle), 1.0)
        sin = torch.where(rot, torch.where(o < R // 2, -torch.sin(angle), torch.sin(angle)), 0.0)
        return cos.contiguous(), sin.contiguous()

    def variant(tables: bool, q_in_walk: bool = False):
        positions, rope_dims = transforms.gated_delta_rule_rope_transform_args(call, 0, None, q.device)
        cos_t, sin_t = rope_tables(positions, rope_dims[0]) if tables else (None, None)
        y_q, y_k, y_beta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(beta)
        y_g = torch.empty_like(g, dtype=torch.float32)
        generated_wu = chunk._chunk_wu

        def chunk_wu(q_, k_, v_, g_, beta_, scale_, do, cu_seqlens, chunk_indices, plan_):
            # the generated launcher's body with the prologue kernel and its extra arguments
            BT = plan_.chunk_size
            cfg = plan_.config("fwd_wu")
            BK, BV = launch.dot_tile(cfg.block_k, K), launch.dot_tile(cfg.block_v, V)
            w, u = torch.empty_like(k_), torch.empty_like(v_)
            Ai = k_.new_empty(B, T, H, BT)
            g_cum = torch.empty(B, T, H, dtype=torch.float32, device=k_.device)
            kernel[(launch.num_chunks(T, BT, None), B * H)](
                q, k, g, beta, A_log, dt_bias, positions, *rope_dims, cos_t, sin_t,
                q_, k_, v_, g_, g_cum, beta_, None, Ai, w, u, None, None, None, scale_, T,
                H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, USE_G=True, DV_LOCAL=False, IS_VARLEN=False,
                BKF=launch.whole_dim_tile(K), TABLES=tables, WRITE_Q=not q_in_walk, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
            return w, u, Ai, None, g_cum

        class WalkWithQAtLoad:
            """Stands in for the generated walk in chunk_fwd: the same launch, the raw q and the tables first."""

            def __getitem__(self, grid):
                return lambda *a, **kw: walk[grid](q, cos_t, sin_t, rope_dims[0], *a, **kw)

        generated_walk = chunk.gated_delta_rule_rope_fwd_fused_kernel
        chunk._chunk_wu = chunk_wu
        if q_in_walk:
            chunk.gated_delta_rule_rope_fwd_fused_kernel = WalkWithQAtLoad()
        try:
            with torch.no_grad():
                return chunk.chunk_fwd(y_q, y_k, v, y_g, y_beta, scale, None, False, None, None, None, plan)[0]
        finally:
            chunk._chunk_wu = generated_wu
            chunk.gated_delta_rule_rope_fwd_fused_kernel = generated_walk

    ref = public()
    names = {"public": public, "variant": lambda: variant(False), "variant_tables": lambda: variant(True),
             "op_alone": op_alone}
    if launch.fused_walk_tile(plan, V, B * H, q.device):  # q is read by the walk only where the walk runs
        names["q_in_walk"] = lambda: variant(True, q_in_walk=True)
    errs = {n: _ops.rel_err(f().float(), ref.float()) for n, f in names.items() if n != "public"}
    times = _ops.interleaved_times(names, lambda n: bench(names[n]), args.rounds)
    row = {"shape": _ops.shape_str(shape), **{f"{n}_ms": min(t) for n, t in times.items()},
           **{f"{n}_rounds": t for n, t in times.items()}, **{f"{n}_rel_err": e for n, e in errs.items()}}
    print(f"{row['shape']}: pass + chunk_fwd {row['public_ms']:.4f} ms, prologue in fwd_wu {row['variant_ms']:.4f}, "
          f"the same with rotary tables {row['variant_tables_ms']:.4f}, "
          f"and q transformed in the walk {row.get('q_in_walk_ms', float('nan')):.4f}, chunk_fwd on transformed inputs "
          f"{row['op_alone_ms']:.4f}; o rel err vs the op: {errs}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128")
    p.add_argument("--rounds", type=int, default=3)
    add_run_options(p)
    args = p.parse_args()
    bench = timer(args)
    shapes = _ops.parse_shapes(args.shapes) if args.device == "cuda" else [(2, 100, 2, 32, 32)]
    kernel, walk = prologue_kernel(), walk_kernel()
    warm_up_clocks(args, bench)
    with contextlib.ExitStack() as stack:
        if args.device != "cuda":  # the H100's plans with the walk taken, so the CPU check covers the walk variant
            stack.enter_context(forced_arch("sm90"))
            stack.enter_context(launch.forced_sm_count(0))
        rows = [run_shape(s, args, bench, kernel, walk) for s in shapes]
    write_record(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
