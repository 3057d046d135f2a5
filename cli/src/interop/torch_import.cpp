// A PyTorch memory-snapshot pickle as a remat snapshot dump (torch_snapshot.hpp): its segments,
// blocks and device trace, tags read back from the frames an export wrote, labels from the
// trace entries' user_metadata (torch.cuda.memory._set_memory_metadata).

#include "core/errors.hpp"
#include "interop/pickle_reader.hpp"
#include "interop/torch_fields.hpp"
#include "interop/torch_snapshot.hpp"
#include "interop/torch_tags.hpp"
#include "output/dump_header.hpp"
#include "reader/dump_reader.hpp"
#include "reader/event_checks.hpp"
#include "reader/json_document.hpp"

#include <remat/alloc/snapshot.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace remat::report {

namespace {

using Kind = PyValue::Kind;
using torch_fields::bad;
using torch_fields::integer_at;
using torch_fields::key_path;
using torch_fields::list_at;
using torch_fields::size_at;
using torch_fields::string_at;

nlohmann::ordered_json stat(std::uint64_t current, std::uint64_t peak, std::uint64_t total) {
  return {{"current", current}, {"peak", std::max(peak, current)}, {"total", std::max(total, current)}};
}

// What import writes must read back: the checks above name the pickle's paths; this catches
// whatever they miss (sums of tag peaks past 64 bits, say) with the written dump's path.
void check_as_remat_reads_it(const std::string& text) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(text);
  try {
    read_snapshot(json::as_object(parse_json(parser, padded), JsonPath()));
  } catch (const InputError& error) {
    bad("$", fmt::format("the snapshot imports into a dump remat-report cannot read ({}); nothing was written",
                         error.what()));
  }
}

// PyTorch's snapshot()["allocator_settings"] as PYTORCH_CUDA_ALLOC_CONF text.
std::optional<std::string> allocator_settings_text(const PyValue& root) {
  const PyValue* settings = root.kind == Kind::dict ? root.get("allocator_settings") : nullptr;
  if (settings == nullptr || settings->kind != Kind::dict) return std::nullopt;
  const PyValue* text = settings->get("PYTORCH_CUDA_ALLOC_CONF");
  if (text != nullptr && text->kind == Kind::string && !text->text.empty()) return text->text;
  std::string conf;
  auto add = [&](const std::string& item) {
    if (!conf.empty()) conf += ',';
    conf += item;
  };
  if (const PyValue* v = settings->get("expandable_segments");
      v != nullptr && v->is_number() && (v->boolean || v->integer != 0))
    add("expandable_segments:True");
  // max_split_size is SIZE_MAX (written as -1) when unlimited.
  if (const PyValue* v = settings->get("max_split_size");
      v != nullptr && v->kind == Kind::integer && !v->above_int64 && v->integer > 0) {
    add(fmt::format("max_split_size_mb:{}", v->unsigned_integer() >> 20));
  }
  if (const PyValue* v = settings->get("garbage_collection_threshold");
      v != nullptr && v->kind == Kind::real && v->real > 0.0) {
    add(fmt::format("garbage_collection_threshold:{}", v->real));
  }
  // {"1": n, "2": n, "4": n, ...}: divisions per interval starting at that many MiB.
  if (const PyValue* v = settings->get("roundup_power2_divisions"); v != nullptr && v->kind == Kind::dict) {
    std::string list;
    bool any = false;
    for (const auto& [key, value] : v->entries) {
      if (key->kind != Kind::string || value->kind != Kind::integer) continue;
      if (value->integer > 0) any = true;
      if (!list.empty()) list += ',';
      list += key->text;
      list += ':';
      list += std::to_string(value->integer);
    }
    if (any) {
      std::string item = "roundup_power2_divisions:[";
      item += list;
      item += ']';
      add(item);
    }
  }
  return conf;
}

// The segment list and the device traces (null where the snapshot has none).
struct SnapshotLists {
  const PyValue* segments = nullptr;
  const PyValue* traces = nullptr;
};

SnapshotLists snapshot_lists(const PyValue& root) {
  SnapshotLists lists;
  if (root.kind == Kind::dict) {
    lists.segments = root.get("segments");
    lists.traces = root.get("device_traces");
    if (lists.segments == nullptr) bad("$", "not a PyTorch memory snapshot: no 'segments' key");
  } else if (root.kind == Kind::list) {
    lists.segments = &root;  // torch.cuda.memory_snapshot(): the segment list alone
  } else {
    bad("$", "not a PyTorch memory snapshot: expected a dict with 'segments' and 'device_traces'");
  }
  list_at(*lists.segments, "$['segments']");
  if (lists.traces != nullptr && lists.traces->kind != Kind::none)
    list_at(*lists.traces, "$['device_traces']");
  else
    lists.traces = nullptr;
  return lists;
}

// The devices with segments or trace entries in the snapshot.
std::set<std::int64_t> devices_held(const SnapshotLists& lists) {
  std::set<std::int64_t> held;
  std::size_t s = 0;
  for (const PyValue* segment : lists.segments->items) {
    const std::string where = fmt::format("$['segments'][{}]", s++);
    if (segment->kind == Kind::dict && segment->get("device") != nullptr)
      held.insert(integer_at(*segment, "device", where));
  }
  if (lists.traces != nullptr) {
    for (std::size_t d = 0; d < lists.traces->items.size(); ++d) {
      if (!lists.traces->items[d]->items.empty()) held.insert(static_cast<std::int64_t>(d));
    }
  }
  return held;
}

// The device asked for (one the snapshot holds something of, where it holds any), or (below 0) the
// first segment's, else the first with trace entries.
std::int64_t pick_device(const SnapshotLists& lists, std::int64_t device) {
  if (device >= 0) {
    const std::set<std::int64_t> held = devices_held(lists);
    if (!held.empty() && held.count(device) == 0) {
      bad("$", fmt::format("the snapshot holds no segment or trace entry of device {}: it holds device(s) {}; pass "
                           "--device with one of them, or leave it out for the first",
                           device, fmt::join(held, ", ")));
    }
    return device;
  }
  for (const PyValue* segment : lists.segments->items) {
    if (segment->kind == Kind::dict && segment->get("device") != nullptr) {
      return integer_at(*segment, "device", "$['segments'][0]");
    }
  }
  if (lists.traces != nullptr) {
    for (std::size_t d = 0; d < lists.traces->items.size(); ++d) {
      if (!lists.traces->items[d]->items.empty()) return static_cast<std::int64_t>(d);
    }
  }
  return 0;
}

// The latest alloc entry at each address that carries a label: PyTorch's blocks have no
// metadata of their own, so a live block without remat's frames takes that entry's tag.
std::map<std::uint64_t, const PyValue*> labelled_alloc_entries(const PyValue* device_trace) {
  std::map<std::uint64_t, const PyValue*> labelled;
  if (device_trace == nullptr) return labelled;
  for (const PyValue* entry : device_trace->items) {
    if (entry->kind != Kind::dict || string_at(*entry, "action", "") != "alloc") continue;
    const PyValue* address = entry->get(entry->get("addr") ? "addr" : "address");
    if (address == nullptr || address->kind != Kind::integer) continue;
    if (user_metadata_of(*entry).empty())
      labelled.erase(address->unsigned_integer());
    else
      labelled[address->unsigned_integer()] = entry;
  }
  return labelled;
}

// The device's segments as the dump writes them, and what they hold.
struct SegmentsRead {
  nlohmann::ordered_json segments = nlohmann::ordered_json::array();
  std::map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> tag_live;  // tag -> (bytes, count)
  std::map<std::uint32_t, std::uint64_t> tag_requested;
  std::uint64_t allocated = 0, requested = 0, active = 0, reserved = 0, allocated_blocks = 0;
};

// What a segment's blocks hold, as the dump writes them.
struct BlocksRead {
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
  std::uint64_t allocated = 0, active = 0, requested = 0;
};

// The blocks of the segment at `address` (`total` bytes, ending at segment_end), which must tile
// it in address order: each tagged from its frames, or from the alloc event PyTorch labelled it
// by; the live ones counted under their tags in `read`.
BlocksRead read_blocks(const PyValue& segment, const std::string& where, std::uint64_t address, std::uint64_t total,
                       std::uint64_t segment_end, const std::map<std::uint64_t, const PyValue*>& labelled_allocs,
                       TagBuilder& tags, SegmentsRead& read, ImportResult& result) {
  BlocksRead out;
  auto& [blocks, seg_allocated, seg_active, seg_requested] = out;
  std::uint64_t cursor = address;
  const PyValue* blocks_value = segment.get("blocks");
  if (blocks_value != nullptr) {
    std::size_t b = 0;
    for (const PyValue* block : list_at(*blocks_value, where + "['blocks']").items) {
      const std::string bwhere = fmt::format("{}['blocks'][{}]", where, b++);
      if (block->kind != Kind::dict) bad(bwhere, "expected a dict");
      const std::uint64_t size = size_at(*block, "size", bwhere);
      const std::uint64_t block_address = block->get("address") ? size_at(*block, "address", bwhere) : cursor;
      // Blocks tile their segment in address order, as remat-report's readers require.
      if (block_address != cursor) {
        bad(key_path(bwhere, "address"),
            fmt::format("block at 0x{:x} does not follow the previous block (expected 0x{:x}): the blocks of the "
                        "segment at 0x{:x} must start at its address and follow each other without gaps",
                        block_address, cursor, address));
      }
      if (size > segment_end - cursor) {
        bad(key_path(bwhere, "size"), fmt::format("block of {} bytes at 0x{:x} extends past the end of its segment "
                                                  "(0x{:x}, total_size {})",
                                                  size, block_address, segment_end, total));
      }
      const std::string torch_state = string_at(*block, "state", "inactive");
      const auto parsed_state = alloc::block_state_from_torch(torch_state);
      if (!parsed_state) bad(bwhere + "['state']", fmt::format("unknown block state '{}'", printable(torch_state)));
      const BlockState state = *parsed_state;
      // PyTorch keeps a stale requested_size on inactive blocks (the remainder of a split
      // keeps its old value), so it is only read, and only checked, for active ones.
      const std::uint64_t block_requested =
          state == BlockState::inactive ? 0 : size_at(*block, "requested_size", bwhere, size);
      if (block_requested > size) {
        bad(key_path(bwhere, "requested_size"),
            fmt::format("requested_size {} exceeds the block size {}: an active block holds at least the bytes "
                        "requested of it; the snapshot is corrupt",
                        block_requested, size));
      }
      std::uint32_t tag = 0;
      if (state != BlockState::inactive) {
        const PyValue* frames = block->get("frames");
        const auto alloc = labelled_allocs.find(block_address);
        tag = alloc != labelled_allocs.end() && !has_remat_frames(frames)
                  ? tags.tag_of(alloc->second->get("frames"), user_metadata_of(*alloc->second))
                  : tags.tag_of(frames);
      }
      if (state == BlockState::active_allocated) {
        seg_allocated += size;
        read.tag_live[tag].first += size;
        ++read.tag_live[tag].second;
        read.tag_requested[tag] += block_requested;
        ++read.allocated_blocks;
      }
      if (state != BlockState::inactive) seg_active += size;
      seg_requested += block_requested;
      blocks.push_back({{"address", block_address},
                        {"size", size},
                        {"requested_size", block_requested},
                        {"state", std::string(to_string(state))},
                        {"tag", tag}});
      cursor = block_address + size;
      ++result.blocks;
    }
  }
  return out;
}

// The segments on `device`, each read with its blocks; segments that overlap are refused.
SegmentsRead read_segments(const PyValue& segments_value, std::int64_t device,
                           const std::map<std::uint64_t, const PyValue*>& labelled_allocs, TagBuilder& tags,
                           ImportResult& result) {
  SegmentsRead read;
  auto& [segments, tag_live, tag_requested, allocated, requested, active, reserved, allocated_blocks] = read;
  std::vector<AddressRange> extents;        // this device's segments
  std::vector<std::size_t> extent_indices;  // their indices in the pickle's segment list
  std::size_t index = 0;
  for (const PyValue* segment : segments_value.items) {
    const std::string where = fmt::format("$['segments'][{}]", index++);
    if (segment->kind != Kind::dict) bad(where, "expected a dict");
    if (integer_at(*segment, "device", where, device) != device) continue;
    const std::uint64_t address = size_at(*segment, "address", where);
    const std::uint64_t total = size_at(*segment, "total_size", where);
    std::uint64_t segment_end = 0;
    if (__builtin_add_overflow(address, total, &segment_end)) {
      bad(key_path(where, "total_size"),
          fmt::format("{} bytes at 0x{:x} end past the 64-bit address space", total, address));
    }
    if (__builtin_add_overflow(reserved, total, &reserved)) {
      bad(key_path(where, "total_size"),
          "the segments' sizes add up to more than 2^64 - 1 bytes: the snapshot is corrupt");
    }
    extents.push_back({address, total});
    extent_indices.push_back(index - 1);
    BlocksRead blocks = read_blocks(*segment, where, address, total, segment_end, labelled_allocs, tags, read, result);
    std::string type = string_at(*segment, "segment_type", total <= (std::uint64_t{2} << 20) ? "small" : "large");
    if (type != "small" && type != "large") type = "large";
    nlohmann::ordered_json imported = {{"address", address},
                                       {"total_size", total},
                                       {"stream", size_at(*segment, "stream", where, 0)},
                                       {"segment_type", type},
                                       {"allocated_size", blocks.allocated},
                                       {"active_size", blocks.active},
                                       {"requested_size", blocks.requested},
                                       {"blocks", std::move(blocks.blocks)}};
    const PyValue* expandable = segment->get("is_expandable");
    if (expandable != nullptr && expandable->kind == Kind::boolean && expandable->boolean) {
      imported["is_expandable"] = true;
    }
    segments.push_back(std::move(imported));
    allocated += blocks.allocated;
    active += blocks.active;
    requested += blocks.requested;
    ++result.segments;
  }
  if (const auto overlap = first_overlap(extents)) {
    const auto [later, other] = *overlap;
    bad(fmt::format("$['segments'][{}]['address']", extent_indices[later]),
        fmt::format("segment at 0x{:x} ({} bytes) overlaps segments[{}] at 0x{:x} ({} bytes): segments must not share "
                    "bytes; the snapshot is corrupt",
                    extents[later].address, extents[later].size, extent_indices[other], extents[other].address,
                    extents[other].size));
  }
  return read;
}

// The device's trace as the dump writes it, and the figures replaying it gives.
struct TraceRead {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  std::uint64_t ooms = 0, alloc_events = 0, peak = 0, reserved_peak = 0;
  std::map<std::uint32_t, std::uint64_t> tag_peak, tag_allocs;
};

// The trace: actions keep their names; PyTorch's segment_map/unmap (expandable segments)
// become segment_alloc/free; `snapshot` markers carry no memory change and are dropped.
TraceRead read_trace(const PyValue& trace, std::int64_t device, TagBuilder& tags, ImportResult& result) {
  TraceRead read;
  auto& [events, ooms, alloc_events, peak, reserved_peak, tag_peak, tag_allocs] = read;
  std::uint64_t live = 0, reserved_live = 0;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> live_blocks;
  std::map<std::uint32_t, std::uint64_t> tag_now;
  std::int64_t last_time = INT64_MIN;
  EventChecker checker;
  std::vector<std::size_t> checked;  // pickle index of each event the checker saw
  checker.name_events_by(
      [&](std::uint64_t event) { return fmt::format("$['device_traces'][{}][{}]", device, checked[event - 1]); });
  std::size_t e = 0;
  for (const PyValue* entry : trace.items) {
    const std::string where = fmt::format("$['device_traces'][{}][{}]", device, e++);
    if (entry->kind != Kind::dict) bad(where, "expected a dict");
    const auto parsed = alloc::trace_action_from_torch(string_at(*entry, "action", ""));
    if (!parsed) {
      ++result.skipped_events;
      continue;
    }
    const std::uint64_t address = size_at(*entry, entry->get("addr") ? "addr" : "address", where, 0);
    const std::uint64_t size = size_at(*entry, "size", where, 0);
    const char* address_key = entry->get("addr") ? "addr" : "address";
    const std::int64_t time = integer_at(*entry, "time_us", where, last_time == INT64_MIN ? 0 : last_time);
    last_time = time;
    const std::uint64_t stream = size_at(*entry, "stream", where, 0);
    const std::uint32_t tag = tags.tag_of(entry->get("frames"), user_metadata_of(*entry));
    checked.push_back(e - 1);
    try {
      checker.check(Event{*parsed, time, address, size, stream, tag});
    } catch (const EventError& error) {
      bad(key_path(where, error.field == "address" ? address_key : error.field), error.problem);
    }
    switch (*parsed) {
      case Action::alloc:
        ++alloc_events;
        live += size;
        peak = std::max(peak, live);
        live_blocks[address] = {size, tag};
        tag_now[tag] += size;
        tag_peak[tag] = std::max(tag_peak[tag], tag_now[tag]);
        ++tag_allocs[tag];
        break;
      case Action::free_requested:
      case Action::free_completed:
        if (const auto it = live_blocks.find(address); it != live_blocks.end()) {
          live -= it->second.first;
          tag_now[it->second.second] -= it->second.first;
          live_blocks.erase(it);
        }
        break;
      case Action::segment_alloc:
        reserved_live += size;
        reserved_peak = std::max(reserved_peak, reserved_live);
        break;
      case Action::segment_free: reserved_live -= std::min(reserved_live, size); break;
      case Action::oom: ++ooms; break;
      case Action::retag:
        if (const auto it = live_blocks.find(address); it != live_blocks.end()) {
          tag_now[it->second.second] -= it->second.first;
          it->second.second = tag;
          tag_now[tag] += it->second.first;
          tag_peak[tag] = std::max(tag_peak[tag], tag_now[tag]);
        }
        break;
    }
    events.push_back({{"action", std::string(to_string(*parsed))},
                      {"time_us", time},
                      {"address", address},
                      {"size", size},
                      {"stream", stream},
                      {"tag", tag}});
    ++result.events;
  }
  return read;
}

// Per tag: live bytes and blocks from the segments, peaks and allocation counts from the trace.
nlohmann::ordered_json tag_stats_json(SegmentsRead& segments, TraceRead& trace) {
  nlohmann::ordered_json tag_stats = nlohmann::ordered_json::array();
  std::map<std::uint32_t, bool> seen;
  for (const auto& [tag, v] : segments.tag_live) seen[tag] = true;
  for (const auto& [tag, v] : trace.tag_peak) seen[tag] = true;
  for (const auto& [tag, unused] : seen) {
    const auto current =
        segments.tag_live.count(tag) ? segments.tag_live[tag] : std::pair<std::uint64_t, std::uint64_t>{0, 0};
    tag_stats.push_back({{"tag", tag},
                         {"bytes", stat(current.first, trace.tag_peak[tag], 0)},
                         {"requested_bytes", stat(segments.tag_requested[tag], segments.tag_requested[tag], 0)},
                         {"count", stat(current.second, current.second, trace.tag_allocs[tag])}});
  }
  return tag_stats;
}

nlohmann::ordered_json tag_table_json(const TagBuilder& tags) {
  nlohmann::ordered_json tag_table = nlohmann::ordered_json::array();
  for (const Tag& tag : tags.tags()) {
    nlohmann::ordered_json recv = nullptr;
    if (tag.recv)
      recv = {{"stage", tag.recv->stage}, {"direction", std::string(1, tag.recv->direction)}, {"slot", tag.recv->slot}};
    tag_table.push_back({{"region", tag.region},
                         {"policy", to_string(tag.policy)},
                         {"phase", to_string(tag.phase)},
                         {"site", tag.site},
                         {"recv", recv}});
    if (tag.label != 0) tag_table.back()["label"] = tag.label;
    if (tag.category != 0) tag_table.back()["category"] = std::string(category_name(tag.category));
    if (tag.module != 0) tag_table.back()["module"] = tag.module;
  }
  return tag_table;
}

}  // namespace

ImportResult import_torch_snapshot(std::string_view pickle_bytes, std::int64_t device, const std::string& source) {
  const PickleDocument document = read_pickle(pickle_bytes);
  const PyValue& root = *document.root;
  const SnapshotLists lists = snapshot_lists(root);
  device = pick_device(lists, device);
  if (device < 0) bad("$", "device must not be negative");
  const PyValue* device_trace = nullptr;
  if (lists.traces != nullptr && static_cast<std::size_t>(device) < lists.traces->items.size()) {
    device_trace = &list_at(*lists.traces->items[static_cast<std::size_t>(device)], "$['device_traces'][device]");
  }

  ImportResult result;
  result.device = static_cast<std::uint64_t>(device);
  result.allocator_settings = allocator_settings_text(root);
  TagBuilder tags;
  SegmentsRead segments = read_segments(*lists.segments, device, labelled_alloc_entries(device_trace), tags, result);
  TraceRead trace = device_trace != nullptr ? read_trace(*device_trace, device, tags, result) : TraceRead{};

  nlohmann::ordered_json& s = result.snapshot;
  s = dump_header_json("snapshot", alloc::kSnapshotSchemaVersion, static_cast<std::uint64_t>(device));
  // The pickle does not say which process wrote it: the import is the producer.
  s["producer"] = kImportProducer;
  s["host"] = "";
  s["pid"] = 0;
  s["rank"] = 0;
  s["config"] = {{"backend", "cuda"},
                 {"host_capacity_mb", 1},
                 {"max_split_size_mb", nullptr},
                 {"memory_fraction", 1.0},
                 {"trace_entries", result.events},
                 {"oom_dump_dir", ""},
                 {"tagging", tags.tags().size() > 1},
                 {"text", "imported from the PyTorch snapshot " + source}};
  s["device_memory"] = {{"free_bytes", 0}, {"total_bytes", 0}};
  s["stats"] = {{"allocated_bytes", stat(segments.allocated, trace.peak, 0)},
                {"requested_bytes", stat(segments.requested, segments.requested, 0)},
                {"active_bytes", stat(segments.active, segments.active, 0)},
                {"reserved_bytes", stat(segments.reserved, trace.reserved_peak, 0)},
                {"allocations", stat(segments.allocated_blocks, segments.allocated_blocks, trace.alloc_events)},
                {"segments", stat(result.segments, result.segments, 0)},
                {"num_ooms", trace.ooms},
                {"num_alloc_retries", 0},
                {"num_invalid_frees", 0}};
  s["names"] = tags.names();
  s["tags"] = tag_table_json(tags);
  s["tag_stats"] = tag_stats_json(segments, trace);
  s["segments"] = std::move(segments.segments);
  s["trace"] = {{"capacity", result.events}, {"dropped", 0}, {"events", std::move(trace.events)}};
  result.text = s.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  check_as_remat_reads_it(result.text);
  return result;
}

}  // namespace remat::report
