"""Files qkv writes or converts go into the qkv.nn layers in one call: qkv.load(file) ->
KerasMultiHeadAttention.from_weights / MultiheadAttention.from_state_dict, for every format
`qkv convert` writes x every --to, from real Keras files (tests/fixtures/seed001: the Keras
3 model's outputs) and the Keras fixture mha_keras/self (Keras' float64 output); plus
`qkv convert`'s refusal to overwrite its input and the --force rule."""

import os
import pathlib
import shutil

import numpy as np
import pytest

import qkv
import qkv.nn

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
SEED = FIXTURES / "seed001"
SELF = FIXTURES / "mha_keras" / "self.safetensors"
TOL = 1e-5

OUTPUTS = {"weights.h5": "out.weights.h5", "h5": "out.h5", "keras": "out.keras", "ckpt": "out_ckpt",
           "safetensors": "out.safetensors"}
SOURCES = ["seed_weights_h5", "seed_h5", "seed_keras", "seed_ckpt", "keras_self", "torch_self"]
# What qkv says for the (source, --to, output) cells it refuses.
REFUSED_OUTPUT = {("same", "h5"): "needs layers", ("same", "keras"): "needs layers",
                  ("torch", "h5"): "PyTorch's layout is written to", ("torch", "keras"): "PyTorch's layout is written to",
                  ("torch", "ckpt"): "PyTorch's layout is written to"}


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)


@pytest.fixture(scope="module")
def sources(tmp_path_factory, qkv_cli):
    """name -> (path, --heads for a PyTorch layout or None)."""
    import subprocess

    tmp = tmp_path_factory.mktemp("sources")
    torch_self = tmp / "torch_self.safetensors"
    r = subprocess.run([qkv_cli, "convert", str(SELF), str(torch_self), "--to", "torch"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return {"seed_weights_h5": SEED / "model.weights.h5", "seed_h5": SEED / "model.h5",
            "seed_keras": SEED / "model.keras", "seed_ckpt": SEED / "ckpt", "keras_self": SELF,
            "torch_self": torch_self}


def refusal(source, to, fmt):
    """The message of a refused conversion, or None."""
    if (to, fmt) in REFUSED_OUTPUT:
        return REFUSED_OUTPUT[(to, fmt)]
    if to == "torch" and source.startswith("seed"):  # E = 3, 2 heads of 4: no PyTorch layout
        return "torch.nn.MultiheadAttention has no such layout"
    if to == "torch" and source == "torch_self":
        return "no layer weights found"
    if (source, to, fmt) == ("seed_h5", "same", "weights.h5"):  # model_weights/... keys make a tf.keras file
        return "is a tf.keras model .h5"
    return None


def layer_output(tensors, x):
    """The attention output of the one MHA layer in qkv.load's dict, as the layout asks."""
    if any(k.endswith("in_proj_weight") for k in tensors):
        mha = qkv.nn.MultiheadAttention.from_state_dict(tensors, 2, batch_first=True)
        return mha(x, x, x, need_weights=False)[0]
    return qkv.nn.KerasMultiHeadAttention.from_weights(tensors)(x, x)


def check_against_keras(source, tensors):
    """Outputs of the loaded layers against what Keras computed for the source."""
    if source.startswith("seed"):  # seed 001: dense(mha(x, x)), Keras' model outputs
        x = np.load(SEED / "probe_inputs.npy")
        model = {k: v for k, v in tensors.items() if "optimizer" not in k}
        kernel = [v for v in model.values() if v.shape == (3, 1)]
        bias = [v for v in model.values() if v.shape == (1,)]
        assert len(kernel) == 1 and len(bias) == 1, sorted(tensors)
        y = np.asarray(layer_output(tensors, x)) @ kernel[0] + bias[0]
        assert rel_err(y, np.load(SEED / "probe_outputs.npy")) <= TOL
    else:  # mha_keras/self: Keras' float64 self-attention output
        t = qkv.load(SELF)
        assert rel_err(layer_output(tensors, t["input.query"]), t["expected.output"]) <= TOL


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("to", ["keras", "torch", "same"])
@pytest.mark.parametrize("fmt", list(OUTPUTS))
def test_converted_files_load_into_layers(sources, run, tmp_path, source, to, fmt):
    out = tmp_path / OUTPUTS[fmt]
    args = ["convert", sources[source], out, "--to", to]
    if to == "keras" and source == "torch_self":
        args += ["--heads", "2"]
    if to == "keras" and fmt == "keras" and source in ("seed_weights_h5", "seed_h5"):
        args += ["--layer-order", "multi_head_attention,dense"]  # the file has no model order for config.json
    r = run(*args)
    why = refusal(source, to, fmt)
    if why is not None:
        assert r.returncode == 1 and why in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    check_against_keras(source, qkv.load(out))


def test_python_converts_as_the_cli_does(sources):
    # Keras -> PyTorch: the same tensors `qkv convert --to torch` wrote, giving Keras' output.
    t = qkv.load(SELF)
    sd = qkv.nn.keras_to_torch(t)
    cli = qkv.load(sources["torch_self"])
    assert sorted(sd) == sorted(cli)
    for k in cli:
        np.testing.assert_array_equal(sd[k], cli[k])
    q = t["input.query"]
    m = qkv.nn.MultiheadAttention.from_state_dict(sd, 2, batch_first=True)
    assert rel_err(m(q, q, q)[0], t["expected.output"]) <= TOL
    # And back: Keras variable paths that from_weights takes, giving the same output.
    keras = qkv.nn.torch_to_keras(sd, 2)
    assert sorted(keras) == sorted("mha/" + w for w in ("query/kernel", "query/bias", "key/kernel", "key/bias",
                                                        "value/kernel", "value/bias", "attention_output/kernel",
                                                        "attention_output/bias"))
    np.testing.assert_array_equal(keras["mha/query/kernel"], t["mha/query/kernel"])
    assert rel_err(qkv.nn.KerasMultiHeadAttention.from_weights(keras)(q, q), t["expected.output"]) <= TOL
    with pytest.raises(ValueError, match="embed dim 8 is not divisible by num_heads 3$"):
        qkv.nn.torch_to_keras(sd, 3)


def test_convert_adds_the_flag_that_fixes_a_library_error(sources, run, tmp_path):
    # The library's errors name weights and shapes (nn/convert.cc, nn/keras_layout.cc); the CLI
    # appends the option that fixes them.
    r = run("convert", sources["torch_self"], tmp_path / "a.weights.h5", "--to", "keras", "--heads", "3")
    assert r.returncode == 1 and "embed dim 8 is not divisible by num_heads 3 (--heads)" in r.stderr, r.stderr
    r = run("convert", SEED / "model.weights.h5", tmp_path / "b.keras", "--to", "keras",
            "--layer-order", "dense,multi_head_attention")
    assert r.returncode == 1, r.stderr
    assert "the layers are not in model order" in r.stderr and "give --layer-order or --config" in r.stderr, r.stderr


@pytest.mark.parametrize("source", ["seed_weights_h5", "seed_h5", "seed_keras", "keras_self", "torch_self"])
def test_files_load_into_layers_without_converting(sources, source):
    check_against_keras(source, qkv.load(sources[source]))


def test_layers_are_chosen_by_name_and_missing_ones_list_the_keys(sources):
    t = qkv.load(SEED / "model.weights.h5")
    two = dict(t, **{"layers/encoder/" + k[7:]: v for k, v in t.items() if k.startswith("layers/multi_head")})
    with pytest.raises(ValueError, match=r"2 MultiHeadAttention layers .*choose one by name \(layer=\)"):
        qkv.nn.KerasMultiHeadAttention.from_weights(two)
    a = qkv.nn.KerasMultiHeadAttention.from_weights(two, layer="encoder/multi_head_attention")
    x = np.load(SEED / "probe_inputs.npy")
    np.testing.assert_array_equal(a(x, x), qkv.nn.KerasMultiHeadAttention.from_weights(t)(x, x))
    # TF's own checkpoint of a Keras 3 model keys its layer variables optimizer/_trainable_variables/N:
    # no layer names to go by; the error lists the keys.
    with pytest.raises(ValueError, match=r"no MultiHeadAttention layer .*optimizer/_trainable_variables/0/"):
        qkv.nn.KerasMultiHeadAttention.from_weights(qkv.load(SEED / "ckpt"))
    sd = qkv.load(sources["torch_self"])
    both = dict(sd, **{"dec." + k: v for k, v in sd.items() if k.startswith("mha.")})
    with pytest.raises(ValueError, match=r"2 MultiheadAttention layers \(prefixes 'dec.mha.', 'mha.'\)"):
        qkv.nn.MultiheadAttention.from_state_dict(both, 2)
    m = qkv.nn.MultiheadAttention.from_state_dict(both, 2, prefix="dec.mha", batch_first=True)
    q = qkv.load(SELF)["input.query"]
    assert rel_err(m(q, q, q)[0], qkv.load(SELF)["expected.output"]) <= TOL
    with pytest.raises(ValueError, match=r"no <prefix>out_proj.weight\); the keys: dense.weight \[1, 3\]"):
        qkv.nn.MultiheadAttention.from_state_dict({"dense.weight": np.ones((1, 3), np.float32)}, 1)
    with pytest.raises(ValueError, match=r'no weight named "key/bias".*the layer has attention_output/bias'):
        qkv.nn.KerasMultiHeadAttention.from_weights({k: v for k, v in t.items() if "key_dense/vars/1" not in k})


def _same_files(a, b):
    return pathlib.Path(a).read_bytes() == pathlib.Path(b).read_bytes()


def test_convert_never_overwrites_its_input(run, tmp_path):
    for f in ("ckpt.index", "ckpt.data-00000-of-00001"):
        shutil.copy(SEED / f, tmp_path / f)
    ck = tmp_path / "ckpt"
    for out in (ck, tmp_path / "ckpt.index"):
        for force in ([], ["--force"]):
            r = run("convert", ck, out, "--to", "same", *force)
            assert r.returncode == 1 and "is the input" in r.stderr, r.stderr
    r = run("convert", tmp_path / "ckpt.index", ck, "--to", "keras", "--force")
    assert r.returncode == 1 and "is the input" in r.stderr
    assert _same_files(ck.with_suffix(".index"), SEED / "ckpt.index")
    src = tmp_path / "in.weights.h5"
    shutil.copy(SEED / "model.weights.h5", src)
    os.symlink(src, tmp_path / "link.weights.h5")
    os.link(src, tmp_path / "hard.weights.h5")
    for out in ("in.weights.h5", "link.weights.h5", "hard.weights.h5"):
        r = run("convert", src, tmp_path / out, "--to", "same", "--force")
        assert r.returncode == 1 and "is the input" in r.stderr, (out, r.stderr)
    assert _same_files(src, SEED / "model.weights.h5")


def test_convert_needs_force_to_overwrite_another_file(run, tmp_path):
    out = tmp_path / "out.safetensors"
    qkv.save(out, {"old": np.zeros(2, np.float32)})
    r = run("convert", SEED / "model.weights.h5", out, "--to", "keras")
    assert r.returncode == 1 and f"{out} exists; --force overwrites it" in r.stderr, r.stderr
    assert list(qkv.load(out)) == ["old"]
    r = run("convert", SEED / "model.weights.h5", out, "--to", "keras", "--force")
    assert r.returncode == 0, r.stderr
    assert "layers/multi_head_attention/query_dense/vars/0" in qkv.load(out)
    qkv.save(tmp_path / "ck.index", {"old": np.zeros(2, np.float32)})
    r = run("convert", SEED / "model.weights.h5", tmp_path / "ck", "--to", "keras")
    assert r.returncode == 1 and "ck.index exists; --force" in r.stderr, r.stderr


def test_convert_same_keeps_the_layer_names(run, tmp_path):
    """A copy of TF's checkpoint of a Keras 3 model still has its layers: --to keras after
    --to same finds them, as it does in the original."""
    copy = tmp_path / "copy"
    assert run("convert", SEED / "ckpt", copy, "--to", "same").returncode == 0
    names = {n for n, _, _ in qkv.inspect(copy)}
    assert "multi_head_attention/query/kernel" in names and "dense/kernel" in names
    assert any(n.startswith("optimizer/_variables/") for n in names)  # optimizer state kept
    r = run("convert", copy, tmp_path / "k.weights.h5", "--to", "keras")
    assert r.returncode == 0, r.stderr
    check_against_keras("seed_ckpt", qkv.load(tmp_path / "k.weights.h5"))
