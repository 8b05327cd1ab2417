// Argument conversion with named errors (args.h).
#include "args.h"

#include <nanobind/stl/string.h>

#include <limits>
#include <string>

#include "qkv/error.h"

namespace qkv::python {

namespace {

// "str 'abc'": the type and a short repr of what was given.
std::string given(nb::handle value) {
  std::string repr = nb::cast<std::string>(nb::repr(value));
  if (repr.size() > 40) {  // cut at a character start, never inside a UTF-8 sequence
    size_t cut = 37;
    while (cut > 0 && (static_cast<unsigned char>(repr[cut]) & 0xC0) == 0x80) --cut;
    repr = repr.substr(0, cut) + "...";
  }
  return nb::cast<std::string>(nb::type_name(value.type())) + " " + repr;
}

[[noreturn]] void type_fault(const std::string& what, const char* expected, nb::handle value) {
  throw nb::type_error((what + " must be " + expected + ", got " + given(value)).c_str());
}

bool is_bool(nb::handle value) {
  if (PyBool_Check(value.ptr())) return true;
  // numpy.bool (NumPy 2) / numpy.bool_ (NumPy 1); nb::type_name gives the bare name "bool"
  const nb::handle type = value.type();
  if (!nb::hasattr(type, "__module__") || !nb::hasattr(type, "__name__")) return false;
  const std::string module = nb::cast<std::string>(nb::str(type.attr("__module__")));
  const std::string name = nb::cast<std::string>(nb::str(type.attr("__name__")));
  return module == "numpy" && (name == "bool" || name == "bool_");
}

}  // namespace

std::string arg_name(const char* op, const char* name) { return std::string(op) + ": " + name; }

double float_arg(nb::handle value, const std::string& what) {
  if (is_bool(value) || PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr())) {
    type_fault(what, "a float", value);
  }
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    type_fault(what, "a float", value);
  }
  return v;
}

std::optional<double> optional_float_arg(nb::handle value, const std::string& what) {
  if (value.is_none()) return std::nullopt;
  return float_arg(value, what);
}

bool bool_arg(nb::handle value, const std::string& what) {
  if (!is_bool(value)) type_fault(what, "a bool", value);
  return PyObject_IsTrue(value.ptr()) == 1;
}

namespace {

// value as a Python int (via __index__), or a TypeError naming `what`.
nb::object as_index(nb::handle value, const std::string& what, const char* expected) {
  if (is_bool(value)) type_fault(what, expected, value);
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    type_fault(what, expected, value);
  }
  return nb::steal(index);
}

}  // namespace

int64_t int_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi) {
  const nb::object index = as_index(value, what, "an int");
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) {
    fail<ValueError>(what, " must be an int in [", lo, ", ", hi, "], got ", nb::cast<std::string>(nb::repr(index)));
  }
  return v;
}

namespace {

uint64_t to_uint64(nb::handle value, const std::string& what, const char* expected) {
  const nb::object index = as_index(value, what, expected);
  const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {  // negative or >= 2**64
    PyErr_Clear();
    fail<ValueError>(what, " must be an int in [0, 2**64), got ", nb::cast<std::string>(nb::repr(index)));
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

uint64_t uint64_arg(nb::handle value, const std::string& what) { return to_uint64(value, what, "an int"); }

std::optional<uint64_t> seed_arg(nb::handle value, const std::string& what) {
  if (value.is_none()) return std::nullopt;
  return to_uint64(value, what, "None or an int");
}

std::optional<int64_t> optional_int_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi) {
  if (value.is_none()) return std::nullopt;
  return int_arg(value, what, lo, hi);
}

std::vector<int64_t> int_list_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi) {
  if (value.is_none()) return {};
  const bool sequence = PySequence_Check(value.ptr()) != 0;
  if (PyLong_Check(value.ptr()) || (PyIndex_Check(value.ptr()) && !sequence)) return {int_arg(value, what, lo, hi)};
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()) || !sequence) {
    type_fault(what, "None, an int or a sequence of ints", value);
  }
  std::vector<int64_t> out;
  for (nb::handle item : value) out.push_back(int_arg(item, what + " entry", lo, hi));
  return out;
}

std::string str_arg(nb::handle value, const std::string& what) {
  if (!PyUnicode_Check(value.ptr())) type_fault(what, "a str", value);
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (utf8 == nullptr) {  // a lone surrogate ('\udcff') has no UTF-8 form: nb::cast threw std::bad_cast
    PyErr_Clear();
    fail<ValueError>(what, " must be text that UTF-8 can encode (a lone surrogate cannot be), got ", given(value));
  }
  return std::string(utf8, static_cast<size_t>(size));
}

std::string path_arg(nb::handle value, const std::string& what) {
  PyObject* path = PyOS_FSPath(value.ptr());  // str, bytes, or __fspath__'s result
  if (path == nullptr) {
    PyErr_Clear();
    type_fault(what, "a str or os.PathLike", value);
  }
  const nb::object owned = nb::steal(path);
  if (!PyUnicode_Check(path)) type_fault(what, "a str or os.PathLike (not bytes)", value);
  // The file system's bytes, as os.fsencode gives them: a name that is not UTF-8 comes
  // with surrogate escapes ('x\udcff.npy'), which a UTF-8 cast refuses (std::bad_cast).
  const nb::object bytes = nb::steal(PyUnicode_EncodeFSDefault(path));
  if (!bytes.is_valid()) throw nb::python_error();
  return std::string(PyBytes_AS_STRING(bytes.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr())));
}

std::optional<std::map<std::string, std::string>> str_dict_arg(nb::handle value, const std::string& what) {
  if (value.is_none()) return std::nullopt;
  if (!PyDict_Check(value.ptr())) type_fault(what, "None or a dict of str to str", value);
  std::map<std::string, std::string> out;
  for (auto [key, item] : nb::borrow<nb::dict>(value)) {
    const std::string name = str_arg(key, what + " key");
    out.emplace(name, str_arg(item, what + "['" + name + "']"));
  }
  return out;
}

}  // namespace qkv::python
