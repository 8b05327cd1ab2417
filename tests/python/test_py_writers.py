"""`qkv convert` to every format qkv writes, read back by qkv; and the proof that real
TensorFlow, tf_keras and Keras 3 load those files.

TF and Keras are not in this venv. tests/io/check_writers_with_tf.py (run by `make
fixtures` with TF, tf_keras and Keras 3) makes the files with the CLI, loads them into
TF/Keras models, checks the weights and outputs, and commits both the report and the
exact files it loaded (tests/fixtures/writers/files, sha256 in the report). Here the CLI
writes the same files again and they must be equal byte for byte to the committed ones:
what real TF/Keras loaded is what qkv writes today. A writer change fails this test
until the script has re-proved the new bytes with real TF/Keras. The writers are
deterministic (HDF5 without object times) except for one field: a .keras archive's
metadata.json carries date_saved (the time of writing, as Keras writes it), so .keras
files are compared member by member with that one value set aside.
"""
import hashlib
import io
import json
import pathlib
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed001"
WRITERS = ROOT / "tests" / "fixtures" / "writers"
REPORT = json.loads((WRITERS / "tf_report.json").read_text())
TF = load_file(SEED / "variables.safetensors")
QUERY_KERNEL = TF["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"]

# The commands check_writers_with_tf.py runs, with the files each writes.
WRITES = [
    (["convert", ROOT / "tests" / "fixtures" / "keras_tf" / "dtypes", "{out}/dtypes", "--to", "same"],
     ["dtypes.index", "dtypes.data-00000-of-00001"]),
    (["convert", SEED / "ckpt", "{out}/seed_ckpt", "--to", "keras"],
     ["seed_ckpt.index", "seed_ckpt.data-00000-of-00001"]),
    (["convert", SEED / "ckpt", "{out}/seed.h5", "--to", "keras"], ["seed.h5"]),
    (["convert", SEED / "ckpt", "{out}/seed.keras", "--to", "keras"], ["seed.keras"]),
    (["convert", SEED / "ckpt", "{out}/seed.weights.h5", "--to", "keras"], ["seed.weights.h5"]),
]


@pytest.mark.parametrize("args, files", WRITES, ids=lambda x: x[-1] if isinstance(x, list) and x else None)
def test_cli_writes_the_bytes_tf_and_keras_loaded(run, tmp_path, args, files):
    result = run(*[str(a).format(out=tmp_path) for a in args])
    assert result.returncode == 0, result.stderr
    hashes = REPORT["files loaded (sha256)"]
    for name in files:
        committed = (WRITERS / "files" / name).read_bytes()
        assert hashlib.sha256(committed).hexdigest() == hashes[name], f"{name}: not the file the report covers"
        assert comparable(name, (tmp_path / name).read_bytes()) == comparable(name, committed), (
            f"{name}: qkv now writes other bytes than those real TF/Keras loaded; rerun "
            "tests/io/check_writers_with_tf.py with TF and Keras (make fixtures) to re-prove them")


def comparable(name, data):
    """The file's bytes; for a .keras zip, its members (names, order, bytes) and the
    zip's layout, with metadata.json's date_saved set aside."""
    if not name.endswith(".keras"):
        return data
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = []
        for info in z.infolist():
            content = z.read(info)
            if info.filename == "metadata.json":
                meta = json.loads(content)
                assert "date_saved" in meta
                meta["date_saved"] = None
                content = json.dumps(meta, sort_keys=True).encode()
            members.append((info.filename, info.date_time, info.compress_type, info.external_attr, content))
    return members, len(data)


def test_report_covers_every_written_file():
    assert sorted(REPORT["files loaded (sha256)"]) == sorted(n for _, files in WRITES for n in files)
    assert sorted(p.name for p in (WRITERS / "files").iterdir()) == sorted(REPORT["files loaded (sha256)"])


@pytest.mark.parametrize("name, key", [
    ("out.weights.h5", "layers/multi_head_attention/query_dense/vars/0"),
    ("out.h5", "multi_head_attention/multi_head_attention/query/kernel:0"),
    ("out.keras", "layers/multi_head_attention/query_dense/vars/0"),
    ("out.index", "layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"),
])
def test_cli_convert_writes_each_keras_format(run, tmp_path, name, key):
    result = run("convert", SEED / "ckpt", tmp_path / name, "--to", "keras")
    assert result.returncode == 0, result.stderr
    got = qkv.load(tmp_path / name)
    assert len(got) == 10
    np.testing.assert_array_equal(got[key], QUERY_KERNEL)


def test_tensorflow_read_every_dtype_of_a_qkv_checkpoint():
    listing = REPORT["tf.train.load_checkpoint(dtypes)"]
    assert {k.split("/")[0] for k in listing} == {"f32", "f64", "f16", "bf16", "i8", "i32", "i64", "b", "scalar", "empty"}
    for key, entry in listing.items():
        assert entry["equal"] and entry["dtype"] == entry["tf_dtype"], key
    assert listing["empty/.ATTRIBUTES/VARIABLE_VALUE"]["shape"] == [0, 4]
    assert listing["scalar/.ATTRIBUTES/VARIABLE_VALUE"]["shape"] == []
    assert REPORT["tf.train.Checkpoint.read(dtypes)"] == {"restored_variables_equal_tf": True, "variables": 10}


@pytest.mark.parametrize("reader", [
    "tf_keras load_weights(TF checkpoint)", "tf_keras load_weights(.h5)",
    "keras3 load_model(.keras)", "keras3 load_weights(.weights.h5)"])
def test_keras_loaded_seed001_from_qkv_files(reader):
    r = REPORT[reader]
    assert r["weights_equal_tf"] and r["probe_outputs_close"]
    assert r.get("outputs_equal_original_model_keras", True)
