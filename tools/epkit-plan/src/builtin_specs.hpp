// The texts of the built-in spec files under src/plan/specs/, generated into the build at configure time.
#pragma once

#include <string>
#include <vector>

namespace epkit::plan {

// JSON texts of the built-in GPU specs (src/plan/specs/gpu_*.json).
const std::vector<std::string>& builtin_gpu_texts();
// JSON texts of the built-in model specs (src/plan/specs/model_*.json).
const std::vector<std::string>& builtin_model_texts();

}  // namespace epkit::plan
