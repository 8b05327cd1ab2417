"""The framework-made fixture files the layer tests read (tests/fixtures/*/*.safetensors, one
"options" JSON metadata key each) and the relative error they are judged by."""
import json

import numpy as np
from safetensors import safe_open


def load(path):
    """(tensors, options) of one fixture file."""
    with safe_open(str(path), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        options = json.loads(f.metadata()["options"])
    return tensors, options


def rel_err(got, want):
    """max |got - want| / max |want| (shapes must agree)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)
