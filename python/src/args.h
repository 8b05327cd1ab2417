// Python arguments -> C++ values, with qkv messages that name the argument.
//
// nanobind rejects a mistyped argument with "incompatible function arguments" and
// the list of signatures, not saying which argument is wrong nor why; these take
// the argument as an object and say it: "scaled_dot_product_attention: seed must be
// an int in [0, 2**64), got -1". Type faults raise TypeError, values out of range
// ValueError (qkv::ValueError), as Python's own functions do.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qkv::python {

namespace nb = nanobind;

// "op: name"; used as the prefix of the messages below.
std::string arg_name(const char* op, const char* name);

// A real number: float, int, or a NumPy/torch scalar (not bool, not str).
double float_arg(nb::handle value, const std::string& what);
// None -> nullopt, else float_arg.
std::optional<double> optional_float_arg(nb::handle value, const std::string& what);
// bool or numpy.bool_ (an int is refused, as it is usually a misplaced positional).
bool bool_arg(nb::handle value, const std::string& what);
// An int (or NumPy integer) in [lo, hi].
int64_t int_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi);
// An int in [0, 2**64) (a layer's seed).
uint64_t uint64_arg(nb::handle value, const std::string& what);
// A random seed: None -> nullopt, else an int in [0, 2**64).
std::optional<uint64_t> seed_arg(nb::handle value, const std::string& what);
// None -> nullopt, else an int in [lo, hi].
std::optional<int64_t> optional_int_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi);
// None -> {}, an int -> {it}, else a sequence of ints (not a str) -> them, each in [lo, hi].
std::vector<int64_t> int_list_arg(nb::handle value, const std::string& what, int64_t lo, int64_t hi);
// A str.
std::string str_arg(nb::handle value, const std::string& what);
// A str or os.PathLike (os.fspath) naming a file.
std::string path_arg(nb::handle value, const std::string& what);
// None -> nullopt, else a dict of str -> str.
std::optional<std::map<std::string, std::string>> str_dict_arg(nb::handle value, const std::string& what);

}  // namespace qkv::python
