"""`qkv convert` to every format qkv writes, read back by qkv; and the report of what real
TensorFlow, tf_keras and Keras 3 read from those files (tests/io/check_writers_with_tf.py,
run with /work/tfenv and /work/kerasenv; TF/Keras are not in this venv)."""
import json
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed001"
REPORT = json.loads((ROOT / "tests" / "fixtures" / "writers" / "tf_report.json").read_text())
TF = load_file(SEED / "variables.safetensors")
QUERY_KERNEL = TF["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"]


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
