// Turns one child's raw output stream into whole lines, each starting with "[rank] ".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace epkit::run {

class LinePrefixer {
 public:
  // A line longer than max_line bytes is cut there (and ends with '\n') so memory stays bounded.
  explicit LinePrefixer(std::string prefix, size_t max_line = 64 * 1024)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // Returns the complete lines in `bytes` (plus any pending partial line), prefixed.
  std::string feed(std::string_view bytes) {
    std::string out;
    for (char c : bytes) {
      partial_.push_back(c);
      if (c == '\n' || partial_.size() >= max_line_) {
        if (partial_.back() != '\n') partial_.push_back('\n');
        out += prefix_;
        out += partial_;
        partial_.clear();
      }
    }
    return out;
  }

  // At end of stream: the final line that had no newline, prefixed and terminated; else "".
  std::string finish() {
    if (partial_.empty()) return {};
    std::string out = prefix_ + partial_ + "\n";
    partial_.clear();
    return out;
  }

 private:
  std::string prefix_;
  size_t max_line_;
  std::string partial_;
};

}  // namespace epkit::run
