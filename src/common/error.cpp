#include "epkit/error.hpp"

namespace epkit {

Error::~Error() = default;

}  // namespace epkit
