#include "reader/dump_reader.hpp"

#include "core/errors.hpp"
#include "reader/event_checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace remat::report {

using json::member;

DumpHeader read_dump_header(json::object root, const JsonPath& path) {
  DumpHeader header;
  header.kind = json::string_field(root, "kind", path);
  header.schema_version = json::i64_field(root, "schema_version", path);
  header.producer = json::string_field(root, "producer", path);
  header.created_at = json::string_field(root, "created_at", path);
  header.host = json::string_field(root, "host", path);
  header.pid = json::u64_field(root, "pid", path);
  header.rank = json::u64_field(root, "rank", path);
  header.device = json::u64_field(root, "device", path);
  return header;
}

namespace {

Tag read_tag(json::element value, const JsonPath& path, std::size_t name_count) {
  const json::object object = json::as_object(value, path);
  Tag tag;
  tag.region = json::as_index(member(object, "region", path), path.key("region"), name_count, "names");
  tag.site = json::as_index(member(object, "site", path), path.key("site"), name_count, "names");
  if (const auto label = json::optional_member(object, "label")) {  // absent in dumps without labels
    tag.label = json::as_index(*label, path.key("label"), name_count, "names");
  }
  if (json::optional_member(object, "category")) {  // absent in dumps without categories
    const std::string_view category = json::string_field(object, "category", path);
    const auto known = alloc::from_name<alloc::Category>(category);
    if (!known || *known == alloc::Category::none) {
      throw InputError(path.key("category").str(),
                       fmt::format("unknown category '{}'; expected parameter, gradient, optimizer_state, activation, "
                                   "temporary, input or other",
                                   printable(category)));
    }
    tag.category = static_cast<std::uint8_t>(*known);
  }
  if (const auto module = json::optional_member(object, "module")) {
    tag.module = json::as_index(*module, path.key("module"), name_count, "names");
  }
  const JsonPath policy_path = path.key("policy");
  const std::string_view policy = json::string_field(object, "policy", path);
  if (auto p = policy_from(policy))
    tag.policy = *p;
  else
    throw InputError(policy_path.str(),
                     fmt::format("unknown policy '{}'; expected none, save or recompute", printable(policy)));
  const JsonPath phase_path = path.key("phase");
  const std::string_view phase = json::string_field(object, "phase", path);
  if (auto p = phase_from(phase))
    tag.phase = *p;
  else
    throw InputError(phase_path.str(), fmt::format("unknown phase '{}'; expected other, forward, recompute, backward or offloaded",
                                                   printable(phase)));
  const JsonPath recv_path = path.key("recv");
  const json::element recv = member(object, "recv", path);
  if (!json::is_null(recv)) {
    const json::object r = json::as_object(recv, recv_path);
    RecvSlot slot;
    slot.stage = json::u64_field(r, "stage", recv_path);
    slot.slot = json::u64_field(r, "slot", recv_path);
    const JsonPath direction_path = recv_path.key("direction");
    const std::string_view direction = json::string_field(r, "direction", recv_path);
    if (direction != "F" && direction != "B") {
      throw InputError(direction_path.str(),
                       fmt::format("unknown direction '{}'; expected F or B", printable(direction)));
    }
    slot.direction = direction[0];
    tag.recv = slot;
  }
  return tag;
}

}  // namespace

TagTable read_tag_table(json::object root, const JsonPath& path) {
  TagTable table;
  const JsonPath names_path = path.key("names");
  const json::array names = json::as_array(member(root, "names", path), names_path);
  std::size_t i = 0;
  for (json::element name : names) table.names.emplace_back(json::as_string(name, names_path.index(i++)));
  if (table.names.empty()) throw InputError(names_path.str(), "must hold at least the empty name at index 0");
  if (!table.names[0].empty()) {
    throw InputError(names_path.index(0).str(),
                     fmt::format("must be the empty name, found '{}': index 0 stands for no name (untagged memory, "
                                 "no site)",
                                 printable(table.names[0])));
  }
  const JsonPath tags_path = path.key("tags");
  const json::array tags = json::as_array(member(root, "tags", path), tags_path);
  i = 0;
  for (json::element tag : tags) {
    table.tags.push_back(read_tag(tag, tags_path.index(i), table.names.size()));
    ++i;
  }
  if (table.tags.empty()) throw InputError(tags_path.str(), "must hold at least the untagged tag at index 0");
  return table;
}

Stat read_stat(json::element value, const JsonPath& path) {
  const json::object object = json::as_object(value, path);
  Stat stat;
  stat.current = json::u64_field(object, "current", path);
  stat.peak = json::u64_field(object, "peak", path);
  stat.total = json::u64_field(object, "total", path);
  if (stat.peak < stat.current) {
    throw InputError(path.key("peak").str(),
                     fmt::format("peak {} is below current {}: a peak is the highest value current has reached, so "
                                 "at least current; the dump is corrupt (regenerate it)",
                                 stat.peak, stat.current));
  }
  return stat;
}

Event read_event(json::element value, const JsonPath& path, std::size_t tag_count) {
  const json::object object = json::as_object(value, path);
  Event event;
  const JsonPath action_path = path.key("action");
  const std::string_view action = json::string_field(object, "action", path);
  if (auto a = action_from(action))
    event.action = *a;
  else {
    throw InputError(action_path.str(),
                     fmt::format("unknown action '{}'; expected alloc, free_requested, free_completed, "
                                 "segment_alloc, segment_free or oom",
                                 printable(action)));
  }
  event.time_us = json::i64_field(object, "time_us", path);
  event.address = json::u64_field(object, "address", path);
  event.size = json::u64_field(object, "size", path);
  event.stream = json::u64_field(object, "stream", path);
  event.tag = json::as_index(member(object, "tag", path), path.key("tag"), tag_count, "tags");
  if (const auto requested = json::optional_member(object, "requested")) {
    event.requested = json::as_u64(*requested, path.key("requested"));
  }
  return event;
}

namespace {

Block read_block(json::element value, const JsonPath& path, std::size_t tag_count) {
  const json::object object = json::as_object(value, path);
  Block block;
  block.address = json::u64_field(object, "address", path);
  block.size = json::u64_field(object, "size", path);
  block.requested_size = json::u64_field(object, "requested_size", path);
  const JsonPath state_path = path.key("state");
  const std::string_view state = json::string_field(object, "state", path);
  if (auto s = block_state_from(state))
    block.state = *s;
  else {
    throw InputError(state_path.str(), fmt::format("unknown block state '{}'; expected active_allocated, "
                                                   "active_pending_free or inactive",
                                                   printable(state)));
  }
  block.tag = json::as_index(member(object, "tag", path), path.key("tag"), tag_count, "tags");
  if (block.requested_size > block.size) {
    throw InputError(path.key("requested_size").str(),
                     fmt::format("requested_size {} exceeds the block size {}", block.requested_size, block.size));
  }
  return block;
}

Segment read_segment(json::element value, const JsonPath& path, std::size_t tag_count) {
  const json::object object = json::as_object(value, path);
  Segment segment;
  segment.address = json::u64_field(object, "address", path);
  segment.total_size = json::u64_field(object, "total_size", path);
  segment.stream = json::u64_field(object, "stream", path);
  const JsonPath type_path = path.key("segment_type");
  const std::string_view type = json::string_field(object, "segment_type", path);
  if (type != "small" && type != "large") {
    throw InputError(type_path.str(),
                     fmt::format("unknown segment_type '{}'; expected small or large", printable(type)));
  }
  segment.small = type == "small";
  if (const auto expandable = json::optional_member(object, "is_expandable")) {
    segment.expandable = json::as_bool(*expandable, path.key("is_expandable"));
  }
  segment.allocated_size = json::u64_field(object, "allocated_size", path);
  segment.active_size = json::u64_field(object, "active_size", path);
  segment.requested_size = json::u64_field(object, "requested_size", path);
  std::uint64_t segment_end = 0;
  if (__builtin_add_overflow(segment.address, segment.total_size, &segment_end)) {
    throw InputError(path.key("total_size").str(), fmt::format("{} bytes at 0x{:x} end past the 64-bit address space",
                                                               segment.total_size, segment.address));
  }
  const JsonPath blocks_path = path.key("blocks");
  std::size_t i = 0;
  std::uint64_t covered = 0;
  for (json::element block : json::as_array(member(object, "blocks", path), blocks_path)) {
    const JsonPath block_path = blocks_path.index(i++);
    segment.blocks.push_back(read_block(block, block_path, tag_count));
    const Block& b = segment.blocks.back();
    if (b.address < segment.address || b.address - segment.address != covered) {
      throw InputError(block_path.key("address").str(),
                       fmt::format("block at 0x{:x} does not follow the previous block (expected 0x{:x})", b.address,
                                   segment.address + covered));
    }
    if (__builtin_add_overflow(covered, b.size, &covered) || covered > segment.total_size) {
      throw InputError(block_path.key("size").str(),
                       fmt::format("blocks extend past the segment's total_size {}", segment.total_size));
    }
  }
  return segment;
}

}  // namespace

SegmentChecks::SegmentChecks(const JsonPath& segments_path) : path_(segments_path) {}

Segment SegmentChecks::read(json::element value, std::size_t tag_count) {
  const JsonPath segment_path = path_.index(ranges_.size());
  Segment segment = read_segment(value, segment_path, tag_count);
  if (__builtin_add_overflow(reserved_, segment.total_size, &reserved_)) {
    throw InputError(segment_path.key("total_size").str(),
                     "the segments' sizes add up to more than 2^64 - 1 bytes: the snapshot is corrupt");
  }
  ranges_.push_back({segment.address, segment.total_size});
  return segment;
}

// Segments that overlap (or repeat an address) would count reserved and allocated bytes twice.
void SegmentChecks::finish() const {
  const auto overlap = first_overlap(ranges_);
  if (!overlap) return;
  const auto [later, other] = *overlap;
  throw InputError(path_.index(later).key("address").str(),
                   fmt::format("segment at 0x{:x} ({} bytes) overlaps segments[{}] at 0x{:x} ({} bytes): segments "
                               "must not share bytes, or reserved memory is counted twice; the snapshot is corrupt "
                               "(regenerate it)",
                               ranges_[later].address, ranges_[later].size, other, ranges_[other].address,
                               ranges_[other].size));
}

Event read_checked_event(json::element value, const JsonPath& path, std::size_t tag_count, EventChecker& checker) {
  Event event = read_event(value, path, tag_count);
  try {
    checker.check(event);
  } catch (const InputError& error) {
    throw InputError(path.str(), error.what());
  }
  return event;
}

namespace {

AllocatorConfig read_config(json::element value, const JsonPath& path) {
  const json::object object = json::as_object(value, path);
  AllocatorConfig config;
  config.backend = json::string_field(object, "backend", path);
  config.host_capacity_mb = json::u64_field(object, "host_capacity_mb", path);
  const json::element split = member(object, "max_split_size_mb", path);
  if (!json::is_null(split)) config.max_split_size_mb = json::as_u64(split, path.key("max_split_size_mb"));
  config.memory_fraction = json::as_number(member(object, "memory_fraction", path), path.key("memory_fraction"));
  config.trace_entries = json::u64_field(object, "trace_entries", path);
  config.oom_dump_dir = json::string_field(object, "oom_dump_dir", path);
  config.tagging = json::as_bool(member(object, "tagging", path), path.key("tagging"));
  config.text = json::string_field(object, "text", path);
  return config;
}

AllocatorStats read_stats(json::element value, const JsonPath& path) {
  const json::object o = json::as_object(value, path);
  AllocatorStats s;
  s.allocated_bytes = read_stat(member(o, "allocated_bytes", path), path.key("allocated_bytes"));
  s.requested_bytes = read_stat(member(o, "requested_bytes", path), path.key("requested_bytes"));
  s.active_bytes = read_stat(member(o, "active_bytes", path), path.key("active_bytes"));
  s.reserved_bytes = read_stat(member(o, "reserved_bytes", path), path.key("reserved_bytes"));
  s.allocations = read_stat(member(o, "allocations", path), path.key("allocations"));
  s.segments = read_stat(member(o, "segments", path), path.key("segments"));
  s.num_ooms = json::u64_field(o, "num_ooms", path);
  s.num_alloc_retries = json::u64_field(o, "num_alloc_retries", path);
  s.num_invalid_frees = json::u64_field(o, "num_invalid_frees", path);
  return s;
}

}  // namespace

Snapshot read_snapshot(json::object root) {
  const JsonPath path;
  Snapshot snapshot;
  snapshot.header = read_dump_header(root, path);
  snapshot.config = read_config(member(root, "config", path), path.key("config"));
  const JsonPath memory_path = path.key("device_memory");
  const json::object memory = json::as_object(member(root, "device_memory", path), memory_path);
  snapshot.device_free_bytes = json::u64_field(memory, "free_bytes", memory_path);
  snapshot.device_total_bytes =
      json::u64_field(memory, "total_bytes", memory_path);
  snapshot.stats = read_stats(member(root, "stats", path), path.key("stats"));
  snapshot.tags = read_tag_table(root, path);
  const std::size_t tag_count = snapshot.tags.tags.size();

  const JsonPath tag_stats_path = path.key("tag_stats");
  std::size_t i = 0;
  // Views add these up across tags; so must they fit in 64 bits.
  std::uint64_t current_sum = 0, peak_sum = 0, count_sum = 0;
  std::vector<std::size_t> listed_at(tag_count, 0);  // by tag: 1 + its entry's index, 0 where not listed
  for (json::element entry : json::as_array(member(root, "tag_stats", path), tag_stats_path)) {
    const JsonPath entry_path = tag_stats_path.index(i++);
    const json::object o = json::as_object(entry, entry_path);
    TagStat stat;
    stat.tag = json::as_index(member(o, "tag", entry_path), entry_path.key("tag"), tag_count, "tags");
    if (listed_at[stat.tag] != 0) {
      throw InputError(entry_path.key("tag").str(),
                       fmt::format("tag {} is listed again (first at {}): each tag's figures come once, and the "
                                   "views add them up: the snapshot is corrupt",
                                   stat.tag, tag_stats_path.index(listed_at[stat.tag] - 1).str()));
    }
    listed_at[stat.tag] = i;
    stat.bytes = read_stat(member(o, "bytes", entry_path), entry_path.key("bytes"));
    stat.requested_bytes = read_stat(member(o, "requested_bytes", entry_path), entry_path.key("requested_bytes"));
    stat.count = read_stat(member(o, "count", entry_path), entry_path.key("count"));
    if (__builtin_add_overflow(current_sum, stat.bytes.current, &current_sum) ||
        __builtin_add_overflow(peak_sum, stat.bytes.peak, &peak_sum) ||
        __builtin_add_overflow(count_sum, stat.count.total, &count_sum)) {
      throw InputError(entry_path.str(),
                       "the tags' bytes or counts add up to more than 2^64 - 1: the snapshot is corrupt");
    }
    snapshot.tag_stats.push_back(stat);
  }

  const JsonPath segments_path = path.key("segments");
  SegmentChecks segments(segments_path);
  for (json::element segment : json::as_array(member(root, "segments", path), segments_path)) {
    snapshot.segments.push_back(segments.read(segment, tag_count));
  }
  segments.finish();

  const JsonPath trace_path = path.key("trace");
  const json::object trace = json::as_object(member(root, "trace", path), trace_path);
  snapshot.trace_capacity = json::u64_field(trace, "capacity", trace_path);
  snapshot.trace_dropped = json::u64_field(trace, "dropped", trace_path);
  const JsonPath events_path = trace_path.key("events");
  i = 0;
  EventChecker checker;
  for (json::element event : json::as_array(member(trace, "events", trace_path), events_path)) {
    snapshot.events.push_back(read_checked_event(event, events_path.index(i++), tag_count, checker));
  }
  return snapshot;
}

TraceHeader read_trace_header(json::object root) {
  const JsonPath path;
  TraceHeader header;
  header.header = read_dump_header(root, path);
  if (const auto config = json::optional_member(root, "config")) header.config = read_config(*config, path.key("config"));
  header.tags = read_tag_table(root, path);
  const json::element count = member(root, "event_count", path);
  if (!json::is_null(count)) header.event_count = json::as_u64(count, path.key("event_count"));
  if (const auto dropped = json::optional_member(root, "dropped_records")) {
    header.dropped_records = json::as_u64(*dropped, path.key("dropped_records"));
  }
  return header;
}

std::optional<std::pair<std::size_t, std::size_t>> first_overlap(const std::vector<AddressRange>& ranges) {
  std::vector<std::size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranges[a].address != ranges[b].address ? ranges[a].address < ranges[b].address : a < b;
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const AddressRange& before = ranges[order[i - 1]];
    const AddressRange& range = ranges[order[i]];
    if (range.address == before.address || range.address - before.address < before.size) {
      return std::pair{std::max(order[i - 1], order[i]), std::min(order[i - 1], order[i])};
    }
  }
  return std::nullopt;
}

}  // namespace remat::report
