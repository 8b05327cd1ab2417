#!/usr/bin/env python3
"""HDF5 weight files whose data lies outside the file, written by h5py, for the
reader's refusal to follow them (tests/python/test_py_io.py):

  outside_raw.weights.h5   a Keras 3 layout whose dataset layers/dense/vars/0 (int8 [16])
                           is stored in the external raw file 'outside_raw.bin' (relative:
                           libhdf5 resolves it from the working directory)
  outside_virtual.weights.h5  a Keras 3 layout whose dataset layers/dense/vars/0 (float32 [5])
                           is a virtual dataset mapping 'outside_target.h5':/secret
  outside_link.h5          a tf.keras 2.x layout (layer_names / weight_names) whose weight
                           dense/dense/kernel:0 is an external link to
                           'outside_target.h5':/secret

Run: .venv-fixtures/bin/python tests/io/make_h5_outside_fixtures.py  (pip install h5py numpy)
"""
import os
import sys

import h5py
import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures", "keras_tf")


def main():
    os.makedirs(out, exist_ok=True)
    with h5py.File(os.path.join(out, "outside_raw.weights.h5"), "w", track_order=False) as f:
        f.create_dataset("layers/dense/vars/0", shape=(16,), dtype="i1", external=[("outside_raw.bin", 0, 16)],
                         track_times=False)
    layout = h5py.VirtualLayout(shape=(5,), dtype="f4")
    layout[:] = h5py.VirtualSource("outside_target.h5", "secret", shape=(5,))
    with h5py.File(os.path.join(out, "outside_virtual.weights.h5"), "w", track_order=False) as f:
        f.create_virtual_dataset("layers/dense/vars/0", layout)
    with h5py.File(os.path.join(out, "outside_link.h5"), "w", track_order=False) as f:
        f.attrs["layer_names"] = np.array([b"dense"])
        g = f.create_group("dense")
        g.attrs["weight_names"] = np.array([b"dense/kernel:0"])
        g["dense/kernel:0"] = h5py.ExternalLink("outside_target.h5", "/secret")


if __name__ == "__main__":
    main()
