// Spec parsing, validation and lookup of the built-in GPU and model files.
#include "epkit/plan/specs.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "epkit/error.hpp"
#include "builtin_specs.hpp"

namespace epkit::plan {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Rejects unknown keys: a misspelt field in a user file would otherwise silently keep its default.
void check_keys(const Json& j, const std::string& where, const std::set<std::string>& allowed) {
  for (const auto& [k, v] : j.as_object(where)) {
    (void)v;
    EPKIT_CHECK(allowed.count(k) != 0, where, ": unknown field '", k, "'");
  }
}

double positive(const Json& j, const std::string& key, const std::string& where) {
  double v = j.at(key).as_number(where + "." + key);
  EPKIT_CHECK(std::isfinite(v) && v > 0, where, ".", key, " = ", v, " must be > 0");
  return v;
}

double non_negative(const Json& j, const std::string& key, const std::string& where) {
  double v = j.at(key).as_number(where + "." + key);
  EPKIT_CHECK(std::isfinite(v) && v >= 0, where, ".", key, " = ", v, " must be >= 0");
  return v;
}

int integer(const Json& j, const std::string& key, const std::string& where, int min_value) {
  double v = j.at(key).as_number(where + "." + key);
  EPKIT_CHECK(v == std::floor(v) && v >= min_value && v <= 1e9, where, ".", key, " = ", v,
              " must be an integer >= ", min_value);
  return static_cast<int>(v);
}

}  // namespace

GpuSpec gpu_from_json(const Json& j) {
  const std::string w = "gpu spec";
  check_keys(j, w, {"name", "note", "peak_bf16_tflops", "peak_fp8_tflops", "hbm_bandwidth_tb_per_s",
                    "hbm_capacity_gb", "nvlink_gb_per_s", "network_gbit_per_s", "gpus_per_node",
                    "kernel_launch_us", "nvlink_latency_us", "network_latency_us", "reserved_gb"});
  GpuSpec g;
  g.name = j.at("name").as_string(w + ".name");
  g.peak_bf16_tflops = positive(j, "peak_bf16_tflops", w);
  g.peak_fp8_tflops = positive(j, "peak_fp8_tflops", w);
  g.hbm_bandwidth_tb_per_s = positive(j, "hbm_bandwidth_tb_per_s", w);
  g.hbm_capacity_gb = positive(j, "hbm_capacity_gb", w);
  g.nvlink_gb_per_s = positive(j, "nvlink_gb_per_s", w);
  g.network_gbit_per_s = positive(j, "network_gbit_per_s", w);
  g.gpus_per_node = integer(j, "gpus_per_node", w, 1);
  g.kernel_launch_us = non_negative(j, "kernel_launch_us", w);
  g.nvlink_latency_us = non_negative(j, "nvlink_latency_us", w);
  g.network_latency_us = non_negative(j, "network_latency_us", w);
  g.reserved_gb = non_negative(j, "reserved_gb", w);
  EPKIT_CHECK(g.reserved_gb < g.hbm_capacity_gb, w, ".reserved_gb = ", g.reserved_gb,
              " must be below hbm_capacity_gb = ", g.hbm_capacity_gb);
  return g;
}

ModelSpec model_from_json(const Json& j) {
  const std::string w = "model spec";
  check_keys(j, w, {"name", "note", "aliases", "num_layers", "num_dense_layers", "hidden", "vocab", "attention",
                    "moe", "dense_inter", "weight_bytes", "weight_block", "embedding_bytes", "kv_bytes",
                    "dispatch_bytes", "combine_bytes", "mtp_draft_tokens"});
  ModelSpec m;
  m.name = j.at("name").as_string(w + ".name");
  if (const Json* a = j.find("aliases"))
    for (const Json& s : a->as_array(w + ".aliases")) m.aliases.push_back(s.as_string(w + ".aliases[]"));
  m.num_layers = integer(j, "num_layers", w, 1);
  m.num_dense_layers = integer(j, "num_dense_layers", w, 0);
  EPKIT_CHECK(m.num_dense_layers < m.num_layers, w, ".num_dense_layers = ", m.num_dense_layers,
              " must be below num_layers = ", m.num_layers, " (a MoE model needs a MoE layer)");
  m.hidden = integer(j, "hidden", w, 1);
  m.vocab = integer(j, "vocab", w, 1);

  const Json& at = j.at("attention");
  const std::string wa = w + ".attention";
  const std::string type = at.at("type").as_string(wa + ".type");
  if (type == "mla") {
    check_keys(at, wa, {"type", "num_heads", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                        "qk_nope_head_dim", "v_head_dim"});
    m.attention = AttentionKind::kMla;
    m.num_heads = integer(at, "num_heads", wa, 1);
    m.q_lora_rank = integer(at, "q_lora_rank", wa, 0);
    m.kv_lora_rank = integer(at, "kv_lora_rank", wa, 1);
    m.qk_rope_head_dim = integer(at, "qk_rope_head_dim", wa, 0);
    m.qk_nope_head_dim = integer(at, "qk_nope_head_dim", wa, 1);
    m.v_head_dim = integer(at, "v_head_dim", wa, 1);
  } else if (type == "gqa") {
    check_keys(at, wa, {"type", "num_heads", "num_kv_heads", "head_dim"});
    m.attention = AttentionKind::kGqa;
    m.num_heads = integer(at, "num_heads", wa, 1);
    m.num_kv_heads = integer(at, "num_kv_heads", wa, 1);
    m.head_dim = integer(at, "head_dim", wa, 1);
    EPKIT_CHECK(m.num_heads % m.num_kv_heads == 0, wa, ".num_heads = ", m.num_heads,
                " must be a multiple of num_kv_heads = ", m.num_kv_heads);
  } else {
    EPKIT_FAIL(wa, ".type = '", type, "' is not one of: mla, gqa");
  }

  const Json& moe = j.at("moe");
  const std::string wm = w + ".moe";
  check_keys(moe, wm, {"num_routed_experts", "num_shared_experts", "top_k", "inter"});
  m.num_routed_experts = integer(moe, "num_routed_experts", wm, 1);
  m.num_shared_experts = integer(moe, "num_shared_experts", wm, 0);
  m.top_k = integer(moe, "top_k", wm, 1);
  EPKIT_CHECK(m.top_k <= m.num_routed_experts, wm, ".top_k = ", m.top_k, " must be <= num_routed_experts = ",
              m.num_routed_experts);
  m.moe_inter = integer(moe, "inter", wm, 1);
  m.dense_inter = integer(j, "dense_inter", w, 0);
  EPKIT_CHECK(m.num_dense_layers == 0 || m.dense_inter > 0, w, ".dense_inter = ", m.dense_inter,
              " must be > 0 when num_dense_layers = ", m.num_dense_layers);
  m.weight_bytes = positive(j, "weight_bytes", w);
  m.weight_block = integer(j, "weight_block", w, 0);
  m.embedding_bytes = positive(j, "embedding_bytes", w);
  m.kv_bytes = positive(j, "kv_bytes", w);
  m.dispatch_bytes = positive(j, "dispatch_bytes", w);
  m.combine_bytes = positive(j, "combine_bytes", w);
  if (j.find("mtp_draft_tokens")) m.mtp_draft_tokens = integer(j, "mtp_draft_tokens", w, 0);
  return m;
}

Json to_json(const GpuSpec& g) {
  Json j = Json::object();
  j.set("name", g.name)
      .set("peak_bf16_tflops", g.peak_bf16_tflops)
      .set("peak_fp8_tflops", g.peak_fp8_tflops)
      .set("hbm_bandwidth_tb_per_s", g.hbm_bandwidth_tb_per_s)
      .set("hbm_capacity_gb", g.hbm_capacity_gb)
      .set("nvlink_gb_per_s", g.nvlink_gb_per_s)
      .set("network_gbit_per_s", g.network_gbit_per_s)
      .set("gpus_per_node", g.gpus_per_node)
      .set("kernel_launch_us", g.kernel_launch_us)
      .set("nvlink_latency_us", g.nvlink_latency_us)
      .set("network_latency_us", g.network_latency_us)
      .set("reserved_gb", g.reserved_gb);
  return j;
}

Json to_json(const ModelSpec& m) {
  Json aliases = Json::array();
  for (const auto& a : m.aliases) aliases.push(a);
  Json att = Json::object();
  if (m.attention == AttentionKind::kMla) {
    att.set("type", "mla").set("num_heads", m.num_heads).set("q_lora_rank", m.q_lora_rank)
        .set("kv_lora_rank", m.kv_lora_rank).set("qk_rope_head_dim", m.qk_rope_head_dim)
        .set("qk_nope_head_dim", m.qk_nope_head_dim).set("v_head_dim", m.v_head_dim);
  } else {
    att.set("type", "gqa").set("num_heads", m.num_heads).set("num_kv_heads", m.num_kv_heads)
        .set("head_dim", m.head_dim);
  }
  Json moe = Json::object();
  moe.set("num_routed_experts", m.num_routed_experts).set("num_shared_experts", m.num_shared_experts)
      .set("top_k", m.top_k).set("inter", m.moe_inter);
  Json j = Json::object();
  j.set("name", m.name).set("aliases", aliases).set("num_layers", m.num_layers)
      .set("num_dense_layers", m.num_dense_layers).set("hidden", m.hidden).set("vocab", m.vocab)
      .set("attention", att).set("moe", moe).set("dense_inter", m.dense_inter)
      .set("weight_bytes", m.weight_bytes).set("weight_block", m.weight_block)
      .set("embedding_bytes", m.embedding_bytes).set("kv_bytes", m.kv_bytes)
      .set("dispatch_bytes", m.dispatch_bytes).set("combine_bytes", m.combine_bytes)
      .set("mtp_draft_tokens", m.mtp_draft_tokens);
  return j;
}

std::vector<std::string> builtin_gpu_names() {
  std::vector<std::string> names;
  for (const auto& s : builtin_gpu_texts()) names.push_back(gpu_from_json(Json::parse(s)).name);
  return names;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const auto& s : builtin_model_texts()) names.push_back(model_from_json(Json::parse(s)).name);
  return names;
}

GpuSpec load_gpu(const std::string& name_or_path) {
  if (ends_with(name_or_path, ".json")) return gpu_from_json(read_json_file(name_or_path));
  const std::string want = lower(name_or_path);
  std::string known;
  for (const auto& s : builtin_gpu_texts()) {
    GpuSpec g = gpu_from_json(Json::parse(s));
    // "h100" is what people type for the SXM part; accept the name without the form-factor suffix.
    if (lower(g.name) == want || lower(g.name).rfind(want + "-", 0) == 0) return g;
    known += (known.empty() ? "" : ", ") + g.name;
  }
  EPKIT_FAIL("unknown GPU '", name_or_path, "': built-in GPUs are ", known, ", or pass a .json file");
}

ModelSpec load_model(const std::string& name_or_path) {
  if (ends_with(name_or_path, ".json")) return model_from_json(read_json_file(name_or_path));
  const std::string want = lower(name_or_path);
  std::string known;
  for (const auto& s : builtin_model_texts()) {
    ModelSpec m = model_from_json(Json::parse(s));
    if (lower(m.name) == want) return m;
    for (const auto& a : m.aliases)
      if (lower(a) == want) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  EPKIT_FAIL("unknown model '", name_or_path, "': built-in models are ", known, ", or pass a .json file");
}

}  // namespace epkit::plan
