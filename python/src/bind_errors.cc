// qkv errors -> the Python exceptions numpy/einops/torch raise in the same
// situation, message unchanged:
//   ShapeError, ValueError, FormatError -> ValueError    DTypeError -> TypeError
//   IndexError -> IndexError    IOError -> OSError    OutOfMemoryError -> MemoryError
//   other qkv::Error -> RuntimeError
//   std::bad_alloc -> MemoryError naming the operation (qkv/out_of_memory.h)
// (bind_io raises FileNotFoundError itself when the file is missing.)
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <exception>
#include <string>

#include "qkv/error.h"
#include "qkv/out_of_memory.h"
#include "qkv/size.h"

namespace nb = nanobind;

namespace {

// PyErr_SetString with the message decoded as os.fsdecode does: a file name that is
// not UTF-8 keeps its bytes as surrogate escapes (PyErr_SetString raised a
// UnicodeDecodeError that hid the message).
void set_error(PyObject* type, const char* message) {
  PyObject* text = PyUnicode_DecodeUTF8(message, static_cast<Py_ssize_t>(std::strlen(message)), "surrogateescape");
  if (text == nullptr) return;  // the decode's own error is set
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

void translate(const std::exception_ptr& error, void*) {
  // Whatever it was, the scope text an exception left is not for a later call's bad_alloc.
  struct Forget {
    ~Forget() { qkv::forget_unwound_scope(); }
  } forget;
  try {
    std::rethrow_exception(error);
  } catch (const qkv::ShapeError& e) {
    set_error(PyExc_ValueError, e.what());
  } catch (const qkv::ValueError& e) {
    set_error(PyExc_ValueError, e.what());
  } catch (const qkv::FormatError& e) {
    set_error(PyExc_ValueError, e.what());
  } catch (const qkv::DTypeError& e) {
    set_error(PyExc_TypeError, e.what());
  } catch (const qkv::IndexError& e) {
    set_error(PyExc_IndexError, e.what());
  } catch (const qkv::IOError& e) {
    set_error(PyExc_OSError, e.what());
  } catch (const qkv::OutOfMemoryError& e) {
    set_error(PyExc_MemoryError, e.what());
  } catch (const qkv::Interrupted& e) {
    // Ctrl-C stopped the work (python/src/interrupt.h): Python's own handler decides
    // (KeyboardInterrupt by default); if it returns, the call still did not finish.
    if (PyErr_CheckSignals() == 0) set_error(PyExc_KeyboardInterrupt, e.what());
  } catch (const qkv::Error& e) {
    set_error(PyExc_RuntimeError, e.what());
  } catch (const std::bad_alloc&) {  // a container's growth in an attention, nn or io call
    set_error(PyExc_MemoryError, qkv::bad_alloc_message("qkv").c_str());
  }
  // Anything else propagates to nanobind's own translators (std::exception, ...).
}

// Throws the qkv error named `kind`: lets the tests pin the table above.
void throw_error(const std::string& kind, const std::string& message) {
  if (kind == "ShapeError") throw qkv::ShapeError(message);
  if (kind == "ValueError") throw qkv::ValueError(message);
  if (kind == "FormatError") throw qkv::FormatError(message);
  if (kind == "DTypeError") throw qkv::DTypeError(message);
  if (kind == "IndexError") throw qkv::IndexError(message);
  if (kind == "IOError") throw qkv::IOError(message);
  if (kind == "OutOfMemoryError") throw qkv::OutOfMemoryError(message);
  if (kind == "Error") throw qkv::Error(message);
  throw std::invalid_argument("_throw: unknown kind " + kind);
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::register_exception_translator(translate);
  m.def("_throw", &throw_error, nb::arg("kind"), nb::arg("message"),
        "Test hook: throws the C++ qkv::<kind> error with `message`.");
  m.def("_max_alloc_bytes", &qkv::max_alloc_bytes,
        "The largest single allocation (QKV_MAX_ALLOC_BYTES, read once; default: physical memory).");
}
