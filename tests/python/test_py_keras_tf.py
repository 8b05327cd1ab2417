"""qkv.load / qkv.inspect and `qkv inspect` / `qkv convert` on the weight files Keras 3 and
TensorFlow wrote for seed 001 (tests/seed001/train_seed001.py), against the values
TensorFlow itself read from the checkpoint (variables.safetensors, written by numpy)."""
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv

SEED = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "seed001"
TF = load_file(SEED / "variables.safetensors")
KERAS3 = {  # Keras 3 .weights.h5 path -> the TF checkpoint key of the same variable
    "layers/multi_head_attention/query_dense/vars/0": "optimizer/_trainable_variables/0",
    "layers/multi_head_attention/output_dense/vars/0": "optimizer/_trainable_variables/6",
    "layers/dense/vars/1": "optimizer/_trainable_variables/9",
}
SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def test_load_reads_the_checkpoint_as_tensorflow_does():
    got = qkv.load(SEED / "ckpt")
    assert len(got) == len(TF)
    for key, value in TF.items():
        np.testing.assert_array_equal(got[key], value)


@pytest.mark.parametrize("name", ["model.weights.h5", "model.keras"])
def test_load_reads_keras3_files(name):
    got = qkv.load(SEED / name)
    for path, key in KERAS3.items():
        np.testing.assert_array_equal(got[path], TF[key + SUFFIX])


def test_inspect_lists_checkpoint_entries():
    listing = {name: (dtype, tuple(shape)) for name, dtype, shape in qkv.inspect(SEED / "ckpt.index")}
    assert listing["optimizer/_trainable_variables/0" + SUFFIX] == ("float32", (3, 2, 4))
    assert listing["_CHECKPOINTABLE_OBJECT_GRAPH"] == ("string", ())


def test_cli_inspect_names_variables_and_marks_optimizer_state(run):
    result = run("inspect", SEED / "ckpt")
    assert result.returncode == 0, result.stderr
    assert "33 variables, 22 of them optimizer state" in result.stdout
    line = next(l for l in result.stdout.splitlines() if l.startswith("optimizer/_variables/2/"))
    assert "adam/multi_head_attention_query_kernel_momentum" in line and "(optimizer)" in line


def test_cli_convert_checkpoint_to_keras3_weights(run, tmp_path):
    out = tmp_path / "converted.weights.h5"
    result = run("convert", SEED / "ckpt", out, "--to", "keras")
    assert result.returncode == 0, result.stderr
    got = qkv.load(out)
    assert len(got) == 10
    for path, key in KERAS3.items():
        np.testing.assert_array_equal(got[path], TF[key + SUFFIX])


def test_cli_convert_explains_why_seed_model_has_no_torch_layout(run, tmp_path):
    result = run("convert", SEED / "model.keras", tmp_path / "t.safetensors", "--to", "torch")
    assert result.returncode == 1
    assert "num_heads * key_dim = 2 * 4 != embed dim 3" in result.stderr
