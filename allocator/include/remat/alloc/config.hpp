#pragma once
// Allocator configuration, parsed from REMAT_ALLOC_CONF-style text ("key:value,key:value").

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace remat::alloc {

enum class BackendKind : std::uint8_t { automatic, cuda, host };

struct Config {
  static constexpr std::size_t kMiB = std::size_t{1} << 20;
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  BackendKind backend = BackendKind::automatic;  // cuda where a GPU is visible, else host
  std::size_t host_capacity_bytes = 4096 * kMiB;
  std::size_t max_split_size_bytes = kUnlimited;  // blocks at least this large are never split
  double memory_fraction = 1.0;                   // cap on reserved bytes, as a share of device total
  std::size_t trace_entries = 16384;              // trace ring size; 0 switches tracing off
  std::string oom_dump_dir;                       // where OOM reports go; empty = REMAT_OOM_DUMP_DIR
  bool tagging = true;                            // off: every block is untagged (tag 0)
  std::size_t oom_dump_interval_ms = 10000;       // at most one OOM report per interval
  // PyTorch's roundup_power2_divisions: for requests in [2^(20+i), 2^(21+i)) bytes (i = 0..15,
  // the last interval open-ended; below 1 MiB interval 0 applies), round up to one of this many
  // equal steps between two powers of two; 0 or 1 = 512 B rounding only.
  static constexpr std::size_t kRoundUpIntervals = 16;
  std::array<std::size_t, kRoundUpIntervals> roundup_power2_divisions{};
  // PyTorch's expandable_segments: one segment per stream and pool, grown at its end by
  // mapping more memory and shrunk from its end by empty_cache, instead of fixed segments.
  bool expandable_segments = false;
  // PyTorch's max_non_split_rounding_mb: a request of at least max_split_size takes an
  // unsplittable cached block only if the block is less than this much larger.
  std::size_t max_non_split_rounding_bytes = 20 * kMiB;
  // PyTorch's garbage_collection_threshold: with memory_fraction below 1, once reserved bytes
  // pass this share of the cap, a request that finds no cached block first frees the cached
  // segments idle longest until reserved is back under it. 0 switches it off.
  double garbage_collection_threshold = 0.0;
  // PyTorch's large_segment_size_mb: the segment that requests from 1 MiB to 10 MiB share,
  // and the growth step of an expandable segment's large pool.
  std::size_t large_segment_size_bytes = 20 * kMiB;

  // Applies every key in `text` on top of `base`. Throws ConfigError naming the key, the
  // value and what is accepted. `source` names the text's origin in messages.
  static Config parse(std::string_view text, Config base, std::string_view source = "REMAT_ALLOC_CONF");

  // PyTorch's PYTORCH_CUDA_ALLOC_CONF text ("key:value,...", lists in brackets as in
  // roundup_power2_divisions:[256:1,512:2]) applied on top of `base`: the keys that mean
  // something here apply (max_split_size_mb, roundup_power2_divisions, expandable_segments,
  // max_non_split_rounding_mb, garbage_collection_threshold, large_segment_size_mb;
  // per_process_memory_fraction as memory_fraction; backend:native, PyTorch's own caching
  // allocator, is what this allocator is), and the keys
  // only PyTorch's allocator implements are appended to `not_applied` as "key:value". Throws
  // ConfigError for a bad value of an applied key, a malformed item and a key PyTorch does not have.
  static Config parse_pytorch(std::string_view text, Config base, std::vector<std::string>& not_applied,
                              std::string_view source = "PYTORCH_CUDA_ALLOC_CONF");

  // REMAT_ALLOC_CONF, or PyTorch's settings when it is unset (PYTORCH_ALLOC_CONF, else
  // PYTORCH_CUDA_ALLOC_CONF, in PyTorch's order of precedence), over the defaults; `notice`
  // gets the line to print for a job (empty when there is nothing to say): the PyTorch keys not
  // applied, or that PyTorch's variable is not read because REMAT_ALLOC_CONF wins.
  static Config from_environment(std::string& notice);
  // The same, printing the notice on stderr.
  static Config from_environment();

  // The canonical "key:value,..." form; parse(to_string()) round-trips.
  std::string to_string() const;
};

std::string_view to_string(BackendKind kind);

}  // namespace remat::alloc
