#include <remat/alloc/dump.hpp>
#include <remat/alloc/snapshot.hpp>

#include <string>

namespace remat::alloc {
namespace {

void write_tag_table(JsonWriter& json) {
  json.key("names").begin_array();
  for (const std::string& name : interned_names()) json.value(name);
  json.end_array();
  json.key("tags").begin_array();
  for (const Tag& tag : interned_tags()) {
    json.begin_object()
        .field("region", tag.region)
        .field("policy", to_string(tag.policy))
        .field("phase", to_string(tag.phase))
        .field("site", tag.site);
    if (tag.label != 0) json.field("label", tag.label);  // absent: no label, as in dumps from before labels
    // absent: no category or module, as in dumps from before categories
    if (tag.category != Category::none) json.field("category", to_string(tag.category));
    if (tag.module != 0) json.field("module", tag.module);
    json.key("recv");
    if (tag.has_recv) {
      const char direction[2] = {to_char(tag.recv.direction), '\0'};
      json.begin_object()
          .field("stage", tag.recv.stage)
          .field("direction", direction)
          .field("slot", tag.recv.slot)
          .end_object();
    } else {
      json.null();
    }
    json.end_object();
  }
  json.end_array();
}

// The settings the allocator ran under; `text` parses back into the same Config.
void write_config(JsonWriter& json, const AllocatorSnapshot& snapshot) {
  const Config& config = snapshot.config;
  json.key("config").begin_object()
      .field("backend", snapshot.backend)
      .field("host_capacity_mb", static_cast<std::uint64_t>(config.host_capacity_bytes / Config::kMiB));
  json.key("max_split_size_mb");
  if (config.max_split_size_bytes == Config::kUnlimited) json.null();
  else json.value(static_cast<std::uint64_t>(config.max_split_size_bytes / Config::kMiB));
  json.field("memory_fraction", config.memory_fraction)
      .field("trace_entries", static_cast<std::uint64_t>(config.trace_entries))
      .field("oom_dump_dir", config.oom_dump_dir)
      .field("tagging", config.tagging)
      .field("expandable_segments", config.expandable_segments);
  json.key("roundup_power2_divisions").begin_array();
  for (const std::size_t divisions : config.roundup_power2_divisions) json.value(static_cast<std::uint64_t>(divisions));
  json.end_array();
  json.field("max_non_split_rounding_mb", static_cast<std::uint64_t>(config.max_non_split_rounding_bytes / Config::kMiB))
      .field("garbage_collection_threshold", config.garbage_collection_threshold)
      .field("large_segment_size_mb", static_cast<std::uint64_t>(config.large_segment_size_bytes / Config::kMiB))
      .field("text", config.to_string())
      .end_object();
}

void write_event(JsonWriter& json, const TraceEvent& event) {
  json.begin_object()
      .field("action", to_string(event.action))
      .field("time_us", event.time_us)
      .field("address", event.address)
      .field("size", event.size)
      .field("stream", static_cast<std::uint64_t>(event.stream))
      .field("tag", event.tag);
  if (event.requested != 0) json.field("requested", event.requested);
  json.end_object();
}

void write_stat(JsonWriter& json, std::string_view name, const Stat& stat) {
  json.key(name).begin_object().field("current", stat.current).field("peak", stat.peak).field("total", stat.total_added);
  json.end_object();
}

}  // namespace

std::string snapshot_to_json(const AllocatorSnapshot& snapshot) {
  std::size_t blocks = 0;
  for (const SegmentInfo& segment : snapshot.segments) blocks += segment.blocks.size();
  JsonWriter json(4096 + blocks * 128 + snapshot.trace.size() * 128);
  json.begin_object();
  write_dump_header(json, "snapshot", kSnapshotSchemaVersion, snapshot.device);

  write_config(json, snapshot);

  json.key("device_memory").begin_object()
      .field("free_bytes", static_cast<std::uint64_t>(snapshot.memory.free_bytes))
      .field("total_bytes", static_cast<std::uint64_t>(snapshot.memory.total_bytes))
      .end_object();

  const AllocatorStats& stats = snapshot.stats;
  json.key("stats").begin_object();
  write_stat(json, "allocated_bytes", stats.allocated_bytes);
  write_stat(json, "requested_bytes", stats.requested_bytes);
  write_stat(json, "active_bytes", stats.active_bytes);
  write_stat(json, "reserved_bytes", stats.reserved_bytes);
  write_stat(json, "allocations", stats.allocations);
  write_stat(json, "segments", stats.segments);
  json.field("num_ooms", stats.num_ooms)
      .field("num_alloc_retries", stats.num_alloc_retries)
      .field("num_invalid_frees", stats.num_invalid_frees)
      .end_object();

  write_tag_table(json);

  json.key("tag_stats").begin_array();
  for (const TagStatsEntry& entry : snapshot.tag_stats) {
    json.begin_object().field("tag", entry.tag);
    write_stat(json, "bytes", entry.stats.bytes);
    write_stat(json, "requested_bytes", entry.stats.requested_bytes);
    write_stat(json, "count", entry.stats.count);
    json.end_object();
  }
  json.end_array();

  json.key("segments").begin_array();
  for (const SegmentInfo& segment : snapshot.segments) {
    std::uint64_t allocated = 0;
    std::uint64_t active = 0;
    std::uint64_t requested = 0;
    for (const BlockInfo& block : segment.blocks) {
      if (block.state == BlockState::active_allocated) allocated += block.size;
      if (block.state != BlockState::inactive) active += block.size;
      requested += block.requested_size;
    }
    json.begin_object()
        .field("address", segment.address)
        .field("total_size", static_cast<std::uint64_t>(segment.total_size))
        .field("stream", static_cast<std::uint64_t>(segment.stream))
        .field("segment_type", segment.is_small ? "small" : "large")
        .field("is_expandable", segment.is_expandable)
        .field("allocated_size", allocated)
        .field("active_size", active)
        .field("requested_size", requested);
    json.key("blocks").begin_array();
    for (const BlockInfo& block : segment.blocks) {
      json.begin_object()
          .field("address", block.address)
          .field("size", static_cast<std::uint64_t>(block.size))
          .field("requested_size", static_cast<std::uint64_t>(block.requested_size))
          .field("state", to_string(block.state))
          .field("tag", block.tag)
          .end_object();
    }
    json.end_array().end_object();
  }
  json.end_array();

  json.key("trace").begin_object()
      .field("capacity", static_cast<std::uint64_t>(snapshot.trace_capacity))
      .field("dropped", snapshot.trace_dropped);
  json.key("events").begin_array();
  for (const TraceEvent& event : snapshot.trace) write_event(json, event);
  json.end_array().end_object();

  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

std::string trace_to_jsonl(const AllocatorSnapshot& snapshot) {
  JsonWriter header;
  header.begin_object();
  write_dump_header(header, "trace", kTraceSchemaVersion, snapshot.device);
  write_config(header, snapshot);  // a replay (remat-report whatif) runs under the recorded settings
  write_tag_table(header);
  header.field("event_count", static_cast<std::uint64_t>(snapshot.trace.size()));
  header.field("dropped_records", snapshot.trace_dropped);
  header.end_object();
  std::string out = std::move(header.str());
  out += '\n';
  out.reserve(out.size() + snapshot.trace.size() * 120);
  for (const TraceEvent& event : snapshot.trace) {
    JsonWriter line(128);
    write_event(line, event);
    out += line.str();
    out += '\n';
  }
  return out;
}

void write_snapshot(const AllocatorSnapshot& snapshot, const std::string& path) {
  write_file_atomically(path, snapshot_to_json(snapshot));
}

void write_trace(const AllocatorSnapshot& snapshot, const std::string& path) {
  write_file_atomically(path, trace_to_jsonl(snapshot));
}

}  // namespace remat::alloc
