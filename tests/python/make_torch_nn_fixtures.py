#!/usr/bin/env python3
"""Writes the torch fixture of tests/python/test_nn.py's torch-in, torch-out parity test
(torch is not in .venv).

Usage: make_torch_nn_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`,
or /work/fixenv/bin/python with torch installed)

OUTPUT_DIR/mha_kdim_vdim.safetensors (the `safetensors` package) holds, float32:
  sd.<key>   torch.nn.MultiheadAttention(16, 4, batch_first=True, kdim=10, vdim=6)'s
             state_dict (torch.manual_seed(0) initialisation; separate q/k/v projections)
  q, k, v    inputs [2, 5, 16], [2, 7, 10], [2, 7, 6]
  kpm        key_padding_mask [2, 7] bool (True = ignore), batch 1 keys 4.. padded
  out, w     the layer's eval() forward(q, k, v, key_padding_mask=kpm,
             average_attn_weights=False): output [2, 5, 16], weights [2, 4, 5, 7]
and __metadata__ {"torch": torch.__version__}.
"""
import pathlib
import sys

import torch
from safetensors.torch import save_file


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True, kdim=10, vdim=6).eval()
    q, k, v = torch.randn(2, 5, 16), torch.randn(2, 7, 10), torch.randn(2, 7, 6)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    with torch.inference_mode():
        out, w = ref(q, k, v, key_padding_mask=kpm, average_attn_weights=False)
    tensors = {"sd." + name: t.detach().contiguous() for name, t in ref.state_dict().items()}
    tensors.update(q=q, k=k, v=v, kpm=kpm, out=out.contiguous(), w=w.contiguous())
    save_file(tensors, str(out_dir / "mha_kdim_vdim.safetensors"), metadata={"torch": torch.__version__})


if __name__ == "__main__":
    main()
