#include "report.hpp"

#include "bytes.hpp"

#include <cstdio>
#include <iomanip>

namespace epkit::bench {

namespace {

#define EPKIT_BENCH_FIELD(f) RowField{#f, [](const Row& r) -> FieldValue { return r.f; }}
#define EPKIT_BENCH_INT(f) RowField{#f, [](const Row& r) -> FieldValue { return static_cast<int64_t>(r.f); }}

std::string number(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string json_value(const FieldValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return json_quote(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  const std::string n = number(std::get<double>(v));
  return n.empty() ? "null" : n;
}

std::string csv_cell(const FieldValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    if (s->find_first_of(",\"\n") == std::string::npos) return *s;
    std::string q = "\"";
    for (char c : *s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  return number(std::get<double>(v));
}

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

const std::vector<RowField>& row_fields() {
  static const std::vector<RowField> fields = {
      EPKIT_BENCH_FIELD(preset), EPKIT_BENCH_INT(tokens), EPKIT_BENCH_INT(world_size), EPKIT_BENCH_FIELD(system),
      EPKIT_BENCH_INT(dp_size), EPKIT_BENCH_INT(hidden), EPKIT_BENCH_INT(experts), EPKIT_BENCH_INT(topk),
      EPKIT_BENCH_INT(max_tokens), EPKIT_BENCH_FIELD(dispatch_dtype), EPKIT_BENCH_FIELD(combine_dtype),
      EPKIT_BENCH_FIELD(routing), EPKIT_BENCH_FIELD(path), EPKIT_BENCH_FIELD(layout), EPKIT_BENCH_INT(num_sms), EPKIT_BENCH_INT(p2p_peers),
      EPKIT_BENCH_FIELD(note), EPKIT_BENCH_FIELD(samples),
      EPKIT_BENCH_FIELD(dispatch_us_median), EPKIT_BENCH_FIELD(dispatch_us_p99),
      EPKIT_BENCH_FIELD(combine_us_median), EPKIT_BENCH_FIELD(combine_us_p99),
      EPKIT_BENCH_FIELD(total_us_median), EPKIT_BENCH_FIELD(total_us_p99),
      EPKIT_BENCH_FIELD(dispatch_send_us_median), EPKIT_BENCH_FIELD(dispatch_send_us_p99),
      EPKIT_BENCH_FIELD(dispatch_recv_us_median), EPKIT_BENCH_FIELD(dispatch_recv_us_p99),
      EPKIT_BENCH_FIELD(combine_send_us_median), EPKIT_BENCH_FIELD(combine_send_us_p99),
      EPKIT_BENCH_FIELD(combine_recv_us_median), EPKIT_BENCH_FIELD(combine_recv_us_p99),
      EPKIT_BENCH_FIELD(split_total_us_median), EPKIT_BENCH_FIELD(split_total_us_p99),
      EPKIT_BENCH_FIELD(graph_total_us_median), EPKIT_BENCH_FIELD(graph_total_us_p99),
      EPKIT_BENCH_FIELD(dispatch_bytes_per_rank), EPKIT_BENCH_FIELD(combine_bytes_per_rank),
      EPKIT_BENCH_FIELD(dispatch_gbps), EPKIT_BENCH_FIELD(combine_gbps),
      EPKIT_BENCH_FIELD(dispatch_pct_of_ceiling), EPKIT_BENCH_FIELD(combine_pct_of_ceiling),
      EPKIT_BENCH_FIELD(dispatch_wire_bytes_per_rank), EPKIT_BENCH_FIELD(combine_wire_bytes_per_rank),
      EPKIT_BENCH_FIELD(symmetric_bytes), EPKIT_BENCH_FIELD(workspace_bytes), EPKIT_BENCH_FIELD(buffer_bytes),
  };
  return fields;
}

double pct_of(double gbps, double ceiling_gbps) {
  if (!(std::isfinite(gbps) && std::isfinite(ceiling_gbps) && ceiling_gbps > 0)) return kNotMeasured;
  return 100.0 * gbps / ceiling_gbps;
}

void set_bandwidth(Row& row, double dispatch_bytes_per_rank, double combine_bytes_per_rank, double ceiling_gbps) {
  row.dispatch_bytes_per_rank = dispatch_bytes_per_rank;
  row.combine_bytes_per_rank = combine_bytes_per_rank;
  row.dispatch_gbps = gb_per_s(dispatch_bytes_per_rank, row.dispatch_us_median);
  row.combine_gbps = gb_per_s(combine_bytes_per_rank, row.combine_us_median);
  row.dispatch_pct_of_ceiling = pct_of(row.dispatch_gbps, ceiling_gbps);
  row.combine_pct_of_ceiling = pct_of(row.combine_gbps, ceiling_gbps);
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::vector<std::string> run_notes(int world_size, int gpus, bool smoke, int iters) {
  std::vector<std::string> n;
  if (world_size == 1) {
    n.push_back(
        "world size 1: one rank, no peer. Dispatch and combine only move tokens within this GPU (a local "
        "permutation; no link is crossed), so these are the kernels' fixed costs and local copies, not "
        "communication. More ranks: epkit-run -n N -- epkit-bench (N > the GPU count puts several ranks on a "
        "GPU: the results stay correct, the timings mean nothing)");
  } else if (gpus < world_size) {
    n.push_back(std::to_string(world_size) + " ranks share " + std::to_string(gpus) +
                " GPU(s): the processes time-slice each GPU, so no timing below means anything; the run only "
                "shows that every mode completes");
  }
  if (smoke)
    n.push_back("--smoke: " + std::to_string(iters) +
                " samples per mode and short probes; the numbers only show that every mode ran");
  return n;
}

void write_json(std::ostream& os, const Report& r) {
  os << "{\n  \"meta\": {";
  for (size_t i = 0; i < r.meta.size(); ++i) {
    os << (i ? "," : "") << "\n    " << json_quote(r.meta[i].first) << ": " << json_quote(r.meta[i].second);
  }
  os << "\n  },\n  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) os << (i ? ", " : "") << json_quote(r.notes[i]);
  os << "]";
  const Ceilings& c = r.ceilings;
  os << ",\n  \"ceilings\": {"
     << "\n    \"p2p_gbps\": " << json_value(c.p2p_gbps) << ",\n    \"p2p_us_median\": " << json_value(c.p2p_us_median)
     << ",\n    \"p2p_us_p99\": " << json_value(c.p2p_us_p99) << ",\n    \"p2p_bytes\": " << c.p2p_bytes
     << ",\n    \"p2p_method\": " << json_quote(c.p2p_method)
     << ",\n    \"put_signal_us_median\": " << json_value(c.put_signal_us_median)
     << ",\n    \"put_signal_us_p99\": " << json_value(c.put_signal_us_p99)
     << ",\n    \"put_signal_bytes\": " << c.put_signal_bytes
     << ",\n    \"put_signal_method\": " << json_quote(c.put_signal_method)
     << ",\n    \"hbm_copy_gbps\": " << json_value(c.hbm_copy_gbps)
     << ",\n    \"hbm_copy_us_median\": " << json_value(c.hbm_copy_us_median)
     << ",\n    \"hbm_copy_bytes\": " << c.hbm_copy_bytes
     << ",\n    \"hbm_copy_method\": " << json_quote(c.hbm_copy_method)
     << ",\n    \"launch_floor_blocks\": " << c.launch_floor_blocks
     << ",\n    \"empty_kernel_us_median\": " << json_value(c.empty_kernel_us_median)
     << ",\n    \"empty_one_warp_us_median\": " << json_value(c.empty_one_warp_us_median)
     << ",\n    \"flag_exchange_us_median\": " << json_value(c.flag_exchange_us_median) << "\n  },\n  \"rows\": [";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    os << (i ? "," : "") << "\n    {";
    const auto& fields = row_fields();
    for (size_t f = 0; f < fields.size(); ++f) {
      os << (f ? ", " : "") << json_quote(fields[f].name) << ": " << json_value(fields[f].get(r.rows[i]));
    }
    os << "}";
  }
  os << (r.rows.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

void write_csv(std::ostream& os, const Report& r) {
  // The row fields, then the run's ceilings repeated on every line so the file stands alone.
  const auto& fields = row_fields();
  for (size_t f = 0; f < fields.size(); ++f) os << (f ? "," : "") << fields[f].name;
  os << ",ceiling_p2p_gbps,ceiling_put_signal_us_median,ceiling_hbm_copy_gbps\n";
  for (const Row& row : r.rows) {
    for (size_t f = 0; f < fields.size(); ++f) os << (f ? "," : "") << csv_cell(fields[f].get(row));
    os << "," << number(r.ceilings.p2p_gbps) << "," << number(r.ceilings.put_signal_us_median) << ","
       << number(r.ceilings.hbm_copy_gbps) << "\n";
  }
}

void print_table(std::ostream& os, const Report& r) {
  const Ceilings& c = r.ceilings;
  for (const std::string& n : r.notes) os << "NOTE: " << n << "\n";
  os << "ceilings: P2P copy " << fixed(c.p2p_gbps, 1) << " GB/s per direction (" << c.p2p_method
     << "); put-with-signal one-way " << fixed(c.put_signal_us_median, 2) << " us median, "
     << fixed(c.put_signal_us_p99, 2) << " us p99 (" << c.put_signal_method << "); device memory copy "
     << fixed(c.hbm_copy_gbps, 1) << " GB/s read + write (" << c.hbm_copy_method << ")\n";
  os << "harness floor per timed call (" << c.launch_floor_blocks << " blocks x 512 threads): empty kernel "
     << fixed(c.empty_kernel_us_median, 2) << " us (1 x 32 threads: " << fixed(c.empty_one_warp_us_median, 2)
     << " us), one flag to and from every P2P peer "
     << fixed(c.flag_exchange_us_median, 2) << " us (medians)\n";
  os << std::left << std::setw(14) << "preset" << std::right << std::setw(6) << "tok" << std::setw(3) << "W"
     << "  " << std::left << std::setw(8) << "system" << std::right << std::setw(10) << "disp_us"
     << std::setw(10) << "comb_us" << std::setw(10) << "total_us" << std::setw(10) << "p99_us" << std::setw(10)
     << "graph_us" << std::setw(9) << "d_send" << std::setw(9) << "d_recv" << std::setw(9) << "c_send"
     << std::setw(9) << "c_recv" << std::setw(8) << "disp%" << std::setw(8) << "comb%" << std::setw(10)
     << "sym_MiB" << "\n";
  for (const Row& row : r.rows) {
    os << std::left << std::setw(14) << row.preset << std::right << std::setw(6) << row.tokens << std::setw(3)
       << row.world_size << "  " << std::left << std::setw(8) << row.system << std::right << std::setw(10)
       << fixed(row.dispatch_us_median, 1) << std::setw(10) << fixed(row.combine_us_median, 1) << std::setw(10)
       << fixed(row.total_us_median, 1) << std::setw(10) << fixed(row.total_us_p99, 1) << std::setw(10)
       << fixed(row.graph_total_us_median, 1) << std::setw(9) << fixed(row.dispatch_send_us_median, 1)
       << std::setw(9) << fixed(row.dispatch_recv_us_median, 1) << std::setw(9)
       << fixed(row.combine_send_us_median, 1) << std::setw(9) << fixed(row.combine_recv_us_median, 1)
       << std::setw(8) << fixed(row.dispatch_pct_of_ceiling, 1) << std::setw(8)
       << fixed(row.combine_pct_of_ceiling, 1) << std::setw(10)
       << fixed(static_cast<double>(row.symmetric_bytes) / (1 << 20), 1);
    if (row.layout == "packed") os << "  packed";
    if (!row.note.empty()) os << "  " << row.note;
    os << "\n";
  }
}

}  // namespace epkit::bench
