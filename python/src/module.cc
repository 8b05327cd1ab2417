// The _qkv extension module: thin nanobind bindings over the qkv C++ API.
//
// Each area of the API lives in python/src/bind_<area>.cc and defines
//   void bind_<area>(nanobind::module_& m);
// A new area (einsum, einops, nn, ...) is one new file plus one line in the
// list below; python/qkv/__init__.py re-exports every public name of _qkv.
// Arrays cross the boundary through tensor_convert.h (zero-copy both ways).
#include <nanobind/nanobind.h>

#define QKV_PYTHON_AREAS(AREA) \
  AREA(errors)                 \
  AREA(runtime)                \
  AREA(io)                     \
  AREA(einops)                 \
  AREA(attention)              \
  AREA(variants)               \
  AREA(lsh)                    \
  AREA(plot)                   \
  AREA(decode)                 \
  AREA(dist)                   \
  AREA(cuda)                   \
  AREA(einsum)                 \
  AREA(nn)

#define QKV_DECLARE_AREA(area) void bind_##area(nanobind::module_& m);
QKV_PYTHON_AREAS(QKV_DECLARE_AREA)

NB_MODULE(_qkv, m) {
  m.doc() = "qkv: multi-head attention and Einstein-notation tensor operations (C++ core)";
#define QKV_BIND_AREA(area) bind_##area(m);
  QKV_PYTHON_AREAS(QKV_BIND_AREA)
}
