// qkv.einsum and qkv.einsum_path, with numpy's signatures (subscripts string or the
// interleaved operand/sublist form; optimize as numpy and opt_einsum take it).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "qkv/einsum.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_tensor;

namespace {

struct Call {
  std::string subscripts;
  std::vector<qkv::Tensor> operands;
  qkv::EinsumOptions options;
};

// numpy's sublist labels: 0-25 -> 'A'-'Z', 26-51 -> 'a'-'z', Ellipsis -> '...'.
std::string sublist_term(nb::handle sublist) {
  std::string term;
  for (nb::handle item : sublist) {
    if (item.is(nb::ellipsis())) {
      term += "...";
      continue;
    }
    const int64_t v = qkv::python::int_arg(item, "einsum: a subscript in a sublist", 0, 51);
    term += static_cast<char>(v < 26 ? 'A' + v : 'a' + (v - 26));
  }
  return term;
}

// optimize: False/True, a name, ('name', memory_limit), or ['einsum_path', (0, 1), ...].
void parse_optimize(nb::handle optimize, qkv::EinsumOptions& o) {
  if (optimize.is_none()) {  // numpy reads None as False
    o.optimize = qkv::EinsumOptimize::none;
  } else if (nb::isinstance<nb::bool_>(optimize)) {
    o.optimize = nb::cast<bool>(optimize) ? qkv::EinsumOptimize::auto_ : qkv::EinsumOptimize::none;
  } else if (nb::isinstance<nb::str>(optimize)) {
    o.optimize = qkv::einsum_optimize_from_name(qkv::python::str_arg(optimize, "einsum: optimize"));
  } else if (nb::isinstance<nb::tuple>(optimize) && nb::len(optimize) == 2 && nb::isinstance<nb::str>(optimize[0])) {
    o.optimize = qkv::einsum_optimize_from_name(qkv::python::str_arg(optimize[0], "einsum: optimize"));
    const double limit = qkv::python::float_arg(optimize[1], "einsum: optimize's memory_limit");
    if (std::isnan(limit)) throw nb::value_error("einsum: optimize's memory_limit is nan");
    // Beyond int64 (1e30, inf) the limit limits nothing; casting it would be undefined
    // (it came out negative: no pairwise step fitted).
    o.memory_limit = static_cast<int64_t>(std::clamp(limit, -9.2e18, 9.2e18));
  } else if (nb::isinstance<nb::list>(optimize) || nb::isinstance<nb::tuple>(optimize)) {
    std::vector<std::vector<int>> path;
    for (nb::handle step : optimize) {
      if (nb::isinstance<nb::str>(step)) continue;  // the leading 'einsum_path'
      std::vector<int> ids;
      for (nb::handle id : step) {
        ids.push_back(static_cast<int>(qkv::python::int_arg(id, "einsum: optimize path entry", 0, 1 << 20)));
      }
      path.push_back(std::move(ids));
    }
    o.path = std::move(path);
  } else {
    throw nb::type_error("einsum: optimize must be a bool, a name, (name, memory_limit) or an explicit path");
  }
}

Call parse_call(const nb::args& args, nb::handle optimize) {
  Call c;
  if (args.size() == 0) throw nb::value_error("einsum: no subscripts and no operands given");
  if (nb::isinstance<nb::str>(args[0])) {
    c.subscripts = qkv::python::str_arg(args[0], "einsum: subscripts");
    for (size_t i = 1; i < args.size(); ++i) {
      c.operands.push_back(to_tensor(args[i], ("einsum: operand " + std::to_string(i - 1)).c_str()));
    }
  } else {  // einsum(a, [0, 1], b, [1, 2], [0, 2])
    const size_t n = args.size();
    std::string lhs;
    for (size_t i = 0; i + 1 < n; i += 2) {
      c.operands.push_back(to_tensor(args[i], ("einsum: operand " + std::to_string(i / 2)).c_str()));
      lhs += (i ? "," : "") + sublist_term(args[i + 1]);
    }
    c.subscripts = n % 2 == 1 ? lhs + "->" + sublist_term(args[n - 1]) : lhs;
  }
  parse_optimize(optimize, c.options);
  return c;
}

nb::object einsum_py(nb::args args, nb::handle optimize) {
  const Call c = parse_call(args, optimize);
  qkv::Tensor out;
  {
    qkv::python::InterruptibleRelease release;
    out = qkv::einsum(c.subscripts, c.operands, c.options);
  }
  // The first operand sets the array type (torch in, torch out).
  const size_t first = nb::isinstance<nb::str>(args[0]) ? 1 : 0;
  const nb::handle like = first < args.size() ? nb::handle(PyTuple_GET_ITEM(args.ptr(), first)) : nb::handle(Py_None);
  return qkv::python::to_array_like(out, like);
}

nb::object einsum_path_py(nb::args args, nb::handle optimize) {
  const Call c = parse_call(args, optimize);
  const qkv::EinsumPath p = qkv::einsum_path(c.subscripts, c.operands, c.options);
  nb::list path;
  path.append(nb::str("einsum_path"));
  for (const auto& step : p.path) {
    nb::list ids;
    for (int id : step) ids.append(id);
    path.append(nb::tuple(ids));
  }
  return nb::make_tuple(path, nb::str(p.report.c_str()));
}

}  // namespace

void bind_einsum(nb::module_& m) {
  m.def("einsum", &einsum_py, nb::arg("operands"), nb::arg("optimize").none() = false,
        nb::sig("def einsum(subscripts: str | typing.Any, /, *operands: typing.Any, "
                "optimize: bool | str | tuple | list | None = False) -> numpy.ndarray"),
        "numpy.einsum(subscripts, *operands, optimize=False): Einstein summation with numpy's\n"
        "semantics (implicit/explicit output, '...' broadcasting, diagonals, traces, size-1\n"
        "broadcasting, scalars), also in the interleaved form einsum(a, [0, 1], b, [1, 2], [0, 2]).\n"
        "optimize: False (one step, run as left-to-right pairs), True/'auto' (opt_einsum's\n"
        "rules), 'greedy', 'optimal', 'dp', 'branch-all', 'branch-2', 'branch-1', a tuple\n"
        "(name, memory_limit) or an explicit path ['einsum_path', (0, 1), ...].\n"
        "Pairwise contractions run as strided batched GEMMs (float32 through oneDNN).\n"
        "Result dtype: numpy's result type; float16/bfloat16 are computed in float32. A\n"
        "single operand without summation gives a view (as numpy). The GIL is released.\n"
        "Errors: ValueError naming the equation, the fault and the operand shapes.");
  m.def("einsum_path", &einsum_path_py, nb::arg("operands"), nb::arg("optimize").none() = "greedy",
        nb::sig("def einsum_path(subscripts: str | typing.Any, /, *operands: typing.Any, "
                "optimize: bool | str | tuple | list | None = 'greedy') -> tuple[list, str]"),
        "numpy.einsum_path(subscripts, *operands, optimize='greedy'): the contraction path\n"
        "qkv.einsum takes, as ['einsum_path', (i, j), ...], and numpy's printed report (naive\n"
        "and optimized FLOP counts, scaling, largest intermediate, one line per step).");
}
