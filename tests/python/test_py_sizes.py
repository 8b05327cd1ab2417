"""Checked sizes: results too large to allocate are MemoryError (qkv::OutOfMemoryError)
naming the operation, the shapes and the bytes, raised before any work; the limit is
QKV_MAX_ALLOC_BYTES (read once per process, so those tests run in a child process)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qkv


def run_python(script, env=None, timeout=120):
    full_env = dict(os.environ)
    full_env.pop("QKV_MAX_ALLOC_BYTES", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def test_repeat_whose_bytes_overflow_is_memory_error_not_a_segfault():
    # Before: 2^62 float32 elements, 2^64 bytes wrapped to 0, SIGSEGV in permuted_copy.
    with pytest.raises(MemoryError) as e:
        qkv.repeat(np.ones((2, 2), np.float32), "h w -> (h w c)", c=1 << 60)
    assert str(e.value) == (
        "repeat: 'h w -> (h w c)' (input [2, 2]): output [2, 2, 1152921504606846976] float32 "
        "needs 2^64 bytes: the size overflows"
    )


def test_repeat_axes_past_2_to_62_are_value_errors():
    with pytest.raises(ValueError, match=r"Axis lengths multiply past 2\^62: 4 \* 4611686018427387904"):
        qkv.repeat(np.ones((2, 2), np.float32), "h w -> (h w c)", c=1 << 62)


def test_cli_repeat_with_a_huge_axis_fails_cleanly(run, tmp_path):
    src = tmp_path / "ones22.npy"
    np.save(src, np.ones((2, 2), np.float32))
    r = run("repeat", "h w -> (h w c)", src, "-o", tmp_path / "big.npy", "c=1152921504606846976")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)  # was -11 (SIGSEGV)
    assert "output [2, 2, 1152921504606846976] float32 needs 2^64 bytes: the size overflows" in r.stderr
    assert not (tmp_path / "big.npy").exists()


def test_max_alloc_bytes_is_read_once_from_the_environment():
    script = """
        import time, numpy as np, qkv
        print(qkv._qkv._max_alloc_bytes())
        a, b = np.ones((131072, 1), np.float32), np.ones((1, 32768), np.float32)
        t = time.perf_counter()
        try:
            qkv.einsum("ij,jk->ik", a, b)
        except MemoryError as e:
            print("MemoryError:", e)
        print("seconds", time.perf_counter() - t)
        small = qkv.einsum("ij,jk->ik", a[:1024], b[:, :256])  # 1 MiB: fits
        print("small", small.shape, float(small.sum()))
        """
    r = run_python(script, {"QKV_MAX_ALLOC_BYTES": "1G"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(1 << 30)
    assert lines[1] == (
        "MemoryError: einsum: 'ij,jk->ik' (operands [131072, 1], [1, 32768]): output [131072, 32768] "
        "float32 needs 17179869184 bytes (16.0 GiB), more than QKV_MAX_ALLOC_BYTES=1073741824"
    )
    assert float(lines[2].split()[1]) < 1.0  # failed up front, not after computing
    assert lines[3] == "small (1024, 256) 262144.0"


def test_invalid_max_alloc_bytes_is_a_value_error():
    r = run_python("""
        import numpy as np, qkv
        try:
            qkv.rearrange(np.ones((2, 3)), "a b -> b a").copy()
            qkv.repeat(np.ones((2, 3)), "a b -> a (b c)", c=2)
        except ValueError as e:
            print("ValueError:", e)
        """, {"QKV_MAX_ALLOC_BYTES": "lots"})
    assert r.returncode == 0, r.stderr
    assert "ValueError: QKV_MAX_ALLOC_BYTES='lots' is not a positive byte count" in r.stdout


def test_default_limit_is_the_memory_of_the_machine():
    r = run_python("import qkv; print(qkv._qkv._max_alloc_bytes())")
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limits = [physical]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
        break
    assert int(r.stdout) == min(limits)


def test_allocation_the_system_refuses_is_memory_error_with_the_operation():
    # RLIMIT_AS 1 GiB above what the child already maps: an 8 GiB result is refused
    # by aligned_alloc (the QKV_MAX_ALLOC_BYTES check is lifted to let it try).
    script = """
        import resource, numpy as np, qkv
        x = np.ones((2, 2), np.float32)
        qkv.repeat(x, "h w -> h (w c)", c=2)  # warm up threads and pools before the limit
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        try:
            qkv.repeat(x, "h w -> h (w c)", c=1 << 29)
        except MemoryError as e:
            print("MemoryError:", e)
        """
    r = run_python(script, {"QKV_MAX_ALLOC_BYTES": "1T"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "MemoryError: repeat: 'h w -> h (w c)' (input [2, 2]): out of memory allocating output "
        "[2, 2, 536870912] float32 (8589934592 bytes (8.0 GiB))"
    )


def test_out_of_memory_error_maps_to_memory_error():
    with pytest.raises(MemoryError, match="^op: too big$"):
        qkv._qkv._throw("OutOfMemoryError", "op: too big")


def npy_bytes(header):
    header = header.ljust(118) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 16


@pytest.mark.parametrize(
    "shape, message",
    [
        # 2^40 floats in a 16-byte body
        ("(1099511627776,)", "shape [1099511627776] of float32 needs 4398046511104 data bytes, but 16 follow"),
        ("(4611686018427387904,)", "shape [4611686018427387904] has too many bytes (overflow)"),  # 2^64 bytes
        ("(4294967296, 4294967296)", "shape [4294967296, 4294967296] has too many elements (overflow)"),
    ],
)
def test_npy_header_claiming_a_huge_shape_is_a_format_error(tmp_path, shape, message):
    path = tmp_path / "huge.npy"
    path.write_bytes(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape))
    with pytest.raises(ValueError, match="huge.npy") as e:
        qkv.load(path)
    assert message in str(e.value)


@pytest.mark.parametrize("shape", [[1 << 40], [1 << 31, 1 << 31, 4], [1 << 62, 4]])
def test_safetensors_header_claiming_a_huge_shape_is_a_format_error(tmp_path, shape):
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with pytest.raises(ValueError, match="huge.safetensors"):
        qkv.load(path)


# ---- out of memory names the call everywhere (qkv/out_of_memory.h) ------------------------

BIG = np.ones((1, 1, 1 << 20, 1))  # float64: [2^20, 2^20] scores or weights are 8 TiB
BIG_SHAPES = "q [1, 1, 1048576, 1], k [1, 1, 1048576, 1], v [1, 1, 1048576, 1]"
BIG_WEIGHTS = ("output [1, 1, 1048576, 1048576] float64 needs 8796093022208 bytes (8192.0 GiB), more than the "
               "memory of this machine")


def test_reference_bad_alloc_names_the_call_and_shapes():
    # Before: "MemoryError: std::bad_alloc" (a std::vector the system refuses, not a qkv allocation).
    with pytest.raises(MemoryError) as e:
        qkv.attention_reference(BIG, BIG, BIG)
    assert str(e.value) == f"attention_reference ({BIG_SHAPES}): out of memory (std::bad_alloc)"


def test_sdpa_weights_over_the_memory_name_the_call_and_shapes():
    # The fused kernel (float64 too, since issue 14) stores no scores: only the weights asked
    # for are too big, and the error says so before any work (without them the call would
    # compute 2^40 scores for hours).
    with pytest.raises(MemoryError) as e:
        qkv.scaled_dot_product_attention(BIG, BIG, BIG, return_weights=True)
    assert str(e.value).startswith(f"scaled_dot_product_attention ({BIG_SHAPES}): {BIG_WEIGHTS}"), str(e.value)


def test_cli_attention_over_the_memory_names_the_call(run, tmp_path):
    q = tmp_path / "q.npy"
    np.save(q, BIG)
    r = run("attention", "--q", q, "--k", q, "--v", q, "-o", tmp_path / "out.npy", "--weights", tmp_path / "w.npy")
    assert r.returncode == 1, (r.returncode, r.stderr)  # was "qkv: internal error: std::bad_alloc"
    assert r.stderr.startswith(f"qkv: error: scaled_dot_product_attention ({BIG_SHAPES}): {BIG_WEIGHTS}"), r.stderr


def test_layer_forward_over_the_limit_names_the_layer_and_its_inputs():
    # Before: "Tensor::empty: output [1, 4096, 24] float32 needs ...", no layer, no inputs.
    r = run_python("""
        import numpy as np, qkv
        layer = qkv.nn.MultiheadAttention(8, 2, batch_first=True)
        x = np.ones((1, 4096, 8), np.float32)
        try:
            layer(x, x, x)
        except MemoryError as e:
            print("MemoryError:", e)
        """, {"QKV_MAX_ALLOC_BYTES": "64K"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "MemoryError: MultiheadAttention.forward (query [1, 4096, 8], key [1, 4096, 8], value [1, 4096, 8]): "
        "output [1, 4096, 24] float32 needs 393216 bytes, more than QKV_MAX_ALLOC_BYTES=65536")


def zip_bytes(members):
    """A zip archive of (name, method, data, claimed uncompressed size, crc32) members."""
    import struct
    body, central = b"", b""
    for name, method, data, size, crc in members:
        n = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(data), size,
                               len(n), 0, 0, 0, 0, 0, len(body)) + n
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), size, len(n), 0) + n + data
    return body + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central),
                                        len(body), 0)


def test_io_load_bad_alloc_names_the_call_and_file(tmp_path):
    # A .keras archive whose model.weights.h5 member claims 1 GiB (1 MiB of deflate data
    # follows, so the claim passes the 1032:1 check); with 512 MiB of address space left,
    # the std::vector it is inflated into is refused. Before: "MemoryError: std::bad_alloc".
    import zlib
    deflated = zlib.compress(np.random.default_rng(0).bytes(1 << 20), 1)[2:-4]  # raw deflate
    path = tmp_path / "claims_1gib.keras"
    path.write_bytes(zip_bytes([("config.json", 0, b"{}", 2, zlib.crc32(b"{}")),
                                ("model.weights.h5", 8, deflated, 1 << 30, 0)]))
    r = run_python(f"""
        import resource, qkv
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
        try:
            qkv.load({str(path)!r})
        except MemoryError as e:
            print("MemoryError:", e)
        """, {"QKV_MAX_ALLOC_BYTES": "1T"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"MemoryError: load_weights: '{path}': out of memory (std::bad_alloc)"
