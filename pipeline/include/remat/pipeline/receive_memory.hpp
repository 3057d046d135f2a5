#pragma once
// Receive-buffer memory as the tagging allocator sees it: live blocks tagged with a receive
// slot, by stage and direction, in this process.

#include <remat/pipeline/buffers.hpp>

#include <cstdint>
#include <vector>

namespace remat::pipeline {

struct ReceiveBufferUsage {
  int stage = 0;
  Direction direction = Direction::forward;
  int sets = 0;             // distinct receive slots with live blocks
  std::uint64_t bytes = 0;  // requested bytes of those blocks
};

// Ordered by stage, F before B; only stages and directions with live receive buffers.
std::vector<ReceiveBufferUsage> live_receive_buffers();

}  // namespace remat::pipeline
