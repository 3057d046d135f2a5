#pragma once
// Byte counts for people, in every message and report the producers write: "512 B",
// "3.00 KiB", "1.19 MiB", "2.00 GiB".

#include <cstdint>
#include <string>

namespace remat::alloc {

std::string format_bytes(std::uint64_t bytes);

}  // namespace remat::alloc
