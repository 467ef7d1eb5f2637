// Strict JSON (RFC 8259) parser and writer for the planner's data files and reports.
#include "epkit/plan/json.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>

#include "epkit/error.hpp"

namespace epkit::plan {

namespace {

const char* type_name(const Json& j) {
  if (j.is_null()) return "null";
  if (j.is_bool()) return "bool";
  if (j.is_number()) return "number";
  if (j.is_string()) return "string";
  if (j.is_array()) return "array";
  return "object";
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Json parse_document() {
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  // Deep nesting would overflow the stack on hostile input; real spec files are a few levels deep.
  static constexpr int kMaxDepth = 64;
  const std::string& s_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& msg) const {
    EPKIT_FAIL("JSON parse error at byte ", pos_, ": ", msg);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    return s_[pos_];
  }
  void expect_word(const char* w) {
    for (const char* c = w; *c; ++c, ++pos_)
      if (pos_ >= s_.size() || s_[pos_] != *c) fail(std::string("expected '") + w + "'");
  }

  Json parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Json(parse_string());
    if (c == 't') { expect_word("true"); return Json(true); }
    if (c == 'f') { expect_word("false"); return Json(false); }
    if (c == 'n') { expect_word("null"); return Json(nullptr); }
    if (c == '-' || (c >= '0' && c <= '9')) return Json(parse_number());
    fail(std::string("unexpected character '") + c + "'");
  }

  Json parse_object(int depth) {
    ++pos_;  // '{'
    Json::Object obj;
    if (peek() == '}') { ++pos_; return Json(std::move(obj)); }
    while (true) {
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      if (peek() != ':') fail("expected ':' after key");
      ++pos_;
      obj.emplace_back(std::move(key), parse_value(depth + 1));
      char c = peek();
      ++pos_;
      if (c == '}') return Json(std::move(obj));
      if (c != ',') { --pos_; fail("expected ',' or '}' in object"); }
    }
  }

  Json parse_array(int depth) {
    ++pos_;  // '['
    Json::Array arr;
    if (peek() == ']') { ++pos_; return Json(std::move(arr)); }
    while (true) {
      arr.push_back(parse_value(depth + 1));
      char c = peek();
      ++pos_;
      if (c == ']') return Json(std::move(arr));
      if (c != ',') { --pos_; fail("expected ',' or ']' in array"); }
    }
  }

  double parse_number() {
    // Validate the RFC grammar first: strtod alone accepts forms JSON forbids (hex, "inf", leading '+').
    size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t d0 = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d0) fail("expected a digit");
    };
    if (pos_ < s_.size() && s_[pos_] == '0') ++pos_; else digits();
    if (pos_ < s_.size() && s_[pos_] == '.') { ++pos_; digits(); }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
    return std::stod(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    const int extra = cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
    static constexpr unsigned char kLead[] = {0x00, 0xC0, 0xE0, 0xF0};
    out += char(kLead[extra] | (cp >> (6 * extra)));
    for (int i = extra - 1; i >= 0; --i) out += char(0x80 | ((cp >> (6 * i)) & 0x3F));
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) { --pos_; fail("control character in string"); }
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      static constexpr std::string_view kEscapes = "\"\\/bfnrt", kMeanings = "\"\\/\b\f\n\r\t";
      if (size_t k = kEscapes.find(e); k != std::string_view::npos) {
        out += kMeanings[k];
        continue;
      }
      if (e != 'u') { --pos_; fail(std::string("bad escape '\\") + e + "'"); }
      unsigned cp = hex4();
      if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
        if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') fail("lone high surrogate");
        pos_ += 2;
        unsigned lo = hex4();
        if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp < 0xE000) {
        fail("lone low surrogate");
      }
      append_utf8(out, cp);
    }
  }
};

void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {  // other control characters: the generic escape is valid everywhere
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  out += '"';
}
void dump_number(std::string& out, double d) {
  // JSON has no NaN/Inf; an infeasible quantity is written as null rather than an invalid token.
  if (!std::isfinite(d)) { out += "null"; return; }
  if (d == std::floor(d) && std::fabs(d) < 1e15) {
    out += std::to_string(static_cast<long long>(d));
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", d);
  out += buf;
}

}  // namespace

// One template for the typed accessors: the error names the field and both types.
template <typename T>
static const T& typed(const std::variant<std::nullptr_t, bool, double, std::string, Json::Array, Json::Object>& v,
                      const Json& self, const std::string& what, const char* want) {
  EPKIT_CHECK(std::holds_alternative<T>(v), what, ": expected ", want, ", got ", type_name(self));
  return std::get<T>(v);
}
bool Json::as_bool(const std::string& what) const { return typed<bool>(v_, *this, what, "bool"); }
double Json::as_number(const std::string& what) const { return typed<double>(v_, *this, what, "number"); }
const std::string& Json::as_string(const std::string& what) const { return typed<std::string>(v_, *this, what, "string"); }
const Json::Array& Json::as_array(const std::string& what) const { return typed<Array>(v_, *this, what, "array"); }
const Json::Object& Json::as_object(const std::string& what) const { return typed<Object>(v_, *this, what, "object"); }

const Json* Json::find(const std::string& key) const {
  for (const auto& [k, v] : as_object("lookup of '" + key + "'"))
    if (k == key) return &v;
  return nullptr;
}

const Json& Json::at(const std::string& key) const {
  const Json* j = find(key);
  EPKIT_CHECK(j != nullptr, "missing required field '", key, "'");
  return *j;
}

Json& Json::set(const std::string& key, Json value) {
  EPKIT_CHECK(is_object(), "set('", key, "') on a ", type_name(*this));
  auto& obj = std::get<Object>(v_);
  for (auto& [k, v] : obj)
    if (k == key) { v = std::move(value); return *this; }
  obj.emplace_back(key, std::move(value));
  return *this;
}

void Json::push(Json value) {
  EPKIT_CHECK(is_array(), "push() on a ", type_name(*this));
  std::get<Array>(v_).push_back(std::move(value));
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (is_null()) out += "null";
  else if (is_bool()) out += std::get<bool>(v_) ? "true" : "false";
  else if (is_number()) dump_number(out, std::get<double>(v_));
  else if (is_string()) dump_string(out, std::get<std::string>(v_));
  else if (is_array()) {
    const auto& a = std::get<Array>(v_);
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += ',';
      newline(depth + 1);
      a[i].dump_to(out, indent, depth + 1);
    }
    if (!a.empty()) newline(depth);
    out += ']';
  } else {
    const auto& o = std::get<Object>(v_);
    out += '{';
    for (size_t i = 0; i < o.size(); ++i) {
      if (i) out += ',';
      newline(depth + 1);
      dump_string(out, o[i].first);
      out += indent < 0 ? ":" : ": ";
      o[i].second.dump_to(out, indent, depth + 1);
    }
    if (!o.empty()) newline(depth);
    out += '}';
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

Json Json::parse(const std::string& text) { return Parser(text).parse_document(); }

Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EPKIT_CHECK(in.good(), "cannot open JSON file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const Error& e) {
    EPKIT_FAIL("in '", path, "': ", e.what());
  }
}

}  // namespace epkit::plan
