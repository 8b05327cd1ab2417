"""Seed 001 in real Keras/TensorFlow: train the model, save it in every format qkv reads.

MultiHeadAttention(num_heads=2, key_dim=4) + Dense(1), Adam, binary cross-entropy
from logits, 10 epochs on the seed's toy token-tagging batch. Writes into OUT_DIR
(default tests/fixtures/seed001):

  ckpt.index, ckpt.data-00000-of-00001   tf.train.Checkpoint(model, optimizer).write
  model.weights.h5                       Keras 3 model.save_weights
  model.keras                            Keras 3 model.save (zip: config.json + model.weights.h5)
  model.h5                               legacy HDF5 model.save (model_weights/<layer>/<layer>/...:0)
  probe_inputs.npy   [5, 2, 3] float32   constant inputs 0.1, 1, 10, 100, 1000
  probe_outputs.npy  [5, 2, 1] float32   model(probe_inputs) computed by Keras
  toy_outputs.npy    [2, 2, 1] float32   model(toy inputs)
  variables.safetensors                  every checkpoint key's value as TF reads it
                                         (tf.train.load_checkpoint), for the reader tests
  variables.txt                          tf.train.list_variables(ckpt): the seed's listing

Run: /work/tfenv/bin/python tests/seed001/train_seed001.py [OUT_DIR]
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import tensorflow as tf
import keras
from safetensors.numpy import save_file

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "seed001")
os.makedirs(out, exist_ok=True)

keras.utils.set_random_seed(1)
x = np.array([[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [2, 2, 6]]], dtype=np.float32)  # [2, 2, 3]
y = np.array([[[1], [0]], [[0], [0]]], dtype=np.float32)                          # [2, 2, 1]

inputs = keras.Input(shape=(2, 3))
attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="multi_head_attention")(inputs, inputs)
outputs = keras.layers.Dense(1, name="dense")(attended)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(x, y, epochs=10, verbose=0)

prefix = os.path.join(out, "ckpt")
tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(prefix)
model.save_weights(os.path.join(out, "model.weights.h5"))
model.save(os.path.join(out, "model.keras"))
model.save(os.path.join(out, "model.h5"))  # legacy HDF5 (tf.keras 2.x layout)

probe = np.stack([np.full((2, 3), c, np.float32) for c in (0.1, 1.0, 10.0, 100.0, 1000.0)])
np.save(os.path.join(out, "probe_inputs.npy"), probe)
np.save(os.path.join(out, "probe_outputs.npy"), np.asarray(model.predict(probe, verbose=0), np.float32))
np.save(os.path.join(out, "toy_outputs.npy"), np.asarray(model.predict(x, verbose=0), np.float32))

reader = tf.train.load_checkpoint(prefix)
values = {}
with open(os.path.join(out, "variables.txt"), "w") as f:
    for name, shape in tf.train.list_variables(prefix):
        f.write(f"{name} {shape}\n")
        v = np.asarray(reader.get_tensor(name))
        if v.dtype != object and v.dtype.kind != "S":
            values[name] = np.array(v, copy=True)  # keeps 0-d scalars 0-d
save_file(values, os.path.join(out, "variables.safetensors"))
print(open(os.path.join(out, "variables.txt")).read())
print("probe outputs:", model.predict(probe, verbose=0)[:, 0, 0])
