"""The loop the MHA fixture scripts share: run every configuration, write one
.safetensors per configuration and a README.md table, bound the total size."""
import os
import sys

TOTAL_LIMIT = 1024 * 1024


def write_fixture_set(configs, run, first_seed, default_dir, title, save_file, out_dir=None):
    """run(config, seed) -> (tensors, metadata); save_file is safetensors' numpy or torch
    writer. The folder is out_dir, else argv[1], else tests/fixtures/<default_dir>."""
    if out_dir is None:
        out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                                     default_dir)
    os.makedirs(out_dir, exist_ok=True)
    total = 0
    lines = title + ["", "| file | configuration |", "|---|---|"]
    for i, c in enumerate(configs):
        tensors, meta = run(c, first_seed + i)
        path = os.path.join(out_dir, c["name"] + ".safetensors")
        save_file(tensors, path, metadata=meta)
        total += os.path.getsize(path)
        lines.append(f"| {c['name']} | {c['description']} |")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(configs)} fixtures, {total} bytes in {out_dir}")
    assert total < TOTAL_LIMIT, total
