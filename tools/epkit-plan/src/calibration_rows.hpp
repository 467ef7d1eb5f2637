// Row readers shared by the calibration files: epkit-bench rows (calibration.cpp) and epkit-moe rows
// (moe_calibration.cpp). Every reader names the row and field it rejects, e.g. "rows[3].G = 0".
#pragma once

#include <string>

#include "epkit/plan/calibration.hpp"
#include "epkit/plan/json.hpp"

namespace epkit::plan::detail {

// row[key] as a finite number >= 0; throws naming `where.key` when missing or out of range.
double row_number(const Json& row, const char* key, const std::string& where);
// row[key] as an integer >= lo.
int row_integer(const Json& row, const char* key, const std::string& where, int lo);
// row[key] as a string.
const std::string& row_string(const Json& row, const char* key, const std::string& where);

// What an epkit-moe file says about all of its rows.
struct MoeFile {
  std::string device;    // meta.device, "" when absent
  double hbm_GBps = 0;   // ceilings.hbm_read_GBps (0 until a kernel row needs it)
  double fp8_TFLOPs = 0; // ceilings.fp8_dense_TFLOPs
};
// meta.device of the document (ceilings are read by kernel_row's caller through read_ceilings).
MoeFile moe_file(const Json& doc);
// Fills hbm_GBps / fp8_TFLOPs from doc.ceilings; throws naming a missing or non-positive ceiling.
void read_ceilings(const Json& doc, MoeFile& f);

// One epkit-moe kernel row (kernel != "moe_layer"); f must hold the ceilings.
KernelMeasurement kernel_row(const Json& row, const std::string& where, const MoeFile& f, std::string* system);
// One epkit-moe layer row (kernel == "moe_layer").
LayerMeasurement layer_row(const Json& row, const std::string& where, const MoeFile& f);

// Whether a result measured on `device` (e.g. "NVIDIA H200") applies to the planner GPU `gpu` (e.g.
// "h200", "h100-sxm"): one of the device name's words equals the GPU name or its part before '-'.
// An empty device (not recorded) matches every GPU.
bool device_matches(const std::string& device, const std::string& gpu);

}  // namespace epkit::plan::detail
