"""A DLPack producer built with ctypes: by default one that says its memory is on a CUDA
device, for machines without a GPU (imported as `fake_cuda_dlpack` by test_cuda.py); with
`memory=` a host (kDLCPU) producer over real memory, for dtypes no Python producer in .venv
exports through DLPack (bfloat16: NumPy refuses ml_dtypes.bfloat16; test_py_interop.py).

FakeCudaArray builds the DLPack structs (dlpack.h, v1.0) with ctypes: device (kDLCUDA, id),
dtype, shape, strides in elements and byte_offset over memory that is mapped PROT_NONE, so
any read or write of it on the host is a segfault, never a silent success, or over the
memory of a NumPy array given as `memory` (FakeCudaArray.on_host(array) makes one over an
array's own elements). It records the keyword arguments __dlpack__ was called with and how
often the consumer called the capsule's deleter (what tells that qkv released the memory).
"""
import ctypes
import mmap

kDLCPU, kDLCUDA, kDLROCM = 1, 2, 10
_CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64), "int32": (0, 32),
          "uint8": (1, 8)}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", DELETER_VERSIONED), ("flags", ctypes.c_uint64),
                                     ("dl_tensor", DLTensor)]
READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# What each consumed-or-not capsule points into (its managed struct, shape and strides, and
# through the deleter the producer and its memory), by the struct's address, until the
# consumer calls the deleter: a capsule may outlive its producer (a failing test's frame
# holds a result over it when the garbage collector takes the producer), and a deleter
# called into freed ctypes memory crashed pytest instead of reporting the failure. Released
# entries are dropped at the next export, not inside the deleter call they hold; a capsule
# never consumed keeps its entry (the capsules have no destructor). Never freed itself, so
# that a tensor dying at interpreter exit still finds its deleter.
_LIVE, _RELEASED = {}, []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_LIVE))

_GUARD_BYTES = 1 << 20
_PROT_NONE = 0  # Linux (Python's mmap module does not export it)


def _guard_memory():
    """1 MiB of address space that faults on any access (mapped once, never unmapped)."""
    if _guard_memory.address is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        address = libc.mmap(None, _GUARD_BYTES, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap PROT_NONE failed")
        _guard_memory.address = address
    return _guard_memory.address


_guard_memory.address = None


class FakeCudaArray:
    """A CUDA DLPack producer over unreadable host memory.

    shape and strides (in elements; None: contiguous) describe the array; byte_offset is
    added to the data pointer; versioned=True answers max_version with a DLPack 1.0 capsule
    (read_only sets its flag); versioned=False refuses max_version (TypeError), as producers
    before DLPack 1.0 do. memory: a NumPy array whose buffer the data pointer points into
    (its element [0, ..., 0]; kept alive by the producer) instead of the unreadable pages.
    """

    def __init__(self, shape, dtype="float32", strides=None, byte_offset=0, device=(kDLCUDA, 0), versioned=True,
                 read_only=False, first_element=None, memory=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        itemsize = _CODES[dtype][1] // 8
        if strides is None:
            strides, running = [], 1
            for d in reversed(self.shape):
                strides.insert(0, running)
                running *= d
        self.strides = tuple(strides)
        # first_element: element index of [0, ..., 0] from the start of the memory (room for negative strides).
        self.memory = memory
        start = _guard_memory() if memory is None else memory.__array_interface__["data"][0]
        self.base = start + (first_element or 0) * itemsize
        self.byte_offset, self.versioned, self.read_only = byte_offset, versioned, read_only
        self.calls = []  # the kwargs of every __dlpack__ call
        self.deleted = 0  # deleter calls

    @property
    def data_ptr(self):
        """The address of element [0, ..., 0] (what torch's data_ptr() says)."""
        return self.base + self.byte_offset

    def __dlpack_device__(self):
        return self.device

    def _tensor(self):
        n = len(self.shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(n, 1))(*self.strides)
        code, bits = _CODES[self.dtype]
        t = DLTensor(self.base, DLDevice(*self.device), n, DLDataType(code, bits, 1), shape, strides, self.byte_offset)
        return t, (shape, strides)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        _RELEASED.clear()
        tensor, arrays = self._tensor()
        if max_version is not None and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if max_version is not None and max_version[0] >= 1:
            managed = DLManagedTensorVersioned(DLPackVersion(1, 0), None, DELETER_VERSIONED(self._delete), 0, tensor)
            managed.flags = READ_ONLY if self.read_only else 0
            name = b"dltensor_versioned"
        else:
            managed = DLManagedTensor(tensor, None, DELETER(self._delete))
            name = b"dltensor"
        _LIVE[ctypes.addressof(managed)] = (managed, arrays)
        return _capsule_new(ctypes.addressof(managed), name, None)

    def _delete(self, managed):
        self.deleted += 1
        _RELEASED.append(_LIVE.pop(ctypes.cast(managed, ctypes.c_void_p).value, None))

    @classmethod
    def on_host(cls, array, **kwargs):
        """A kDLCPU producer over `array`'s own elements (no copy) with its shape and strides,
        exported with DLPack's code for its dtype: kDLBfloat 16 for ml_dtypes.bfloat16, kDLFloat
        16 for float16, ... (keyword arguments: the constructor's)."""
        if any(s % array.itemsize for s in array.strides):
            raise ValueError("DLPack strides are in whole elements")
        strides = [s // array.itemsize for s in array.strides]
        return cls(array.shape, array.dtype.name, strides=strides, device=(kDLCPU, 0), memory=array, **kwargs)
