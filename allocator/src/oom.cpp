#include <remat/alloc/bytes.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/utc_time.hpp>

#include "message_text.hpp"
#include "detail/oom_reporting.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace remat::alloc {
namespace {

void write_holders(JsonWriter& json, std::string_view key, const std::vector<OomHolder>& holders) {
  json.key(key).begin_array();
  for (const OomHolder& holder : holders) {
    json.begin_object()
        .field("name", holder.name)
        .field("bytes", holder.bytes)
        .field("blocks", holder.blocks)
        .field("saved_bytes", holder.saved_bytes)
        .end_object();
  }
  json.end_array();
}

std::string fraction_text(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", fraction);
  return text;
}

// What the request ran into, in words: the start of the error message and the stderr line.
std::string what_happened(const OomReport& r) {
  const std::string request = "tried to allocate " + format_bytes(r.requested_bytes);
  switch (r.cause) {
    case OomCause::request_exceeds_device:
      return request + ", a " + format_bytes(r.segment_bytes) + " segment: larger than the whole device (" +
             format_bytes(r.memory.total_bytes) + ")";
    case OomCause::memory_fraction_cap:
      return request + ", but memory_fraction:" + fraction_text(r.memory_fraction) + " caps reserved memory at " +
             std::to_string(r.reserved_limit_bytes) + " bytes (" + format_bytes(r.reserved_limit_bytes) +
             ") and " + format_bytes(r.reserved_bytes) +
             " are reserved; the device has " + format_bytes(r.memory.free_bytes) + " free";
    case OomCause::device_full:
      break;
  }
  return request + " (a " + format_bytes(r.segment_bytes) + " segment): " +
         format_bytes(r.memory.free_bytes) + " free of " + format_bytes(r.memory.total_bytes) + ", " +
         format_bytes(r.allocated_bytes) + " allocated, " +
         format_bytes(r.reserved_bytes) + " reserved";
}

// The host backend's "device" is a capacity the configuration sets, not a card's memory.
std::string host_capacity_advice(const OomReport& r) {
  return "raise host_capacity_mb (REMAT_ALLOC_CONF, remat_configure or remat_alloc.configure; the host backend "
         "holds " + format_bytes(r.memory.total_bytes) + " now)";
}

// The change that addresses the cause.
std::string what_to_change(const OomReport& r) {
  const bool host = r.backend == "host";
  switch (r.cause) {
    case OomCause::request_exceeds_device:
      return (host ? host_capacity_advice(r) + ", or " : std::string()) +
             "split the tensor, or shrink what sizes it (batch size, sequence length)";
    case OomCause::memory_fraction_cap:
      return "raise memory_fraction (REMAT_ALLOC_CONF, remat_configure or "
             "torch.cuda.set_per_process_memory_fraction), or free tensors";
    case OomCause::device_full:
      break;
  }
  return "free tensors, recompute more regions, or lower the batch size" +
         (host ? ", or " + host_capacity_advice(r) : std::string());
}

}  // namespace

std::string_view to_string(OomCause cause) {
  switch (cause) {
    case OomCause::request_exceeds_device: return "request_exceeds_device";
    case OomCause::memory_fraction_cap: return "memory_fraction_cap";
    case OomCause::device_full: break;
  }
  return "device_full";
}

std::string oom_message(const OomReport& r) {
  return "out of memory on device " + std::to_string(r.device) + " (" + r.backend + "): " + what_happened(r) + ". " +
         what_to_change(r);
}

std::string oom_report_to_json(const OomReport& r) {
  JsonWriter json(8192 + r.last_events.size() * 128);
  json.begin_object();
  write_dump_header(json, "oom", kOomSchemaVersion, r.device);
  json.field("backend", r.backend).field("cause", to_string(r.cause));
  json.key("request").begin_object()
      .field("requested_bytes", r.requested_bytes)
      .field("rounded_bytes", r.rounded_bytes)
      .field("segment_bytes", r.segment_bytes)
      .end_object();
  json.key("memory").begin_object()
      .field("device_free_bytes", r.memory.free_bytes)
      .field("device_total_bytes", r.memory.total_bytes)
      .field("reserved_bytes", r.reserved_bytes)
      .field("allocated_bytes", r.allocated_bytes)
      .field("requested_bytes", r.requested_live_bytes)
      .field("active_bytes", r.active_bytes)
      .field("segments", r.segments)
      .field("memory_fraction", r.memory_fraction);
  if (r.reserved_limit_bytes != 0) json.field("reserved_limit_bytes", r.reserved_limit_bytes);
  json.end_object();
  json.key("fragmentation")
      .begin_object()
      .field("largest_free_block", r.largest_free_block)
      .field("cached_free_bytes", r.cached_free_bytes)
      .field("releasable_bytes", r.releasable_bytes)
      .field("fragmented_free_bytes", r.fragmented_free_bytes)
      .field("free_blocks_in_split_segments", r.free_blocks_in_split_segments)
      .field("internal_bytes", r.allocated_bytes - r.requested_live_bytes);
  if (r.request_pool) {
    json.key("request_pool")
        .begin_object()
        .field("pool", r.request_pool->small ? "small" : "large")
        .field("free_bytes", r.request_pool->free_bytes)
        .field("fragmented_free_bytes", r.request_pool->fragmented_free_bytes)
        .field("free_blocks_in_split_segments", r.request_pool->free_blocks_in_split_segments)
        .end_object();
  }
  json.end_object();
  json.field("num_ooms", r.num_ooms).field("config", r.config);
  json.key("holders").begin_object();
  write_holders(json, "by_region", r.by_region);
  write_holders(json, "by_recv_slot", r.by_recv_slot);
  write_holders(json, "by_site", r.by_site);
  write_holders(json, "by_phase", r.by_phase);
  if (!r.by_label.empty()) write_holders(json, "by_label", r.by_label);  // absent: nothing held carries a label
  // absent: nothing held carries a category
  if (!r.by_category.empty()) write_holders(json, "by_category", r.by_category);
  if (!r.by_module.empty()) write_holders(json, "by_module", r.by_module);
  json.end_object();
  json.key("tag_stack").begin_array();
  for (const std::string& frame : r.tag_stack) json.value(frame);
  json.end_array();
  json.key("last_events").begin_array();
  for (const OomTraceEvent& e : r.last_events) {
    json.begin_object()
        .field("action", to_string(e.event.action))
        .field("time_us", e.event.time_us)
        .field("address", e.event.address)
        .field("size", e.event.size)
        .field("stream", static_cast<std::uint64_t>(e.event.stream))
        .field("region", e.region)
        .end_object();
  }
  json.end_array();
  json.end_object();
  json.str() += '\n';
  return std::move(json.str());
}

std::string oom_summary_line(const OomReport& r, const std::string& dump_path, const std::string& write_error) {
  std::string line = "remat: out of memory on device " + std::to_string(r.device) + " (" + r.backend + "): " +
                     what_happened(r) + "; top holders: ";
  auto list = [&line](const std::vector<OomHolder>& holders) {
    const std::size_t shown = std::min<std::size_t>(3, holders.size());
    for (std::size_t i = 0; i < shown; ++i) {
      line += (i ? ", " : "") + detail::printable(holders[i].name) + " " + format_bytes(holders[i].bytes);
    }
    if (shown == 0) line += "none";
  };
  list(r.by_region);
  if (!r.by_category.empty()) {  // tracked memory (remat_alloc.track): what it is for, and whose
    line += "; by category: ";
    list(r.by_category);
    line += "; by module: ";
    list(r.by_module);
  }
  if (!dump_path.empty()) line += "; report: " + dump_path;
  else if (!write_error.empty()) line += "; no report written: " + write_error;
  else line += "; no report written (set REMAT_OOM_DUMP_DIR or oom_dump_dir to keep one)";
  return line;
}

std::string oom_dump_path(const std::string& directory, int device) {
  static std::atomic<unsigned> sequence{0};
  const DumpHeader header = current_dump_header();
  std::string path = directory;
  if (!path.empty() && path.back() != '/') path += '/';
  path += "oom-" + header.host + "-r" + std::to_string(header.rank) + "-p" + std::to_string(header.pid) + "-d" +
          std::to_string(device) + "-" + utc_file_stamp(now_us());
  const unsigned n = sequence++;
  if (n > 0) path += "-" + std::to_string(n);
  return path + ".json";
}

namespace detail {

OomReport build_oom_report(const PoolFigures& pool, std::size_t requested, std::size_t rounded,
                           std::size_t segment) {
  OomReport r;
  r.device = pool.device;
  r.backend = std::string(pool.backend);
  r.requested_bytes = requested;
  r.rounded_bytes = rounded;
  r.segment_bytes = segment;
  r.memory = pool.memory;
  r.memory_fraction = pool.config.memory_fraction;
  r.reserved_limit_bytes = pool.reserved_limit == Config::kUnlimited ? 0 : pool.reserved_limit;
  // Built right after the pool's last new segment of `segment` bytes failed, with the same
  // reserved bytes and cap: the cap refused it exactly when it would have exceeded the cap.
  const bool cap_refused = exceeds_reserved_cap(static_cast<std::size_t>(pool.stats.reserved_bytes.current),
                                                pool.reserved_limit, segment);
  r.cause = segment > pool.memory.total_bytes ? OomCause::request_exceeds_device
            : cap_refused                     ? OomCause::memory_fraction_cap
                                              : OomCause::device_full;
  const AllocatorStats& stats = pool.stats;
  r.reserved_bytes = stats.reserved_bytes.current;
  r.allocated_bytes = stats.allocated_bytes.current;
  r.requested_live_bytes = stats.requested_bytes.current;
  r.active_bytes = stats.active_bytes.current;
  r.segments = stats.segments.current;
  r.cached_free_bytes = stats.reserved_bytes.current - stats.active_bytes.current;
  r.largest_free_block = pool.free.largest_free_block;
  r.releasable_bytes = pool.free.releasable_bytes;
  r.fragmented_free_bytes = pool.free.fragmented_free_bytes;
  r.free_blocks_in_split_segments = pool.free.free_blocks_in_split_segments;
  r.request_pool = pool.free.request_pool;
  r.num_ooms = stats.num_ooms;
  r.config = pool.config.to_string();

  const std::vector<std::string> names = interned_names();
  const std::vector<Tag> tags = interned_tags();
  // Regions and sites are keyed by name id, so that a region a user named "<untagged>" is not
  // merged with untagged memory.
  std::map<NameId, OomHolder> regions, sites, labels, modules;
  bool any_label = false, any_category = false;
  std::map<std::string, OomHolder> slots, phases, categories;
  auto add = [](auto& into, const auto& key, std::string name, const TagStats& per_tag, bool saved) {
    OomHolder& holder = into[key];
    holder.name = std::move(name);
    holder.bytes += per_tag.bytes.current;
    holder.blocks += per_tag.count.current;
    if (saved) holder.saved_bytes += per_tag.bytes.current;
  };
  for (std::size_t id = 0; id < pool.tag_stats.size() && id < tags.size(); ++id) {
    const TagStats& per_tag = pool.tag_stats[id];
    if (per_tag.count.current == 0) continue;
    const Tag& tag = tags[id];
    const bool saved = tag.policy == Policy::save;
    // Memory saved outside any region has no region to switch to recompute.
    add(regions, tag.region, tag.region != 0 ? names[tag.region] : "<untagged>", per_tag, saved && tag.region != 0);
    if (tag.has_recv) {
      std::string slot = std::to_string(tag.recv.stage) + to_char(tag.recv.direction) + std::to_string(tag.recv.slot);
      add(slots, slot, slot, per_tag, saved);
    }
    add(sites, tag.site, tag.site != 0 ? names[tag.site] : "<no site>", per_tag, saved);
    add(labels, tag.label, tag.label != 0 ? names[tag.label] : "<no label>", per_tag, saved);
    any_label = any_label || tag.label != 0;
    const std::string category(to_string(tag.category));
    add(categories, category, tag.category != Category::none ? category : "<no category>", per_tag, saved);
    add(modules, tag.module, tag.module != 0 ? names[tag.module] : "<no module>", per_tag, saved);
    any_category = any_category || tag.category != Category::none;
    const std::string phase(to_string(tag.phase));
    add(phases, phase, phase, per_tag, saved);
  }
  auto top = [](const auto& holders) {
    std::vector<OomHolder> out;
    for (const auto& entry : holders) out.push_back(entry.second);
    std::sort(out.begin(), out.end(), [](const OomHolder& a, const OomHolder& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
    });
    if (out.size() > kOomTopHolders) out.resize(kOomTopHolders);
    return out;
  };
  r.by_region = top(regions);
  r.by_recv_slot = top(slots);
  r.by_site = top(sites);
  r.by_phase = top(phases);
  if (any_label) r.by_label = top(labels);
  if (any_category) {
    r.by_category = top(categories);
    r.by_module = top(modules);
  }
  r.tag_stack = describe_tag_stack();
  for (const TraceEvent& event : pool.trace.events(kOomTraceEvents)) {
    const std::string region = event.tag < tags.size() && tags[event.tag].region != 0 ? names[tags[event.tag].region]
                                                                                       : std::string();
    r.last_events.push_back({event, region});
  }
  return r;
}

bool OomDumpLimiter::take(std::size_t interval_ms) {
  const auto now = std::chrono::steady_clock::now();
  if (dumped_ && now - last_ < std::chrono::milliseconds(interval_ms)) return false;
  dumped_ = true;
  last_ = now;
  return true;
}

void announce_out_of_memory(OomEvent& event, std::string directory, bool may_dump, const OomHandler& handler) {
  if (directory.empty()) {
    if (const char* env = std::getenv("REMAT_OOM_DUMP_DIR")) directory = env;
  }
  if (event.report) {
    std::string write_error;
    if (!directory.empty() && !may_dump) {
      write_error = "skipped by the rate limit (oom_dump_interval_ms)";
    } else if (!directory.empty()) {
      try {
        event.dump_path = oom_dump_path(directory, event.device);
        write_file_atomically(event.dump_path, oom_report_to_json(*event.report));
      } catch (const std::exception& e) {
        write_error = e.what();
        event.dump_path.clear();
      }
    }
    std::fprintf(stderr, "%s\n", oom_summary_line(*event.report, event.dump_path, write_error).c_str());
  }
  if (!handler) return;
  try {
    handler(event);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: the out-of-memory handler threw: %s (ignored)\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "remat: the out-of-memory handler threw (ignored)\n");
  }
}

}  // namespace detail

}  // namespace remat::alloc
