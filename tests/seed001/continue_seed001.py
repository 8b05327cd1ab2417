"""Seed 001's training resumed from its saved model, optimizer state included (issue 15 item 3).

Loads tests/fixtures/seed001/model.keras (train_seed001.py: 10 epochs of Adam, saved with
model.save, which stores the optimizer's variables), checks that Keras restored its Adam state
(iterations = 10), trains 3 more epochs on the same toy batch and writes
OUT_DIR/continued.safetensors (default tests/fixtures/seed001_train):
  loss [3] float64                              Keras' per-epoch loss of epochs 11..13
  final/<variable>                              every trainable weight after them
Variable names as train_seed001_history.py's (query_kernel [3, 2, 4], ..., dense_bias [1]).
qkv resumes from the same file's weights and Adam slots (nn::keras_adam_state) and must match.
A rerun with the same TensorFlow and Keras writes the same bytes.
Run: KERAS_BACKEND=tensorflow .venv-fixtures/bin/python tests/seed001/continue_seed001.py
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import numpy as np
from safetensors.numpy import save_file

here = os.path.dirname(__file__)
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "seed001_train")
os.makedirs(out, exist_ok=True)
model = keras.saving.load_model(os.path.join(here, "..", "fixtures", "seed001", "model.keras"))
assert int(model.optimizer.iterations.numpy()) == 10, "the optimizer state was not restored"
x = np.array([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [2, 2, 6]]], dtype=np.float32)  # [2, 2, 3]
y = np.array([[[1], [0]], [[0], [0]]], dtype=np.float32)                          # [2, 2, 1]
history = model.fit(x, y, epochs=3, verbose=0)
mha, dense = model.get_layer("multi_head_attention"), model.get_layer("dense")
tensors = {"loss": np.asarray(history.history["loss"], np.float64)}
for part, layer in (("query", mha._query_dense), ("key", mha._key_dense), ("value", mha._value_dense),
                    ("attention_output", mha._output_dense), ("dense", dense)):
    tensors[f"final/{part}_kernel"] = np.asarray(layer.kernel.numpy(), np.float32)
    tensors[f"final/{part}_bias"] = np.asarray(layer.bias.numpy(), np.float32)
save_file(tensors, os.path.join(out, "continued.safetensors"))
print("losses:", history.history["loss"], "iterations:", int(model.optimizer.iterations.numpy()))
