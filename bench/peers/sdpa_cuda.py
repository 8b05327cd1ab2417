#!/usr/bin/env python3
"""PyTorch's flash SDPA and cuBLAS bf16 GEMM on one GPU: the peer of attention_cuda_bench (issue 19).

Per (B, H, L, D) shape and causal flag it times
`torch.nn.functional.scaled_dot_product_attention` on bf16 q, k, v of shape
[B, H, L, D] (randn, seeded) under `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`, so
only the FlashAttention backend may run (a shape it refuses is a row with "error");
then torch.matmul on two bf16 8192 x 8192 matrices (cuBLAS) as the yardstick.

    python3 bench/peers/sdpa_cuda.py --out torch_bench.json
    python3 bench/peers/sdpa_cuda.py --shapes "4,16,4096,128" --causal 1
    python3 bench/peers/sdpa_cuda.py --backward --out torch_backward.json

--backward times the backward instead (the peer of attention_backward_cuda_bench):
torch.autograd.grad of one flash forward's output for q, k, v, with a randn dO
(rows named torch_sdpa_flash_backward; FLOPs 2.5 times the forward's, as
FlashAttention counts them).

FLOPs, as FlashAttention and attention_cuda_bench count them: 4*B*H*L*L*D for the
non-causal forward, half that for causal (the half actually computed); 2*M*N*K for
the GEMM. Timing: three warm-up calls, then one call timed to choose N so that the N
timed calls take about --seconds (N in [5, 1000]); each call between its own pair of
CUDA events; the time reported is the median of the N. bench/peers/cuda_report.py
puts the result beside qkv's.

Output (stdout, or --out FILE): {"context": {gpu, driver, CUDA versions, torch
version, ...}, "rows": [{name, B, H, L, D, causal, ms, tflops, runs}, ...]}; GEMM
rows have M, N, K and null B, H, L, D, causal. --device cpu runs the same code with
wall-clock timing on the CPU (tiny shapes only): it tests the script, not a GPU.
"""
import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time

SHAPES = [(4, 16, 4096, 128), (1, 16, 16384, 128)]
GEMM = (8192, 8192, 8192)


def attention_flops(b, h, length, d, causal):
    """FlashAttention's count: two [L, D] x [D, L]-sized GEMMs per head; causal computes half."""
    flops = 4 * b * h * length * length * d
    return flops / 2 if causal else flops


def nvidia_smi():
    """{gpu_name, driver, sm_clock_max_mhz} from nvidia-smi, or {} where it is missing."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = [f.strip() for f in out.stdout.splitlines()[0].split(",")] if out.stdout.strip() else []
    return dict(zip(("smi_gpu_name", "driver", "sm_clock_max_mhz"), fields)) if len(fields) == 3 else {}


def cuda_driver_api_version():
    """cuDriverGetVersion (e.g. 13000): the CUDA version the driver supports, or None."""
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    except OSError:
        pass
    return None


def context(torch, device):
    ctx = {"torch": torch.__version__, "torch_cuda_runtime": torch.version.cuda, "python": sys.version.split()[0],
           "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        ctx.update(gpu=torch.cuda.get_device_name(0), compute_capability=f"{props.major}.{props.minor}",
                   multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                   cudnn=torch.backends.cudnn.version(), cuda_driver_api=cuda_driver_api_version())
        ctx.update(nvidia_smi())
    return ctx


class Timer:
    """Times one call: between CUDA events on the GPU, by the wall clock on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def times_ms(self, fn, runs):
        """Milliseconds of each of `runs` back-to-back calls (queued without host waits on a GPU)."""
        if not self.cuda:
            out = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        events = [(self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))
                  for _ in range(runs)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        self.sync()
        return [start.elapsed_time(end) for start, end in events]


def median_ms(timer, fn, seconds):
    """(median ms, N): 3 warm-up calls, one call to size N, then N timed calls."""
    for _ in range(3):
        fn()
    timer.sync()
    probe = max(timer.times_ms(fn, 1)[0], 1e-3)
    runs = int(min(1000, max(5, round(seconds * 1e3 / probe))))
    return statistics.median(timer.times_ms(fn, runs)), runs


def sdpa_row(torch, timer, device, shape, causal, seconds, backward=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    b, h, length, d = shape
    row = {"name": "torch_sdpa_flash_backward" if backward else "torch_sdpa_flash", "B": b, "H": h, "L": length,
           "D": d, "causal": causal}
    g = torch.Generator(device=device).manual_seed(0)
    # [B, H, L, D] each
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16, requires_grad=backward)
               for _ in range(3))
    try:
        if backward:  # the flash forward once; its backward timed (the graph kept for the next call)
            dout = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms, runs = median_ms(timer, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), seconds)
        else:
            with torch.inference_mode(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms, runs = median_ms(timer, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                     seconds)
    except RuntimeError as e:  # the flash backend refused the shape or the GPU
        row.update(error=str(e).splitlines()[0][:300], ms=None, tflops=None)
        return row
    flops = attention_flops(b, h, length, d, causal) * (2.5 if backward else 1)
    row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12, runs=runs)
    return row


def gemm_row(torch, timer, device, mnk, seconds):
    m, n, k = mnk
    g = torch.Generator(device=device).manual_seed(1)
    a = torch.randn((m, k), generator=g, device=device, dtype=torch.bfloat16)  # [M, K]
    b = torch.randn((k, n), generator=g, device=device, dtype=torch.bfloat16)  # [K, N]
    with torch.inference_mode():
        ms, runs = median_ms(timer, lambda: torch.matmul(a, b), seconds)
    return {"name": "torch_matmul_bf16", "M": m, "N": n, "K": k, "B": None, "H": None, "L": None, "D": None,
            "causal": None, "ms": ms, "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12, "runs": runs}


def parse_shapes(text):
    shapes = [tuple(int(x) for x in s.split(",")) for s in text.split(";") if s.strip()]
    if any(len(s) != 4 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: expected B,H,L,D;B,H,L,D with positive sizes, got {text!r}")
    return shapes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="B,H,L,D;B,H,L,D (default: 4,16,4096,128;1,16,16384,128)")
    ap.add_argument("--causal", default="0,1", help="causal flags to run: 0, 1 or 0,1")
    ap.add_argument("--gemm", default="8192,8192,8192", help="M,N,K of the bf16 GEMM yardstick; 0 skips it")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per row (about)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--backward", action="store_true", help="time the backward (dq, dk, dv) instead")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    a = ap.parse_args(argv)
    shapes = parse_shapes(a.shapes) if a.shapes else SHAPES
    causals = [bool(int(c)) for c in a.causal.split(",")]
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("sdpa_cuda.py: torch sees no CUDA device (--device cpu tests the script on the CPU)")
    timer = Timer(torch, a.device)
    rows = []
    for shape in shapes:
        for causal in causals:
            rows.append(sdpa_row(torch, timer, a.device, shape, causal, a.seconds, a.backward))
            print(f"sdpa_cuda: {rows[-1]}", file=sys.stderr, flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if a.gemm != "0":
        rows.append(gemm_row(torch, timer, a.device, tuple(int(x) for x in a.gemm.split(",")), a.seconds))
        print(f"sdpa_cuda: {rows[-1]}", file=sys.stderr, flush=True)
    text = json.dumps({"context": context(torch, a.device), "rows": rows}, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
