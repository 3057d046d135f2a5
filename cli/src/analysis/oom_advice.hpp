#pragma once
// What to change after an out-of-memory error, computed from the numbers of the OOM report.
// Every suggestion cites the numbers it rests on; none is given that they do not support.

#include "model/reports.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::report {

enum class SuggestionKind : std::uint8_t {
  request_exceeds_device,  // the request alone is larger than the device
  raise_memory_fraction,   // the memory_fraction cap, not the device, stopped the request
  empty_cache,             // whole cached segments would cover the request
  fragmentation,           // enough is cached, but no free block is large enough
  recompute_region,        // a region keeps saved activations that recompute would free
  reduce_batch,            // allocated memory is close to the capacity (the cap, when one applied)
};

struct Suggestion {
  SuggestionKind kind;
  std::string message;                 // one line for people, citing the numbers
  std::optional<std::uint64_t> frees;  // bytes the change would free, where known
  std::string setting;                 // a configuration setting to apply, or empty
  std::string region;                  // the region it concerns, or empty
};

// Allocated at or above this share of the device counts as near capacity.
inline constexpr double kNearCapacityShare = 0.9;
// PyTorch and this allocator refuse max_split_size_mb values at or below 20.
inline constexpr std::uint64_t kMinMaxSplitSizeMb = 20;
// ... and values above 2^40 MiB (allocator/src/config.cpp): a request that would need more gets
// no max_split_size_mb advice.
inline constexpr std::uint64_t kMaxMaxSplitSizeMb = std::uint64_t{1} << 40;

// What else the advice reads from the report.
struct OomContext {
  // Written for PyTorch's own caching allocator (remat.attach_oom_observer on it): its settings
  // go in PYTORCH_CUDA_ALLOC_CONF, and it has no large_segment_size_mb.
  bool pytorch_allocator = false;
  std::vector<OomHolder> categories;  // held by category, where the memory carries them (remat.track)
};

std::vector<Suggestion> suggest(const OomNumbers& numbers, const std::vector<OomHolder>& regions,
                                const std::string& config, const OomContext& context = {});
std::string_view to_string(SuggestionKind kind);

}  // namespace remat::report
