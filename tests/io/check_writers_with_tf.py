"""Real TensorFlow, tf_keras 2.x and Keras 3 read the files qkv's writers make.

The built `qkv` CLI writes, from files TF/Keras made (tests/fixtures):
  dtypes ckpt      `qkv convert keras_tf/dtypes OUT --to same` (every qkv dtype, a scalar,
                   an empty tensor): tf.train.list_variables / load_checkpoint must give
                   TF's own dtypes, shapes and values of the original checkpoint
  seed001 ckpt     `qkv convert seed001/ckpt OUT/seed_ckpt --to keras` (tf.keras
                   save_weights(prefix) layout + object graph): tf_keras model.load_weights
                   restores it by object path (assert_existing_objects_matched)
  seed001 .h5      `... OUT/seed.h5 --to keras` (tf.keras 2.x save_weights layout):
                   tf_keras model.load_weights
  seed001 .keras   `... OUT/seed.keras --to keras`: Keras 3 keras.saving.load_model
  seed001 .weights.h5  Keras 3 model.load_weights
Each model's weights must equal TF's checkpoint values exactly and its outputs on the
five probe inputs (0.1, 1, 10, 100, 1000) are compared with Keras' probe_outputs.npy.

Run (the Keras 3 part re-runs this script under $KERAS3_PYTHON, default this interpreter, with
KERAS_BACKEND=jax; `make fixtures` runs it in .venv-fixtures):
  KERAS3_PYTHON=/work/kerasenv/bin/python /work/tfenv/bin/python tests/io/check_writers_with_tf.py \
      [build/release/bin/qkv] [--update]
--update rewrites tests/fixtures/writers/tf_report.json and copies the very files TF and
Keras loaded to tests/fixtures/writers/files/ (their sha256 are in the report). Without TF
in the test venv, tests/python/test_py_writers.py re-proves the claim on every run: the
CLI must write those files byte for byte again, so any change to a writer fails the test
until this script has rerun real TF/Keras on the new bytes (`make fixtures`).
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
SEED = FIX / "seed001"
REPORT = FIX / "writers" / "tf_report.json"
FILES = FIX / "writers" / "files"
# What the CLI writes below (see the module docstring), all loaded by TF or Keras.
WRITTEN = ["dtypes.index", "dtypes.data-00000-of-00001", "seed_ckpt.index", "seed_ckpt.data-00000-of-00001",
           "seed.h5", "seed.keras", "seed.weights.h5"]
# The interpreter with Keras 3 + JAX (make fixtures: the same .venv-fixtures).
KERAS3_PYTHON = os.environ.get("KERAS3_PYTHON", sys.executable)


def qkv(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"qkv {' '.join(map(str, args))} failed: {r.stderr}")


def tf_values():
    from safetensors.numpy import load_file
    v = load_file(SEED / "variables.safetensors")
    k = "optimizer/_trainable_variables/{}/.ATTRIBUTES/VARIABLE_VALUE"
    return [v[k.format(i)] for i in range(10)]  # Keras' weight order: MHA q,k,v,o kernels/biases, Dense


def model_report(weights, outputs):
    want = tf_values()
    probe_want = np.load(SEED / "probe_outputs.npy")
    return {
        "weights_equal_tf": len(weights) == len(want) and all(
            w.shape == t.shape and np.array_equal(w, t) for w, t in zip(weights, want)),
        "probe_outputs_max_abs_diff": float(np.max(np.abs(outputs - probe_want))),
        "probe_outputs_close": bool(np.allclose(outputs, probe_want, rtol=1e-5, atol=1e-5)),
    }


def check_dtypes(cli, out):
    import tensorflow as tf
    src = FIX / "keras_tf" / "dtypes"
    dst = out / "dtypes"
    qkv(cli, "convert", src, dst, "--to", "same")
    theirs, ours = tf.train.load_checkpoint(str(src)), tf.train.load_checkpoint(str(dst))
    report = {}
    for name, shape in tf.train.list_variables(str(dst)):
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue  # ours, not TF's: checked by restoring through it below
        mine = ours.get_tensor(name)
        orig = theirs.get_tensor(name)
        report[name] = {
            "dtype": ours.get_variable_to_dtype_map()[name].name,
            "tf_dtype": theirs.get_variable_to_dtype_map()[name].name,
            "shape": list(shape),
            "equal": bool(np.asarray(mine).shape == np.asarray(orig).shape and np.array_equal(mine, orig)),
        }
    # tf.train.Checkpoint restores fresh variables by object path through our graph.
    fresh = {n.split("/")[0]: tf.Variable(tf.zeros(ours.get_variable_to_shape_map()[n],
                                                   ours.get_variable_to_dtype_map()[n]))
             for n in report}
    status = tf.train.Checkpoint(**fresh).read(str(dst))
    status.assert_existing_objects_matched()
    restored = all(np.array_equal(fresh[n.split("/")[0]].numpy(), theirs.get_tensor(n)) for n in report)
    return report, {"restored_variables_equal_tf": restored, "variables": len(fresh)}


def tf_keras_model():
    import tf_keras
    inputs = tf_keras.Input(shape=(2, 3))
    a = tf_keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="multi_head_attention")(inputs, inputs)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(1, name="dense")(a))


def check_tf_keras(cli, out):
    probe = np.load(SEED / "probe_inputs.npy")
    report = {}
    qkv(cli, "convert", SEED / "ckpt", out / "seed_ckpt", "--to", "keras")
    model = tf_keras_model()
    status = model.load_weights(str(out / "seed_ckpt"))
    status.assert_existing_objects_matched()
    r = model_report([w.numpy() for w in model.weights], model.predict(probe, verbose=0))
    r["restored_by_object_graph"] = True  # assert_existing_objects_matched passed
    report["tf_keras load_weights(TF checkpoint)"] = r

    import tensorflow as tf
    listing = dict(tf.train.list_variables(str(out / "seed_ckpt")))
    report["tf.train.list_variables(TF checkpoint)"] = {k: list(v) for k, v in sorted(listing.items())}

    qkv(cli, "convert", SEED / "ckpt", out / "seed.h5", "--to", "keras")
    model = tf_keras_model()
    model.load_weights(str(out / "seed.h5"))
    report["tf_keras load_weights(.h5)"] = model_report([w.numpy() for w in model.weights],
                                                        model.predict(probe, verbose=0))
    return report


def check_keras3(out):
    """Runs under KERAS3_PYTHON: Keras 3 reads the .keras and .weights.h5 files in `out`."""
    import keras
    probe = np.load(SEED / "probe_inputs.npy")
    # probe_outputs.npy came from Keras on TF; on JAX the same weights differ in the last
    # bits, so each file is also compared with Keras' own model.keras on this backend.
    original = np.asarray(keras.saving.load_model(SEED / "model.keras").predict(probe, verbose=0))
    report = {}
    model = keras.saving.load_model(out / "seed.keras")
    outputs = np.asarray(model.predict(probe, verbose=0))
    report["keras3 load_model(.keras)"] = model_report([np.asarray(w) for w in model.weights], outputs)
    report["keras3 load_model(.keras)"]["outputs_equal_original_model_keras"] = bool(np.array_equal(outputs, original))
    inputs = keras.Input(shape=(2, 3))
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="multi_head_attention")(inputs, inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="dense")(a))
    model.load_weights(out / "seed.weights.h5")
    outputs = np.asarray(model.predict(probe, verbose=0))
    report["keras3 load_weights(.weights.h5)"] = model_report([np.asarray(w) for w in model.weights], outputs)
    report["keras3 load_weights(.weights.h5)"]["outputs_equal_original_model_keras"] = bool(
        np.array_equal(outputs, original))
    return report


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--keras3":
        print(json.dumps(check_keras3(pathlib.Path(sys.argv[2]))))
        return
    args = [a for a in sys.argv[1:] if a != "--update"]
    cli = args[0] if args else str(ROOT / "build" / "writers" / "bin" / "qkv")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        listing, restore = check_dtypes(cli, out)
        report = {"tf.train.load_checkpoint(dtypes)": listing, "tf.train.Checkpoint.read(dtypes)": restore}
        report.update(check_tf_keras(cli, out))
        qkv(cli, "convert", SEED / "ckpt", out / "seed.keras", "--to", "keras")
        qkv(cli, "convert", SEED / "ckpt", out / "seed.weights.h5", "--to", "keras")
        env = dict(os.environ, KERAS_BACKEND="jax")
        r = subprocess.run([KERAS3_PYTHON, __file__, "--keras3", str(out)], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError("Keras 3 check failed:\n" + r.stderr[-4000:])
        report.update(json.loads(r.stdout.strip().splitlines()[-1]))
        report["files loaded (sha256)"] = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in WRITTEN}
        if "--update" in sys.argv:
            FILES.mkdir(parents=True, exist_ok=True)
            for n in WRITTEN:
                shutil.copyfile(out / n, FILES / n)
    for k, v in report.items():
        if isinstance(v, dict) and "probe_outputs_max_abs_diff" in v:
            v["probe_outputs_max_abs_diff"] = float(f"{v['probe_outputs_max_abs_diff']:.1e}")
    text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    print(text)
    ok = all(v.get("weights_equal_tf", True) and v.get("probe_outputs_close", True) and
             v.get("outputs_equal_original_model_keras", True) and v.get("restored_variables_equal_tf", True)
             for k, v in report.items() if isinstance(v, dict) and k != "files loaded (sha256)") and all(
        e["equal"] and e["dtype"] == e["tf_dtype"] for e in report["tf.train.load_checkpoint(dtypes)"].values())
    print("ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED")
    if "--update" in sys.argv:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
