#!/usr/bin/env python3
"""Writes the PyTorch fixtures for qkv::attention_reference.

Usage: make_sdpa_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Every configuration becomes OUTPUT_DIR/<name>.safetensors, written by the
`safetensors` package, holding:

  q, k, v      the inputs, in the configuration's dtype (f64, f32, f16 or bf16)
  attn_mask    (optional) bool (True = take part) or float (added), input dtype
  out          torch SDPA (math backend) in float64 on the float64 upcast of the
               stored inputs: the exact values the stored inputs define
  weights      float64 softmax of the masked, scaled scores computed with plain
               torch ops from the same upcast inputs; rows whose every key is
               masked are 0 (PyTorch's _safe_softmax convention, torch >= 2.5)
  out_f32      torch SDPA on the float32 cast of the stored inputs (information)
  out_native   f16/bf16 configurations only: torch SDPA on the half inputs
               themselves, in that dtype (information)

and `__metadata__` with one key, "options" (JSON: is_causal, scale,
enable_gqa, dropout_p, dtype, description).

Seeds are fixed per configuration, so reruns with the same torch give the same
inputs. Dropout is not covered: torch's RNG stream cannot be reproduced by qkv.
Also writes OUTPUT_DIR/README.md listing the configurations.
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

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
TOTAL_LIMIT = 2 * 1024 * 1024


@dataclass
class Config:
    name: str
    description: str
    q: tuple
    k: tuple
    v: tuple
    dtype: str = "float64"
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    # mask: None, or (kind, shape, pattern); kind "bool" | "float".
    mask: tuple | None = None
    input_scale: float = 1.0
    extra: dict = field(default_factory=dict)


def configs() -> list[Config]:
    C = Config
    out = [
        # ---- shapes --------------------------------------------------------------
        C("basic_4d", "plain 4-D, Lq == Lk, Dk == Dv", (2, 3, 8, 16), (2, 3, 8, 16), (2, 3, 8, 16)),
        C("dk_ne_dv", "Dk = 16, Dv = 24", (2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 24)),
        C("dk_gt_dv", "Dk = 32, Dv = 5", (1, 2, 7, 32), (1, 2, 7, 32), (1, 2, 7, 5)),
        C("lq_lt_lk", "Lq = 5 < Lk = 17", (2, 2, 5, 8), (2, 2, 17, 8), (2, 2, 17, 8)),
        C("lq_gt_lk", "Lq = 19 > Lk = 6", (2, 2, 19, 8), (2, 2, 6, 8), (2, 2, 6, 12)),
        C("lq1", "Lq = 1 (decode step), Lk = 33", (2, 3, 1, 16), (2, 3, 33, 16), (2, 3, 33, 16)),
        C("lk1", "Lk = 1: every weight is 1", (2, 2, 9, 8), (2, 2, 1, 8), (2, 2, 1, 8)),
        C("lq1_lk1", "Lq = Lk = 1", (3, 2, 1, 4), (3, 2, 1, 4), (3, 2, 1, 6)),
        C("d1", "Dk = Dv = 1", (2, 2, 6, 1), (2, 2, 7, 1), (2, 2, 7, 1)),
        C("long_64", "L = S = 64, D = 32, one head", (1, 1, 64, 32), (1, 1, 64, 32), (1, 1, 64, 32)),
        C("bcast_kv_batch", "q [2,3,L,D], k/v [1,3,S,D]: batch broadcast from k/v",
          (2, 3, 6, 8), (1, 3, 10, 8), (1, 3, 10, 8)),
        C("bcast_q_batch", "q [1,3,L,D], k/v [2,3,S,D]: batch broadcast from q",
          (1, 3, 6, 8), (2, 3, 10, 8), (2, 3, 10, 8)),
        C("bcast_heads", "q [2,4,L,D], k [2,1,S,D], v [1,1,S,Dv]: heads broadcast without GQA",
          (2, 4, 5, 8), (2, 1, 7, 8), (1, 1, 7, 6)),
        C("no_batch_2d", "2-D q [L,D], k [S,D], v [S,Dv]", (7, 8), (11, 8), (11, 5)),
        C("three_d", "3-D q/k/v [H,L,D]", (3, 9, 8), (3, 12, 8), (3, 12, 8)),
        C("three_d_vs_4d", "3-D q [H,L,D] with 4-D k/v [B,H,S,D]", (3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 8)),
        C("five_d", "5-D q [2,1,2,L,D] with k/v [1,3,2,S,D]", (2, 1, 2, 4, 8), (1, 3, 2, 6, 8), (1, 3, 2, 6, 4)),
        # ---- scale ---------------------------------------------------------------
        C("scale_explicit", "explicit scale 0.37", (2, 2, 8, 16), (2, 2, 9, 16), (2, 2, 9, 16), scale=0.37),
        C("scale_two", "explicit scale 2.0 (sharper than default)", (1, 2, 8, 8), (1, 2, 8, 8), (1, 2, 8, 8),
          scale=2.0),
        C("scale_zero", "scale 0: uniform weights", (1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), scale=0.0),
        C("scale_negative", "scale -0.5: scores negated", (1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), scale=-0.5),
        # ---- boolean masks (True = take part) ------------------------------------------
        C("bool_mask_ls", "bool mask [L,S] with fully masked rows 1 and 4",
          (2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 8), mask=("bool", (6, 9), "rows:1,4")),
        C("bool_mask_b1ls", "bool mask [B,1,L,S] with a fully masked row per batch",
          (2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 8), mask=("bool", (2, 1, 6, 7), "rows:2")),
        C("bool_mask_bhls", "bool mask [B,H,L,S] with some fully masked rows",
          (2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 10), mask=("bool", (2, 3, 6, 7), "rows:0,5")),
        C("bool_mask_1s", "bool mask [1,S] (key padding broadcast over rows)",
          (2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 8), mask=("bool", (1, 9), "random")),
        C("bool_mask_b11s_all_false", "bool mask [B,1,1,S]; batch 1 masks every key (whole batch zero)",
          (2, 2, 5, 8), (2, 2, 8, 8), (2, 2, 8, 8), mask=("bool", (2, 1, 1, 8), "batch1_false")),
        C("bool_mask_2d_inputs", "2-D q/k/v with bool mask [L,S], one fully masked row",
          (6, 8), (9, 8), (9, 4), mask=("bool", (6, 9), "rows:3")),
        C("bool_mask_lk1_masked", "Lk = 1 with bool mask [L,1]: masked rows give 0",
          (1, 2, 5, 8), (1, 2, 1, 8), (1, 2, 1, 8), mask=("bool", (5, 1), "rows:0,3")),
        # ---- additive float masks ------------------------------------------------------
        C("float_mask_ls", "float mask [L,S], normal values", (2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 8),
          mask=("float", (6, 9), "normal")),
        C("float_mask_neg_inf", "float mask [B,H,L,S] with -inf entries and a fully -inf row",
          (2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 8), mask=("float", (2, 2, 6, 9), "neginf_row:2")),
        C("float_mask_b1ls_neg_inf", "float mask [B,1,L,S] with -inf entries and a fully -inf row",
          (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), mask=("float", (2, 1, 5, 7), "neginf_row:4")),
        C("float_mask_minus_1e9", "float mask [1,S] with -1e9 (finite) entries: not fully masked",
          (1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), mask=("float", (1, 6), "minus1e9_all_but_one")),
        # ---- causal (top-left aligned tril) --------------------------------------------
        C("causal_square", "is_causal, Lq == Lk", (2, 2, 9, 8), (2, 2, 9, 8), (2, 2, 9, 8), is_causal=True),
        C("causal_lq_lt_lk", "is_causal, Lq = 5 < Lk = 12 (top-left: row i sees j <= i)",
          (2, 2, 5, 8), (2, 2, 12, 8), (2, 2, 12, 8), is_causal=True),
        C("causal_lq_gt_lk", "is_causal, Lq = 12 > Lk = 5 (rows >= 4 see every key)",
          (2, 2, 12, 8), (2, 2, 5, 8), (2, 2, 5, 6), is_causal=True),
        C("causal_lq1", "is_causal, Lq = 1, Lk = 8 (top-left: only key 0)",
          (1, 2, 1, 8), (1, 2, 8, 8), (1, 2, 8, 8), is_causal=True),
        C("causal_2d", "is_causal with 2-D inputs", (7, 8), (7, 8), (7, 8), is_causal=True),
        # ---- GQA -----------------------------------------------------------------
        C("gqa_8_2", "enable_gqa, Hq = 8, Hk = 2", (2, 8, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8), enable_gqa=True),
        C("gqa_4_1", "enable_gqa, Hq = 4, Hk = 1", (2, 4, 6, 8), (2, 1, 7, 8), (2, 1, 7, 6), enable_gqa=True),
        C("gqa_causal", "enable_gqa (8/2) with is_causal", (1, 8, 8, 8), (1, 2, 8, 8), (1, 2, 8, 8),
          enable_gqa=True, is_causal=True),
        C("gqa_mask_bhls", "enable_gqa (4/2) with bool mask [B,Hq,L,S] and a fully masked row",
          (2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8), enable_gqa=True, mask=("bool", (2, 4, 5, 6), "rows:1")),
        C("gqa_3d_decode", "enable_gqa with 3-D inputs, Hq = 6, Hk = 3, Lq = 1",
          (6, 1, 8), (3, 10, 8), (3, 10, 8), enable_gqa=True),
        C("gqa_equal_heads", "enable_gqa with Hq == Hk (no repetition)", (2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8),
          enable_gqa=True),
        # ---- large logits ----------------------------------------------------------
        C("large_x1000", "q, k, v scaled x1000 (logits ~1e6: needs max subtraction)",
          (2, 2, 8, 16), (2, 2, 9, 16), (2, 2, 9, 16), input_scale=1000.0),
        C("large_x1000_causal_mask", "x1000 inputs with is_causal", (1, 2, 8, 8), (1, 2, 8, 8), (1, 2, 8, 8),
          is_causal=True, input_scale=1000.0),
        C("large_q_only_x30", "q x30: logits ~ 30x typical, a few keys share the weight",
          (1, 2, 8, 16), (1, 2, 9, 16), (1, 2, 9, 16), extra={"q_scale": 30.0}),
        # ---- float32 inputs ------------------------------------------------------------
        C("f32_basic", "float32 inputs", (2, 3, 8, 16), (2, 3, 10, 16), (2, 3, 10, 16), dtype="float32"),
        C("f32_dk_ne_dv_causal", "float32, Dk != Dv, is_causal, Lq > Lk", (2, 2, 10, 16), (2, 2, 7, 16),
          (2, 2, 7, 8), dtype="float32", is_causal=True),
        C("f32_mask_gqa", "float32, GQA 4/2, float mask with -inf and a fully -inf row",
          (1, 4, 6, 8), (1, 2, 7, 8), (1, 2, 7, 8), dtype="float32", enable_gqa=True,
          mask=("float", (6, 7), "neginf_row:5")),
        C("f32_large_x1000", "float32, x1000 inputs", (1, 2, 6, 8), (1, 2, 7, 8), (1, 2, 7, 8),
          dtype="float32", input_scale=1000.0),
        # ---- half inputs -----------------------------------------------------------------
        C("f16_basic", "float16 inputs", (2, 2, 8, 16), (2, 2, 9, 16), (2, 2, 9, 16), dtype="float16"),
        C("f16_bool_mask_causalish", "float16, bool mask [B,1,L,S] with a fully masked row",
          (2, 2, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8), dtype="float16", mask=("bool", (2, 1, 6, 7), "rows:3")),
        C("f16_float_mask", "float16, float mask [L,S] with -inf", (1, 2, 6, 8), (1, 2, 7, 8), (1, 2, 7, 8),
          dtype="float16", mask=("float", (6, 7), "neginf_row:0")),
        C("bf16_basic", "bfloat16 inputs", (2, 2, 8, 16), (2, 2, 9, 16), (2, 2, 9, 16), dtype="bfloat16"),
        C("bf16_gqa_causal", "bfloat16, GQA 8/2, is_causal, Lq < Lk", (1, 8, 5, 8), (1, 2, 9, 8), (1, 2, 9, 8),
          dtype="bfloat16", enable_gqa=True, is_causal=True),
        C("bf16_large_x100", "bfloat16, x100 inputs", (1, 2, 6, 8), (1, 2, 7, 8), (1, 2, 7, 8),
          dtype="bfloat16", input_scale=100.0),
    ]
    names = [c.name for c in out]
    assert len(names) == len(set(names)), "duplicate config names"
    return out


def make_mask(kind: str, shape: tuple, pattern: str, gen: torch.Generator, dtype: torch.dtype):
    if kind == "bool":
        m = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.7
        if pattern.startswith("rows:"):
            for r in (int(x) for x in pattern[5:].split(",")):
                m[..., r, :] = False
        elif pattern == "batch1_false":
            m[1] = False
        elif pattern == "random":
            m[..., 0] = True  # keep at least one key per row
        else:
            raise ValueError(pattern)
        # Every row not deliberately masked keeps at least one key.
        return m
    m = torch.randn(shape, generator=gen, dtype=torch.float64)
    if pattern == "normal":
        pass
    elif pattern.startswith("neginf_row:"):
        r = int(pattern.split(":")[1])
        holes = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.3
        m[holes] = -math.inf
        m[..., r, :] = -math.inf
    elif pattern == "minus1e9_all_but_one":
        m[...] = -1e9
        m[..., 2] = 0.5
    else:
        raise ValueError(pattern)
    return m.to(dtype)


def causal_mask(lq: int, lk: int) -> torch.Tensor:
    return torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=0)


def reference_weights(q, k, v, mask, c: Config) -> torch.Tensor:
    """float64 attention weights from plain torch ops (no SDPA)."""
    q, k = q.double(), k.double()
    if c.enable_gqa:
        rep = q.size(-3) // k.size(-3)
        k = k.repeat_interleave(rep, dim=-3)
    scale = c.scale if c.scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if c.is_causal:
        mask = causal_mask(q.size(-2), k.size(-2))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, -math.inf)
        else:
            scores = scores + mask.double()
    w = torch.softmax(scores, dim=-1)
    fully_masked = torch.all(scores == -math.inf, dim=-1, keepdim=True)
    return torch.where(fully_masked, torch.zeros_like(w), w)


def sdpa(q, k, v, mask, c: Config, backend=SDPBackend.MATH):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=c.is_causal, scale=c.scale,
            enable_gqa=c.enable_gqa)


def generate(c: Config, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]

    def rnd(shape, s=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * s).to(dt)

    q = rnd(c.q, c.input_scale * c.extra.get("q_scale", 1.0))
    k = rnd(c.k, c.input_scale)
    v = rnd(c.v, c.input_scale)
    mask = make_mask(c.mask[0], c.mask[1], c.mask[2], gen, dt) if c.mask else None

    def up(t, d):
        return None if t is None else (t if t.dtype == torch.bool else t.to(d))

    q64, k64, v64, m64 = (up(t, torch.float64) for t in (q, k, v, mask))
    out = sdpa(q64, k64, v64, m64, c)
    weights = reference_weights(q64, k64, v64, m64, c)

    # Self-checks: SDPA and the explicit weights agree; fully masked rows are 0.
    v_rep = v64.repeat_interleave(q64.size(-3) // v64.size(-3), dim=-3) if c.enable_gqa else v64
    explicit = torch.matmul(weights, v_rep)
    assert explicit.shape == out.shape, (c.name, explicit.shape, out.shape)
    err = (explicit - out).abs().max().item()
    mag = max(out.abs().max().item(), 1e-300)
    assert err <= 1e-12 * mag, (c.name, err, mag)
    dead = (weights == 0).all(dim=-1)
    if dead.any():
        assert (out[dead] == 0).all(), (c.name, "torch gives non-zero output for a fully masked row")
    # The default backend (CPU flash kernel where it applies) gives the same result.
    out_default = sdpa(q64, k64, v64, m64, c, backend=[SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    assert (out_default - out).abs().max().item() <= 1e-12 * mag, (c.name, "flash vs math")

    tensors = {"q": q, "k": k, "v": v, "out": out, "weights": weights}
    if mask is not None:
        tensors["attn_mask"] = mask
    tensors["out_f32"] = sdpa(*(up(t, torch.float32) for t in (q, k, v, mask)), c)
    if dt in (torch.float16, torch.bfloat16):
        tensors["out_native"] = sdpa(q, k, v, mask, c, backend=[SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    options = {
        "is_causal": c.is_causal,
        "scale": c.scale,
        "enable_gqa": c.enable_gqa,
        "dropout_p": 0.0,
        "dtype": c.dtype,
        "description": c.description,
    }
    # One key only: safetensors writes metadata in hash-map order, so a second key
    # would make the bytes differ between runs. torch version and seeds: README.md.
    meta = {"options": json.dumps(options, sort_keys=True)}
    stats = {
        "fully_masked_rows": int(dead.sum().item()),
        "err_f32": (tensors["out_f32"].double() - out).abs().max().item(),
    }
    if "out_native" in tensors:
        stats["err_native"] = (tensors["out_native"].double() - out).abs().max().item()
    return {n: t.contiguous() for n, t in tensors.items()}, meta, stats


def shape_str(t):
    return "[" + ",".join(str(s) for s in t) + "]"


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

    rows = []
    total = 0
    for i, c in enumerate(configs()):
        seed = 1000 + i
        tensors, meta, stats = generate(c, seed)
        path = os.path.join(outdir, c.name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        size = os.path.getsize(path)
        total += size
        mask = "-"
        if "attn_mask" in tensors:
            m = tensors["attn_mask"]
            mask = ("bool" if m.dtype == torch.bool else "float") + shape_str(m.shape)
        rows.append((c, tensors, mask, size, stats, seed))
        print(f"{c.name:28s} {size:7d} B  masked_rows={stats['fully_masked_rows']:3d} "
              f"err_f32={stats['err_f32']:.2e}" +
              (f" err_native={stats['err_native']:.2e}" if "err_native" in stats else ""))
    assert total < TOTAL_LIMIT, f"fixtures total {total} bytes, over {TOTAL_LIMIT}"

    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("# PyTorch SDPA fixtures\n\n")
        f.write("Generated by `tests/attention/make_sdpa_fixtures.py` (run `make fixtures`); do not edit.\n")
        f.write(f"torch {torch.__version__}; {len(rows)} files, {total} bytes in all.\n\n")
        f.write("Each file holds `q`, `k`, `v`, optional `attn_mask`, `out` (torch SDPA in float64 on the\n"
                "upcast inputs), `weights` (float64 softmax of the masked scaled scores; fully masked rows\n"
                "are 0), `out_f32` (torch SDPA on float32 inputs) and, for f16/bf16, `out_native` (torch\n"
                "SDPA in that dtype). `__metadata__[\"options\"]` is JSON: is_causal, scale, enable_gqa,\n"
                "dropout_p, dtype, description. No dropout fixtures: torch's RNG cannot be matched.\n\n")
        f.write("| name | dtype | q | k | v | mask | causal | scale | gqa | masked rows | seed | bytes | description |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for c, t, mask, size, stats, seed in rows:
            f.write(f"| {c.name} | {c.dtype} | {shape_str(t['q'].shape)} | {shape_str(t['k'].shape)} | "
                    f"{shape_str(t['v'].shape)} | {mask} | {'yes' if c.is_causal else '-'} | "
                    f"{'-' if c.scale is None else c.scale} | {'yes' if c.enable_gqa else '-'} | "
                    f"{stats['fully_masked_rows']} | {seed} | {size} | {c.description} |\n")
    print(f"{len(rows)} fixtures, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
