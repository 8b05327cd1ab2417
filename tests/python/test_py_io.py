"""qkv.load / qkv.save / qkv.inspect against numpy and the safetensors package."""
import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qkv
from oracles import data_ptr

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sdpa"
DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "bool"]


def sample(dtype, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_npy_bytes_equal_numpy_save(tmp_path, dtype):
    x = sample(dtype)
    np.save(tmp_path / "numpy.npy", x)
    qkv.save(tmp_path / "qkv.npy", x)
    assert (tmp_path / "qkv.npy").read_bytes() == (tmp_path / "numpy.npy").read_bytes()
    loaded = qkv.load(tmp_path / "numpy.npy")
    assert list(loaded) == ["numpy"]
    np.testing.assert_array_equal(loaded["numpy"], x)
    assert loaded["numpy"].dtype == x.dtype


def test_npy_reads_fortran_order_and_big_endian(tmp_path):
    x = np.asfortranarray(sample("float64", (3, 5)))
    np.save(tmp_path / "f.npy", x)
    np.save(tmp_path / "b.npy", sample("float32").astype(">f4"))
    np.testing.assert_array_equal(qkv.load(str(tmp_path / "f.npy"))["f"], x)
    np.testing.assert_array_equal(qkv.load(tmp_path / "b.npy")["b"], sample("float32"))


def test_safetensors_bytes_equal_the_reference_writer(tmp_path):
    arrays = {name: sample(dtype, (2, 3), i) for i, (name, dtype) in enumerate(
        [("w", "float32"), ("b", "float64"), ("h", "float16"), ("i", "int32"), ("m", "bool")])}
    save_file(arrays, str(tmp_path / "ref.safetensors"), metadata={"format": "np"})
    qkv.save(tmp_path / "qkv.safetensors", arrays, metadata={"format": "np"})
    assert (tmp_path / "qkv.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    loaded = qkv.load(tmp_path / "ref.safetensors")
    assert sorted(loaded) == sorted(arrays)
    for name, x in arrays.items():
        np.testing.assert_array_equal(loaded[name], x)
        assert loaded[name].dtype == x.dtype


@pytest.mark.parametrize("layout", ["F", "F-3d", "size-1", "empty"])
def test_npy_bytes_equal_numpy_save_for_fortran_arrays(tmp_path, layout):
    # np.save writes F- but not C-contiguous arrays with fortran_order True.
    x = {"F": lambda: np.asfortranarray(sample("float32", (3, 5))),
         "F-3d": lambda: sample("int64", (4, 3, 2)).T,
         "size-1": lambda: np.asfortranarray(sample("float64", (1, 5))),
         "empty": lambda: np.asfortranarray(np.zeros((0, 3)))}[layout]()
    np.save(tmp_path / "numpy.npy", x)
    qkv.save(tmp_path / "qkv.npy", x)
    assert (tmp_path / "qkv.npy").read_bytes() == (tmp_path / "numpy.npy").read_bytes()
    np.testing.assert_array_equal(np.load(tmp_path / "qkv.npy"), x)


QKV_NPY_DTYPES = {np.dtype(d) for d in ["float32", "float64", "float16", "int8", "int32", "int64", "bool", "V2"]}
# Every byte-order form of each code ('>V2' aside: numpy keeps a void's bytes as they are,
# qkv swaps them as big-endian bfloat16, docs/formats.md), and descrs numpy refuses.
DESCRS = [order + code for code in ["f4", "f8", "f2", "i1", "i4", "i8", "b1", "V2", "u1", "u2"]
          for order in ["", "=", "|", "<", ">"] if order + code != ">V2"]
DESCRS += ["f3", "f0", " f4", "f4 ", "<<f4", "x4", "=", "<", ""]


@pytest.mark.parametrize("descr", DESCRS)
def test_npy_descr_forms_load_as_numpy_loads_them(tmp_path, descr):
    # A bare 'f4' is '=f4' to numpy (native order); qkv refused it as no dtype string.
    header = "{'descr': %r, 'fortran_order': False, 'shape': (2, 3), }" % descr
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except TypeError:
        dtype = None
    values = np.arange(6).reshape(2, 3)
    data = bytes(24) if dtype is None else values.astype(
        ml_dtypes.bfloat16 if dtype.kind == "V" else dtype).tobytes()
    path = tmp_path / "x.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data)
    if dtype is None:
        with pytest.raises(ValueError):
            np.load(path)
        with pytest.raises((ValueError, TypeError), match="x.npy"):
            qkv.load(path)
        return
    expected = np.load(path)
    if dtype.newbyteorder("=") not in QKV_NPY_DTYPES:
        with pytest.raises(TypeError, match="is not one qkv holds"):
            qkv.load(path)
        return
    if dtype.kind == "V":
        expected = expected.view(ml_dtypes.bfloat16)
    want = expected.dtype.newbyteorder("=")
    loaded = qkv.load(path)["x"]
    assert loaded.dtype == want
    np.testing.assert_array_equal(loaded, expected.astype(want))
    assert qkv.inspect(path) == [("x", str(want), (2, 3))]


def test_object_arrays_are_refused_as_object_arrays(tmp_path):
    """np.save writes an object array as descr '|O' and a pickle; qkv refused it as "descr
    '|O' is not a numpy dtype string". numpy.load(allow_pickle=False) refuses it too (the
    oracle), and qkv now says what it is; qkv.inspect lists it as other dtypes qkv does not hold."""
    path = tmp_path / "o.npy"
    np.save(path, np.array([1, "a", None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Object arrays cannot be loaded when allow_pickle=False"):
        np.load(path, allow_pickle=False)
    with pytest.raises(TypeError, match=r"dtype '\|O' is an object array \(pickled Python objects\), which qkv "
                                        r"does not read \(as numpy.load\(allow_pickle=False\) refuses it\)"):
        qkv.load(path)
    assert qkv.inspect(path) == [("o", "|O", (3,))]


def test_metadata_extension_matches_in_any_case(tmp_path):
    arrays = {"w": sample("float32", (2, 3))}
    save_file(arrays, str(tmp_path / "ref.safetensors"), metadata={"format": "np"})
    qkv.save(tmp_path / "qkv.SafeTensors", arrays, metadata={"format": "np"})
    assert (tmp_path / "qkv.SafeTensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_file_names_that_are_not_utf8(tmp_path):
    # Linux names are bytes; Python hands undecodable ones over with surrogate escapes
    # (os.fsdecode). qkv raised RuntimeError 'std::bad_cast' for any such path, and its
    # errors naming the file came back as UnicodeDecodeError.
    import os
    path = os.fsdecode(bytes(tmp_path) + b"/w\xff.npy")
    x = sample("float32")
    np.save(path, x)
    loaded = qkv.load(path)
    assert list(loaded) == [os.fsdecode(b"w\xff")]
    np.testing.assert_array_equal(loaded[os.fsdecode(b"w\xff")], np.load(path))
    assert qkv.inspect(path) == [(os.fsdecode(b"w\xff"), "float32", (3, 4))]
    qkv.save(path, x)
    np.save(tmp_path / "numpy.npy", x)
    assert pathlib.Path(path).read_bytes() == (tmp_path / "numpy.npy").read_bytes()
    missing = os.fsdecode(bytes(tmp_path) + b"/missing\xfe.npy")
    with pytest.raises(FileNotFoundError) as info:
        qkv.load(missing)
    assert info.value.filename == missing and missing in str(info.value)
    bad = os.fsdecode(bytes(tmp_path) + b"/bad\xfd.safetensors")
    pathlib.Path(bad).write_bytes(b"xx")
    for fn in (qkv.load, qkv.inspect):
        with pytest.raises(ValueError) as info:
            fn(bad)
        assert not isinstance(info.value, UnicodeError) and bad in str(info.value)


def test_save_reads_views_and_dlpack_producers(tmp_path):
    x = sample("float32", (4, 6))
    qkv.save(tmp_path / "v.safetensors", {"t": x.T, "s": x[::2, 1:]})
    loaded = load_file(str(tmp_path / "v.safetensors"))
    np.testing.assert_array_equal(loaded["t"], x.T)
    np.testing.assert_array_equal(loaded["s"], x[::2, 1:])


def test_bfloat16_round_trips_through_ml_dtypes(tmp_path):
    x = sample("float32").astype(ml_dtypes.bfloat16)
    qkv.save(tmp_path / "bf.safetensors", {"x": x})
    y = qkv.load(tmp_path / "bf.safetensors")["x"]
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))
    assert qkv.inspect(tmp_path / "bf.safetensors") == [("x", "bfloat16", (3, 4))]


SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16, "I8": "i1",
                      "I32": "<i4", "I64": "<i8", "BOOL": "?"}


def read_safetensors_by_hand(path):
    """The format spelled out with json and np.frombuffer: an oracle that reads bfloat16 too."""
    data = pathlib.Path(path).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name != "__metadata__":
            begin, end = entry["data_offsets"]
            dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]])
            out[name] = np.frombuffer(data[base + begin:base + end], dtype=dtype).reshape(entry["shape"])
    return out, header


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.safetensors")), ids=lambda p: p.stem)
def test_load_matches_an_independent_reader_on_fixtures(path):
    ours = qkv.load(path)
    theirs, _ = read_safetensors_by_hand(path)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype
        assert ours[name].shape == theirs[name].shape
        assert ours[name].tobytes() == theirs[name].tobytes()


def test_loaded_arrays_are_views_into_one_file_buffer(tmp_path):
    """Zero-copy out of qkv: the arrays sit at the file's own data offsets."""
    a, b = np.arange(16, dtype=np.float32), np.arange(8, dtype=np.float32) + 100
    path = tmp_path / "two.safetensors"
    save_file({"a": a, "b": b}, str(path))
    _, header = read_safetensors_by_hand(path)
    loaded = qkv.load(path)
    offset = header["b"]["data_offsets"][0] - header["a"]["data_offsets"][0]
    assert data_ptr(loaded["b"]) - data_ptr(loaded["a"]) == offset
    np.testing.assert_array_equal(loaded["b"], b)


def test_inspect_lists_without_reading(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 2, 4), np.float32))
    assert qkv.inspect(tmp_path / "x.npy") == [("x", "float32", (3, 2, 4))]


class TestErrors:
    def test_missing_file_is_file_not_found_error(self, tmp_path):
        missing = tmp_path / "nope.npy"
        with pytest.raises(FileNotFoundError, match="nope.npy") as info:
            qkv.load(missing)
        assert info.value.filename == str(missing) and info.value.errno == 2
        with pytest.raises(FileNotFoundError):
            qkv.inspect(missing)

    def test_directory_is_os_error(self, tmp_path):
        (tmp_path / "d.npy").mkdir()
        with pytest.raises(OSError, match="not a regular file") as info:
            qkv.load(tmp_path / "d.npy")
        assert not isinstance(info.value, FileNotFoundError)

    def test_malformed_file_is_value_error_naming_it(self, tmp_path):
        (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
        with pytest.raises(ValueError, match="bad.npy"):
            qkv.load(tmp_path / "bad.npy")
        (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
        with pytest.raises(ValueError, match="bad.safetensors"):
            qkv.load(tmp_path / "bad.safetensors")

    @pytest.mark.parametrize("fmt,at", [("npy", "descr"), ("npy", "'<f"), ("npy", "fortran"),
                                        ("safetensors", '{"'), ("safetensors", '"x"'), ("safetensors", "F32")])
    def test_non_utf8_bytes_in_a_header_give_the_value_error(self, tmp_path, fmt, at):
        # A flipped high bit puts a byte >= 0x80 into the header: numpy / the safetensors
        # package reject the file, and qkv's message, which quotes the header, must stay
        # valid UTF-8 (it came back as a UnicodeDecodeError that hid the message).
        from safetensors.numpy import load as st_load
        path = tmp_path / f"x.{fmt}"
        x = np.arange(6, dtype=np.float32)
        np.save(path, x) if fmt == "npy" else save_file({"x": x}, str(path))
        data = bytearray(path.read_bytes())
        data[data.index(at.encode()) + 1] |= 0x80
        path.write_bytes(bytes(data))
        with pytest.raises(Exception):
            np.load(path) if fmt == "npy" else st_load(bytes(data))
        for fn in (qkv.load, qkv.inspect):
            with pytest.raises(ValueError) as info:
                fn(path)
            assert not isinstance(info.value, UnicodeError), info.value
            assert str(path) in str(info.value) and "\\x" in str(info.value)

    def test_hdf5_data_outside_the_file_is_not_read(self, tmp_path, monkeypatch):
        # h5py-written files (tests/io/make_h5_outside_fixtures.py) whose data lives in
        # other files of the working directory: qkv read them (any file on the machine,
        # through a hostile weight file); now it refuses and reads nothing.
        import shutil
        fixtures = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "keras_tf"
        for name in ("outside_raw.weights.h5", "outside_virtual.weights.h5", "outside_link.h5"):
            shutil.copy(fixtures / name, tmp_path / name)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "outside_raw.bin").write_bytes(bytes(range(16)))
        qkv.save(tmp_path / "outside_target.h5", {"secret": np.arange(5, dtype=np.float32)})
        with pytest.raises(ValueError, match="layers/dense/vars/0.*stored outside the file"):
            qkv.load("outside_raw.weights.h5")
        assert qkv.inspect("outside_raw.weights.h5") == [("layers/dense/vars/0", "int8", (16,))]
        with pytest.raises(ValueError, match="layers/dense/vars/0.*stored outside the file .a virtual dataset"):
            qkv.load("outside_virtual.weights.h5")
        for fn in (qkv.load, qkv.inspect):
            with pytest.raises(ValueError, match="dense/dense/kernel:0' is an external link to another file"):
                fn("outside_link.h5")

    def test_dtype_qkv_lacks_is_type_error(self, tmp_path):
        np.save(tmp_path / "u.npy", np.zeros(3, np.uint16))
        with pytest.raises(TypeError, match="u.npy"):
            qkv.load(tmp_path / "u.npy")
        with pytest.raises(TypeError, match="save: x: dtype uint16"):
            qkv.save(tmp_path / "u.safetensors", {"x": np.zeros(3, np.uint16)})

    def test_bad_save_arguments_are_value_errors(self, tmp_path):
        x = np.zeros(3)
        with pytest.raises(ValueError):
            qkv.save(tmp_path / "two.npy", {"a": x, "b": x})
        with pytest.raises(ValueError, match="metadata"):
            qkv.save(tmp_path / "m.npy", x, metadata={"k": "v"})
        with pytest.raises(ValueError, match="x.txt"):
            qkv.save(tmp_path / "x.txt", {"x": x})
        with pytest.raises(TypeError, match="names must be str"):
            qkv.save(tmp_path / "k.safetensors", {1: x})

    def test_unwritable_path_is_os_error(self, tmp_path):
        with pytest.raises(OSError):
            qkv.save(tmp_path / "no" / "such" / "dir.npy", np.zeros(3))


def _safetensors_with_dims(path, ndim):
    header = json.dumps({"x": {"dtype": "F32", "shape": [1] * ndim, "data_offsets": [0, 4]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.float32(7).tobytes())


def test_a_tensor_with_more_dims_than_numpy_takes_is_a_value_error(tmp_path):
    """NumPy 2 arrays have at most 64 dims. A 65-dim tensor came back as a 0-d array (shape ()),
    silently; qkv.inspect still lists it, as it reads no data."""
    path = tmp_path / "dims65.safetensors"
    _safetensors_with_dims(path, 65)
    assert qkv.inspect(path) == [("x", "float32", (1,) * 65)]
    with pytest.raises(ValueError, match=r"load: .*dims65.safetensors: tensor 'x' has 65 dims; a NumPy array has at most 64"):
        qkv.load(path)
    _safetensors_with_dims(path, 64)
    assert qkv.load(path)["x"].shape == (1,) * 64


def test_a_hostile_dim_count_does_not_abort_the_interpreter(tmp_path):
    """10,000 dims of 1 in a .safetensors header: nanobind's export aborted the process
    ('Critical nanobind error'); run in a child so that a regression fails this test only."""
    import subprocess
    import sys

    path = tmp_path / "dims10000.safetensors"
    _safetensors_with_dims(path, 10_000)
    code = (
        "import sys, qkv\n"
        "try:\n    qkv.load(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "tensor 'x' has 10000 dims" in result.stdout


def test_results_with_more_dims_than_numpy_takes_are_refused():
    x = np.arange(2.0).reshape((2,) + (1,) * 63)
    pattern = " ".join(f"a{i}" for i in range(64))
    assert qkv.rearrange(x, f"{pattern} -> {pattern}").shape == x.shape
    with pytest.raises(ValueError, match=r"to_numpy: a float64 result with 65 dims cannot become a NumPy array"):
        qkv.repeat(x, f"{pattern} -> {pattern} z", z=3)
