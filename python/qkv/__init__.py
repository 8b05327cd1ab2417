"""qkv: multi-head attention and Einstein-notation tensor operations, in C++.

Every function is a thin binding of the C++ library (the _qkv extension, one
implementation for C++ and Python). Arrays are NumPy arrays or any CPU DLPack
producer (torch tensors, ...), read in place; results have the array type of the
first argument (torch in, torch out, else NumPy arrays over qkv's memory); Ctrl-C
raises KeyboardInterrupt. See docs/python.md.
"""

import importlib as _importlib

from ._qkv import *  # noqa: F401,F403  (every public binding; see python/src/module.cc)
from ._qkv import __version__  # noqa: F401
from .mods import AttentionMods  # noqa: F401  (mods= of scaled_dot_product_attention)
# qkv.nn (the layers, python/qkv/nn.py) and qkv.einops (einops' API) after a plain
# `import qkv`. Not `from . import nn`: the star import above already bound `nn` to the
# extension's submodule qkv._qkv.nn, and `from . import` takes an existing attribute
# without importing the submodule; import_module always loads python/qkv/nn.py.
nn = _importlib.import_module(".nn", __name__)
einops = _importlib.import_module(".einops", __name__)
attention = _importlib.import_module(".attention", __name__)  # the attention family: qkv.attention.window, ...
plot = _importlib.import_module(".plot", __name__)  # heatmaps (PNG)
dist = _importlib.import_module(".dist", __name__)  # ring / Ulysses / tensor-parallel attention over MPI
cuda = _importlib.import_module(".cuda", __name__)  # the CUDA backend's runtime (qkv.cuda.is_available(), ...)
