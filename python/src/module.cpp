// The epkit._C extension module: registers the bindings and maps epkit::Error to epkit.EpkitError.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "epkit/error.hpp"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "epkit C++ bindings (use the epkit package, not this module)";
  // A RuntimeError subclass, so callers catching RuntimeError (as for pplx-kernels) still work.
  static nb::exception<epkit::Error> error(m, "EpkitError", PyExc_RuntimeError);
  epkit::py::bind_runtime(m);
  epkit::py::bind_all_to_all(m);
}
