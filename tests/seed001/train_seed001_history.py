"""Seed 001's training, step by step, for qkv to reproduce (issue 15 item 4).

The model, data, optimizer and loss of train_seed001.py (MultiHeadAttention(num_heads=2,
key_dim=4) + Dense(1), Adam(), BinaryCrossentropy(from_logits=True), 10 epochs of the toy
batch, one step per epoch) from keras.utils.set_random_seed(1), in Keras 3 on TensorFlow.
Writes OUT_DIR/history.safetensors (default tests/fixtures/seed001_train):
  x [2, 2, 3], y [2, 2, 1]                      the toy batch
  init/<variable>                               every trainable weight before training
  final/<variable>                              after the 10 epochs
  loss [10] float64                             Keras' per-epoch loss (History): the loss of
                                                the step's batch before its update
Variable names: query_kernel [3, 2, 4], query_bias [2, 4], key_*, value_*,
attention_output_kernel [2, 4, 3], attention_output_bias [3], dense_kernel [3, 1],
dense_bias [1]. A rerun with the same TensorFlow and Keras writes the same bytes.
Run: KERAS_BACKEND=tensorflow .venv-fixtures/bin/python tests/seed001/train_seed001_history.py
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "seed001_train")
os.makedirs(out, exist_ok=True)
keras.utils.set_random_seed(1)
x = np.array([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [2, 2, 6]]], dtype=np.float32)  # [2, 2, 3]
y = np.array([[[1], [0]], [[0], [0]]], dtype=np.float32)                          # [2, 2, 1]
inputs = keras.Input(shape=(2, 3))
mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="multi_head_attention")
dense = keras.layers.Dense(1, name="dense")
model = keras.Model(inputs, dense(mha(inputs, inputs)))
model.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(from_logits=True))


def weights():
    w = {}
    for part, layer in (("query", mha._query_dense), ("key", mha._key_dense), ("value", mha._value_dense),
                        ("attention_output", mha._output_dense), ("dense", dense)):
        w[f"{part}_kernel"] = np.asarray(layer.kernel.numpy(), np.float32)
        w[f"{part}_bias"] = np.asarray(layer.bias.numpy(), np.float32)
    return w


tensors = {"x": x, "y": y}
tensors.update({f"init/{k}": v for k, v in weights().items()})
history = model.fit(x, y, epochs=10, verbose=0)
tensors.update({f"final/{k}": v for k, v in weights().items()})
tensors["loss"] = np.asarray(history.history["loss"], np.float64)
save_file(tensors, os.path.join(out, "history.safetensors"))
print("losses:", history.history["loss"])
