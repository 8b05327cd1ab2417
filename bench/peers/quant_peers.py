#!/usr/bin/env python3
"""Dynamic int8 quantization of the MHA layer (issue 14): qkv f32 vs qkv int8 vs PyTorch.

One invocation prints one Markdown table whose header names the machine (CPU model,
AVX-512/AMX flags, Highway's and oneDNN's ISA: `qkv info`). Same weights everywhere: a torch
nn.MultiheadAttention (batch_first) initialised from a fixed seed. Timed, in this order,
self-attention forward (need_weights=False) of:
  qkv f32        qkv.nn.MultiheadAttention.from_state_dict(its state_dict)
  qkv int8       qkv.nn.quantize_dynamic(that layer, weight_bits=--weight-bits): 8-bit weights
                 where the CPU has VNNI/AMX, 7-bit elsewhere unless told (docs/nn_quantization.md)
  qkv int8 + bf16 attention
                 the same, its attention with attention_options={"matmul_precision": "medium"}
                 (bf16 Q K^T and P V tiles where the CPU has a native bf16 GEMM; opt-in)
  torch f32      the same projections as four nn.Linear + F.scaled_dot_product_attention
  torch int8     torch.ao.quantization.quantize_dynamic of that module ({nn.Linear}, qint8):
                 nn.MultiheadAttention itself has no nn.Linear in_proj, so quantize_dynamic
                 leaves it as it is; the four-Linear module is its quantizable equivalent
and the relative error ||y - y_f32|| / ||y_f32|| of each against torch's f32 output.

    .venv-fixtures/bin/python bench/peers/quant_peers.py --threads 2
    ONEDNN_MAX_CPU_ISA=AVX2 .venv-fixtures/bin/python bench/peers/quant_peers.py --threads 2
        (qkv's GEMMs as on an AVX2-only machine; torch's fbgemm does not read that cap)
    .venv-fixtures/bin/python bench/peers/quant_peers.py --threads 1,2 --parts
        (and a second table: each int8 layer's float32 attention timed alone, and the rest)
"""
import argparse
import os
import sys
import warnings

from precision_peers import machine
from timing import best_seconds


def build(embed, heads, seed):
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    mha = tnn.MultiheadAttention(embed, heads, batch_first=True)

    class Projections(tnn.Module):  # nn.MultiheadAttention's math with nn.Linear projections
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (tnn.Linear(embed, embed) for _ in range(4))
            w, b = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
            for i, lin in enumerate((self.q, self.k, self.v)):
                lin.weight.data, lin.bias.data = w[i * embed:(i + 1) * embed].clone(), b[i * embed:(i + 1) * embed].clone()
            self.o.weight.data = mha.out_proj.weight.detach().clone()
            self.o.bias.data = mha.out_proj.bias.detach().clone()

        def forward(self, x):
            n, l, e = x.shape
            split = lambda t: t.view(n, l, heads, e // heads).transpose(1, 2)
            y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
            return self.o(y.transpose(1, 2).reshape(n, l, e))

    return mha, Projections().eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--shape", default="8,512,768,12", help="B,L,E,H")
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI (for the machine line)")
    ap.add_argument("--weight-bits", type=int, default=None, help="qkv int8 weights: 8 or 7 (default: the CPU's)")
    ap.add_argument("--parts", action="store_true",
                    help="also a table of where each int8 layer's time goes: its float32 attention alone "
                         "(on the layer's head views) and the rest (projections, quantization, head merge)")
    a = ap.parse_args()
    b, l, e, h = map(int, a.shape.split(","))
    import numpy as np
    import torch
    import qkv
    import qkv.nn

    warnings.filterwarnings("ignore")
    mha, proj = build(e, h, 0)
    x = torch.randn(b, l, e, generator=torch.Generator().manual_seed(1))
    xn = x.numpy()
    layer = qkv.nn.MultiheadAttention.from_state_dict({k: v.numpy() for k, v in mha.state_dict().items()}, h,
                                                      batch_first=True)
    qlayer = qkv.nn.quantize_dynamic(layer, weight_bits=a.weight_bits)
    tq = torch.ao.quantization.quantize_dynamic(proj, {torch.nn.Linear}, dtype=torch.qint8)
    print(f"torch {torch.__version__}, load {os.getloadavg()}", file=sys.stderr)
    print(f"Machine: {machine(a.qkv)}\n")
    print(f"(B, L, E, H) = ({b}, {l}, {e}, {h}), self-attention forward, need_weights=False; qkv int8 with "
          f"{qlayer.weight_bits}-bit weights (this CPU's choice: {qkv.nn.int8_weight_bits()}); "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}\n")
    print("| threads | qkv f32 ms | qkv int8 ms | qkv int8 + bf16 attention ms | torch f32 ms | torch int8 ms "
          "| qkv int8 / qkv f32 | qkv int8 / torch int8 | qkv int8 + bf16 attention / torch int8 "
          "| rel. error qkv int8 | rel. error qkv int8 + bf16 attention | rel. error torch int8 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    medium = {"need_weights": False, "attention_options": {"matmul_precision": "medium"}}
    parts = []
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        qkv.set_num_threads(threads)
        with torch.inference_mode():
            want = proj(x)
            t = {"qkv f32": best_seconds(lambda: layer(xn, xn, xn, need_weights=False), a.min_time),
                 "qkv int8": best_seconds(lambda: qlayer(xn, xn, xn, need_weights=False), a.min_time),
                 "qkv int8 medium": best_seconds(lambda: qlayer(xn, xn, xn, **medium), a.min_time),
                 "torch f32": best_seconds(lambda: proj(x), a.min_time),
                 "torch int8": best_seconds(lambda: tq(x), a.min_time)}
            got_q = torch.from_numpy(qlayer(xn, xn, xn, need_weights=False)[0])
            got_m = torch.from_numpy(qlayer(xn, xn, xn, **medium)[0])
            got_t = tq(x)
        rel = lambda y: float((y - want).norm() / want.norm())
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"| {threads} | {ms['qkv f32']:.1f} | {ms['qkv int8']:.1f} | {ms['qkv int8 medium']:.1f} "
              f"| {ms['torch f32']:.1f} | {ms['torch int8']:.1f} "
              f"| {ms['qkv f32'] / ms['qkv int8']:.2f}× | {ms['torch int8'] / ms['qkv int8']:.2f}× "
              f"| {ms['torch int8'] / ms['qkv int8 medium']:.2f}× "
              f"| {rel(got_q):.2e} | {rel(got_m):.2e} | {rel(got_t):.2e} |")
        if a.parts:
            parts.append((threads, ms["qkv int8"], ms["torch int8"]) + attention_ms(b, l, e, h, a.min_time))
    if parts:
        print_parts(parts)


def attention_ms(b, l, e, h, min_time):
    """qkv's and torch's float32 attention alone, as each int8 layer runs it: on [B, H, L, E/H] head
    views of the projections' [B, L, 3E] (qkv) or of three [B, L, E] outputs (torch), ms."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import qkv

    qkv_all = np.random.default_rng(2).standard_normal((b, l, 3, h, e // h), dtype=np.float32)
    heads = [qkv_all[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]  # [B, H, L, D] views
    split = lambda t: t.view(b, l, h, e // h).transpose(1, 2)
    tq, tk, tv = (split(torch.randn(b, l, e)) for _ in range(3))
    with torch.inference_mode():
        torch_s = best_seconds(lambda: F.scaled_dot_product_attention(tq, tk, tv), min_time)
    qkv_s = best_seconds(lambda: qkv.scaled_dot_product_attention(*heads), min_time)
    return qkv_s * 1e3, torch_s * 1e3


def print_parts(parts):
    print("\nWhere the int8 layers' time goes (same run; rest = layer − its float32 attention timed alone: "
          "the int8 projections, the activations' quantization, the head merge):\n")
    print("| threads | qkv int8 layer ms | qkv attention ms | qkv rest ms | torch int8 layer ms | torch attention ms "
          "| torch rest ms | qkv int8 / torch int8 | qkv rest for 1.3× (torch int8 / 1.3 − qkv attention) ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads, q, t, qa, ta in parts:
        print(f"| {threads} | {q:.1f} | {qa:.1f} | {q - qa:.1f} | {t:.1f} | {ta:.1f} | {t - ta:.1f} "
              f"| {t / q:.2f}× | {t / 1.3 - qa:.1f} |")


if __name__ == "__main__":
    main()
