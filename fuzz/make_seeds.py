#!/usr/bin/env python3
"""Seeds for the einsum and einops libFuzzer targets, from the equations and
patterns the tests and docs use, plus hand-made ones with huge or zero dims.

    python3 fuzz/make_seeds.py OUT_DIR     (writes OUT_DIR/einsum, OUT_DIR/einops)

The committed corpora (fuzz/corpus/einsum, fuzz/corpus/einops) are these seeds
merged with what the fuzz runs found (libFuzzer -merge=1 keeps the inputs that add
coverage); see docs/testing.md.

Input format (fuzz/fuzz_util.h): the text first; after a backslash and one more
byte, the bytes that FuzzedDataProvider consumes from the back (the last byte is
the first number consumed). A text alone gets the default choices (small dims).
"""
import hashlib
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUOTED = re.compile(r"'([^'\n]{0,120})'|\"([^\"\n]{0,120})\"")

# draw_dim's byte for each special dim (fuzz_util.h: 192 + index in kSpecial).
SPECIAL = {0: 192, 1: 193, 6: 194, 7: 195, 16: 196, 64: 197, 65: 198, 4096: 199, 2**20: 200, 2**31: 201,
           2**32: 202, 3037000500: 203, 2**40: 204, 2**52: 205, 2**53 + 1: 206, 2**60: 207, 2**62 - 1: 208,
           2**62: 209, 2**62 + 1: 210, 2**63 - 2: 211, 2**63 - 1: 212}


def quoted_strings(paths):
    for path in paths:
        for m in QUOTED.finditer(path.read_text(errors="replace")):
            yield m.group(1) if m.group(1) is not None else m.group(2)


def with_numbers(text, consumed):
    """text, then the numbers in the order the fuzzer consumes them (from the back)."""
    return text.encode().replace(b"\\", b"\\\\") + b"\\;" + bytes(reversed(consumed))


def einsum_seeds():
    files = list((ROOT / "tests/einsum").glob("*.cc")) + [ROOT / "tests/python/test_einsum.py",
                                                          ROOT / "docs/einsum.md"]
    eqs = {s for s in quoted_strings(files) if re.fullmatch(r"[A-Za-z.,\s]*(->[A-Za-z.\s]*)?", s) and
           re.search(r"[A-Za-z]", s) and ("," in s or "->" in s)}
    cases = json.loads((ROOT / "tests/einsum/path_fixtures.json").read_text())["cases"]
    eqs |= {c["equation"] for c in cases[::8]}
    seeds = [e.encode() for e in sorted(eqs)]
    # Huge and zero dims: count tweak, then per term (no "...") per label: size, tweak.
    seeds.append(with_numbers("ij,jk->ik", [0, SPECIAL[2**62], 0, 0, 0, 0, SPECIAL[2**62], 0]))
    seeds.append(with_numbers("ab,bc->ac", [0, SPECIAL[3037000500], 0, 0, 0, SPECIAL[3037000500], 0]))
    seeds.append(with_numbers("ab,bc,cd->ad", [0, SPECIAL[0], 0, 0, 0, 0, 0, SPECIAL[2**63 - 1], 0]))
    seeds.append(with_numbers("i,j->ij", [0, SPECIAL[2**32], 0, SPECIAL[2**32], 0]))
    # Every optimizer over a 5-operand chain (options follow the shapes).
    chain = "ab,bc,cd,de,ef->af"
    for opt in range(8):
        seeds.append(with_numbers(chain, [0] * 20 + [opt, 200 + opt % 8, 0]))
    return seeds


def einops_seeds():
    files = list((ROOT / "tests/einops").glob("*.cc")) + [ROOT / "tests/python/test_einops_cli.py",
                                                          ROOT / "tests/python/test_einops.py",
                                                          ROOT / "docs/einops.md"]
    texts = {s for s in quoted_strings(files) if 0 < len(s) < 120 and "\\" not in s}
    seeds = []
    for t in sorted(texts):
        if "->" in t and "," in t:
            seeds.append(with_numbers(t, [192]))           # einops.einsum
        elif "->" in t:
            for op in (0, 1, 2):                          # rearrange, reduce, repeat
                seeds.append(with_numbers(t, [op]))
        elif "*" in t and re.fullmatch(r"[\w\s*]+", t):
            seeds.append(with_numbers(t, [128]))          # pack
            seeds.append(with_numbers(t, [129]))          # unpack
        elif re.fullmatch(r"[\w\s.()]+", t) and " " in t:
            seeds.append(with_numbers(t, [160]))          # parse_shape
    # repeat with c = 2^60 (the segfault) and other huge new axes: op, left
    # dims (h, w small), tweak, then the new axis' size.
    seeds.append(with_numbers("h w -> (h w c)", [2, 0, 0, 0, SPECIAL[2**60]]))
    seeds.append(with_numbers("h w -> h w c", [2, 0, 0, 0, SPECIAL[2**62]]))
    seeds.append(with_numbers("h w -> (c h) w", [2, 0, 0, 0, SPECIAL[2**63 - 1]]))
    seeds.append(with_numbers("b (h d) -> b h d", [0, 0, SPECIAL[2**62], SPECIAL[3037000500]]))
    return seeds


def write(out, seeds):
    out.mkdir(parents=True, exist_ok=True)
    for s in seeds:
        (out / hashlib.sha1(s).hexdigest()).write_bytes(s)
    print(f"{out}: {len(seeds)} seeds")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    write(out / "einsum", einsum_seeds())
    write(out / "einops", einops_seeds())
