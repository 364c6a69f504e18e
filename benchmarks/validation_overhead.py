#!/usr/bin/env python3
"""Host-side validation on the GPU: its cost per call, and proof that it never syncs the device
when the caller passes cu_seqlens_cpu (torch's sync debug mode turns any sync into an error).

    python benchmarks/validation_overhead.py [--out $OUT/validation.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from fla_gen.runtime.validate import validate_call  # noqa: E402
from generated.gla import chunk_gla  # noqa: E402
from generated.gla.chunk import _ARGS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dev = "cuda"
    T, H, K = 4096, 16, 128
    q, k, v = (torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, device=dev)) / 16
    cu_cpu = torch.tensor([0, 1000, 1001, 3000, T], dtype=torch.int32)
    cu = cu_cpu.to(dev)
    h0 = torch.zeros(4, H, K, K, device=dev)

    def validate():
        validate_call("chunk_gla", _ARGS, (q, k, v, g), params=(("scale", None),), initial_state=h0,
                      output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)

    for _ in range(100):
        validate()
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        validate()
    validate_us = (time.perf_counter() - start) / n * 1e6

    def call():
        return chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)

    call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any device sync inside the call raises
    try:
        call()
        no_sync = True
        sync_error = ""
    except RuntimeError as e:
        no_sync, sync_error = False, str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    op_ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
    result = {"validate_us": validate_us, "chunk_gla_fwd_ms": op_ms, "overhead_pct": validate_us / 1e3 / op_ms * 100,
              "no_device_sync_with_cu_seqlens_cpu": no_sync, "sync_error": sync_error,
              "shape": f"B=1 T={T} H={H} K=V={K} bf16, 4 sequences"}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if no_sync else 1


if __name__ == "__main__":
    sys.exit(main())
