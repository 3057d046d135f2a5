#pragma once
// Allocator configuration, parsed from REMAT_ALLOC_CONF-style text ("key:value,key:value").

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

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

  // Applies every key in `text` on top of `base`. Throws ConfigError naming the key, the
  // value and what is accepted. `source` names the text's origin in messages.
  static Config parse(std::string_view text, Config base, std::string_view source = "REMAT_ALLOC_CONF");

  // Config from the REMAT_ALLOC_CONF environment variable (defaults when unset).
  static Config from_environment();

  // The canonical "key:value,..." form; parse(to_string()) round-trips.
  std::string to_string() const;
};

std::string_view to_string(BackendKind kind);

}  // namespace remat::alloc
