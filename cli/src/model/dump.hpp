#pragma once
// In-memory form of the dumps remat-report reads. Field meanings follow
// schemas/snapshot.schema.json and schemas/trace.schema.json.

#include <remat/alloc/names.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::report {

// The fields every dump kind starts with.
struct DumpHeader {
  std::string kind;
  std::int64_t schema_version = 0;
  std::string producer;
  std::string created_at;
  std::string host;
  std::uint64_t pid = 0;
  std::uint64_t rank = 0;
  std::uint64_t device = 0;
};

// The dumps' vocabulary is the allocator's: its enums, and their names from its to_string.
using alloc::Policy;
using alloc::Phase;
using Action = alloc::TraceAction;
using alloc::BlockState;
inline constexpr int kActionCount = alloc::kTraceActionCount;

struct RecvSlot {
  std::uint64_t stage = 0;
  char direction = 'F';
  std::uint64_t slot = 0;
};

struct Tag {
  std::uint32_t region = 0;  // index into names
  Policy policy = Policy::none;
  Phase phase = Phase::other;
  std::uint32_t site = 0;  // index into names
  std::optional<RecvSlot> recv;
  std::uint32_t label = 0;  // index into names: the process-wide label (PyTorch's user_metadata)
  std::uint8_t category = 0;  // an alloc::Category (0: none), as remat_alloc.track sets it
  std::uint32_t module = 0;   // index into names: the module path the category belongs to
};

// A tag's category by name ("" for none, which dumps leave out), and back (0 for a name that is
// none or no category).
inline std::string_view category_name(std::uint8_t category) {
  return category == 0 || category >= alloc::kCategoryCount ? std::string_view()
                                                             : alloc::to_string(static_cast<alloc::Category>(category));
}
inline std::uint8_t category_index(std::string_view name) {
  return static_cast<std::uint8_t>(alloc::from_name<alloc::Category>(name).value_or(alloc::Category::none));
}

// Interned names and tags as written once per dump. Index 0 of each is "untagged".
struct TagTable {
  std::vector<std::string> names;
  std::vector<Tag> tags;

  std::string_view region(std::uint32_t tag) const { return names[tags[tag].region]; }
  std::string_view site(std::uint32_t tag) const { return names[tags[tag].site]; }
  std::string_view label(std::uint32_t tag) const { return names[tags[tag].label]; }
  std::string_view category(std::uint32_t tag) const { return category_name(tags[tag].category); }
  std::string_view module(std::uint32_t tag) const { return names[tags[tag].module]; }
};

struct Event {
  Action action = Action::alloc;
  std::int64_t time_us = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint32_t tag = 0;
  // alloc and oom: the bytes the caller asked for, where the input records it (else 0); `size`
  // is the block handed out.
  std::uint64_t requested = 0;
};

struct Stat {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t total = 0;
};

struct TagStat {
  std::uint32_t tag = 0;
  Stat bytes;
  Stat requested_bytes;
  Stat count;
};

struct Block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  BlockState state = BlockState::inactive;
  std::uint32_t tag = 0;
};

struct Segment {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t stream = 0;
  bool small = false;
  bool expandable = false;  // grown and shrunk at its end; total_size is what is mapped now
  std::uint64_t allocated_size = 0;
  std::uint64_t active_size = 0;
  std::uint64_t requested_size = 0;
  std::vector<Block> blocks;
};

struct AllocatorConfig {
  std::string backend;
  std::uint64_t host_capacity_mb = 0;
  std::optional<std::uint64_t> max_split_size_mb;
  double memory_fraction = 1.0;
  std::uint64_t trace_entries = 0;
  std::string oom_dump_dir;
  bool tagging = true;
  std::string text;
};

struct AllocatorStats {
  Stat allocated_bytes;
  Stat requested_bytes;
  Stat active_bytes;
  Stat reserved_bytes;
  Stat allocations;
  Stat segments;
  std::uint64_t num_ooms = 0;
  std::uint64_t num_alloc_retries = 0;
  std::uint64_t num_invalid_frees = 0;
};

struct Snapshot {
  DumpHeader header;
  AllocatorConfig config;
  std::uint64_t device_free_bytes = 0;
  std::uint64_t device_total_bytes = 0;
  AllocatorStats stats;
  TagTable tags;
  std::vector<TagStat> tag_stats;
  std::vector<Segment> segments;
  std::uint64_t trace_capacity = 0;
  std::uint64_t trace_dropped = 0;
  std::vector<Event> events;
};

// The header line of a JSON Lines trace.
struct TraceHeader {
  DumpHeader header;
  // The recording allocator's settings (absent in traces written before they were recorded, and
  // in other producers' traces).
  std::optional<AllocatorConfig> config;
  TagTable tags;
  std::optional<std::uint64_t> event_count;
  // Records the ring overwrote before the first event (absent in traces from other producers).
  std::optional<std::uint64_t> dropped_records;
};

using alloc::to_string;
inline std::optional<Policy> policy_from(std::string_view text) { return alloc::from_name<Policy>(text); }
inline std::optional<Phase> phase_from(std::string_view text) { return alloc::from_name<Phase>(text); }
inline std::optional<Action> action_from(std::string_view text) { return alloc::from_name<Action>(text); }
inline std::optional<BlockState> block_state_from(std::string_view text) { return alloc::from_name<BlockState>(text); }

}  // namespace remat::report
