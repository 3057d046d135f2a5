#pragma once

// The message of the torch.OutOfMemoryError raised for remat's allocator.

#include <string>
#include <string_view>

namespace remat::detail {

// PyTorch's first sentence ("CUDA out of memory."), which code that retries with a smaller batch
// looks for (accelerate's find_executable_batch_size, transformers.Trainer's
// auto_find_batch_size: " out of memory."), then the allocator's own account of the failure.
inline std::string torch_oom_message(std::string_view allocator_message, bool cuda) {
  constexpr std::string_view kLead = "out of memory on ";
  if (allocator_message.substr(0, kLead.size()) == kLead) allocator_message.remove_prefix(kLead.size());
  return std::string(cuda ? "CUDA" : "Host") + " out of memory. remat: " + std::string(allocator_message);
}

}  // namespace remat::detail
