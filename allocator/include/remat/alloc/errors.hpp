#pragma once
// Exceptions thrown by the allocator's C++ API. The C ABI turns each into a status code
// (see c_api.h) and keeps the message as the thread's last error.

#include <stdexcept>
#include <string>

namespace remat::alloc {

enum class ErrorCode : int {
  invalid_argument = 1,
  config = 2,
  out_of_memory = 3,
  invalid_pointer = 4,
  tag_stack = 5,
  io = 6,
  backend = 7,
  state = 8,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define REMAT_ALLOC_DEFINE_ERROR(Name, code_value)                                   \
  class Name : public Error {                                                        \
   public:                                                                           \
    explicit Name(const std::string& message) : Error(ErrorCode::code_value, message) {} \
  };

REMAT_ALLOC_DEFINE_ERROR(InvalidArgumentError, invalid_argument)
REMAT_ALLOC_DEFINE_ERROR(ConfigError, config)
REMAT_ALLOC_DEFINE_ERROR(OutOfMemoryError, out_of_memory)
REMAT_ALLOC_DEFINE_ERROR(InvalidPointerError, invalid_pointer)
REMAT_ALLOC_DEFINE_ERROR(TagStackError, tag_stack)
REMAT_ALLOC_DEFINE_ERROR(IoError, io)
REMAT_ALLOC_DEFINE_ERROR(BackendError, backend)
REMAT_ALLOC_DEFINE_ERROR(StateError, state)

#undef REMAT_ALLOC_DEFINE_ERROR

}  // namespace remat::alloc
