#!/usr/bin/env python3
"""Writes the .npy / .safetensors files that tests/io/*_test.cc read, with the real
numpy, safetensors and ml_dtypes packages, and the seed corpora of the fuzz targets.

    python tests/io/make_io_fixtures.py            # from the repository root
    (needs: pip install numpy safetensors ml_dtypes)

Values are chosen so the C++ tests can check every element by formula; i is the
row-major (C order) flat index of the element:
    float dtypes  i * 0.5 - 1        (exact in float16 and bfloat16)
    int8          i - 3
    int32         i * 100000 - 7
    int64         i * 2**40 - 7
    bool          i % 3 == 0
Keep these in sync with ExpectedValue() in tests/io/io_test_util.h.
"""
import io
import os
import struct
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save as st_save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "io")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "bool": np.bool_,
}


def values(name, shape):
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if name in ("f32", "f64", "f16", "bf16"):
        return (i * 0.5 - 1).astype(DTYPES[name])
    if name == "i8":
        return (i - 3).astype(np.int8)
    if name == "i32":
        return (i * 100000 - 7).astype(np.int32)
    if name == "i64":
        return i * 2**40 - 7
    return i % 3 == 0


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def npy_fixtures():
    files = {}
    for name in DTYPES:  # every dtype, C order, little endian, shape (2, 3)
        files[f"{name}.npy"] = npy_bytes(values(name, (2, 3)))
    for name in ("f32", "f64", "f16", "bf16", "i32", "i64"):  # '>' descr
        a = values(name, (2, 3))
        files[f"{name}_be.npy"] = npy_bytes(a.astype(a.dtype.newbyteorder(">")))
    files["f32_fortran.npy"] = npy_bytes(np.asfortranarray(values("f32", (2, 3, 4))))
    files["i64_fortran.npy"] = npy_bytes(np.asfortranarray(values("i64", (3, 2))))
    files["f32_v2.npy"] = npy_bytes(values("f32", (2, 3)), version=(2, 0))
    files["f32_v3.npy"] = npy_bytes(values("f32", (2, 3)), version=(3, 0))
    files["scalar_f64.npy"] = npy_bytes(np.float64(2.5))
    files["empty_f32.npy"] = npy_bytes(np.zeros((0, 3), np.float32))
    files["u16.npy"] = npy_bytes(np.arange(3, dtype=np.uint16))  # a dtype qkv cannot hold
    # An object array: '|O' and a pickle as the data, which qkv does not read.
    buf = io.BytesIO()
    np.save(buf, np.array([1, "a", None], dtype=object), allow_pickle=True)
    files["object.npy"] = buf.getvalue()
    return files


def st_fixtures():
    tensors = {name: values(name, (2, 3)) for name in DTYPES}
    tensors["scalar"] = np.array(2.5, np.float32)
    tensors["empty"] = np.zeros((0, 3), np.float32)
    # One metadata key: the reference writes a HashMap, whose order is not fixed.
    mixed = st_save(tensors, metadata={"source": "make_io_fixtures.py"})
    unsupported = st_save({"u8": np.arange(4, dtype=np.uint8), "w": values("f32", (2,))})
    return {"mixed.safetensors": mixed, "unsupported.safetensors": unsupported}


def st_raw(header, data=b"", length=None):
    """A .safetensors file from a header string, for the near-valid corpus entries."""
    h = header.encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def npy_raw(header, data=b"", version=1):
    h = header.encode("latin1")
    size = struct.pack("<H" if version == 1 else "<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + size + h + data


def npy_corpus(fixtures):
    seeds = {k: fixtures[k] for k in ("f32.npy", "bool.npy", "bf16_be.npy", "f32_fortran.npy", "f32_v2.npy",
                                      "f32_v3.npy", "scalar_f64.npy", "empty_f32.npy", "u16.npy", "i8.npy",
                                      "object.npy")}
    good = fixtures["f32.npy"]
    seeds["truncated_data.npy"] = good[:-3]
    seeds["truncated_header.npy"] = good[:40]
    seeds["py2_long.npy"] = npy_raw("{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 1L), }\n",
                                    struct.pack("<2i", 1, 2))
    seeds["structured.npy"] = npy_bytes(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    seeds["bad_dict.npy"] = npy_raw("{'descr': '<f4' 'fortran_order': False, 'shape': (1,), }\n", b"\0" * 4)
    seeds["bool_bytes.npy"] = npy_raw("{'descr': '|b1', 'fortran_order': True, 'shape': (2, 2), }\n",
                                      bytes([0, 1, 2, 255]))
    # No byte-order character: numpy reads 'f4' as '=f4' (native order).
    seeds["bare_descr.npy"] = npy_raw("{'descr': 'f4', 'fortran_order': False, 'shape': (2,), }\n",
                                      struct.pack("<2f", 1.5, -2.0))
    return seeds


def st_corpus(fixtures):
    seeds = dict(fixtures)
    seeds["empty.safetensors"] = st_raw("{}      ")
    seeds["metadata_only.safetensors"] = st_raw('{"__metadata__":{"a":"b"}}')
    f32x2 = struct.pack("<2f", 1.0, 2.0)
    seeds["overlap.safetensors"] = st_raw(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32x2)
    seeds["gap.safetensors"] = st_raw(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32x2)
    seeds["unaligned.safetensors"] = st_raw(
        '{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},'
        '"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}', b"\x07" + f32x2)
    seeds["bad_json.safetensors"] = st_raw('{"a":{"dtype":"F32",', f32x2)
    seeds["unknown_dtype.safetensors"] = st_raw('{"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}}', f32x2)
    seeds["huge_length.safetensors"] = st_raw("{}", length=2**40)
    seeds["f4.safetensors"] = st_raw('{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}', b"\x12\x34")
    return seeds


def main():
    npy = npy_fixtures()
    st = st_fixtures()
    for name, data in {**npy, **st}.items():
        write(os.path.join(FIXTURES, name), data)
    for name, data in npy_corpus(npy).items():
        write(os.path.join(CORPUS, "npy", name), data)
    for name, data in st_corpus(st).items():
        write(os.path.join(CORPUS, "safetensors", name), data)
    print(f"wrote {len(npy) + len(st)} fixtures to {FIXTURES} and seed corpora to {CORPUS}", file=sys.stderr)


if __name__ == "__main__":
    main()
