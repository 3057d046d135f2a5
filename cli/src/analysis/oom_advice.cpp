#include "analysis/oom_advice.hpp"

#include "core/format.hpp"

#include <remat/alloc/size_classes.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace remat::report {

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kLeastLargeSegmentMb = 10;  // the least large_segment_size_mb the allocator takes

// Sums of report fields saturate: a report's numbers may be anything, and a sum that wrapped
// would advise a setting far too small to help.
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

std::uint64_t whole_mib_above(std::uint64_t bytes) { return bytes / kMiB + (bytes % kMiB != 0 ? 1 : 0); }

double share_of(std::uint64_t part, std::uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

// The value of `key` in a `key:value,key:value` configuration, or empty.
std::string config_value(const std::string& config, std::string_view key) {
  std::size_t at = 0;
  while (at < config.size()) {
    std::size_t end = config.find(',', at);
    if (end == std::string::npos) end = config.size();
    const std::string_view entry(config.data() + at, end - at);
    if (entry.size() > key.size() && entry.substr(0, key.size()) == key && entry[key.size()] == ':') {
      return std::string(entry.substr(key.size() + 1));
    }
    at = end + 1;
  }
  return {};
}

}  // namespace

std::string_view to_string(SuggestionKind kind) {
  switch (kind) {
    case SuggestionKind::request_exceeds_device: return "request_exceeds_device";
    case SuggestionKind::raise_memory_fraction: return "raise_memory_fraction";
    case SuggestionKind::empty_cache: return "empty_cache";
    case SuggestionKind::fragmentation: return "fragmentation";
    case SuggestionKind::recompute_region: return "recompute_region";
    case SuggestionKind::reduce_batch: return "reduce_batch";
  }
  return "unknown";
}

std::vector<Suggestion> suggest(const OomNumbers& n, const std::vector<OomHolder>& regions, const std::string& config,
                                const OomContext& context) {
  std::vector<Suggestion> out;
  const std::string_view conf = context.pytorch_allocator ? "PYTORCH_CUDA_ALLOC_CONF" : "REMAT_ALLOC_CONF";
  // What the allocator must place: the request after rounding.
  const std::uint64_t need = std::max(n.rounded_bytes, n.requested_bytes);

  if (n.cause == alloc::OomCause::request_exceeds_device || (n.memory.total_bytes > 0 && need > n.memory.total_bytes)) {
    if (n.memory.total_bytes > 0 && need <= kLeastLargeSegmentMb * kMiB && n.segment_bytes > n.memory.total_bytes) {
      // The request fits; the segment it goes into does not: requests of 1 to 10 MiB share
      // segments of large_segment_size_mb (20 by default, 10 at least)
      // (PyTorch's own allocator has no such setting: its shared segments are 20 MiB)
      const bool smaller_fits = !context.pytorch_allocator && kLeastLargeSegmentMb * kMiB <= n.memory.total_bytes;
      out.push_back({SuggestionKind::request_exceeds_device,
                     fmt::format("the request ({}) goes into a {} segment, larger than the whole device ({}): {}",
                                 human_bytes(need), human_bytes(n.segment_bytes), human_bytes(n.memory.total_bytes),
                                 smaller_fits ? fmt::format("set REMAT_ALLOC_CONF=large_segment_size_mb:{} (the "
                                                            "segment requests of 1 to 10 MiB share)",
                                                            kLeastLargeSegmentMb)
                                 : context.pytorch_allocator
                                     ? "PyTorch's allocator has no setting that makes that segment smaller; shrink "
                                       "what sizes the tensor (batch size, sequence length)"
                                     : "no setting makes that segment smaller than 10 MiB; shrink what "
                                       "sizes the tensor (batch size, sequence length)"),
                     std::nullopt, smaller_fits ? fmt::format("large_segment_size_mb:{}", kLeastLargeSegmentMb) : "",
                     ""});
      return out;
    }
    const std::string placed =
        n.segment_bytes > need ? fmt::format(" in its {} segment", human_bytes(n.segment_bytes)) : std::string();
    out.push_back({SuggestionKind::request_exceeds_device,
                   fmt::format("the request alone ({}{}) is larger than the whole device ({}): no cache setting or "
                               "recompute makes it fit; split the tensor or shrink what sizes it (batch size, "
                               "sequence length)",
                               human_bytes(need), placed, human_bytes(n.memory.total_bytes)),
                   std::nullopt, "", ""});
    return out;  // nothing else can help a request the device cannot hold
  }

  // Under a memory_fraction cap the cap is the capacity; older reports without a cause count
  // as capped when the segment would have passed the cap.
  const bool capped = n.cause == alloc::OomCause::memory_fraction_cap ||
                      (!n.cause && n.reserved_limit_bytes > 0 &&
                       saturating_add(n.reserved_bytes, n.segment_bytes) > n.reserved_limit_bytes);
  if (capped && n.memory.total_bytes > 0) {
    // What must fit under the cap: what stays reserved plus the new segment.
    const std::uint64_t must_fit =
        saturating_add(n.reserved_bytes - std::min(n.reserved_bytes, n.releasable_bytes), n.segment_bytes);
    const double needed = std::ceil(100.0 * share_of(must_fit, n.memory.total_bytes)) / 100.0;
    const std::string cap_text =
        fmt::format("memory_fraction:{} caps reserved memory at {} bytes ({}), {} were reserved and the request "
                    "needed a {} segment, while the device had {} free",
                    n.memory_fraction, n.reserved_limit_bytes, human_bytes(n.reserved_limit_bytes),
                    human_bytes(n.reserved_bytes), human_bytes(n.segment_bytes), human_bytes(n.memory.free_bytes));
    if (needed <= 1.0) {
      out.push_back({SuggestionKind::raise_memory_fraction,
                     context.pytorch_allocator
                         ? fmt::format("the memory_fraction cap was reached: {}; raise it to at least {:.2f} "
                                       "(torch.cuda.set_per_process_memory_fraction({:.2f}))",
                                       cap_text, needed, needed)
                         : fmt::format("the memory_fraction cap was reached: {}; raise memory_fraction to at least "
                                       "{:.2f} (REMAT_ALLOC_CONF=memory_fraction:{:.2f}, or "
                                       "torch.cuda.set_per_process_memory_fraction({:.2f}))",
                                       cap_text, needed, needed, needed),
                     std::nullopt, fmt::format("memory_fraction:{:.2f}", needed), ""});
    } else {
      out.push_back({SuggestionKind::raise_memory_fraction,
                     fmt::format("the memory_fraction cap was reached: {}; even memory_fraction:1 would not hold "
                                 "the {} needed, so free memory as well",
                                 cap_text, human_bytes(must_fit)),
                     std::nullopt, "memory_fraction:1", ""});
    }
  }

  if (need > 0 && n.releasable_bytes >= need) {
    out.push_back({SuggestionKind::empty_cache,
                   fmt::format("empty-cache would have freed {} in whole cached segments (enough for this request "
                               "of {}): call empty_cache before the step that fails",
                               human_bytes(n.releasable_bytes), human_bytes(need)),
                   n.releasable_bytes, "", ""});
  }

  // Only the free blocks of the request's own pool can hold it (a report without the pool's
  // figures gives those of both pools: cached_free_bytes counts every free cached byte).
  const bool by_pool = n.request_pool.has_value();
  // max_split_size_mb keeps blocks of at least 20 MiB whole for requests as large. It cannot help
  // a request of the small pool (at most 1 MiB; its 2 MiB segments are always split), nor one under
  // 10 MiB, which goes into the segments of large_segment_size_mb that such requests share and split
  const bool small_request = by_pool ? n.request_pool->small : need <= alloc::kSmallRequestLimit;
  const bool shares_segments = need < alloc::kMinLargeAlloc;
  const std::uint64_t pool_free = by_pool ? n.request_pool->free_bytes : n.cached_free_bytes;
  const std::uint64_t pool_fragmented = by_pool ? n.request_pool->fragmented_free_bytes : n.fragmented_free_bytes;
  const std::uint64_t pool_split_blocks =
      by_pool ? n.request_pool->free_blocks_in_split_segments : n.free_blocks_in_split_segments;
  const std::uint64_t mb = std::max(kMinMaxSplitSizeMb, whole_mib_above(need));
  const std::string now = config_value(config, "max_split_size_mb");
  // Set to that or less already, it changes nothing: blocks of the request's size are not split then
  const bool set_already = !now.empty() && now.find_first_not_of("0123456789") == std::string::npos &&
                           now.size() < 19 && std::stoull(now) <= mb;
  if (!small_request && !shares_segments && n.largest_free_block < need && pool_free >= need && pool_fragmented > 0 &&
      n.releasable_bytes < need && mb <= kMaxMaxSplitSizeMb && !set_already) {
    out.push_back({SuggestionKind::fragmentation,
                   fmt::format("the largest free block ({}) is smaller than the request ({}) although {} sit cached "
                               "and free{}, {} of them in {} free block(s) inside split segments: set "
                               "{}=max_split_size_mb:{} so blocks this large are not split{}",
                               human_bytes(n.largest_free_block), human_bytes(need), human_bytes(pool_free),
                               by_pool ? fmt::format(" in the {} pool", n.request_pool->small ? "small" : "large")
                                       : std::string(),
                               human_bytes(pool_fragmented), pool_split_blocks, conf, mb,
                               now.empty() ? "" : fmt::format(" (now {})", now)),
                   pool_fragmented, fmt::format("max_split_size_mb:{}", mb), ""});
  }

  const auto most_saved = std::max_element(regions.begin(), regions.end(), [](const OomHolder& a, const OomHolder& b) {
    return a.saved_bytes < b.saved_bytes;
  });
  if (most_saved != regions.end() && most_saved->saved_bytes > 0) {
    out.push_back({SuggestionKind::recompute_region,
                   fmt::format("switch region {} to recompute: frees up to {} it keeps saved for backward ({} of "
                               "allocated; the request needs {}{})",
                               most_saved->name, human_bytes(most_saved->saved_bytes),
                               percent(share_of(most_saved->saved_bytes, n.allocated_bytes)), human_bytes(need),
                               most_saved->saved_bytes >= need ? ", no more than this frees" : ""),
                   most_saved->saved_bytes, "", most_saved->name});
  }

  const std::uint64_t capacity = capped ? n.reserved_limit_bytes : n.memory.total_bytes;
  // Where the memory carries categories: what a smaller batch or more recompute can free at all
  std::uint64_t model_state = 0;  // parameters, gradients and optimizer state: the batch sizes none of it
  for (const OomHolder& category : context.categories) {
    if (category.name == "parameter" || category.name == "gradient" || category.name == "optimizer_state") {
      model_state = saturating_add(model_state, category.bytes);
    }
  }
  const bool near_capacity = capacity > 0 && share_of(n.allocated_bytes, capacity) >= kNearCapacityShare;
  if (near_capacity && share_of(model_state, n.allocated_bytes) >= kNearCapacityShare) {
    out.push_back({SuggestionKind::reduce_batch,
                   fmt::format("allocated ({}) is {} of the {} ({}), and parameters, gradients and optimizer state "
                               "hold {} of it: a smaller batch or more recompute frees little; shard or offload the "
                               "optimizer state (or the model), or take an optimizer that keeps less state",
                               human_bytes(n.allocated_bytes), percent(share_of(n.allocated_bytes, capacity)),
                               capped ? "memory_fraction cap" : "device", human_bytes(capacity),
                               percent(share_of(model_state, n.allocated_bytes))),
                   std::nullopt, "", ""});
  } else if (near_capacity) {
    out.push_back({SuggestionKind::reduce_batch,
                   fmt::format("allocated ({}) is {} of the {} ({}): lower the batch size or recompute more regions",
                               human_bytes(n.allocated_bytes), percent(share_of(n.allocated_bytes, capacity)),
                               capped ? "memory_fraction cap" : "device", human_bytes(capacity)),
                   std::nullopt, "", ""});
  }
  return out;
}

}  // namespace remat::report
