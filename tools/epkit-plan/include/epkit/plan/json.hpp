// A small JSON value with a strict parser and a writer. The planner reads spec and calibration files
// and writes its reports with it; it avoids a system dependency for ~250 lines of code.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace epkit::plan {

class Json {
 public:
  using Array = std::vector<Json>;
  // Objects keep insertion order so that reports print their fields in the order they were written.
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() : v_(nullptr) {}
  Json(std::nullptr_t) : v_(nullptr) {}
  Json(bool b) : v_(b) {}
  Json(double d) : v_(d) {}
  Json(int i) : v_(static_cast<double>(i)) {}
  Json(long i) : v_(static_cast<double>(i)) {}
  Json(long long i) : v_(static_cast<double>(i)) {}
  Json(unsigned long i) : v_(static_cast<double>(i)) {}
  Json(unsigned long long i) : v_(static_cast<double>(i)) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(Array a) : v_(std::move(a)) {}
  Json(Object o) : v_(std::move(o)) {}

  // An empty object, ready for set().
  static Json object() { return Json(Object{}); }
  // An empty array, ready for push().
  static Json array() { return Json(Array{}); }

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_number() const { return std::holds_alternative<double>(v_); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<Array>(v_); }
  bool is_object() const { return std::holds_alternative<Object>(v_); }

  // Typed accessors; throw epkit::Error naming `what` when the type differs.
  bool as_bool(const std::string& what = "value") const;
  double as_number(const std::string& what = "value") const;
  const std::string& as_string(const std::string& what = "value") const;
  const Array& as_array(const std::string& what = "value") const;
  const Object& as_object(const std::string& what = "value") const;

  // Object member or nullptr when absent (throws when this is not an object).
  const Json* find(const std::string& key) const;
  // Object member; throws epkit::Error naming the key when absent.
  const Json& at(const std::string& key) const;
  // Sets (or replaces) an object member; returns *this for chaining.
  Json& set(const std::string& key, Json value);
  // Appends to an array.
  void push(Json value);

  // Text form. indent < 0: one line; otherwise pretty-printed with `indent` spaces per level.
  std::string dump(int indent = -1) const;
  // Parses a complete JSON text; throws epkit::Error with the byte offset of the first problem.
  static Json parse(const std::string& text);

 private:
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> v_;
  void dump_to(std::string& out, int indent, int depth) const;
};

// Reads and parses a JSON file; throws epkit::Error naming the path when it cannot be read or parsed.
Json read_json_file(const std::string& path);

}  // namespace epkit::plan
