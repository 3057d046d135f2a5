#pragma once
// Exceptions thrown by the allocator's C++ API. The C ABI turns each into a status code
// (see c_api.h) and keeps the message as the thread's last error.

#include "remat/alloc/c_api.h"

#include <stdexcept>
#include <string>

namespace remat::alloc {

// Each error: its exception type, its ErrorCode and the C ABI status it becomes (c_api.h holds
// the numbers, so the two cannot drift apart).
#define REMAT_ALLOC_ERRORS(X)                                           \
  X(InvalidArgumentError, invalid_argument, REMAT_ERR_INVALID_ARGUMENT) \
  X(ConfigError, config, REMAT_ERR_CONFIG)                              \
  X(OutOfMemoryError, out_of_memory, REMAT_ERR_OUT_OF_MEMORY)           \
  X(InvalidPointerError, invalid_pointer, REMAT_ERR_INVALID_POINTER)    \
  X(TagStackError, tag_stack, REMAT_ERR_TAG_STACK)                      \
  X(IoError, io, REMAT_ERR_IO)                                          \
  X(BackendError, backend, REMAT_ERR_BACKEND)                           \
  X(StateError, state, REMAT_ERR_STATE)

enum class ErrorCode : int {
#define REMAT_ALLOC_ERROR_CODE(Name, code_name, status) code_name = status,
  REMAT_ALLOC_ERRORS(REMAT_ALLOC_ERROR_CODE)
#undef REMAT_ALLOC_ERROR_CODE
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define REMAT_ALLOC_DEFINE_ERROR(Name, code_name, status)                               \
  class Name : public Error {                                                           \
   public:                                                                              \
    explicit Name(const std::string& message) : Error(ErrorCode::code_name, message) {} \
  };
REMAT_ALLOC_ERRORS(REMAT_ALLOC_DEFINE_ERROR)
#undef REMAT_ALLOC_DEFINE_ERROR
#undef REMAT_ALLOC_ERRORS

}  // namespace remat::alloc
