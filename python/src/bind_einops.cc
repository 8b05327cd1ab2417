// einops for Python: qkv.rearrange / qkv.reduce / qkv.repeat with einops' signatures,
// qkv.EinopsError, and the private helpers python/qkv/einops.py builds the rest of
// einops' API on (pack, unpack, parse_shape, einsum).
//
// Pattern and shape errors raise qkv.EinopsError, a subclass of both ValueError (as
// every qkv error) and RuntimeError (einops.EinopsError's base), with einops' message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "qkv/einops.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_numpy;
using qkv::python::to_tensor;

namespace {

PyObject* g_einops_error = nullptr;  // qkv.EinopsError (lives as long as the module)

// Runs fn without the GIL; einops errors become qkv.EinopsError, numpy's mean of
// integers NotImplementedError (as einops).
template <class Fn>
auto call(Fn&& fn) {
  try {
    qkv::python::InterruptibleRelease release;
    return fn();
  } catch (const qkv::FormatError& e) {
    PyErr_SetString(g_einops_error, e.what());
  } catch (const qkv::ShapeError& e) {
    PyErr_SetString(g_einops_error, e.what());
  } catch (const qkv::DTypeError& e) {
    if (std::string(e.what()).find("reduce_mean") == std::string::npos) throw;
    PyErr_SetString(PyExc_NotImplementedError, e.what());
  }
  throw nb::python_error();
}

// einops stacks a list of tensors on a new first axis; anything else is one tensor.
std::vector<qkv::Tensor> inputs(nb::handle tensor, const char* op) {
  std::vector<qkv::Tensor> out;
  if (nb::isinstance<nb::list>(tensor)) {
    if (nb::len(tensor) == 0) throw nb::type_error("Rearrange/Reduce/Repeat can't be applied to an empty list");
    for (nb::handle t : tensor) out.push_back(to_tensor(t, (std::string(op) + ": tensor list element").c_str()));
  } else {
    out.push_back(to_tensor(tensor, (std::string(op) + ": tensor").c_str()));
  }
  return out;
}

qkv::einops::AxisLengths lengths_of(const nb::kwargs& kwargs, const std::string& op) {
  qkv::einops::AxisLengths lengths;
  for (auto [key, value] : kwargs) {  // ints and numpy integers; the recipe checks the values
    const std::string name = qkv::python::str_arg(key, op + ": axis name");
    const int64_t length = qkv::python::int_arg(value, op + ": axis length " + name, INT64_MIN, INT64_MAX);
    lengths.emplace_back(name, length);
  }
  return lengths;
}

// The array whose type the results take: the tensor, or a list's first element.
nb::handle first_array(nb::handle tensor) {
  if (!nb::isinstance<nb::list>(tensor) || nb::len(tensor) == 0) return tensor;
  return PyList_GetItem(tensor.ptr(), 0);  // borrowed: the list keeps it alive
}

nb::object transform(nb::handle tensor, nb::handle pattern_arg, const std::string& op, const std::string& reduction,
                     const nb::kwargs& kwargs) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, op + ": pattern");
  const std::vector<qkv::Tensor> xs = inputs(tensor, op.c_str());
  const qkv::einops::AxisLengths lengths = lengths_of(kwargs, op);
  const bool list = nb::isinstance<nb::list>(tensor);
  const qkv::Tensor r = call([&] {
    if (op == "rearrange")
      return list ? qkv::einops::rearrange(xs, pattern, lengths) : qkv::einops::rearrange(xs[0], pattern, lengths);
    if (op == "repeat")
      return list ? qkv::einops::repeat(xs, pattern, lengths) : qkv::einops::repeat(xs[0], pattern, lengths);
    return list ? qkv::einops::reduce(xs, pattern, reduction, lengths)
                : qkv::einops::reduce(xs[0], pattern, reduction, lengths);
  });
  nb::object out = qkv::python::to_array_like(r, first_array(tensor));
  if (qkv::python::is_torch(first_array(tensor))) return out;  // torch: writable expand() views, as einops
  for (size_t d = 0; d < r.shape().size(); ++d) {
    if (r.strides()[d] == 0 && r.shape()[d] > 1) {  // a broadcast (repeat) view: read-only, as np.broadcast_to
      out.attr("flags").attr("writeable") = false;
      break;
    }
  }
  return out;
}

// einops' reduce with a callable: qkv plans and permutes (views), f reduces the
// trailing axes of the NumPy view, NumPy reshapes the result.
nb::object reduce_with_callable(nb::handle tensor, nb::handle pattern_arg, nb::handle reduction,
                                const nb::kwargs& kwargs) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, "reduce: pattern");
  const std::vector<qkv::Tensor> xs = inputs(tensor, "reduce");
  const qkv::einops::AxisLengths lengths = lengths_of(kwargs, "reduce");
  const bool list = nb::isinstance<nb::list>(tensor);
  const std::string name = nb::cast<std::string>(nb::repr(reduction));
  const qkv::Tensor x = list ? call([&] { return qkv::einops::rearrange(xs, "... -> ...", {}); }) : xs[0];
  const qkv::einops::ReductionPlan plan =
      call([&] { return qkv::einops::reduction_plan(x.shape(), pattern, name, lengths, list); });
  const qkv::Tensor view = x.reshape(plan.init_shape).permute(plan.permutation);
  nb::object result = to_numpy(view);
  if (plan.n_kept < view.dim()) {
    nb::list axes;
    for (int64_t d = plan.n_kept; d < view.dim(); ++d) axes.append(d);
    result = reduction(result, nb::tuple(axes));
  }
  nb::list final_shape;
  for (int64_t d : plan.final_shape) final_shape.append(d);
  result = qkv::python::numpy().attr("reshape")(result, nb::tuple(final_shape));
  return qkv::python::numpy_like(result, first_array(tensor));
}

nb::tuple pack(nb::handle tensors, nb::handle pattern_arg) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, "pack: pattern");
  std::vector<qkv::Tensor> xs;
  nb::handle first = Py_None;  // the first tensor's array type (None: NumPy)
  bool have_first = false;
  for (nb::handle t : tensors) {
    if (!have_first) first = t, have_first = true;
    xs.push_back(to_tensor(t, "pack: tensor"));
  }
  const qkv::einops::Packed p = call([&] { return qkv::einops::pack(xs, pattern); });
  nb::list shapes;
  for (const qkv::Shape& s : p.packed_shapes) {
    nb::list dims;
    for (int64_t d : s) dims.append(d);
    shapes.append(nb::tuple(dims));
  }
  return nb::make_tuple(qkv::python::to_array_like(p.tensor, first), shapes);
}

nb::list unpack(nb::handle tensor, nb::handle packed_shapes, nb::handle pattern_arg) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, "unpack: pattern");
  const qkv::Tensor x = to_tensor(tensor, "unpack: tensor");
  std::vector<qkv::Shape> shapes;
  for (nb::handle s : packed_shapes) {
    qkv::Shape shape;
    for (nb::handle d : s) {
      shape.push_back(qkv::python::int_arg(d, "unpack: packed_shapes entry", INT64_MIN, INT64_MAX));
    }
    shapes.push_back(std::move(shape));
  }
  const std::vector<qkv::Tensor> parts = call([&] { return qkv::einops::unpack(x, shapes, pattern); });
  nb::list out;
  for (const qkv::Tensor& t : parts) out.append(qkv::python::to_array_like(t, tensor));
  return out;
}

// Only the shape is read, so any array with .shape works (also dtypes qkv lacks).
nb::dict parse_shape(nb::handle x, nb::handle pattern_arg) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, "parse_shape: pattern");
  qkv::Shape shape;
  nb::object s =
      nb::hasattr(x, "shape") ? nb::getattr(x, "shape") : nb::getattr(qkv::python::numpy().attr("asarray")(x), "shape");
  for (nb::handle d : s) shape.push_back(nb::cast<int64_t>(d));
  const qkv::einops::AxisLengths lengths = call([&] { return qkv::einops::parse_shape(shape, pattern); });
  nb::dict out;
  for (const auto& [name, length] : lengths) out[nb::str(name.c_str())] = length;
  return out;
}

nb::object einsum(nb::handle tensors, nb::handle pattern_arg) {
  const std::string pattern = qkv::python::str_arg(pattern_arg, "einops.einsum: pattern");
  std::vector<qkv::Tensor> xs;
  for (nb::handle t : tensors) xs.push_back(to_tensor(t, "einops.einsum: tensor"));
  return qkv::python::to_array_like(call([&] { return qkv::einops::einsum(xs, pattern); }), first_array(tensors));
}

}  // namespace

void bind_einops(nb::module_& m) {
  nb::object bases = nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_RuntimeError));
  g_einops_error = PyErr_NewExceptionWithDoc(
      "qkv.EinopsError", "An invalid einops pattern or one that does not fit the input (einops' EinopsError).",
      bases.ptr(), nullptr);
  m.attr("EinopsError") = nb::handle(g_einops_error);

  m.def(
      "rearrange",
      [](nb::handle tensor, nb::handle pattern, const nb::kwargs& kw) {
        return transform(tensor, pattern, "rearrange", "", kw);
      },
      nb::arg("tensor").none(), nb::arg("pattern").none(), nb::arg("axes_lengths"),
      nb::sig("def rearrange(tensor: numpy.typing.ArrayLike | list[numpy.typing.ArrayLike], pattern: str, "
              "**axes_lengths: int) -> numpy.ndarray"),
      "einops.rearrange: reorder, compose and decompose axes ('b t (h d) -> b h t d', h=8).\n"
      "A view of the input when one exists (as numpy), else one copy. A list is stacked on a new first axis.");
  m.def(
      "reduce",
      [](nb::handle tensor, nb::handle pattern, nb::handle reduction, const nb::kwargs& kw) {
        if (PyCallable_Check(reduction.ptr())) return reduce_with_callable(tensor, pattern, reduction, kw);
        return transform(tensor, pattern, "reduce", qkv::python::str_arg(reduction, "reduce: reduction"), kw);
      },
      nb::arg("tensor").none(), nb::arg("pattern").none(), nb::arg("reduction").none(), nb::arg("axes_lengths"),
      nb::sig("def reduce(tensor: numpy.typing.ArrayLike | list[numpy.typing.ArrayLike], pattern: str, "
              "reduction: str | typing.Callable[[numpy.ndarray, tuple[int, ...]], numpy.ndarray], "
              "**axes_lengths: int) -> numpy.ndarray"),
      "einops.reduce: rearrange and reduce the axes missing on the right with 'sum', 'mean', 'max', 'min',\n"
      "'prod', 'any' or 'all' ('b c (h 2) (w 2) -> b c h w', 'max'), numpy's result dtypes; or with a\n"
      "callable f(array, axes) -> array, as einops (e.g. a logsumexp), called on a NumPy view.");
  m.def(
      "repeat",
      [](nb::handle tensor, nb::handle pattern, const nb::kwargs& kw) {
        return transform(tensor, pattern, "repeat", "", kw);
      },
      nb::arg("tensor").none(), nb::arg("pattern").none(), nb::arg("axes_lengths"),
      nb::sig("def repeat(tensor: numpy.typing.ArrayLike | list[numpy.typing.ArrayLike], pattern: str, "
              "**axes_lengths: int) -> numpy.ndarray"),
      "einops.repeat: rearrange and add new axes ('h w -> h w c', c=3); a zero-stride view when no merge copies.");
  m.def("_einops_pack", &pack, nb::arg("tensors"), nb::arg("pattern").none(),
        "einops.pack: (packed array, list of packed shapes); see qkv.einops.pack.");
  m.def("_einops_unpack", &unpack, nb::arg("tensor"), nb::arg("packed_shapes").none(), nb::arg("pattern").none(),
        "einops.unpack: list of views of tensor; see qkv.einops.unpack.");
  m.def("_einops_parse_shape", &parse_shape, nb::arg("x"), nb::arg("pattern").none(),
        "einops.parse_shape: {axis name: length}; see qkv.einops.parse_shape.");
  m.def("_einops_einsum", &einsum, nb::arg("tensors"), nb::arg("pattern").none(),
        "einops.einsum with named axes; see qkv.einops.einsum.");
}
