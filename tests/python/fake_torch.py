"""A stand-in for torch in the tests (torch is not in .venv; imported as `fake_torch`), and
DLPackOnly, a DLPack producer that is not a NumPy array (FakeTensor is one typed as torch).

qkv decides "torch in, torch out" by the module of the argument's type and makes torch
results with torch.from_dlpack; FakeTensor is a DLPack producer whose type lives in
module "torch" and whose data stay in a NumPy array, and `install` puts a module named
torch with from_dlpack / bfloat16 / Tensor into sys.modules (pytest's monkeypatch
restores it). Real torch parity comes from committed fixtures (tests/fixtures/torch_interop,
tests/fixtures/sdpa, made by torch itself).
"""
import sys
import types

import ml_dtypes
import numpy as np


class DLPackOnly:
    """A DLPack producer that is not a NumPy array and has no buffer protocol."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class FakeTensor(DLPackOnly):
    __module__ = "torch"

    def __getitem__(self, index):  # a view, as torch's indexing
        return FakeTensor(self.array[index])

    def view(self, dtype):
        return FakeTensor(self.array.view(dtype))


def install(monkeypatch):
    module = types.ModuleType("torch")
    module.Tensor = FakeTensor
    module.bfloat16 = ml_dtypes.bfloat16
    module.from_dlpack = lambda x: FakeTensor(np.from_dlpack(x))
    monkeypatch.setitem(sys.modules, "torch", module)
    return module
