#!/usr/bin/env python3
"""Writes the PyTorch fixtures for NaN and Inf in attention (qkv/attention.h).

Usage: make_sdpa_nonfinite_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Every configuration (a NaN or Inf put in q, k, v or a mask, fully masked rows,
causal rows) is written once per dtype as OUTPUT_DIR/<name>_<dtype>.safetensors:

  q, k, v      the inputs, in the dtype (NaN and Inf survive every dtype)
  attn_mask    (optional) bool (True = take part) or float in the input dtype
  out          torch SDPA in float64 on the float64 upcast of the stored inputs:
               the math backend, or for `backend = "flash"` configurations (causal
               rows whose hidden keys hold a NaN or Inf) the CPU flash backend,
               whose causal masking removes those keys as qkv's does
  weights      float64 weights from plain torch ops with the same semantics
               (bool False adds -inf, causal removes keys after the diagonal,
               rows of -inf only give 0); equal to torch's math-backend weights
               on the row's keys wherever the math backend is the one used
               (checked here)
  lse          float64 row logsumexp of the scores: NaN on NaN rows, -inf on
               fully masked rows (torch's CPU flash kernel writes 0 there); equal
               to that kernel's logsumexp on every other row (checked here)

and `__metadata__` with one key, "options" (JSON: is_causal, scale, enable_gqa,
dropout_p, dtype, backend, description). Also writes OUTPUT_DIR/README.md, which
lists the configurations and where PyTorch's default backend on the stored
dtype (its CPU flash kernel for f32/f16/bf16) disagrees with these NaN patterns.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_sdpa_fixtures import DTYPES, shape_str  # noqa: E402

NAN, INF = math.nan, math.inf
L, S, D, DV, H = 5, 7, 4, 4, 2  # (torch's flash kernel wants Dv == D) q [1, H, L, D], k [1, H, S, D], v [1, H, S, DV]


@dataclass
class Config:
    name: str
    description: str
    edits: list = field(default_factory=list)  # (tensor, index, value); "mask" edits the mask
    mask: str | None = None  # None, "bool" or "float" (all True / all 0 before the edits)
    is_causal: bool = False
    scale: float | None = None
    lq: int = L
    lk: int = S
    backend: str = "math"


def configs() -> list[Config]:
    C = Config
    row = slice(None)
    return [
        C("nan_q", "NaN in q[0, 0, 1, 2]: row 1 of head 0 is NaN", [("q", (0, 0, 1, 2), NAN)]),
        C("nan_k", "NaN in k[0, 1, 3, 0]: every row of head 1 is NaN", [("k", (0, 1, 3, 0), NAN)]),
        C("nan_v", "NaN in v[0, 0, 4, 1]: column 1 of head 0 is NaN", [("v", (0, 0, 4, 1), NAN)]),
        C("inf_v", "+inf in v[0, 1, 2, 0]: column 0 of head 1 is +-inf", [("v", (0, 1, 2, 0), INF)]),
        C("inf_q_row", "q[0, 0, 2, :] = +inf: scores +-inf, the row is NaN", [("q", (0, 0, 2, row), INF)]),
        C("inf_q_one", "q[0, 1, 3, 0] = +inf: +inf scores where k[.., 0] > 0 make the row NaN",
          [("q", (0, 1, 3, 0), INF)]),
        C("neg_inf_k", "k[0, 0, 2, :] = -inf: scores +-inf or NaN in every row of head 0",
          [("k", (0, 0, 2, row), -INF)]),
        C("all_scores_neg_inf", "q row 2 = [inf, 0, 0, 0] and k[.., 0] = -1: every score -inf, "
          "head 0 row 2 is 0; head 1 key 5 gets +inf, its row 2 is NaN",
          [("q", (0, row, 2, row), 0.0), ("q", (0, row, 2, 0), INF), ("k", (0, row, row, 0), -1.0),
           ("k", (0, 1, 5, 0), 1.0)]),
        C("bool_masked_nan_k", "NaN in k[0, 0, 3, 1] under a bool False column: False adds -inf, "
          "the rows stay NaN", [("k", (0, 0, 3, 1), NAN), ("mask", (row, 3), False)], mask="bool"),
        C("bool_masked_inf_k", "k[0, 0, 3, :] = +inf under a bool False column: NaN where q.k is +inf",
          [("k", (0, 0, 3, row), INF), ("mask", (row, 3), False)], mask="bool"),
        C("bool_rows_false", "bool mask rows 1 and 3 all False: weights, output 0, lse -inf",
          [("mask", (1, row), False), ("mask", (3, row), False), ("mask", (0, 5), False)], mask="bool"),
        C("bool_rows_false_nan_v", "bool rows 1, 3 all False and NaN in v[0, 1, 2, 2]: the masked "
          "rows of head 1 get NaN in column 2 (0 * NaN)",
          [("mask", (1, row), False), ("mask", (3, row), False), ("v", (0, 1, 2, 2), NAN)], mask="bool"),
        C("float_neg_inf_row", "float mask row 2 all -inf, other -inf holes: row 2 is 0",
          [("mask", (2, row), -INF), ("mask", (0, 1), -INF), ("mask", (4, 6), -INF), ("mask", (3, 0), -1e9)],
          mask="float"),
        C("float_neg_inf_row_inf_v", "float mask row 2 all -inf and v[0, 0, 6, 1] = -inf: row 2 of "
          "head 0 gets NaN in column 1 (0 * inf)", [("mask", (2, row), -INF), ("v", (0, 0, 6, 1), -INF)],
          mask="float"),
        C("float_neg_inf_row_nan_q", "float mask row 2 all -inf and NaN in q[0, 1, 2, 0]: -inf + NaN "
          "is NaN, row 2 of head 1 is NaN", [("mask", (2, row), -INF), ("q", (0, 1, 2, 0), NAN)], mask="float"),
        C("float_mask_nan", "NaN in the float mask at (1, 4): row 1 of both heads is NaN",
          [("mask", (1, 4), NAN)], mask="float"),
        C("float_mask_pos_inf", "+inf in the float mask at (3, 2): row 3 of both heads is NaN",
          [("mask", (3, 2), INF)], mask="float"),
        C("scale_zero_inf_q", "scale 0 and q[0, 0, 1, :] = +inf: inf * 0 is NaN, row 1 is NaN",
          [("q", (0, 0, 1, row), INF)], scale=0.0),
        C("causal_nan_q", "is_causal, NaN in q[0, 1, 3, 1]: row 3 of head 1 is NaN, its keys after "
          "the diagonal weigh 0", [("q", (0, 1, 3, 1), NAN)], is_causal=True),
        C("causal_nan_k_hidden", "is_causal, NaN in k[0, 0, 4, :]: only rows i >= 4 see key 4 "
          "(torch's math backend adds -inf there and gives NaN everywhere)",
          [("k", (0, 0, 4, row), NAN)], is_causal=True, backend="flash"),
        C("causal_lq_gt_lk_inf_k", "is_causal, Lq = 9 > Lk = 4, +inf in k[0, 1, 2, :]: rows 0-1 "
          "never see it, rows >= 2 do", [("k", (0, 1, 2, row), INF)], is_causal=True, lq=9, lk=4,
          backend="flash"),
    ]


def tril(lq, lk):
    return torch.ones(lq, lk, dtype=torch.bool).tril()


def additive(mask, dtype):
    """The float mask PyTorch adds: bool False -> -inf, as its SDPA front end converts it."""
    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -INF)


def reference(q, k, v, mask, c: Config):
    """float64 weights, lse and weights @ v with qkv's semantics, from plain torch ops."""
    scale = c.scale if c.scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores + additive(mask, torch.float64)
    if c.is_causal:  # removes the keys after the diagonal
        scores = scores.masked_fill(~tril(c.lq, c.lk), -INF)
    masked = (scores == -INF).all(dim=-1, keepdim=True)
    nan_row = (scores.isnan() | (scores == INF)).any(dim=-1, keepdim=True)
    w = torch.where(masked, torch.zeros_like(scores), torch.softmax(scores, dim=-1))
    w = torch.where(nan_row, torch.full_like(w, NAN), w)
    if c.is_causal:
        w = w.masked_fill(~tril(c.lq, c.lk), 0.0)  # not in the row, even a NaN row
    lse = torch.logsumexp(scores, dim=-1)
    lse = torch.where(nan_row.squeeze(-1), torch.full_like(lse, NAN), lse)
    return w, lse, torch.matmul(w, v)


def sdpa(q, k, v, mask, c: Config, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c.is_causal, scale=c.scale)


def same(a, b, tol=1e-12):
    """Equal NaN positions, equal infinities, finite values within tol (relative)."""
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    fa, fb = a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0)
    inf_ok = torch.equal(a.isinf() & ~a.isnan(), b.isinf() & ~b.isnan()) and torch.equal(
        a[a.isinf()], b[b.isinf()])
    scale = max(fb.abs().max().item(), 1e-300)
    return inf_ok and (fa - fb).abs().max().item() <= tol * scale


def inputs(c: Config, dt, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((1, H, c.lq, D), generator=gen, dtype=torch.float64)
    k = torch.randn((1, H, c.lk, D), generator=gen, dtype=torch.float64)
    v = torch.randn((1, H, c.lk, DV), generator=gen, dtype=torch.float64)
    mask = None
    if c.mask == "bool":
        mask = torch.ones(c.lq, c.lk, dtype=torch.bool)
    elif c.mask == "float":
        mask = torch.randn((c.lq, c.lk), generator=gen, dtype=torch.float64)
    named = {"q": q, "k": k, "v": v, "mask": mask}
    for name, index, value in c.edits:
        named[name][index] = value
    q, k, v = (named[n].to(dt) for n in "qkv")
    mask = named["mask"]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dt)
    return q, k, v, mask


def nan_rows(t):
    """The rows (all dims but the last, flattened) holding a NaN, as a string of 0/1."""
    return "".join("1" if r else "0" for r in t.isnan().any(dim=-1).flatten().tolist())


def generate(c: Config, dt_name: str, seed: int):
    dt = DTYPES[dt_name]
    q, k, v, mask = inputs(c, dt, seed)
    q64, k64, v64 = q.double(), k.double(), v.double()
    m64 = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    w, lse, wv = reference(q64, k64, v64, m64, c)
    backend = SDPBackend.FLASH_ATTENTION if c.backend == "flash" else SDPBackend.MATH
    out = sdpa(q64, k64, v64, m64, c, backend)
    assert same(out, wv), (c.name, dt_name, "torch's output is not weights @ v")
    if c.backend == "math":  # the plain-ops weights are torch's math-backend weights
        _, w_math = torch.ops.aten._scaled_dot_product_attention_math(
            q64, k64, v64, additive(m64, torch.float64), 0.0, c.is_causal, scale=c.scale)
        if c.is_causal:  # compared on the row's keys: torch's math backend adds -inf after the diagonal
            w_math = w_math.masked_fill(~tril(c.lq, c.lk), 0.0)
        assert same(w, w_math), (c.name, dt_name, "weights differ from torch's math backend")
    # torch's CPU flash kernel's logsumexp (float masks only) agrees off fully masked rows.
    flash_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q64, k64, v64, 0.0, c.is_causal, attn_mask=additive(m64, torch.float64), scale=c.scale)[1]
    live = lse != -INF
    assert same(flash_lse[live], lse[live]), (c.name, dt_name, "lse differs from torch's flash kernel")
    # Where torch's default backend on the stored dtype differs (information, README).
    m_dt = None if mask is None else (additive(mask, dt) if mask.dtype == torch.bool else mask)
    default = F.scaled_dot_product_attention(q, k, v, attn_mask=m_dt, is_causal=c.is_causal, scale=c.scale)
    tensors = {"q": q, "k": k, "v": v, "out": out, "weights": w, "lse": lse}
    if mask is not None:
        tensors["attn_mask"] = mask
    options = {"is_causal": c.is_causal, "scale": c.scale, "enable_gqa": False, "dropout_p": 0.0,
               "dtype": dt_name, "backend": c.backend, "description": c.description}
    stats = {"nan_rows": nan_rows(out), "default_nan_rows": nan_rows(default)}
    return {n: t.contiguous() for n, t in tensors.items()}, {"options": json.dumps(options, sort_keys=True)}, stats


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = argv[1]
    os.makedirs(outdir, exist_ok=True)
    for f in os.listdir(outdir):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(outdir, f))
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rows, total = [], 0
    for i, c in enumerate(configs()):
        for dt_name in DTYPES:
            seed = 5000 + i
            tensors, meta, stats = generate(c, dt_name, seed)
            path = os.path.join(outdir, f"{c.name}_{dt_name}.safetensors")
            save_file(tensors, path, metadata=meta)
            total += os.path.getsize(path)
            rows.append((c, dt_name, tensors, stats, seed))
            print(f"{c.name:26s} {dt_name:9s} NaN rows {stats['nan_rows']} default backend "
                  f"{stats['default_nan_rows']}")
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("# PyTorch fixtures: NaN and Inf in attention\n\n")
        f.write("Generated by `tests/attention/make_sdpa_nonfinite_fixtures.py` (run `make fixtures`); do not "
                "edit.\n")
        f.write(f"torch {torch.__version__}; {len(rows)} files, {total} bytes in all. The conventions: "
                "`include/qkv/attention.h`.\n\n")
        f.write("`NaN rows` flags each output row [head, query] (1 = holds a NaN) of `out`; `default` is the "
                "same for torch's default backend on the stored dtype, where it differs.\n\n")
        f.write("| name | dtype | q | k | v | mask | causal | scale | out from | NaN rows | default | seed |"
                " description |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for c, dt_name, t, stats, seed in rows:
            mask = "-" if c.mask is None else c.mask + shape_str(t["attn_mask"].shape)
            differs = stats["default_nan_rows"] if stats["default_nan_rows"] != stats["nan_rows"] else "same"
            f.write(f"| {c.name} | {dt_name} | {shape_str(t['q'].shape)} | {shape_str(t['k'].shape)} | "
                    f"{shape_str(t['v'].shape)} | {mask} | {'yes' if c.is_causal else '-'} | "
                    f"{'-' if c.scale is None else c.scale} | {c.backend} | {stats['nan_rows']} | {differs} | "
                    f"{seed} | {c.description} |\n")
    print(f"{len(rows)} fixtures, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
