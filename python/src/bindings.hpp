// Registration entry points of the extension module, one per source file.
#pragma once

#include <nanobind/nanobind.h>

namespace epkit::py {
void bind_runtime(nanobind::module_& m);
void bind_all_to_all(nanobind::module_& m);
void bind_moe(nanobind::module_& m);
}  // namespace epkit::py
