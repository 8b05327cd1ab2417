"""qkv: multi-head attention and Einstein-notation tensor operations, in C++.

Every function is a thin binding of the C++ library (the _qkv extension, one
implementation for C++ and Python). Arrays are NumPy arrays or any CPU DLPack
producer (torch tensors, ...), read in place; results are NumPy arrays over
qkv's memory. See docs/python.md.
"""

from ._qkv import *  # noqa: F401,F403  (every public binding; see python/src/module.cc)
from ._qkv import __version__  # noqa: F401
from . import nn  # noqa: E402,F401  (qkv.nn: the attention layers, python/qkv/nn.py)
