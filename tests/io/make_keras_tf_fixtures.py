"""Checkpoint and HDF5 files written by real TensorFlow / Keras for qkv's reader tests.

Writes into tests/fixtures/keras_tf/ (default; or argv[1]):

  dtypes.index/.data-*      tf.train.Checkpoint of variables of every qkv dtype, plus
                            uint8 and string ones (listed, not loaded); values in
                            dtypes_expected.safetensors (cast to float64 by numpy)
  many.index/.data-*        300 small variables: an index of several blocks with many
                            restart points; values in many_expected.safetensors
  sharded.index/.data-*     a checkpoint split into several shards (TF's max-shard-size
                            policy); values in sharded_expected.safetensors
  tfkeras2_ckpt.*           the seed-001 model built with tf.keras 2.x (tf_keras) and saved
                            by model.save_weights in TF format: keys such as
                            layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE
                            and .OPTIMIZER_SLOT slots
  tfkeras2_model.h5         the same model, tf.keras 2.x model.save (model_weights/<layer>/<layer>/
                            query/kernel:0, layer_names / weight_names attributes)
  tfkeras2_weights.h5       tf.keras 2.x model.save_weights to .h5 (no model_weights group)
  tfkeras2_expected.safetensors   the tf_keras model's weights by their variable names
  mha4.weights.h5, mha4_*.npy     a Keras 3 MHA whose PyTorch layout exists, its inputs and output
  fuzz seeds in fuzz/corpus/tf_checkpoint/ (index + shard packed, see fuzz/tf_checkpoint_fuzzer.cc),
  fuzz/corpus/keras_h5/ and fuzz/corpus/keras_zip/

Run: /work/tfenv/bin/python tests/io/make_keras_tf_fixtures.py
(pip install tensorflow-cpu tf_keras numpy h5py safetensors)
"""
import os
import struct
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import tensorflow as tf
from safetensors.numpy import save_file

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures", "keras_tf")
os.makedirs(out, exist_ok=True)


def formula(n):
    """Values the C++ tests can also recompute: (i % 23) - 11 scaled by 0.25."""
    return ((np.arange(n) % 23) - 11) * 0.25


def dtypes_checkpoint():
    shape = (2, 3)
    v = formula(6).reshape(shape)
    vars_ = {
        "f32": tf.Variable(v.astype(np.float32)),
        "f64": tf.Variable(v.astype(np.float64)),
        "f16": tf.Variable(v.astype(np.float16)),
        "bf16": tf.Variable(tf.cast(v, tf.bfloat16)),
        "i8": tf.Variable((v * 4).astype(np.int8)),
        "i32": tf.Variable((v * 4).astype(np.int32)),
        "i64": tf.Variable((v * 4).astype(np.int64) * 1000000000),
        "b": tf.Variable(v > 0),
        "u8": tf.Variable((v * 4 + 50).astype(np.uint8)),
        "s": tf.Variable(tf.constant(["alpha", "", "gamma"])),
        "scalar": tf.Variable(np.float32(3.5)),
        "empty": tf.Variable(np.zeros((0, 4), np.float32)),
    }
    ckpt = tf.train.Checkpoint(**vars_)
    prefix = os.path.join(out, "dtypes")
    ckpt.write(prefix)
    reader = tf.train.load_checkpoint(prefix)
    expected = {}
    for name, _ in tf.train.list_variables(prefix):
        value = np.asarray(reader.get_tensor(name))
        if value.dtype != object and value.dtype.kind != "S":
            expected[name] = value.astype(np.float64)
    save_file(expected, os.path.join(out, "dtypes_expected.safetensors"))
    return prefix


def many_checkpoint():
    vars_ = {f"v{i:03d}": tf.Variable(formula(i % 7 + 1).astype(np.float32) + i) for i in range(300)}
    prefix = os.path.join(out, "many")
    tf.train.Checkpoint(**vars_).write(prefix)
    reader = tf.train.load_checkpoint(prefix)
    expected = {n: np.asarray(reader.get_tensor(n)) for n, _ in tf.train.list_variables(prefix) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    save_file(expected, os.path.join(out, "many_expected.safetensors"))
    return prefix


def sharded_checkpoint():
    # TF's size policy: 512 bytes puts whole variables into two shards (a smaller
    # size splits variables into slices, which qkv does not read).
    vars_ = {f"w{i}": tf.Variable(formula(64).astype(np.float32).reshape(8, 8) * (i + 1)) for i in range(4)}
    prefix = os.path.join(out, "sharded")
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=512)
    tf.train.Checkpoint(**vars_).write(prefix, options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    reader = tf.train.load_checkpoint(prefix)
    expected = {n: np.asarray(reader.get_tensor(n)) for n, _ in tf.train.list_variables(prefix) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    save_file(expected, os.path.join(out, "sharded_expected.safetensors"))
    return prefix


def tfkeras2_files():
    import tf_keras
    tf_keras.utils.set_random_seed(1)
    x = np.array([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [2, 2, 6]]], dtype=np.float32)
    y = np.array([[[1], [0]], [[0], [0]]], dtype=np.float32)
    inputs = tf_keras.Input(shape=(2, 3))
    a = tf_keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="multi_head_attention")(inputs, inputs)
    outputs = tf_keras.layers.Dense(1, name="dense")(a)
    model = tf_keras.Model(inputs, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(), loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(x, y, epochs=10, verbose=0)
    model.save_weights(os.path.join(out, "tfkeras2_ckpt"))  # TF checkpoint format
    model.save(os.path.join(out, "tfkeras2_model.h5"))
    model.save_weights(os.path.join(out, "tfkeras2_weights.h5"))
    save_file({w.name: w.numpy() for w in model.weights}, os.path.join(out, "tfkeras2_expected.safetensors"))
    for name, shape in tf.train.list_variables(os.path.join(out, "tfkeras2_ckpt")):
        print(name, shape)


def torch_compatible_mha():
    """Keras 3 MHA with num_heads * key_dim == embed dim (PyTorch's layout exists):
    mha4.weights.h5, cross-attention inputs mha4_query.npy [2, 3, 4], mha4_value.npy
    [2, 5, 4] and Keras' output mha4_output.npy [2, 3, 4]."""
    import keras
    keras.utils.set_random_seed(4)
    q_in = keras.Input(shape=(3, 4))
    v_in = keras.Input(shape=(5, 4))
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2, name="multi_head_attention",
                                            bias_initializer="random_normal")
    model = keras.Model([q_in, v_in], layer(q_in, v_in))
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    v = rng.standard_normal((2, 5, 4)).astype(np.float32)
    model.save_weights(os.path.join(out, "mha4.weights.h5"))
    np.save(os.path.join(out, "mha4_query.npy"), q)
    np.save(os.path.join(out, "mha4_value.npy"), v)
    np.save(os.path.join(out, "mha4_output.npy"), np.asarray(model.predict([q, v], verbose=0), np.float32))


def fuzz_seeds(prefixes):
    """One seed per checkpoint: u32 index length, index bytes, then the shard bytes (one shard)."""
    corpus = os.path.join(root, "fuzz", "corpus", "tf_checkpoint")
    os.makedirs(corpus, exist_ok=True)
    for prefix in prefixes:
        index = open(prefix + ".index", "rb").read()
        shard = open(prefix + ".data-00000-of-00001", "rb").read()
        with open(os.path.join(corpus, os.path.basename(prefix)), "wb") as f:
            f.write(struct.pack("<I", len(index)) + index + shard)


def fuzz_seeds_h5_zip():
    """Small HDF5 files in both Keras layouts and two tiny .keras-like zips."""
    import shutil
    import zipfile
    import h5py
    h5dir = os.path.join(root, "fuzz", "corpus", "keras_h5")
    zipdir = os.path.join(root, "fuzz", "corpus", "keras_zip")
    os.makedirs(h5dir, exist_ok=True)
    os.makedirs(zipdir, exist_ok=True)
    shutil.copy(os.path.join(out, "tfkeras2_weights.h5"), os.path.join(h5dir, "tfkeras2_weights.h5"))
    with h5py.File(os.path.join(h5dir, "small_keras3.h5"), "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.arange(3, dtype=np.float32).reshape(3, 1))
        f.create_dataset("layers/dense/vars/1", data=np.zeros(1, np.float16))
        f.create_dataset("optimizer/vars/0", data=np.int64(3))
        f.create_dataset("b", data=np.array([True, False]))
    with h5py.File(os.path.join(h5dir, "small_legacy.h5"), "w") as f:
        f.attrs["layer_names"] = [b"dense"]
        g = f.create_group("dense")
        g.attrs["weight_names"] = [b"dense/kernel:0"]
        g.create_dataset("dense/kernel:0", data=np.ones((2, 2), np.float64))
    for name, method in (("stored.keras", zipfile.ZIP_STORED), ("deflated.keras", zipfile.ZIP_DEFLATED)):
        with zipfile.ZipFile(os.path.join(zipdir, name), "w", compression=method) as z:
            z.writestr("config.json", '{"class_name": "Functional", "config": {"layers": []}}')
            z.writestr("metadata.json", '{"keras_version": "3.15.1"}')
            z.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n" + bytes(range(64)) * 4)


p1 = dtypes_checkpoint()
p2 = many_checkpoint()
sharded_checkpoint()
tfkeras2_files()
torch_compatible_mha()
fuzz_seeds([p1, p2, os.path.join(out, "tfkeras2_ckpt")])
fuzz_seeds_h5_zip()
if os.path.exists(os.path.join(out, "checkpoint")):
    os.remove(os.path.join(out, "checkpoint"))  # TF's text file naming the latest checkpoint
for f in sorted(os.listdir(out)):
    print(f, os.path.getsize(os.path.join(out, f)))
