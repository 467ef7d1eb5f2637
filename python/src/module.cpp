// The epkit._C extension module: registers the bindings and maps epkit::Error to epkit.EpkitError.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "epkit/error.hpp"
#include "epkit/version.hpp"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "epkit C++ bindings (use the epkit package, not this module)";
  m.attr("__version__") = EPKIT_VERSION_STRING;  // the one version source: VERSION, via CMake
  m.attr("git_commit") = epkit::git_commit();
  // A RuntimeError subclass, so callers catching RuntimeError (as for pplx-kernels) still work.
  // The type object is created once and deliberately never released: the translator may run in
  // any later call, including during interpreter shutdown.
  static PyObject* error_type = PyErr_NewException("epkit._C.EpkitError", PyExc_RuntimeError, nullptr);
  Py_INCREF(error_type);
  m.attr("EpkitError") = nb::handle(error_type);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const epkit::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(payload), e.what());
        }
      },
      error_type);
  epkit::py::bind_runtime(m);
  epkit::py::bind_all_to_all(m);
  epkit::py::bind_moe(m);
}
