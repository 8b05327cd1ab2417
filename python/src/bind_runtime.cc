// Threads, version, the machine, and the conversion test hook.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>

#include "args.h"
#include "array_like.h"
#include "qkv/machine.h"
#include "qkv/parallel.h"
#include "tensor_convert.h"

namespace nb = nanobind;

void bind_runtime(nb::module_& m) {
  m.attr("__version__") = QKV_VERSION;

  m.def(
      "set_num_threads",
      [](nb::handle n) {
        qkv::set_num_threads(static_cast<int>(qkv::python::int_arg(n, "set_num_threads: n", INT_MIN, INT_MAX)));
      },
      nb::arg("n").none(), nb::sig("def set_num_threads(n: int) -> None"),
      "Sets the number of threads qkv's kernels use (n >= 1; ValueError otherwise).\n\n"
      "Global to the process, as torch.set_num_threads. The initial value comes from\n"
      "QKV_NUM_THREADS, else OMP_NUM_THREADS, else the number of cores.");
  m.def("get_num_threads", &qkv::get_num_threads, "The number of threads qkv's kernels use.");
  m.def(
      "machine_info",
      [] {
        const qkv::MachineInfo info = qkv::machine_info();
        nb::dict out;
        out["cpu_model"] = info.cpu_model;
        out["isa_flags"] = info.isa_flags ? nb::cast(*info.isa_flags) : nb::none();
        out["simd_target"] = info.simd_target;
        out["simd_target_cap"] = info.simd_target_cap.empty() ? nb::none() : nb::cast(info.simd_target_cap);
        out["onednn_isa"] = info.onednn_isa;
        out["logical_cpus"] = info.logical_cpus;
        out["threads"] = info.threads;
        return out;
      },
      nb::sig("def machine_info() -> dict[str, typing.Any]"),
      "This machine, as benchmark tables name it (qkv/machine.h; the fields of `qkv info --json`):\n"
      "cpu_model (/proc/cpuinfo's model name, or 'unknown'), isa_flags (its avx2, fma, f16c,\n"
      "avx512* and amx* flags, sorted; None without a flags line), simd_target (the Highway\n"
      "target qkv's kernels dispatch to), simd_target_cap (QKV_MAX_SIMD_TARGET's value, the cap\n"
      "of that dispatch, or None), onednn_isa (oneDNN's effective ISA, with\n"
      "' (ONEDNN_MAX_CPU_ISA=...)' where that caps it), logical_cpus and threads\n"
      "(get_num_threads()).");

  m.def(
      "measure_fma_peak",
      [](nb::handle min_seconds) {
        const double seconds = qkv::python::float_arg(min_seconds, "measure_fma_peak: min_seconds");
        qkv::FmaPeak peak;
        {
          nb::gil_scoped_release release;
          peak = qkv::measure_fma_peak(seconds);
        }
        nb::dict out;
        out["gflops"] = peak.gflops;
        out["threads"] = peak.threads;
        out["simd_target"] = peak.simd_target;
        out["lanes"] = peak.lanes;
        return out;
      },
      nb::arg("min_seconds") = 0.3, nb::sig("def measure_fma_peak(min_seconds: float = 0.3) -> dict[str, typing.Any]"),
      "The float32 multiply-add peak of this machine's cores, measured (qkv/machine.h; `qkv bench\n"
      "peak`): get_num_threads() workers run independent FMA chains on the Highway target the\n"
      "kernels dispatch to, runs of >= 20 ms for min_seconds (at least three), the fastest giving\n"
      "gflops (all workers together); also threads, simd_target and lanes (float32 lanes of one\n"
      "vector there). ValueError for min_seconds outside [0, 3600].");

  m.def(
      "_roundtrip", [](nb::handle array) { return qkv::python::to_numpy(qkv::python::to_tensor(array, "_roundtrip")); },
      nb::arg("array"), nb::sig("def _roundtrip(array: numpy.typing.ArrayLike) -> numpy.ndarray"),
      "Test hook: array -> qkv::Tensor -> NumPy array, copying only where to_tensor must.");
  m.def("_array_like", &qkv::python::numpy_like, nb::arg("array").none(), nb::arg("like").none(),
        nb::sig("def _array_like(array: numpy.ndarray | None, like: typing.Any) -> typing.Any"),
        "The NumPy result `array` in the array type of `like` (torch in, torch out; python/src/array_like.h).");
}
