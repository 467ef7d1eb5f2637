// epkit::Error and the checking macros used by every host-side layer.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace epkit {

// The one exception type of the library. what() carries "file:line: message".
// Its vtable and type info live in libepkit_common.so (the out-of-line destructor), so that every
// library and program of the process catches the same type.
class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& msg)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + msg) {}
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  ~Error() override;
};

namespace detail {
// Hidden: each library keeps its own instantiations instead of exporting them.
template <typename... Args>
[[gnu::visibility("hidden")]] std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace epkit

// Throws epkit::Error when cond is false; the rest of the arguments are streamed into the message.
#define EPKIT_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) throw ::epkit::Error(__FILE__, __LINE__, ::epkit::detail::concat(__VA_ARGS__)); \
  } while (0)

#define EPKIT_FAIL(...) throw ::epkit::Error(__FILE__, __LINE__, ::epkit::detail::concat(__VA_ARGS__))
