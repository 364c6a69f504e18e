"""The command line: ``fla-gen build``, ``fla-gen plan``, ``fla-gen run``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fla_gen import __version__
from fla_gen.canonical import Recurrence, canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import GeneratedFile, emit_package
from fla_gen.errors import SpecError
from fla_gen.lower import explain, lower
from fla_gen.parse import read_spec
from fla_gen.plan import ARCHS, DTYPES, PlanError, plan_algorithm, select_algorithms
from fla_gen.write import diff_files, stale_packages, write_files

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_DIFF, EXIT_SPEC_ERROR, EXIT_USAGE = 0, 1, 2, 3


def _display_name(path: Path) -> str:
    """Spec paths are recorded relative to the repo (so generated headers do not name a home dir)."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def load_recurrence(path: Path) -> Recurrence:
    """Parse, check and canonicalize one spec file."""
    return canonicalize(check_spec(read_spec(path, _display_name(path))))


def compile_spec(path: Path) -> tuple[Recurrence, tuple[GeneratedFile, ...]]:
    """Parse, check, canonicalize, plan and emit one spec."""
    rec = load_recurrence(path)
    return rec, emit_package(rec)


def _spec_paths(args: argparse.Namespace) -> list[Path]:
    """The SPEC arguments, plus every spec in specs/ with --all."""
    return [Path(s) for s in args.specs] + (sorted((REPO_ROOT / "specs").glob("*.fla")) if args.all else [])


def _cmd_build(args: argparse.Namespace) -> int:
    specs = _spec_paths(args)
    if not specs:
        print("fla-gen build: name one or more spec files, or pass --all", file=sys.stderr)
        return EXIT_USAGE
    out_dir = Path(args.output) if args.output else REPO_ROOT / "generated"
    failed = False
    ops: set[str] = set()
    all_diffs = []
    for spec in specs:
        if not spec.is_file():
            print(f"fla-gen build: {spec}: no such spec file", file=sys.stderr)
            failed = True
            continue
        try:
            rec, files = compile_spec(spec)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            failed = True
            continue
        except (PlanError, ValueError) as e:
            print(f"{spec}: error: {e}", file=sys.stderr)
            failed = True
            continue
        ops.add(rec.spec.package)
        if args.check:
            diffs = diff_files(files, out_dir)
            all_diffs += diffs
            print(f"{spec}: {'differs' if diffs else 'up to date'} ({out_dir / rec.spec.package})")
        else:
            changed = write_files(files, out_dir)
            print(f"{spec}: wrote {out_dir / rec.spec.package} ({len(changed)} file(s) changed)")
    if args.check:
        for d in all_diffs:
            sys.stdout.write(d.diff)
        stale = stale_packages(out_dir, ops) if args.all else []
        for name in stale:
            print(f"{out_dir / name}: no spec generates this package any more; delete it")
        if all_diffs or stale:
            print(f"fla-gen build --check: {len(all_diffs)} file(s) differ from the specs; "
                  "run 'fla-gen build --all' and commit generated/", file=sys.stderr)
            return EXIT_DIFF
    return EXIT_SPEC_ERROR if failed else EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        rec = load_recurrence(Path(args.spec))
        algos = select_algorithms(rec)
        plans = [plan_algorithm(rec, a, args.arch, args.dtype, args.head_dim) for a in algos]
        labels = [a.name for a in algos]
        if algos[0].bounded_chunk_size:
            # the chunk plan for calls that pass gate_lower_bound
            try:
                plans.append(plan_algorithm(rec, algos[0], args.arch, args.dtype, args.head_dim, bounded=True))
                labels.append(f"{algos[0].name} with gate_lower_bound >= {plans[-1].gate_bound:.4f}")
            except PlanError as e:
                print(f"(no bounded-gate plan on this target: {e})")
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC_ERROR
    except PlanError as e:
        print(f"fla-gen plan: {e}", file=sys.stderr)
        return EXIT_USAGE
    arch = ARCHS[args.arch]
    print(f"op {rec.spec.op}")
    element_bytes = 4 if args.dtype == "fp32" else 2
    for line in explain(lower(rec), args.head_dim, args.head_dim, element_bytes):
        print(line)
    print(f"target {arch.name}: {arch.reason}")
    for label, p in zip(labels, plans, strict=True):
        print(f"\n{label}  ({args.dtype}, head dim {args.head_dim} -> bucket {p.head_dim})")
        print(f"  chunk size {p.chunk_size}: {p.chunk_size_reason}")
        for stage, c in p.kernels:
            print(f"  {stage:<12} BK={c.block_k:<4} BV={c.block_v:<4} warps={c.num_warps} stages={c.num_stages}"
                  f"  # {c.reason}")
    return EXIT_OK


def _import_package(out_dir: Path, op: str):
    """Import ``<out_dir>/<op>`` as a package (the repo's ``generated.<op>`` when built there)."""
    import importlib
    import importlib.util

    if out_dir.resolve() == (REPO_ROOT / "generated").resolve():
        if str(REPO_ROOT) not in sys.path:
            sys.path.insert(0, str(REPO_ROOT))
        return importlib.import_module(f"generated.{op}")
    name = f"_fla_gen_run_{op}"
    spec = importlib.util.spec_from_file_location(name, out_dir / op / "__init__.py",
                                                  submodule_search_locations=[str(out_dir / op)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cmd_run(args: argparse.Namespace) -> int:
    import os

    import torch

    on_gpu = torch.cuda.is_available() and not args.cpu
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any generated kernel module is imported
    try:
        rec, files = compile_spec(Path(args.spec))
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC_ERROR
    except (PlanError, ValueError) as e:
        print(f"{args.spec}: error: {e}", file=sys.stderr)
        return EXIT_SPEC_ERROR
    heads = args.shape[2]
    HV = heads if args.value_heads is None else args.value_heads
    if HV != heads:
        why = ("the spec declares no input on HV" if not rec.spec.grouped
               else "" if heads >= 1 and HV >= 1 and HV % heads == 0 else f"not a positive multiple of H = {heads}")
        if why:
            print(f"fla-gen run: --value-heads {HV}: {why}", file=sys.stderr)
            return EXIT_USAGE
    out_dir = Path(args.output) if args.output else REPO_ROOT / "generated"
    write_files(files, out_dir)
    pkg = _import_package(out_dir, rec.spec.package)

    from fla_gen.verify import verify_op

    device = "cuda" if on_gpu else "cpu"
    dtype_name = args.dtype or ("bf16" if on_gpu else "fp32")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    B, T, H, K, V = args.shape
    where = "GPU" if on_gpu else "CPU, Triton interpreter"
    print(f"{rec.spec.op}: B={B} T={T} H={H}{f' HV={HV}' if HV != H else ''} K={K} V={V} {args.dtype or dtype} on "
          f"{device} ({where}); "
          f"errors are ||out - ref|| / ||ref|| against the derived reference in float64")
    failed = False
    for mode in ("chunk", "fused_recurrent"):
        r = verify_op(pkg, rec, mode, dtype, B=B, T=T, H=H, K=K, V=V, HV=HV, device=device)
        worst = max((e for k, e in r.errors.items() if k.startswith("d")), default=0.0)
        status = "ok" if not r.failures() else f"FAIL {r.failures()}"
        print(f"  {r.name:<32} o {r.errors['o']:.1e}  final_state {r.errors['final_state']:.1e}  "
              f"worst grad {worst:.1e}  ({r.seconds:.1f} s fwd+bwd)  {status}")
        failed |= bool(r.failures())
    return 1 if failed else EXIT_OK


def _cmd_aot(args: argparse.Namespace) -> int:
    import json
    import os

    if "triton" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)  # real compiles need @triton.jit, not the interpreter
    elif os.environ.get("TRITON_INTERPRET"):
        print("fla-gen aot: run without TRITON_INTERPRET", file=sys.stderr)
        return EXIT_USAGE
    specs = _spec_paths(args)
    if not specs:
        print("fla-gen aot: name one or more spec files, or pass --all", file=sys.stderr)
        return EXIT_USAGE
    caps = tuple(int(c.removeprefix("sm")) for c in args.arch.split(","))
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from fla_gen.aot_ops import compile_op_matrix

    rows, bad = [], 0
    for spec in specs:
        try:
            rec = load_recurrence(spec)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            return EXIT_SPEC_ERROR
        for entry in compile_op_matrix(rec, caps=caps, head_dims=head_dims, jobs=args.jobs):
            r = entry.report
            status = "ok" if not entry.problems else "; ".join(entry.problems)
            bad += bool(entry.problems)
            print(f"{entry.op:<12} {entry.variant:<10} sm{r.cap:<4} {r.kernel:<40} "
                  f"smem {r.shared_bytes // 1024:>4} KB  regs {r.registers}  spills {r.spill_stores}  "
                  f"{'wgmma' if r.uses_wgmma else '':<5}  {status}")
            rows.append({"op": entry.op, "variant": entry.variant, "kernel": r.kernel, "launch": r.launch, "cap": r.cap,
                         "shared_bytes": r.shared_bytes, "registers": r.registers, "spill_stores": r.spill_stores,
                         "uses_wgmma": r.uses_wgmma, "num_warps": r.num_warps, "num_stages": r.num_stages,
                         "problems": list(entry.problems)})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} kernel compiles, {bad} with problems")
    return 1 if bad else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fla-gen`` and its subcommands."""
    parser = argparse.ArgumentParser(
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
        epilog="exit status: 0 ok, 1 --check found differences, 2 a spec has errors, 3 usage error",
    )
    build.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (.fla)")
    build.add_argument("--all", action="store_true", help="build every spec in specs/")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 and print a diff if generated/ differs from the specs")
    build.add_argument("-o", "--output", metavar="DIR", help="output root (default: generated/ in the repo)")
    build.set_defaults(func=_cmd_build)

    plan = sub.add_parser(
        "plan", help="show the plan for a target and explain every choice",
        description="Print the kernels, chunk size, tiles, warps and stages chosen for one target, with reasons.",
    )
    plan.add_argument("spec", metavar="SPEC", help="spec file (.fla)")
    plan.add_argument("--arch", default="sm90", choices=list(ARCHS), help="target GPU arch (default sm90)")
    plan.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="input dtype (default bf16)")
    plan.add_argument("--head-dim", type=int, default=128, metavar="D", help="head dim K = V (default 128)")
    plan.set_defaults(func=_cmd_plan)

    run = sub.add_parser(
        "run", help="build a spec, run its ops forward and backward, compare with the reference",
        description="Build SPEC, then call chunk_<op> and fused_recurrent_<op> forward and backward on random "
                    "inputs and report relative errors against the derived float64 reference. Without a GPU "
                    "the kernels run in Triton's interpreter (slow: keep the shape small).",
    )
    run.add_argument("spec", metavar="SPEC", help="spec file (.fla)")
    run.add_argument("--shape", type=int, nargs=5, default=(2, 100, 2, 32, 48), metavar=("B", "T", "H", "K", "V"),
                     help="input sizes (default 2 100 2 32 48)")
    run.add_argument("--value-heads", type=int, metavar="HV",
                     help="value heads of a grouped spec (inputs on [.., HV, ..]), a multiple of H (default H)")
    run.add_argument("--dtype", choices=list(DTYPES), help="input dtype (default bf16 on a GPU, fp32 on the CPU)")
    run.add_argument("--cpu", action="store_true", help="use the interpreter even when a GPU is present")
    run.add_argument("-o", "--output", metavar="DIR", help="output root (default: generated/ in the repo)")
    run.set_defaults(func=_cmd_run)

    aot = sub.add_parser(
        "aot", help="compile every generated kernel for real GPU targets, without a GPU",
        description="Capture the kernel launches of generated/<op> (chunk and fused_recurrent, forward and "
                    "backward, dense and varlen) with each target's plan, compile them with triton.compile for "
                    "that target, and check shared memory and MMA->MMA layout conversions.",
    )
    aot.add_argument("specs", nargs="*", metavar="SPEC", help="spec files (.fla) whose generated ops to compile")
    aot.add_argument("--all", action="store_true", help="every spec in specs/")
    aot.add_argument("--arch", default="sm80,sm89,sm90,sm100", help="comma-separated targets (default all four)")
    aot.add_argument("--head-dims", default="128", metavar="DIMS",
                     help="comma-separated head dims (K = V); the first gets the full matrix (varlen, bounded gates), "
                          "the others dense calls on the targets with a plan for them (default 128)")
    aot.add_argument("--jobs", type=int, default=2, help="parallel compiles (default 2)")
    aot.add_argument("--json", metavar="FILE", help="write the reports as JSON")
    aot.set_defaults(func=_cmd_aot)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fla-gen`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
