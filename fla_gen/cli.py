"""The command line: ``fla-gen build``, ``fla-gen plan``, ``fla-gen run``, ``fla-gen aot``.

Every path ends in a one-line message and a documented exit status, never a traceback (``FLA_GEN_DEBUG=1``
shows one for an internal error). The build and plan paths import neither torch nor Triton: a spec's
error, or its package, comes back in well under a second.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fla_gen import __version__
from fla_gen.check import check_spec
from fla_gen.errors import Pos, SpecError, UsageError
from fla_gen.ir import CheckedSpec
from fla_gen.lower import explain, lower
from fla_gen.parse import read_spec
from fla_gen.resources import SOURCE_ROOT, source_checkout

if TYPE_CHECKING:
    from fla_gen.canonical import Recurrence
    from fla_gen.emit import GeneratedFile

# The stages after the checker (canonical, plan, emit with Jinja, write) are imported when a spec has passed
# it: a spec's error comes back without loading them. The choices below mirror fla_gen.plan.ARCHS and DTYPES
# (tests/integration/test_cli_misuse.py checks they agree).
ARCH_CHOICES = ("sm80", "sm86", "sm89", "sm90", "sm100")
DTYPE_CHOICES = ("fp16", "bf16", "fp32")

REPO_ROOT = SOURCE_ROOT
EXIT_OK, EXIT_DIFF, EXIT_SPEC_ERROR, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_STATUS_DOC = ("exit status: 0 ok, 1 --check found differences or a run failed its tolerance, "
                   "2 a spec has errors, 3 usage error, 4 internal error")


class _Parser(argparse.ArgumentParser):
    """argparse with the documented usage status (3, where argparse uses 2) and a one-line message."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _call_shape(text: str) -> tuple[int, int, int, int, tuple[int, ...] | None]:
    """A dense call, '1x16384x16' -> (B, T, H, HV = H, None) or '4x4096x16x32' -> (B, T, H, HV, None), HV a multiple
    of H; or a packed one, its sequence lengths before the heads: '16384,700,300x16' -> (1, 17384, 16, 16,
    (16384, 700, 300))."""
    parts = text.lower().split("x")
    packed = "," in parts[0]
    if len(parts) not in ((2, 3) if packed else (3, 4)):
        raise argparse.ArgumentTypeError(f"{text!r} is not BxTxH[xHV] or a packed batch's L1,L2,...xH[xHV] (e.g. "
                                         f"1x16384x16, 4x4096x16x32, 16384,700,300x16)")
    lengths = None
    if packed:
        lengths = tuple(_positive_int(n) for n in parts[0].split(",") if n)
        parts = ["1", str(sum(lengths)), *parts[1:]]
    B, T, H, *HV = (_positive_int(p) for p in parts)
    HV = HV[0] if HV else H
    if HV % H:
        raise argparse.ArgumentTypeError(f"{text!r}: the value heads HV={HV} are not a multiple of the key heads H={H}")
    return B, T, H, HV, lengths


def _display_name(path: Path) -> str:
    """Spec paths are recorded relative to the repo (so generated headers do not name a home dir)."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except (ValueError, OSError):
        return path.as_posix()


def _statement_pos(spec: CheckedSpec, keyword: str, name: str | None = None) -> Pos:
    """Where the first ``keyword`` statement (``op``, ``package``, ``update``...) of a checked spec starts."""
    pattern = re.compile(rf"^(\s*){keyword}\b" + (rf"\s+{re.escape(name)}\b" if name else ""))
    for i, line in enumerate(spec.source.splitlines(), 1):
        m = pattern.match(line.removeprefix("\ufeff"))
        if m:
            return Pos(i, len(m.group(1)) + 1)
    return Pos(1, 1)


def load_recurrence(path: Path) -> Recurrence:
    """Parse, check and canonicalize one spec file."""
    from fla_gen.canonical import canonicalize

    return canonicalize(check_spec(read_spec(path, _display_name(path))))


def compile_spec(path: Path) -> tuple[Recurrence, tuple[GeneratedFile, ...]]:
    """Parse, check, canonicalize, plan and emit one spec: the one pipeline of build, plan and run.

    Raises:
        SpecError: any refusal, the planner's and the emitter's included; those point at the first update
            line (the recurrence the kernels do not implement) or the first transform line.
        UsageError: the spec file is missing or unreadable.
    """
    checked = check_spec(read_spec(path, _display_name(path)))
    from fla_gen.canonical import canonicalize
    from fla_gen.emit import emit_package

    try:
        rec = canonicalize(checked)
        return rec, emit_package(rec)
    except ValueError as e:  # PlanError, and what emit cannot render
        message = str(e)
        keyword = "transform" if checked.transforms and "transform" in message else "update"
        raise SpecError(checked.path, checked.source, _statement_pos(checked, keyword), message) from None


def _spec_paths(args: argparse.Namespace) -> list[Path]:
    """The SPEC arguments, plus every spec in specs/ with --all."""
    if not args.all:
        return [Path(s) for s in args.specs]
    root = source_checkout()
    if root is None:
        raise UsageError("--all builds the specs/ of a source checkout; this fla_gen is installed without one")
    return [Path(s) for s in args.specs] + sorted((root / "specs").glob("*.fla"))


def _output_dir(args: argparse.Namespace) -> Path:
    """-o DIR; else the checkout's generated/ for --all or when run inside the checkout, else ./generated."""
    if args.output:
        out = Path(args.output)
    else:
        root = source_checkout()
        cwd = Path.cwd().resolve()
        inside = root is not None and (cwd == root or root in cwd.parents or getattr(args, "all", False))
        out = root / "generated" if inside else Path("generated")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: the output root exists and is not a directory")
    return out


def _duplicate(first: dict[str, Path], key: str, spec: Path, checked: CheckedSpec, what: str) -> None:
    if key in first:
        keyword = "package" if what == "package" and checked.package != checked.op else "op"
        name = checked.package if keyword == "package" else checked.op
        raise SpecError(checked.path, checked.source, _statement_pos(checked, keyword, name),
                        f"{what} '{key}' is also generated by {first[key]} in this build",
                        "one build writes each package and registers each op once; rename one of them")
    first[key] = spec


def _cmd_build(args: argparse.Namespace) -> int:
    from fla_gen.write import diff_files, stale_packages, write_files

    specs = _spec_paths(args)
    if not specs:
        raise UsageError("name one or more spec files, or pass --all")
    out_dir = _output_dir(args)
    status = EXIT_OK
    packages: dict[str, Path] = {}
    ops: dict[str, Path] = {}
    all_diffs = []
    for spec in specs:
        try:
            rec, files = compile_spec(spec)
            _duplicate(packages, rec.spec.package, spec, rec.spec, "package")
            _duplicate(ops, rec.spec.op, spec, rec.spec, "op")
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            status = max(status, EXIT_SPEC_ERROR)
            continue
        except UsageError as e:
            print(f"fla-gen build: {e}", file=sys.stderr)
            status = max(status, EXIT_USAGE)
            continue
        if args.check:
            diffs = diff_files(files, out_dir)
            all_diffs += diffs
            print(f"{spec}: {'differs' if diffs else 'up to date'} ({out_dir / rec.spec.package})")
        else:
            try:
                changed = write_files(files, out_dir)
            except OSError as e:
                raise UsageError(f"cannot write {out_dir / rec.spec.package}: {e.strerror or e}") from None
            print(f"{spec}: wrote {out_dir / rec.spec.package} ({len(changed)} file(s) changed)")
    if args.check:
        for d in all_diffs:
            sys.stdout.write(d.diff)
        stale = stale_packages(out_dir, set(packages)) if args.all else []
        for name in stale:
            print(f"{out_dir / name}: no spec generates this package any more; delete it")
        if (all_diffs or stale) and status == EXIT_OK:
            print(f"fla-gen build --check: {len(all_diffs)} file(s) differ from the specs; "
                  "run 'fla-gen build --all' and commit generated/", file=sys.stderr)
            return EXIT_DIFF
    return status


def _cmd_plan(args: argparse.Namespace) -> int:
    from fla_gen.plan import (
        ARCHS,
        PlanError,
        backward_walks_forward,
        forward_walk_folds_scan,
        plan_algorithm,
        select_algorithms,
    )

    if args.sms is not None and not args.call:
        raise UsageError("--sms applies to --call: give the call's BxTxH too")
    rec, _ = compile_spec(Path(args.spec))  # what build refuses, plan refuses
    algos = select_algorithms(rec)
    try:
        plans = [plan_algorithm(rec, a, args.arch, args.dtype, args.head_dim) for a in algos]
    except PlanError as e:  # the spec builds; this target (arch, dtype, head dim) has no plan
        raise UsageError(f"no plan for --arch {args.arch} --dtype {args.dtype} --head-dim {args.head_dim}: {e}") \
            from None
    labels = [a.name for a in algos]
    if algos[0].bounded_chunk_size:
        # the chunk plan for calls that pass gate_lower_bound
        try:
            plans.append(plan_algorithm(rec, algos[0], args.arch, args.dtype, args.head_dim, bounded=True))
            labels.append(f"{algos[0].name} with gate_lower_bound >= {plans[-1].gate_bound:.4f}")
        except PlanError as e:
            print(f"(no bounded-gate plan on this target: {e})")
    arch = ARCHS[args.arch]
    print(f"op {rec.spec.op}")
    element_bytes = 4 if args.dtype == "fp32" else 2
    lowered = lower(rec)
    for line in explain(lowered, args.head_dim, args.head_dim, element_bytes):
        print(line)
    print(f"target {arch.name}: {arch.reason}")
    for label, p in zip(labels, plans, strict=True):
        print(f"\n{label}  ({args.dtype}, head dim {args.head_dim} -> bucket {p.head_dim})")
        print(f"  chunk size {p.chunk_size}: {p.chunk_size_reason}")
        for stage, c in p.kernels:
            print(f"  {stage:<12} BK={c.block_k:<4} BV={c.block_v:<4} warps={c.num_warps} stages={c.num_stages}"
                  f"  # {c.reason}")
    if args.call:
        _print_call_decisions(args, algos[0], plans[0], arch.sm_count if args.sms is None else args.sms,
                              backward_walks_forward(algos[0], lowered.features),
                              forward_walk_folds_scan(algos[0], lowered.features))
    return EXIT_OK


def _print_call_decisions(args: argparse.Namespace, algo, plan, sms: int, backward_walks: bool,
                          folds_scan: bool) -> None:
    """The run-time choices of the chunk launchers for one call (``plan --call BxTxH[xHV]``, or a packed batch's
    ``L1,L2,...xH[xHV]``): the sequence split, the state walk's tiles, whether the forward runs as one fused walk,
    and how (``folds_scan``: fla_gen.plan.forward_walk_folds_scan, whether over segments it scans them itself), and
    (``backward_walks``: fla_gen.plan.backward_walks_forward) whether the backward runs as three."""
    from fla_gen.runtime import launch, segments

    B, T, HK, H, lengths = args.call  # the state walks run over the value heads
    V = K = args.head_dim
    # chunks per sequence: B of T tokens, or the packed batch's
    seq_chunks = ([launch.cdiv(n, plan.chunk_size) for n in lengths] if lengths
                  else [launch.cdiv(T, plan.chunk_size)] * B)
    total, longest = sum(seq_chunks), max(seq_chunks)
    grouped = f", v [{B}, {T}, {H}, {V}]" if H != HK else ""
    packed_text = (f" packed: {len(lengths)} sequences of {min(lengths)}-{max(lengths)} tokens ({total} chunks, the "
                   f"longest {longest}), cu_seqlens;" if lengths else "")
    print(f"\nat run time,{packed_text} q [{B}, {T}, {HK}, {K}]{grouped} on {sms} SMs ({algo.name}):")
    walks = len(seq_chunks) * H
    segments_per_sequence = []
    if algo.splits_sequences:
        rule = algo.segment_rule
        print(f"  sequences    {segments.describe_segment_split(total, longest, walks, H, K, V, sms, rule)}")
        chunks = segments.plan_segment_chunks(total, longest, walks, H, K, V, sms, rule)
        if chunks:
            segments_per_sequence = [launch.cdiv(c, chunks) for c in seq_chunks]
            walks = sum(segments_per_sequence) * H
            print(f"               {walks // H} segments of {chunks * plan.chunk_size} tokens"
                  + (" at most" if lengths else ""))
    else:
        print("  sequences    walked whole: this algorithm does not split sequences into segments")
    stages = dict(plan.kernels)
    if "fwd_h" in stages:
        c = stages["fwd_h"]
        bk, bv = launch.dot_tile(c.block_k, K), launch.dot_tile(c.block_v, V)
        if "split-whole-k" in c.source.split(","):
            bv = launch.whole_k_walk_block_v(bv, V, walks, sms)
        elif "split-walk" in c.source.split(","):
            bk, bv = launch.state_walk_tiles(bk, bv, K, V, walks, sms)
        print(f"  fwd_h        [{bk}, {bv}] tiles: {launch.cdiv(K, bk) * launch.cdiv(V, bv) * walks} programs "
              f"over {walks} walks")
    if "fwd_fused" in stages:
        c = stages["fwd_fused"]
        packed = launch.PackedWalks(total * H, longest) if lengths else None
        bv, stages_taken = launch.fused_walk_choice(c, V, walks, sms, packed)
        # a packed call that its longest walk bounds never takes the two-per-SM launch: where this one differs, the
        # call took it
        two = (bv, stages_taken) != launch.fused_walk_choice(c, V, walks, sms, launch.LONGEST_WALK_BOUND)
        how = ""
        if packed and c.two_per_sm and bv:
            tile = launch.dot_tile(c.two_per_sm[0], V)
            per_sm = launch.cdiv(V, tile) * packed.chunk_steps / sms
            how = (f"; at BV {tile}, {per_sm:.0f} chunk steps per SM against the longest sequence's {longest} chunks"
                   + ("" if c.two_per_sm_packed else ", but this walk keeps one program per SM on packed calls"))
        if folds_scan and segments_per_sequence:
            folds = launch.folds_segment_scan(min(segments_per_sequence), max(segments_per_sequence))
            how += ("; each program sums its sequence's earlier segments itself (no segment_scan launch)" if folds
                    else f"; after a segment_scan launch (a sequence of no segment, or of more than "
                         f"{launch.FOLDED_SCAN_MAX_SEGMENTS})")
        if c.reads_inverse:
            how += ("; v_new from fwd_solve's inverse, no fwd_wu" if launch.walk_reads_inverse(c, H // HK) else
                   f"; W and U from fwd_wu (the inverse from {c.inverse_min_group} value heads per key head)")
        print("  fwd_fused    " + (f"taken, BV={bv}, {stages_taken} stages{' (two programs per SM)' if two else ''}: "
                                   f"{launch.cdiv(V, bv) * walks} programs{how}" if bv else "not taken: fwd_h + fwd_o"))
        if backward_walks:
            # K == V here, so the backward's walks (values K and V wide) take the forward's tile
            print("  backward     " + ("three fwd_fused walks (no gate: dq, dv and dk are the forward of (do, v, k), "
                                       "(k, q, do) and (v, do, q), the last two reversed)" if bv else
                                       "fwd_h, bwd_dh and bwd_dqkvg, as fwd_fused is not taken"))


def _import_package(out_dir: Path, package: str):
    """Import ``<out_dir>/<package>`` (the repo's ``generated.<package>`` when built there). Only ``run``
    imports generated code; building never does."""
    import importlib
    import importlib.util

    root = source_checkout()
    if root is not None and out_dir.resolve() == (root / "generated").resolve():
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return importlib.import_module(f"generated.{package}")
    name = f"_fla_gen_run_{package}"
    spec = importlib.util.spec_from_file_location(name, out_dir / package / "__init__.py",
                                                  submodule_search_locations=[str(out_dir / package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Stages:
    """Prints one line per stage of ``run`` with its wall time, as it finishes."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, text: str) -> None:
        now = time.perf_counter()
        print(f"[{now - self.start:6.1f} s] {text}", flush=True)


def _cmd_run(args: argparse.Namespace) -> int:
    from fla_gen.write import write_files

    stage = _Stages()
    rec, files = compile_spec(Path(args.spec))
    if args.value_heads is not None:
        if args.shape is None:
            raise UsageError("--value-heads needs --shape (HV is a multiple of its H)")
        heads = args.shape[2]
        if not rec.spec.grouped:
            raise UsageError(f"--value-heads {args.value_heads}: the spec declares no input on HV")
        if args.value_heads % heads:
            raise UsageError(f"--value-heads {args.value_heads}: not a positive multiple of H = {heads}")
    out_dir = _output_dir(args)
    try:
        write_files(files, out_dir)
    except OSError as e:
        raise UsageError(f"cannot write {out_dir / rec.spec.package}: {e.strerror or e}") from None
    stage(f"built {out_dir / rec.spec.package}")

    import torch  # the only command that runs kernels imports torch (and, through the package, Triton)

    on_gpu = torch.cuda.is_available() and not args.cpu
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any generated kernel module is imported
    pkg = _import_package(out_dir, rec.spec.package)
    stage(f"imported torch {torch.__version__} and the package")

    from fla_gen.verify import run_checks

    # every input, initial state and output weight below comes from torch's global generator
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    torch.manual_seed(seed)
    device = "cuda" if on_gpu else "cpu"
    dtype_name = args.dtype or ("bf16" if on_gpu else "fp32")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    where = "GPU" if on_gpu else "CPU, Triton interpreter"
    grouped = f", HV = {args.value_heads}" if args.value_heads else ""
    print(f"{rec.spec.op}: {dtype_name}{grouped} on {device} ({where}); errors are ||out - ref|| / ||ref|| against the "
          f"derived reference in float64, forward and backward, with an initial state; random inputs of seed {seed} "
          f"(--seed {seed} repeats them)")
    failed = False
    for r in run_checks(pkg, rec, dtype, device=device, shape=args.shape, long=args.long or on_gpu,
                        value_heads=args.value_heads):
        worst = max((e for k, e in r.errors.items() if k.startswith("d")), default=0.0)
        status = "ok" if not r.failures() else f"FAIL {r.failures()}"
        stage(f"{r.name:<44} o {r.errors['o']:.1e}  final_state {r.errors['final_state']:.1e}  "
              f"worst grad {worst:.1e}  {status}")
        failed |= bool(r.failures())
    return EXIT_DIFF if failed else EXIT_OK


def _cmd_aot(args: argparse.Namespace) -> int:
    import json

    if "triton" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)  # real compiles need @triton.jit, not the interpreter
    elif os.environ.get("TRITON_INTERPRET"):
        print("fla-gen aot: run without TRITON_INTERPRET", file=sys.stderr)
        return EXIT_USAGE
    specs = _spec_paths(args)
    if not specs:
        raise UsageError("name one or more spec files, or pass --all")
    try:
        caps = tuple(int(c.strip().removeprefix("sm")) for c in args.arch.split(","))
        head_dims = tuple(_positive_int(d) for d in args.head_dims.split(","))
    except (ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"--arch {args.arch!r} --head-dims {args.head_dims!r}: expected e.g. "
                         f"--arch sm80,sm90 --head-dims 64,128") from None
    override = None
    if args.override:
        from fla_gen.runtime.dispatch import parse_plan_override

        try:
            override = parse_plan_override(json.loads(args.override))
        except json.JSONDecodeError as e:
            raise UsageError(f"--override {args.override!r} is not JSON ({e})") from None
        except ValueError as e:
            raise UsageError(f"--override: {e}") from None
    root = source_checkout()
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from fla_gen.aot_ops import UnknownOverrideKernel, compile_op_matrix

    rows, bad = [], 0
    for spec in specs:
        rec, _ = compile_spec(spec)
        try:
            entries = compile_op_matrix(rec, caps=caps, head_dims=head_dims, jobs=args.jobs, override=override)
        except UnknownOverrideKernel as e:
            raise UsageError(f"--override for {rec.spec.op}: {e}") from None
        for entry in entries:
            r = entry.report
            status = "ok" if not entry.problems else "; ".join(entry.problems)
            bad += bool(entry.problems)
            print(f"{entry.op:<12} {entry.variant:<10} sm{r.cap:<4} {r.kernel:<40} "
                  f"smem {r.shared_bytes // 1024:>4} KB  regs {r.registers}  spills {r.spill_stores}  "
                  f"narrow {r.narrow_loads:<3}  {'wgmma' if r.uses_wgmma else '':<5}  {status}")
            rows.append({"op": entry.op, "variant": entry.variant, "kernel": r.kernel, "launch": r.launch, "cap": r.cap,
                         "shared_bytes": r.shared_bytes, "registers": r.registers, "spill_stores": r.spill_stores,
                         "uses_wgmma": r.uses_wgmma, "num_warps": r.num_warps, "num_stages": r.num_stages,
                         "narrow_loads": r.narrow_loads, "denormal_exps": r.denormal_exps,
                         "problems": list(entry.problems)})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} kernel compiles, {bad} with problems")
    return 1 if bad else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fla-gen`` and its subcommands."""
    parser = _Parser(
        prog="fla-gen",
        description="Compile linear-attention recurrences declared in .fla specs into Triton kernels.",
        epilog="examples:\n  fla-gen build specs/gla.fla\n  fla-gen run specs/gla.fla\n  fla-gen build --all --check\n"
               "  fla-gen plan specs/gla.fla --arch sm90 --dtype bf16 --head-dim 128",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fla-gen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    build = sub.add_parser(
        "build", help="generate Python packages of kernels from specs",
        description="Generate generated/<op>/ (kernels, autograd wrappers, plans, reference) from each spec.",
        epilog=EXIT_STATUS_DOC,
    )
    build.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (.fla)")
    build.add_argument("--all", action="store_true", help="build every spec in specs/")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 and print a diff if generated/ differs from the specs")
    build.add_argument("-o", "--output", metavar="DIR",
                       help="output root (default: generated/ of the checkout with --all or when run inside it, "
                            "else ./generated)")
    build.set_defaults(func=_cmd_build)

    plan = sub.add_parser(
        "plan", help="show the plan for a target and explain every choice",
        description="Print the kernels, chunk size, tiles, warps and stages chosen for one target, with reasons.",
        epilog=EXIT_STATUS_DOC,
    )
    plan.add_argument("spec", metavar="SPEC", help="spec file (.fla)")
    plan.add_argument("--arch", default="sm90", choices=ARCH_CHOICES, help="target GPU arch (default sm90)")
    plan.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES, help="input dtype (default bf16)")
    plan.add_argument("--head-dim", type=_positive_int, default=128, metavar="D", help="head dim K = V (default 128)")
    plan.add_argument("--call", type=_call_shape, metavar="BxTxH[xHV]",
                      help="also print the launchers' run-time choices for a dense call of q [B, T, H, head dim] "
                           "(and v [B, T, HV, head dim] with grouped value heads), or for a packed batch given by its "
                           "sequence lengths, L1,L2,...xH[xHV] (cu_seqlens; e.g. 16384,700,300x16): the sequence "
                           "split, the state walk's tiles, the fused forward walk")
    plan.add_argument("--sms", type=_positive_int, default=None, metavar="N",
                      help="SM count for --call (default: the arch's usual GPU: 108 sm80, 84 sm86, 142 sm89, "
                           "132 sm90, 148 sm100)")
    plan.set_defaults(func=_cmd_plan)

    run = sub.add_parser(
        "run", help="build a spec, run its ops forward and backward, compare with the reference",
        description="Build SPEC, then call chunk_<op> and fused_recurrent_<op> forward and backward on random "
                    "inputs and report relative errors against the derived float64 reference. Without a GPU "
                    "the kernels run in Triton's interpreter: by default at sizes small enough for a minute on "
                    "two cores that still run every kernel (partial chunks, several chunks, varlen batches with "
                    "an empty sequence); --long checks larger ones.",
        epilog=EXIT_STATUS_DOC,
    )
    run.add_argument("spec", metavar="SPEC", help="spec file (.fla)")
    run.add_argument("--shape", type=_positive_int, nargs=5, metavar=("B", "T", "H", "K", "V"),
                     help="the dense calls' sizes, for both ops (default: per op, see fla_gen.verify.run_checks)")
    run.add_argument("--long", action="store_true",
                     help="the long check: larger sizes (minutes in the interpreter; the default on a GPU)")
    run.add_argument("--dtype", choices=DTYPE_CHOICES, help="input dtype (default bf16 on a GPU, fp32 on the CPU)")
    run.add_argument("--value-heads", type=_positive_int, metavar="HV",
                     help="value heads of a grouped spec (inputs on [.., HV, ..]): HV = r * H for every call's H "
                          "(default: H)")
    run.add_argument("--cpu", action="store_true", help="use the interpreter even when a GPU is present")
    run.add_argument("--seed", type=int, metavar="N",
                     help="seed of the random inputs (default: a fresh one, printed, so a failure can be repeated)")
    run.add_argument("-o", "--output", metavar="DIR",
                     help="output root (default: generated/ of the checkout when run inside it, else ./generated)")
    run.set_defaults(func=_cmd_run)

    aot = sub.add_parser(
        "aot", help="compile every generated kernel for real GPU targets, without a GPU",
        description="Capture the kernel launches of generated/<op> (chunk and fused_recurrent, forward and "
                    "backward, dense and varlen) with each target's plan, compile them with triton.compile for "
                    "that target, and check shared memory and MMA->MMA layout conversions. Each row shows the "
                    "kernel's shared memory, registers, spilled bytes, its one- and two-byte global loads "
                    "(narrow; many: a 16-bit tile loaded element by element) and whether it uses wgmma.",
    )
    aot.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (.fla) whose generated ops to compile")
    aot.add_argument("--all", action="store_true", help="every spec in specs/")
    aot.add_argument("--arch", default="sm80,sm89,sm90,sm100", help="comma-separated targets (default all four)")
    aot.add_argument("--head-dims", default="128", metavar="DIMS",
                     help="comma-separated head dims (K = V); the first gets the full matrix (varlen, bounded gates), "
                          "the others dense calls on the targets with a plan for them (default 128)")
    aot.add_argument("--jobs", type=_positive_int, default=2, help="parallel compiles (default 2)")
    aot.add_argument("--json", metavar="FILE", help="write the reports as JSON")
    aot.add_argument("--override", metavar="JSON",
                     help="a plan override to compile instead of the plans' own configs, {kernel: {field: value}} "
                          "with fields block_k, block_v, num_warps, num_stages (FLA_GEN_PLAN_OVERRIDE's form; "
                          "each entry applies to the op's plans that have that kernel), e.g. "
                          "'{\"fwd_A\": {\"block_k\": 128}}': its registers and spills before a GPU times it")
    aot.set_defaults(func=_cmd_aot)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fla-gen`` console script; returns the exit status (see EXIT_STATUS_DOC)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, and usage errors (_Parser.error)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        print("fla-gen: name a command: build, plan, run or aot (see 'fla-gen --help')", file=sys.stderr)
        return EXIT_USAGE
    prog = f"fla-gen {args.command}"
    try:
        return args.func(args)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC_ERROR
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("FLA_GEN_DEBUG"):
            raise
        first_line = (str(e).splitlines() or [""])[0]
        what = "the spec is too complex to compile" if isinstance(e, RecursionError) else \
            f"{type(e).__name__}: {first_line}"
        print(f"{prog}: internal error: {what} (FLA_GEN_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
