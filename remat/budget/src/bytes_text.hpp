#pragma once
// A byte count in the budget module's messages: "1.19 MiB (1245184 bytes)".

#include <remat/alloc/bytes.hpp>

#include <cstdint>
#include <string>

namespace remat::budget {

inline std::string bytes_text(std::uint64_t bytes) {
  return alloc::format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

}  // namespace remat::budget
