"""What every source id of a plan means: the prose, written once, behind the ids in plan tables.

A LaunchConfig's ``source`` names where its numbers come from, as comma-separated ids: a rule of the planner
(plan.py), a compile-time check (``fla-gen aot``, which compiles every planned kernel for sm80, sm89, sm90 and
sm100 and reports shared memory, registers and spills), or a GPU measurement (fla_gen/tuned.py). Generated
plan tables carry only the ids; ``fla-gen plan`` prints this prose.

A Source's ``archs`` are the targets it speaks for: a GPU measurement names the one it was measured on, and
only that target's plan rows may cite it (tests/compiler checks every generated row); empty: a rule or a
compile-time check that holds on every target. GPU measurements below: NVIDIA H100 80GB HBM3 (sm90), torch
2.11.0+cu130, Triton 3.6.0, bf16, inputs of benchmarks/_ops.py; ``benchmarks/sweep_plans.py`` unless said
otherwise (each kernel alone by torch.profiler, and the call by do_bench medians; every variant against the
plan in the same process). The raw results and the one-off scripts are in the git history at 0a80dc0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """The prose of one source id, and the targets it speaks for (empty: every target)."""

    text: str
    archs: tuple[str, ...] = ()


_H100 = ("sm90",)
_MMA_SYNC_SMALL = ("sm86", "sm89")

SOURCES: dict[str, Source] = {
    # ---------------------------------------------------------------------------------------- rules (plan.py)
    "tiles": Source("rule: the widest tiles (64, then 32, 16) and the deepest pipeline (at most 3 stages) whose "
                    "modelled shared memory fits 80% of the target's (the rest is Triton's scratch)"),
    "wide-v": Source("rule: on wgmma targets, one V tile as wide as the head dim (up to 128) for a kernel that loops "
                     "over V around a once-built [BT, BT] product: the product serves all of V at once"),
    "whole-k": Source("rule: whole K with a [K, BV] fp32 state tile in registers; BV = 64 / 32 / 16 at head dim 64 / "
                      "128 / 256 keeps it from spilling (fla-gen aot) and gives the sequential walk more programs"),
    "solve-one-warp": Source(
        "rule: the delta family's fwd_solve (the chunk's A and its blockwise inverse) on one warp, although it "
        "spills up to 104 B there on sm90 (none on sm80 and sm100; fla-gen aot; 560-810 B when these figures were "
        "measured, before the inverse's merge dots took tf32 for 16-bit inputs). Measured on the H200 (bf16, the "
        "real ops through plan overrides, 3 alternating rounds in one process per shape, the fused fwd_wu's build in "
        "processes before and after): Qwen3-Next's gated delta rule (4x4096, H=16, HV=32, K=V=128) forward "
        "0.810-0.816 ms with the fused fwd_wu (2 warps); split, fwd_solve on 4 warps 1.020-1.022, on 2 0.831-0.833, "
        "on 1 0.775-0.778 (fwd_wu on 2) and 0.761-0.763 (fwd_wu on 4); forward+backward 3.94-3.96 fused, 3.82-3.83 "
        "split (1, 4). The delta rule at 4x4096x16x128: forward 0.325-0.327 fused; split 0.425-0.428 (4 warps), "
        "0.339-0.340 (2), 0.322-0.324 (1), 0.317-0.318 (1, fwd_wu on 4); forward+backward 1.33 both. fla-core's "
        "autotune picks one warp for its kkt_solve there too (0.19 ms on 1 warp against 0.60 on 4). Not measured off "
        "sm90"),
    "sub-chunk": Source("rule: one program per 16-token sub-chunk; its 16-row dots are mma.sync on every target"),
    "sub-chunk-loop": Source("rule: one program per sub-chunk and K tile; the loop over the other sub-chunks has at "
                             "most BT / 16 - 1 steps, too few to pipeline"),
    "pair-blocks": Source("rule: K in 16-wide blocks: [BT, 16] factor tiles for dots, or entry-wise [BT, BT, 16] fp32 "
                          "decay tiles under strong gates"),
    "row-gate-pairs": Source("rule: one log gate per token: K in 16-wide blocks of tensor-core dots x y^T, scaled "
                             "by the [BT, BT] decays built from the chunk's [BT] gate cumsum (the per-channel path's "
                             "tiles, not measured for this one)"),
    "recurrent": Source("rule: whole K in registers, V in blocks sized so that ~2 (forward) or ~4 (backward) fp32 "
                        "registers per state element stay under 128 per thread"),
    "recurrent-one-warp": Source(
        "rule: a decode kernel that applies l2norms inline (and no rope) runs on one warp, V in blocks of "
        "4096 / K (128 fp32 state registers per thread), so that each norm's reduction over K stays within "
        "the warp. Decode step B=64, H=16, K=V=128, l2norm on in the call, CUDA-graph replay, worst of 3 (H100, "
        "bf16): KDA 0.0559 ms on [128, 32] and one warp against 0.0587 on [128, 64] and 4 warps (81% against "
        "77% of the copy bandwidth); Gated DeltaNet (32 value heads) 0.0981 against 0.0984. With the norms "
        "switched off, KDA's step is 5% slower on one warp; a rope inline spills 1.2 KB on one warp "
        "(gated_delta_rule_rope, fla-gen aot, sm90)"),
    "elementwise": Source("rule: an elementwise pass, nothing to pipeline"),
    "block-chain": Source("rule: 16x16 blocks held in registers, a chain of small dots and no loop over K or V: "
                          "nothing to pipeline"),
    "scan-loop": Source("rule: a scan whose every step's dot takes the last step's result: nothing to pipeline; "
                        "the whole key head dim in one tile, the V tile narrowed by the launcher on small grids"),
    "fwd-a-chunk-bk32": Source("rule: fwd_A_chunk's K tiles at most 32 wide, beside the chunk's two [BT, BT] "
                               "fp32 products in registers: measured on sm90 (h200-fwd-a-chunk), the rule "
                               "elsewhere"),
    "aot-fwd-a-chunk-sm100": Source("fla-gen aot, sm100, Triton 3.6: the per-channel delta rule's fwd_A_chunk (two "
                                    "dots on one transposed k tile) fails in TritonGPUPipeline at 2 and 3 stages; "
                                    "at 1 it compiles (95 registers, no spill)", ("sm100",)),
    "aot-dqk-intra-chunk-bk32": Source("rule: bwd_dqk_intra_chunk's K tiles at most 32 wide, beside the chunk's "
                                       "[BT, BT] fp32 gradient of A in registers (fla-gen aot, bf16, head dim 128: "
                                       "120-159 registers, no spill on sm80-sm100; wider tiles not timed)"),
    "fwd-a-one-stage": Source("rule: 1 stage: fwd_A's K loop runs K / BK <= 4 steps, too short to pipeline, and "
                              "fewer stages leave room for more programs per SM"),
    "split-walk": Source("rule, at run time: a state walk's K and V tiles halve (to 32 at least) while its "
                         "N*H*(K/BK)*(V/BV) programs are fewer than the GPU's SMs (launch.state_walk_tiles)"),
    "split-whole-k": Source("rule, at run time: a whole-K walk's BV halves (to 16 at least) while its V/BV*N*H "
                            "programs fill at most half of the GPU's SMs (launch.whole_k_walk_block_v)"),
    "split-sequence": Source("rule, at run time: while the N*H (sequence, head) walks, at V/32 programs each, are "
                             "fewer than half the GPU's SMs, each sequence splits into segments of whole chunks (4 at "
                             "least) until about two (segment, head) walks per SM: each segment's state from zero, "
                             "all at once; a scan over the segments (this kernel); then the walks from every "
                             "segment's entering state (fla_gen/runtime/segments.py)"),
    "split-delta": Source(
        "rule, at run time (the delta family, DPLR): a long sequence splits into segments of whole chunks as the "
        "algorithm's SegmentRule says: each segment's state from zero and its transition (the product of its "
        "chunks' [K, K] transitions, a walk from the identity), all at once; a scan over the segments, "
        "entry(s + 1) = M_s entry(s) + C_s, the state in fp32 and the product a tf32x3 dot (this kernel); then the "
        "walk from every segment's entering state (fla_gen/runtime/segments.py). The backward's state-gradient "
        "walk splits the same way in reverse, its scan taking each M_s transposed"),
    "fused-walk": Source("rule, at run time: the forward runs as one walk that also writes the outputs (fwd_fused) "
                         "while its V/BV*N*H programs reach min_sm_share of the GPU's SMs, BV halving to 32 to get "
                         "there (launch.fused_walk_block_v); else fwd_h + fwd_o"),
    "fused-walk-unmeasured": Source("rule: fwd_fused is never taken on this target (not measured here; on the "
                                    "mma.sync targets its tiles spill 24-400 B, fla-gen aot): fwd_h + fwd_o"),
    "fused-walk-no-fit": Source("rule: fwd_fused is never taken: even [K, 16] tiles at 2 stages do not fit the "
                                "target's shared memory"),
    # --------------------------------------------------------------------------- compile-time checks (fla-gen aot)
    "aot-scan-warps": Source("fla-gen aot: 8 warps for the delta family's segment_scan at head dim 128, whose "
                             "tf32x3 dot takes the whole [K, K] fp32 transition: at 4 it spills 428 B on sm90 "
                             "(ptxas); 8 fit in 241 registers. Not at head dim 64, where 8 warps lay the loop's dot "
                             "out apart (an MMA->MMA conversion on sm90). Timed since (H200, bf16, sweep_plans.py, "
                             "kernel time at 1x16384x16x128): 0.029 ms on 8 warps against 0.101-0.102 on 4, the delta "
                             "rule's and KDA's scans alike"),
    "grads-four-warps-sm100": Source("rule: bwd_dqkvg on 4 warps at head dims 128 and 256 on sm100, as measured on "
                                     "sm90 (h200-grads-four-warps; not measured on sm100)", ("sm100",)),
    "aot-channel-stages": Source("fla-gen aot, bf16, 64x64 tiles: the per-channel bwd_dv stages whole-chunk [BT, BT] "
                                 "products and sub-chunk operands: 3 stages need 160-209 KB, 2 stages 88-128 KB, "
                                 "1 stage ~24-40 KB (more than the tile model predicts): 2 stages where 3 do not fit "
                                 "the target (163 KB on sm80) or come within a few KB of it (227 KB on sm90 and "
                                 "sm100)", ("sm80", "sm90", "sm100")),
    "aot-channel-stages-99k": Source("fla-gen aot: the per-channel bwd_dv at 2 stages needs 88-96 KB, within the 99 KB "
                                     "of sm86 / sm89, 3 stages 160+ KB; at head dim 256, 2 stages need 152-161 KB, so "
                                     "1 stage there", _MMA_SYNC_SMALL),
    "aot-dqkg-bk32": Source("fla-gen aot, head dim 128: bwd_dqkg's K in 32-wide tiles: at 64 the [BT, BK] fp32 tiles "
                            "of its epilogue take 255 registers and spill 8-20 B on sm80/89/90 (4 warps; 8 warps still "
                            "need 244 on sm80/89); at 32, 136-168 registers and no spill"),
    "aot-dplr-da-warps": Source("fla-gen aot, bf16, K = V = 128, every target: bwd_dA's four [K, BT] fp32 accumulators "
                                "and three [K, BV] tiles take 228 registers at 4 warps, 182 at 8: 8 warps"),
    "aot-channel-delta-wy-warps": Source("fla-gen aot, bf16: the per-channel delta rule's bwd_wy at 4 warps spills "
                                         "324 B on sm80 (head dim 128) and 8-52 B on sm89 (head dim 64); at 8 warps "
                                         "none on sm80 and 0-16 B on sm89 (sm86 taken as sm89)",
                                         ("sm80", "sm86", "sm89")),
    "aot-channel-delta-h-warps": Source("fla-gen aot, bf16: the per-channel delta rule's fwd_h at 4 warps spills "
                                        "156-164 B on sm100 at head dim 128 (32-44 B at the split tiles); at 8 none",
                                        ("sm100",)),
    "aot-delta-dh-99k": Source("fla-gen aot: the delta family's bwd_dh whole-K tiles need 98 KB at 2 stages, at the "
                               "99 KB limit of sm86 / sm89: 1 stage", _MMA_SYNC_SMALL),
    # ------------------------------------------------------------------------------------ GPU measurements, H100
    "h100-gla-wide-v": Source(
        "the per-channel gated chunk op at 4x4096x16x128: one 128-wide V tile in fwd_o and bwd_dv (no V loop "
        "around the [BT, BT] product) "
        "against two 64-wide ones: forward 1.505 -> 1.327 ms, forward+backward 4.432 -> 4.136 ms (the rule wide-v "
        "since then; this entry pins bwd_dv at 2 stages, 4 warps)", _H100),
    "h100-fwd-a-stages": Source(
        "the per-channel gated op's fwd_A at 1 stage against 3 (which hold 83 KB of shared memory, fla-gen "
        "aot, and so fewer programs per "
        "SM), 4 warps, sweep_plans.py --stages fwd_A: 0.467 -> 0.326 ms at 4x4096x16x128, 0.380 -> 0.341 at "
        "2x8192x8x256, 0.219 -> 0.216 at 8x2048x32x64", _H100),
    "h200-grads-four-warps": Source(
        "the scalar-gate family's bwd_dqkvg on 4 warps against 8 (the rule's 8 had come from fla-gen aot, where 4 "
        "spilled ~156 B on sm90; today 4 warps take 255 registers without a spill at head dim 128, and spill 100 B at "
        "256), H200, bf16, GPU kernel time by torch.profiler. sweep_plans.py --stages bwd_dqkvg: simple_gla's kernel "
        "0.619-0.621 -> 0.418 ms at 4x4096x16x128, 2.446 -> 1.659 at 8x8192x16x128, 0.890 -> 0.671 at 2x8192x8x256 "
        "(there BK 128 on 4 warps 0.618); at head dim 128, 2 stages 0.478 and 32-wide V tiles 0.503. In the op "
        "(compare_builds.py, 2 alternating rounds against the 8-warp build, forward+backward): simple_gla 0.953 -> "
        "0.746 ms at 4x4096x16x128, 1.055 -> 0.856 at 1x16384x16x128, 1.485 -> 1.266 at 2x8192x8x256, 3.989 -> 3.194 "
        "at 1x65536x16x128; the packed batch (run.py's varlen preset, two processes each) 8.488-8.493 -> 6.557-6.567; "
        "linear_attn with the kernel pinned (it walks its backward where the fused walk runs) 0.582 -> 0.551 at "
        "4x4096x16x128 and 0.932 -> 0.914 at 2x8192x8x256. 32-wide K tiles on 4 warps were miscompiled under "
        "Triton 3.6 (wrong gradients for simple_gla, an illegal address for linear_attn): never planned on sm90",
        _H100),
    "h200-fwd-a-chunk": Source(
        "the per-channel delta rule's (KDA's) fwd_A as one program per chunk through one reference token against the "
        "16-token sub-chunks' kernel (the plan's, whole K on 2 warps: 0.277 ms), 4x4096x16x128, H200, bf16, "
        "logsigmoid(randn) / 16 gates (no chunk left to the sub-chunks), kernel time over 30 calls: 32-wide K tiles "
        "on 4 warps 0.147 ms at 2 stages, 0.169 at 1; 64-wide 0.148 at 2 stages, 0.185 at 1; whole K 0.170; 8 "
        "warps 0.148-0.209. A and M within 2.9e-3 and 6.6e-4 of float64, as the sub-chunks' kernel's. In the op "
        "(compare_builds.py --variants, 3 alternating rounds, forward without autograd), the rule's 3 stages "
        "against 2: KDA 0.750 against 0.765 ms, GLA 0.454 against 0.461",
        _H100),
    "h200-delta-channel-wu-bk32": Source(
        "the per-channel delta rule's (KDA's) fwd_wu on 32-wide K tiles (122 registers on sm90, fla-gen aot, against "
        "226 at 64: four programs per SM instead of two; Nsight Compute had the 64-wide kernel latency-bound, 2.81 "
        "TB/s, DRAM 58%) and its fwd_h on 64-wide V tiles at 3 stages (the walk's grid 128 programs at "
        "4x4096x16x128 against 256), compare_builds.py --variants, 3 alternating rounds in one process, H200, bf16, "
        "forward without autograd, 4x4096x16x128: the plan 0.746 ms, fwd_wu at BK 32 0.710 (worst round 1.048x), "
        "2 stages 0.725; with fwd_h at BV 64 and 3 stages as well 0.699 (1.064x), forward+backward 3.028 -> 2.981. "
        "fwd_h alone at BV 64: 0.733-0.754 against 0.745-0.765 over two runs; fwd_wu on 8 warps, at 2 stages, or as "
        "two programs per chunk (W and U apart) was slower. The gated delta rule's fwd_wu at BK 32 was slower "
        "(0.644 against 0.633 ms, Qwen3-Next's 4x4096, H = 16, HV = 32)",
        _H100),
    "h200-gla-fwd-a-tiles": Source(
        "the per-channel gated op's fwd_A on its column blocks (one [BK, 16] tile per earlier sub-chunk), the real "
        "op through plan overrides, forward without autograd, 3 alternating rounds in one process, H200, bf16, "
        "outputs bit-identical: at head dim 128 the whole K in one tile on 2 warps, 0.566 -> 0.511 ms at "
        "4x4096x16x128 (worst round 1.107; 0.720 -> 0.665 at 1x16384x16x128) against 64-wide K tiles (32-wide "
        "0.581, 4 warps 0.643, whole K on 1 warp 0.624); at head dim 64 one warp, 0.448 -> 0.376 at 8x2048x32x64 "
        "(1.188) against 4 (2 warps 0.405); at head dim 256 one warp, 0.743 -> 0.718 at 2x8192x8x256 (1.033; "
        "128-wide K tiles on 2 warps 0.737, on 4 0.773). Its 16-row dots leave more warps little to share. With "
        "one [BK, BT] tile of every column (before the column blocks) 2 warps had beaten 4 on the H100 at head dims "
        "128 and 256, and 4 stayed at 64", _H100),
    "h100-walk-4-stages": Source(
        "the scalar- and channel-gate state walks at 4 stages (a fourth stage keeps one more chunk's loads in "
        "flight past a state held in registers; fla-core's autotune picks 4 for its own walk at head dim 256), "
        "sweep_plans.py --extra-variants num_stages 4, kernel alone: the scalar-gated op fwd_h 0.161 -> 0.149 "
        "ms and bwd_dh "
        "0.164 -> 0.150, the ungated op bwd_dh 0.158 -> 0.146 at 2x8192x8x256 (4 warps); the per-channel gated "
        "op on 8 warps: fwd_h 0.168 "
        "-> 0.160 at 4x4096x16x128 and 0.301 -> 0.281 at 2x8192x8x256, bwd_dh 0.170 -> 0.155 and 0.302 -> 0.257. "
        "Not the scalar-gate walks at head dim 128 (fwd_h 0.094 at 3 stages against 0.096, bwd_dh 0.098 against "
        "0.101)", _H100),
    "h100-delta-fwd-h-128": Source(
        "the delta family's fwd_h at head dim 128, [128, 64] state tile, 4 warps, 3 stages (fla-core's autotuned "
        "pick for its walk), kernel alone: 0.173 -> 0.147 ms at 4x4096x16x128 against the rule's [128, 32] at 2 "
        "stages (gated 0.177 -> 0.147; fla-core's kernel 0.146); at 1x16384x16x128, where the run-time split takes "
        "BV to 16, 0.223 ms against 0.378 at 2 stages", _H100),
    "h100-delta-fwd-h-256": Source(
        "the delta family's fwd_h at head dim 256, [256, 32] state tile, 4 warps, 3 stages, at 2x8192x8x256: "
        "0.641 -> 0.456 ms (the delta rule) and 0.830 -> 0.551 (gated) on 8 warps against the rule's [256, 16]; then "
        "0.409 -> 0.353 and 0.526 -> 0.476 on 4 warps and 3 stages against 8 and 2; 4 stages do not fit (282 KB)",
        _H100),
    "h100-delta-bwd-dh-128": Source(
        "the delta family's bwd_dh at head dim 128, the state gradient as two [64, 64] row blocks, 4 warps, 3 "
        "stages, kernel alone: 0.196 ms against 0.266 for one [128, 32] tile at 2 stages at 4x4096x16x128 "
        "(fla-core's kernel 0.199); at 1x16384x16x128 (run-time split to BV 16) 0.294 ms against 0.652", _H100),
    "h100-delta-bwd-dh-256": Source(
        "the delta family's bwd_dh at head dim 256, [256, 32] state tile, 4 warps, 2 stages, at 2x8192x8x256: "
        "kernel 0.675 -> 0.494 ms (the delta rule) and 0.784 -> 0.569 (gated) against the rule's [256, 16] at 1 stage; "
        "forward+backward 3.024 -> 2.836 and 3.602 -> 3.381 ms", _H100),
    "h100-delta-bwd-dqk-whole-k": Source(
        "the delta family's bwd_dqk at head dim 128 with the whole K in one block against [64, 64] "
        "(sweep_plans.py, the gated delta rule, 4x4096x16x128, --quick): kernel 0.524 -> 0.494 ms, forward+backward "
        "1.934 -> 1.905 ms", _H100),
    "h100-delta-channel-whole-k": Source(
        "the per-channel gated delta rule (KDA's recurrence) at head dim 128, the intra-chunk kernels with the whole "
        "K in one block against 64-wide K blocks (sweep_plans.py, 4x4096x16x128, --quick): fwd_A kernel 0.643 -> "
        "0.502 ms (forward 1.681 -> 1.533), bwd_dqk_intra 0.748 -> 0.648 (forward+backward 6.217 -> 6.151). On 2 "
        "warps since each runs as one launch for both products (A_qk, M, and fwd_A's qg): fwd_A 0.391 -> 0.294 ms "
        "against 4 warps (forward 1.158 -> 1.070), 0.442 with 64-wide K blocks, 0.656 on 8 warps; bwd_dqk_intra "
        "0.779 -> 0.686 (forward+backward 4.453 -> 4.350), 0.817 with 64-wide K blocks, 0.874 on 8 warps", _H100),
    "h100-delta-channel-fwd-o-wide-v": Source(
        "the per-channel gated delta rule's fwd_o at head dim 128 with 128-wide V tiles against 64 (sweep_plans.py, "
        "4x4096x16x128, --quick): kernel 0.221 -> 0.187 ms, forward 1.661 -> 1.638 ms", _H100),
    "h100-dplr-pair-kernels": Source(
        "the DPLR chunk op with RWKV-7 gates (every K block takes the factored dots), sweep_plans.py --stages "
        "fwd_intra,bwd_dqk: fwd_intra on 2 warps with 32-wide K blocks (then one kernel with both paths, spilling "
        "~260 B on sm90, fla-gen aot): 3.27 ms at BK 16 / 8 warps, 2.14 at 4, 1.24 at 2, 1.105 at BK 32 / 2 "
        "(4x4096x16x128); 2.291 -> 1.222 (8x2048x32x64); 2.070 -> 1.083 (2x8192x8x256). bwd_dqk with 32-wide K blocks"
        " on 4 warps (then spilling ~600 B): 3.69 -> 2.19 ms (4x4096x16x128, 5.16 at 8 warps, 9.11 at 2), 3.768 -> "
        "2.084 (8x2048x32x64), 3.686 -> 2.178 (2x8192x8x256, BV 16). Swept again on the H200 as two launches (the "
        "grid's dots alone spill nothing), 4x4096x16x128, kernel time: fwd_intra 0.619 ms at BK 32 / 2 warps, 0.699 "
        "at 16 / 2, 0.803 at 32 / 4, 1.051 at 64 / 4; bwd_dqk 1.803 at BK 32 x BV 32 / 4, 2.941 at 16 x 32 / 4, 3.475"
        " at 32 x 32 / 8", _H100),
    "h200-gla-dqkg-tiles": Source(
        "the per-channel gated op's backward at head dim 128: bwd_dqkg on 64-wide K tiles against the rule's 32 "
        "(aot-dqkg-bk32, from register counts: 64 spills 8-20 B) and bwd_dqk_intra_chunk on 2 warps against 4, "
        "H200, bf16, GPU kernel time by torch.profiler. sweep_plans.py --stages bwd_dqkg,bwd_dqk_intra_chunk at "
        "4x4096x16x128: bwd_dqkg 0.457 -> 0.422 ms (64-wide on 8 warps 0.631, 32-wide at 2 stages 0.470), "
        "bwd_dqk_intra_chunk 0.254 -> 0.239 (64-wide K tiles 0.267); gradients within 2.6e-5 of the plan's. In the "
        "op (compare_builds.py --variants, 2 alternating rounds in one process), forward+backward kernel time with "
        "both: 1.573 -> 1.527 ms at 4x4096x16x128 (1.030x), 1.872 -> 1.822 at 1x16384x16x128 (1.027x); each alone "
        "1.023x and 1.011x at 4x4096",
        _H100),
    "h200-gla-pre-gated": Source(
        "the per-channel gated op's forward reading fwd_A_chunk's qg = scale q exp(G) and kd = k exp(G_L - G) (bf16) "
        "and gl = G_L, with G taken in registers there (no cumsum kernel in the forward). Its launch configs around "
        "the plan's, H200, bf16, GPU kernel time by torch.profiler, compare_builds.py --variants (2 alternating "
        "rounds in one process), forward without autograd: fwd_A_chunk on the whole K at head dim 64, 0.325 -> "
        "0.296 ms at 8x2048x32x64 (1.100x; forward+backward 1.023x; at 2 stages 1.095x, 8 warps 0.893x), not at "
        "256 (64-wide at 2x8192x8x256 1.008x, whole K 0.942x) nor 128 (64-wide 0.986x, 2 stages 0.970x at "
        "4x4096x16x128); fwd_h at 3 stages on 8 warps, 0.464 -> 0.442 ms at 1x16384x16x128 (1.049x; "
        "forward+backward 1.022x) and 1.004x at 4x4096x16x128 (4 warps 0.999x and 0.996x; 4 warps at 3 stages "
        "1.056x and 0.998x); fwd_o on a 128-wide K tile, 1.021x at 4x4096x16x128 and 1.013x at 1x16384x16x128 "
        "(2 stages 1.003x and 1.000x)",
        _H100),
    "h200-delta-channel-bwd-dh-stages": Source(
        "the per-channel gated delta rule's bwd_dh at head dim 128, reading the pre-gated kd and qg of fwd_wu. The "
        "tile, on the H100 (sweep_plans.py, 4x4096x16x128, --quick): [128, 64] on 4 warps, 0.213 ms against 0.313 "
        "with [128, 32] and 0.252 on 8 warps; 4 stages do not fit in shared memory (288 KB). The stages, on the "
        "H200 (bf16, GPU kernel time by torch.profiler): 2 against 3, sweep_plans.py at 4x4096x16x128 0.251 -> "
        "0.207 ms, gradients identical; in the op (compare_builds.py --variants, 2 alternating rounds in one "
        "process), forward+backward kernel time 2.801 -> 2.752 ms at 4x4096x16x128 (1.018x), 3.205 -> 3.203 at "
        "1x16384x16x128 (1.000x). The H100 had measured the other order (3 stages 0.213 against 0.240 at 2)",
        _H100),
    "h200-dplr-walk-stages-64": Source(
        "the DPLR chunk op at head dim 64 with RWKV-7 gates, as h200-dplr-walk-stages at 128: the state walks fwd_h "
        "and bwd_dh ([64, 64] tiles, 4 warps) at 3 stages against 2 and bwd_dA on 4 warps at 3 stages against the "
        "rule's 8 at 2 (aot-dplr-da-warps), H200, bf16, GPU kernel time by torch.profiler. sweep_plans.py at "
        "8x2048x32x64: fwd_h 0.262 -> 0.189 ms, bwd_dh 0.268 -> 0.217, bwd_dA 1.2 -> 0.6 (0.6 on 4 warps at 2 "
        "stages too). In the op (compare_builds.py --variants, 2 alternating rounds in one process): forward 0.960 -> "
        "0.887 ms of kernels (1.083x), forward+backward 3.887 -> 3.121 (1.245x; the walks alone 1.045x, bwd_dA alone "
        "1.180x); outputs identical to the plan's, bf16 gradients within 2.5-3.7e-3 of float64 (gpu_check.py)",
        _H100),
    "h200-dplr-dqk-stages": Source(
        "the DPLR chunk op's bwd_dqk (both launches; its K and V blocks and warps as h100-dplr-pair-kernels) at 3 "
        "pipeline stages against 1, RWKV-7 gates, sweep_plans.py "
        "--stages bwd_dqk,fwd_intra, H200, bf16, kernel time by torch.profiler, gradients bit-identical: 1.840 -> "
        "1.020 ms at 4x4096x16x128 (1.305 at 2 stages), 1.384 -> 1.071 at 8x2048x32x64, 1.822 -> 0.996 at "
        "2x8192x8x256 (BV 16); forward+backward 4.743 -> 3.927, 4.211 -> 3.895 and 8.078 -> 7.253 ms. fwd_intra "
        "at 2 or 3 stages was slower (0.615 -> 0.710-0.735 ms at 4x4096x16x128): it keeps 1",
        _H100),
    "h200-dplr-walk-stages": Source(
        "the DPLR chunk op with RWKV-7 gates, H200, bf16, kernel time: sweep_plans.py --stages bwd_dA,fwd_h,bwd_dh at"
        " 4x4096x16x128 (one process, each variant against the plan): fwd_h 0.543 ms at 2 stages, 0.409 at 3; bwd_dh "
        "0.517 -> 0.430; bwd_dA 1.427 ms on 8 warps x 32-wide V, 0.919 on 4 (1.063 at 4 x 16, 1.171 at 8 x 64). "
        "Together, compare_builds.py --variants, 2 rounds, worst round plan/variant: forward 1.112x and "
        "forward+backward 1.180x at 4x4096x16x128, 1.139x and 1.170x at 1x16384x16x128 (with bwd_dA at 2 stages, "
        "forward+backward 1.151x and 1.145x; with the walks at 4 stages, 1.067x and 1.090x at 1x16384). fla-gen aot: "
        "the walks 56-71 KB of shared memory at 3 stages, bwd_dA 227-235 registers, no spills", _H100),
    "h100-dplr-bwd-da-256": Source(
        "the DPLR chunk op with RWKV-7 gates at 2x8192x8x256, sweep_plans.py --stages bwd_dA: bwd_dA on 4 "
        "warps with the [256, 16] state "
        "tile, 2.893 -> 1.665 ms against 8; forward+backward 16.86 -> 15.79 ms", _H100),
    "h100-dplr-dqk-warps": Source(
        "the DPLR chunk op with RWKV-7 gates at 4x4096x16x128, plan overrides: bwd_dqk 8.63 ms at 8 warps, "
        "5.50 at 4 (though it spills "
        "~240 B, fla-gen aot), 6.12 at 2", _H100),
    "h100-dplr-intra-warps": Source(
        "the DPLR chunk op with RWKV-7 gates at 4x4096x16x128 with the factored dots: fwd_intra 3.27 ms at 8 "
        "warps, 2.14 at 4", _H100),
    "h100-fused-walk-scalar": Source(
        "the forward as one walk (fwd_fused) against fwd_h + fwd_o, through the public op, same inputs, outputs "
        "bit-identical. Without a gate one program per SM is enough: the ungated op 0.244 -> 0.106 ms at "
        "4x4096x16x128 [BV 64, 4 warps, 3 stages], 0.194 -> 0.103 at 8x2048x32x64, 0.353 -> 0.228 at 2x8192x8x256 "
        "[32, 4, 3], even at 1x16384x16x128 on 64 programs (0.294 against 0.304): share 0.5. With a gate each step "
        "also rescales by the chunk's decays and the walk wants two programs per SM (share 1.9): the "
        "scalar-gated op 0.261 "
        "-> 0.204 at 4x4096x16x128 (256 programs, [32, 4, 3]), 0.221 -> 0.139 at 8x2048x32x64 ([64, 4, 2]); slower "
        "at 128 programs (1x8192x32x128 0.290 -> 0.345) and at head dim 256 even on 1024 programs (8x2048x16x256 "
        "0.699 -> 1.033, [256, 32] spills 144 B): never there. One stage is never planned: [32, 4 warps, 1 stage] "
        "with a gate at head dim 128 was miscompiled under Triton 3.6 (an illegal address) while 2 and 3 are exact",
        _H100),
    "h100-fused-walk-delta": Source(
        "the delta family's forward as one walk against fwd_h + fwd_o (P built before q @ h: no spill at [64, 4, "
        "3]), outputs bit-identical: the delta rule 0.500 -> 0.329 ms at 4x4096x16x128 [64, 4, 3], 0.570 -> 0.447 at "
        "8x2048x32x64, 0.573 -> 0.526 at 1x16384x16x128 ([32, 4, 3] on 64 programs, 0.48x the SMs: share 0.45), "
        "0.602 -> 0.567 at 2x8192x8x256 [32, 4, 2]; the gated delta rule 0.526 -> 0.417 at 4x4096x16x128 ([32, 4, 2], "
        "256 programs), 0.619 -> 0.497 at 8x2048x32x64 [64, 4, 2], slower on fewer programs (1x16384x16x128 0.645 "
        "-> 0.808, 2x8192x8x256 0.661 -> 0.716): share 1.9 as the scalar gate's walk, never at head dim 256", _H100),
    "h200-delta-walk-inverse": Source(
        "the delta family's forward walk building v_new = (Ai diag(beta)) (v - exp(G) k h) from fwd_solve's inverse "
        "(fwd_solve also storing G) against reading fwd_wu's W and U, which then does not run in the forward; k's "
        "tile transposed in registers rather than loaded twice (two loads took the walk to 116 KB of shared "
        "memory, one program per SM: fwd_fused 0.387 -> 1.081 ms at Qwen3-Next's 4x4096, H=16, HV=32). "
        "compare_builds.py, bf16, 2 alternating processes per build: at head dim 64 the gated delta rule's "
        "forward 0.405 -> 0.361 ms at 8x2048x32x64 (worst round 1.119), the delta rule's 0.356 -> 0.315 (1.128), "
        "forward+backward 1.676 -> 1.636 and 1.366 -> 1.324; at head dim 128 slower: the gated 0.379 -> 0.398 ms "
        "at 4x4096x16x128 and 0.740 -> 0.792 with HV=32, the delta rule 0.306 -> 0.399 (0.357 on [128, 32] tiles "
        "at 2 stages), so the walk reads W and U there", _H100),
    "h200-gated-delta-walk-inverse-128": Source(
        "the gated delta rule's walk from the inverse at head dim 128, measured again once the walk loaded the "
        "inverse as whole rows: compare_builds.py --variants, bf16, 3 alternating rounds, forward ms, W and U -> "
        "inverse: with grouped value heads (HV = 2H) faster at every batch, 2x4096x16x128 HV=32 0.329 -> 0.319, "
        "4x4096 0.628 -> 0.616, 8x4096 1.236 -> 1.210 (Qwen3-Next's call with l2norm 0.697 -> 0.684, "
        "real_models.py); with HV = H slower at every batch, 4x4096x16x128 0.322 -> 0.330, 8x2048 0.326 -> 0.330, "
        "16x2048 0.629 -> 0.635, so not a matter of program count: the inverse path reads k, which a group's value "
        "heads share, where W is one per value head. Forward+backward within 1% either way. The ungated delta rule "
        "at 128 was mixed (4x4096 0.245 -> 0.238, 8x2048x32 0.472 -> 0.463, 2x4096 0.190 -> 0.211) and keeps W "
        "and U", _H100),
    "h100-fused-walk-gla": Source(
        "the per-channel gated op's forward as one walk (every V-block program rebuilds q exp(G) and k exp(G_L "
        "- G)): faster only at "
        "head dim 64 (8x2048x32x64: 0.575 -> 0.465 ms at [64, 4, 2]); at 128 even at best (4x4096x16x128 [64, 8, "
        "2]: 0.687 -> 0.676 ms; 0.95-0.99 ms at 32-wide V), slower at 256: never there", _H100),
    "h100-split-walk": Source(
        "the state walk split at 1x16384x16x128: 64 -> 256 programs, fwd_h 0.403 -> 0.312 ms (the scalar-gated "
        "op), 0.503 "
        "-> 0.371 (the per-channel gated op)", _H100),
    "h100-split-sequence": Source(
        "the sequence split by segment length, ours alone in one process, do_bench medians (forward with autograd "
        "on): linear_attn at 1x16384x16x128 0.301 ms unsplit, 0.217 at 16 chunks per segment (16 segments), 0.265 "
        "at 8, 0.249 at 32; at 1x65536x16x128 1.168 unsplit, 0.714 at 16 segments, 0.750 at 32, 0.727 at 8; "
        "simple_gla 0.332 -> 0.292 ms (1x16384) and 1.251 -> 1.075 (1x65536) at the rule's 16 and 61 chunks; "
        "2x8192x8x256 (linear_attn, 128 programs unsplit) 0.229 ms unsplit against 0.315-0.741 split. The split "
        "walk's kernels at 1x16384 (simple_gla): fwd_h from zero 0.061 ms, the scan 0.012, fwd_fused 0.204", _H100),
    "h200-walk-two-per-sm": Source(
        "the scalar-gate family's fwd_fused at [K, 64] tiles and 2 stages, whose shared memory holds two programs per "
        "SM, against the plan's launch (compare_builds.py --variants, H200, bf16, 2-3 alternating rounds in one "
        "process, GPU kernel time of the forward by torch.profiler; Nsight Compute: the ungated walk's [K, 64] at 3 "
        "stages builds at 136 KB, one program per SM, 6% of its warps resident; the gated one's [K, 32] at 3 stages "
        "two per SM; the gated walk's [K, 64] at 2 stages builds at 88 KB and spills 184 B on sm90, fla-gen "
        "aot, and still measures faster where it is taken). Ungated (plan [64, 3 stages]): 1x16384x16x128, split "
        "into 16 segments, 512 programs, 0.183 -> 0.156 ms; 1x65536x16x128 0.634 -> 0.547; at 256 programs "
        "(8x4096x16x128) 0.182 -> 0.186 and at 128 (4x4096x16x128) 0.092 -> 0.143: share 3. Gated (plan [32, 3 "
        "stages]): 1x16384x16x128 0.262 -> 0.248, "
        "1x65536x16x128 0.941 -> 0.895, 8x4096x16x128 (256 programs) 0.385 -> 0.316, 4x4096x16x128 (128) 0.194 -> "
        "0.275: share 1.9. Packed batches: h200-walk-packed",
        _H100),
    "h200-walk-packed": Source(
        "the same two launches on packed batches (16 heads, head dim 128, bf16, forward without autograd, GPU kernel "
        "time by torch.profiler, 3 alternating rounds in one process, H200, kernels of fc6ab6d, the two-per-SM launch "
        "as a plan override). The gated walk: 32 sequences of 256-8192 tokens (run.py's varlen preset) 1.604-1.617 "
        "-> 1.281-1.287 ms; 8 sequences of 4096-16384 tokens 1.045-1.046 -> 0.827-0.840; one sequence of 16384 "
        "tokens and 31 of 256-1024 0.512-0.513 -> 0.719-0.721. The call's work per SM at the two-per-SM tile, "
        "(chunks x heads x V / 64) / 132, against its longest walk: 584 against 128 chunks, 311 against 250, 137 "
        "against 256; where the longest walk is the longer, it bounds the call, and two programs per SM slow its "
        "steps. The ungated walk was slower on all three: 0.835-0.854 -> 0.981-0.985, 0.543-0.559 -> 0.623-0.625, "
        "0.332-0.354 -> 0.532-0.534, so its packed calls keep the plan's launch",
        _H100),
    "h200-split-delta": Source(
        "the delta family's sequence split by segment length on the H200 (bf16, benchmarks/segment_sweep.py: ours "
        "alone, or beside fla-core, in one process per op and shape, 3 alternating rounds, worst round). With the "
        "scan as one tf32x3 dot per segment on the whole [K, K] transition (8 warps), at 1x16384x16x128: the gated "
        "delta rule 0.624 ms whole, 0.598 at 32 chunks per segment (8 segments), 0.690 at 29 (9 segments: one more "
        "partial wave of walk programs), 0.642 at 16; KDA 1.204 whole, 1.152 at 32, 1.203 at 29, 1.169 at 16; the "
        "delta rule 0.537-0.538 whole, 0.481-0.482 at 32. With the same scan, 8 segments, the worst round's "
        "whole/split: at 1x65536 (128 chunks) the delta rule 1.216 (2.087-2.092 -> 1.705-1.721 ms), the gated delta "
        "rule 1.106 (2.387-2.399 -> 2.152-2.160), KDA 1.084 (4.646-4.654 -> 4.286-4.292); at 1x131072 (256 chunks) "
        "the delta rule 1.237 (4.154-4.198 -> 3.357-3.394), the gated delta rule 1.120 (4.735-4.758 -> 4.223-4.245), "
        "KDA 1.091 (9.254-9.269 -> 8.469-8.480). With the scan on column blocks of the transition (4 warps): at "
        "1x65536 the delta rule 2.087 -> 1.700 ms, the gated delta rule 2.397 -> 2.156, KDA 4.658 -> 4.286; the "
        "delta rule at 1x16384 0.537 -> 0.481 at 32 chunks, 0.529 at 16, 0.626 at 8. As an fp32 FMA dot ('ieee') the "
        "scan took 1.28 ms of a 1.84 ms forward (1x16384, 32 segments, torch.profiler). The backward's state-gradient "
        "walk split on the same segments (a reverse scan with the transposed transitions), each build in its own "
        "process, 2 rounds: forward+backward at 1x65536 6.740 -> 6.552 ms (the delta rule), 8.467 -> 8.239 (the "
        "gated delta rule); in one process the delta rule's at 1x16384 1.824-1.829 whole, 1.794-1.884 split", _H100),
    "h200-split-dplr": Source(
        "DPLR's sequence split by segment length on the H200 (bf16, benchmarks/segment_sweep.py --ops "
        "dplr_delta_rule --backward: ours alone in one process per shape, 3 alternating rounds, worst round "
        "whole/split; 16-token chunks): forward at 1x65536x16x128 12.31-12.35 ms whole, 8.56-8.62 at 512 chunks per "
        "segment (8 segments), 8.05-8.06 at 256 (16), 7.97 at 128 (32), 8.03 at 64 (64: 1.53x); forward+backward "
        "40.46-40.50 whole, 32.94-32.96 at 256. At 1x16384: 3.12 whole, 2.22 at 128 chunks (8 segments), 2.10 at 64 "
        "(16: 1.48x), 2.16 at 32 (32); forward+backward 10.21-10.23 whole, 8.45 at 64 (1.21x). At 1x4096: 0.799-0.801 "
        "whole, 0.608-0.609 at 32 or 16 chunks (1.31x); forward+backward 2.60 -> 2.26-2.30. At 4x4096 (64 walks): "
        "1.70 whole, 2.09-2.15 split (0.79-0.81x), forward+backward 6.58 -> 7.30-7.46. RWKV-7 (the same kernels) at "
        "1x65536: 12.29-12.35 whole, 8.03-8.07 split (1.53x). The backward's state-gradient walk split on the same "
        "segments (a reverse scan with the transposed transitions), each build in its own process, 2 rounds, at "
        "1x16384: forward+backward 8.421 -> 7.447 ms (DPLR), 8.401 -> 7.427 (RWKV-7); whole walk 10.17-10.22 in the "
        "same process as the split's 7.43-7.46", _H100),
    "h200-delta-solve-stages": Source(
        "fwd_solve on one warp at 2 pipeline stages against the tile rule's 3 and against 1, fwd_wu on 4 warps (the "
        "plan of solve-one-warp), the real op through plan overrides, 3 alternating rounds in one process, H200, "
        "bf16: Qwen3-Next's gated delta rule (4x4096, H=16, HV=32, K=V=128) forward 0.757-0.759 ms at 3 stages, "
        "0.739-0.742 at 2 (worst round 1.022x), 0.761-0.765 at 1; forward+backward 3.80-3.82, 3.77-3.78, "
        "3.81-3.83. fwd_wu at 2 stages (0.767-0.771) or on 8 warps (0.766-0.772) was slower", _H100),
    "h200-delta-wu-warps": Source(
        "fwd_wu (W and U from fwd_solve's stored inverse) on 4 warps against 2, fwd_solve on 1, as in "
        "solve-one-warp: the gated delta rule (4x4096, HV=32) forward 0.775-0.778 -> 0.761-0.763 ms, the "
        "delta rule (4x4096x16x128) 0.322-0.324 -> 0.317-0.318", _H100),
    "h200-delta-channel-solve": Source(
        "the per-channel delta rule (KDA) with its inverse in fwd_solve on 2 warps (1 stage) and W, U in fwd_wu on "
        "4 warps, 3 stages, against the fused fwd_wu that built the inverse itself (2 warps, 2 stages, the plan "
        "measured on the H100: 0.377 ms against 0.499 on 4 warps), H200, bf16, both builds in one process, 3 "
        "alternating rounds: forward 0.883-0.888 -> 0.878-0.880 ms at 4x4096x16x128, 1.708-1.710 -> 1.691-1.693 "
        "with HV=32, 1.163-1.166 -> 1.157-1.158 at 1x16384x16x128; forward+backward 3.706-3.722 -> 3.692-3.696, "
        "7.768-7.770 -> 7.726-7.738, 4.469-4.472 -> 4.445-4.448. fwd_solve on 1 warp (0.903) or 4 (0.893-0.895) "
        "was slower than the fused kernel at 4x4096; fwd_wu on 2 warps beside fwd_solve on 2 about even (0.878-0.880)",
        _H100),
    "h100-split-whole-k": Source(
        "the whole-K walk split at 1x16384x16x128: 64 -> 128 programs, fwd_h 0.452 -> 0.420 ms (the delta rule), "
        "0.690 -> 0.634 (the gated delta rule); bwd_dh on row blocks 0.349 -> 0.294 ms", _H100),
}


def explain(source: str) -> str:
    """The prose of a comma-separated source (``"tiles,h100-split-walk"``), one id per clause; KeyError names an
    unknown id."""
    out = []
    for sid in (s for s in source.split(",") if s):
        if sid not in SOURCES:
            raise KeyError(f"unknown plan source id {sid!r}: describe it in fla_gen/measurements.py")
        out.append(f"[{sid}] {SOURCES[sid].text}")
    return "; ".join(out)


def speaks_for(source_id: str, arch: str) -> bool:
    """Whether a plan row of ``arch`` may cite ``source_id``: a rule or compile-time check for every target, or a
    measurement on ``arch`` itself."""
    archs = SOURCES[source_id].archs
    return not archs or arch in archs
