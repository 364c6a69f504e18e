"""Time to an answer of the front end: ``fla-gen build`` of a bad spec (an error), of a good spec (a
package), of a spec at the size limit and of one over it, each in a fresh process as a user runs it.

    python benchmarks/frontend_latency.py [--repeat 5] [--spec specs/gla.fla]

Prints the median and the fastest wall time of each case, the median CPU time (user + system, which other
processes on the machine disturb less than the wall time) and the peak memory of a build process; the goal
for the bad spec is under 1 s on a 2-core machine. A script, not a test: timings depend on the load.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BAD = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
param scale = K ** -0.5
update S = S + outer(v, k)
output o = scale * S^T @ q
"""


def large_spec(good: str, size: int) -> str:
    """``good`` followed by comment lines up to ``size`` bytes: the whole file is read and lexed."""
    line = "# " + "x" * 97 + "\n"
    return good + line * max(0, (size - len(good)) // len(line))


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def balanced_sum(leaves: int, leaf: str) -> str:
    if leaves == 1:
        return leaf
    return f"({balanced_sum(leaves // 2, leaf)} + {balanced_sum(leaves - leaves // 2, leaf)})"


def expression_spec(good: str, size: int) -> str:
    """``good`` with update lines of long (but not too deep) sums up to ``size`` bytes: the most tokens a
    spec under the limit can have; the canonicalizer refuses it (many write terms)."""
    line = f"update S = S + {balanced_sum(40, 'outer(k, v)')}\n"
    head, _, tail = good.partition("output ")
    return head + line * max(0, (size - len(good)) // len(line)) + "output " + tail


def time_build(spec: Path, out: Path, repeat: int) -> tuple[list[float], list[float], int, str]:
    """Wall and CPU seconds (user + system) of each run, the exit status and the first line printed."""
    times, cpu, code, first = [], [], 0, ""
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), child_cpu()
        proc = subprocess.run([sys.executable, "-m", "fla_gen.cli", "build", str(spec), "-o", str(out)],
                              cwd=REPO_ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        cpu.append(child_cpu() - cpu_start)
        code, first = proc.returncode, (proc.stderr or proc.stdout).splitlines()[0]
    return times, cpu, code, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (default 5)")
    parser.add_argument("--spec", default=str(REPO_ROOT / "specs" / "gla.fla"), help="the good spec")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))  # this checkout's fla_gen, as the subprocesses (cwd) use
    from fla_gen.parse import MAX_SPEC_BYTES

    good = Path(args.spec).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = {
            "bad spec (10 lines)": BAD,
            f"good spec ({Path(args.spec).name})": good,
            f"comments up to the size limit ({MAX_SPEC_BYTES // 1024} KB)": large_spec(good, MAX_SPEC_BYTES - 200),
            f"expressions up to the size limit ({MAX_SPEC_BYTES // 1024} KB)": expression_spec(
                good, MAX_SPEC_BYTES - 200),
            "spec of 1 MB (refused)": large_spec(good, 1 << 20),
        }
        print(f"{'case':<44} {'median s':>9} {'min s':>7} {'cpu s':>6}  exit  first line")
        for name, text in cases.items():
            spec = root / "spec.fla"
            spec.write_text(text)
            times, cpu, code, first = time_build(spec, root / "out", args.repeat)
            print(f"{name:<44} {statistics.median(times):>9.3f} {min(times):>7.3f} {statistics.median(cpu):>6.3f}"
                  f"  {code:>4}  {first[:60]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak memory of a build process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
