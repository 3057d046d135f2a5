// A PyTorch memory-snapshot pickle as a remat snapshot dump (torch_snapshot.hpp): its segments,
// blocks and device trace, tags read back from the frames an export wrote, labels from the
// trace entries' user_metadata (torch.cuda.memory._set_memory_metadata).

#include "core/errors.hpp"
#include "interop/pickle_reader.hpp"
#include "interop/torch_snapshot.hpp"
#include "output/dump_header.hpp"
#include "reader/dump_reader.hpp"
#include "reader/event_checks.hpp"
#include "reader/json_document.hpp"

#include <remat/alloc/snapshot.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace remat::report {

namespace {

using Kind = PyValue::Kind;

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw InputError(where, what); }

std::string key_path(const std::string& where, std::string_view key) { return where + "['" + std::string(key) + "']"; }

// The int under `key`, or null when it is missing or None.
const PyValue* int_value(const PyValue& dict, std::string_view key, const std::string& where, bool has_fallback) {
  const PyValue* v = dict.get(key);
  if (v == nullptr || v->kind == Kind::none) {
    if (has_fallback) return nullptr;
    bad(where, fmt::format("missing key '{}'", key));
  }
  if (v->kind != Kind::integer) bad(key_path(where, key), "expected an int");
  return v;
}

// A signed field (time_us, device): Python ints from 2^63 up do not fit.
std::int64_t integer_at(const PyValue& dict, std::string_view key, const std::string& where,
                        std::optional<std::int64_t> fallback = std::nullopt) {
  const PyValue* v = int_value(dict, key, where, fallback.has_value());
  if (v == nullptr) return *fallback;
  if (v->above_int64) {
    bad(key_path(where, key), fmt::format("{} does not fit a signed 64-bit integer (at most 2^63 - 1 = {})",
                                          v->unsigned_integer(), INT64_MAX));
  }
  return v->integer;
}

// An unsigned field (addresses, sizes, streams): 0 to 2^64 - 1.
std::uint64_t size_at(const PyValue& dict, std::string_view key, const std::string& where,
                      std::optional<std::uint64_t> fallback = std::nullopt) {
  const PyValue* v = int_value(dict, key, where, fallback.has_value());
  if (v == nullptr) return *fallback;
  if (!v->above_int64 && v->integer < 0) {
    bad(key_path(where, key), fmt::format("must not be negative (got {})", v->integer));
  }
  return v->unsigned_integer();
}

std::string string_at(const PyValue& dict, std::string_view key, const std::string& fallback) {
  const PyValue* v = dict.get(key);
  return v != nullptr && v->kind == Kind::string ? v->text : fallback;
}

const PyValue& list_at(const PyValue& value, const std::string& where) {
  if (value.kind != Kind::list && value.kind != Kind::tuple) bad(where, "expected a list");
  return value;
}

struct TagKey {
  std::uint32_t region = 0, site = 0;
  Policy policy = Policy::none;
  Phase phase = Phase::other;
  std::optional<RecvSlot> recv;
  std::uint32_t label = 0;
  std::uint8_t category = 0;
  std::uint32_t module = 0;
  auto tie() const {
    return std::make_tuple(region, site, static_cast<int>(policy), static_cast<int>(phase), recv.has_value(),
                           recv ? recv->stage : 0, recv ? recv->direction : 'F', recv ? recv->slot : 0, label, category,
                           module);
  }
  bool operator<(const TagKey& other) const { return tie() < other.tie(); }
};

// Whether `frames` holds remat's own frames (those an export writes for a tag).
bool has_remat_frames(const PyValue* frames) {
  if (frames == nullptr || (frames->kind != Kind::list && frames->kind != Kind::tuple)) return false;
  return std::any_of(frames->items.begin(), frames->items.end(), [](const PyValue* frame) {
    return frame->kind == Kind::dict && string_at(*frame, "filename", "").starts_with("remat:");
  });
}

// A trace entry's user_metadata: the label PyTorch's allocator held when it was recorded.
std::string user_metadata_of(const PyValue& entry) { return string_at(entry, "user_metadata", ""); }

// Rebuilds tags from frames: remat's own frames when the pickle came from `export`,
// otherwise the first frame outside PyTorch as the allocation site; a label from a
// remat:label frame, else the one given (a trace entry's user_metadata).
class TagBuilder {
 public:
  TagBuilder() {
    names_.push_back("");
    tags_.emplace_back();
    ids_[TagKey{}] = 0;
  }

  // `metadata` is a trace entry's user_metadata: PyTorch's own allocator writes the label there
  // verbatim; remat's allocator under PyTorch writes a tag with more than a label as a JSON
  // object of its dimensions ({"region":"layers.0","phase":"forward","label":"step 3"}).
  std::uint32_t tag_of(const PyValue* frames, const std::string& metadata) {
    const std::uint32_t base = tag_of(frames);
    if (metadata.empty() || tags_[base].label != 0) return base;
    const Tag& t = tags_[base];
    TagKey key{t.region, t.site, t.policy, t.phase, t.recv, 0};
    if (!read_metadata_tag(metadata, key)) key.label = intern(metadata);
    return intern_tag(key);
  }

  std::uint32_t tag_of(const PyValue* frames) {
    if (frames == nullptr || (frames->kind != Kind::list && frames->kind != Kind::tuple) || frames->items.empty()) return 0;
    const auto cached = cache_.find(frames);
    if (cached != cache_.end()) return cached->second;
    TagKey key;
    bool remat = false;
    std::string fallback_site;
    for (const PyValue* frame : frames->items) {
      if (frame->kind != Kind::dict) continue;
      const std::string file = string_at(*frame, "filename", "");
      const std::string name = string_at(*frame, "name", "");
      if (file == "remat:region") remat = true, key.region = intern(name);
      else if (file == "remat:site") remat = true, key.site = intern(name);
      else if (file == "remat:label") remat = true, key.label = intern(name);
      else if (file == "remat:module") remat = true, key.module = intern(name);
      else if (file == "remat:category") remat = true, key.category = category_index(name);
      else if (file == "remat:tag") {
        remat = true;
        char phase[32] = {}, policy[32] = {};
        if (std::sscanf(name.c_str(), "phase=%31s policy=%31s", phase, policy) == 2) {
          key.phase = phase_from(phase).value_or(Phase::other);
          key.policy = policy_from(policy).value_or(Policy::none);
        }
      } else if (file == "remat:recv") {
        remat = true;
        unsigned long long stage = 0, slot = 0;
        char direction = 'F';
        if (std::sscanf(name.c_str(), "stage=%llu direction=%c slot=%llu", &stage, &direction, &slot) == 3 &&
            (direction == 'F' || direction == 'B')) {
          key.recv = RecvSlot{stage, direction, slot};
        }
      } else if (fallback_site.empty() && !file.empty() && file.find("/torch/") == std::string::npos &&
                 file.find("??") == std::string::npos && file[0] != '<' &&
                 !(file.size() > 4 && (file.ends_with(".cpp") || file.ends_with(".h") || file.ends_with(".cu")))) {
        const PyValue* line = frame->get("line");
        const bool has_line = line != nullptr && line->kind == Kind::integer && !line->above_int64;
        fallback_site =
            fmt::format("{}:{}{}", file, has_line ? line->integer : 0, name.empty() ? "" : " (" + name + ")");
      }
    }
    if (!remat && !fallback_site.empty()) key.site = intern(fallback_site);
    const std::uint32_t id = intern_tag(key);
    cache_[frames] = id;
    return id;
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Tag>& tags() const { return tags_; }

 private:
  // The dimensions a JSON object in user_metadata names, over `key`; false (and `key` as it
  // was) when the text is no such object, and so a label.
  bool read_metadata_tag(const std::string& metadata, TagKey& key) {
    if (!metadata.starts_with('{')) return false;
    const auto doc = nlohmann::json::parse(metadata, nullptr, false);
    if (!doc.is_object() || doc.empty()) return false;
    TagKey read = key;
    for (const auto& [name, value] : doc.items()) {
      if (name == "recv" && value.is_object()) {
        const auto stage = value.find("stage"), slot = value.find("slot"), direction = value.find("direction");
        if (stage == value.end() || !stage->is_number_unsigned() || slot == value.end() ||
            !slot->is_number_unsigned() || direction == value.end() || !direction->is_string() ||
            (*direction != "F" && *direction != "B")) {
          return false;
        }
        read.recv = RecvSlot{stage->get<std::uint64_t>(), direction->get<std::string>()[0], slot->get<std::uint64_t>()};
        continue;
      }
      if (!value.is_string()) return false;
      const std::string text = value.get<std::string>();
      if (name == "region") read.region = intern(text);
      else if (name == "site") read.site = intern(text);
      else if (name == "label") read.label = intern(text);
      else if (name == "module") read.module = intern(text);
      else if (name == "category" && category_index(text) != 0) read.category = category_index(text);
      else if (name == "phase" && phase_from(text)) read.phase = *phase_from(text);
      else if (name == "policy" && policy_from(text)) read.policy = *policy_from(text);
      else return false;
    }
    key = read;
    return true;
  }

  std::uint32_t intern_tag(const TagKey& key) {
    const auto [it, inserted] = ids_.try_emplace(key, static_cast<std::uint32_t>(tags_.size()));
    if (inserted) {
      tags_.push_back(Tag{key.region, key.policy, key.phase, key.site, key.recv, key.label, key.category, key.module});
    }
    return it->second;
  }
  std::uint32_t intern(const std::string& name) {
    const auto [it, inserted] = name_ids_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
    if (inserted) names_.push_back(name);
    return it->second;
  }
  std::vector<std::string> names_;
  std::vector<Tag> tags_;
  std::map<std::string, std::uint32_t> name_ids_;
  std::map<TagKey, std::uint32_t> ids_;
  std::map<const PyValue*, std::uint32_t> cache_;
};

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
  if (const PyValue* v = settings->get("expandable_segments"); v != nullptr && v->is_number() && (v->boolean || v->integer != 0))
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

}  // namespace

ImportResult import_torch_snapshot(std::string_view pickle_bytes, std::int64_t device, const std::string& source) {
  const PickleDocument document = read_pickle(pickle_bytes);
  const PyValue& root = *document.root;
  const PyValue* segments_value = nullptr;
  const PyValue* traces_value = nullptr;
  if (root.kind == Kind::dict) {
    segments_value = root.get("segments");
    traces_value = root.get("device_traces");
    if (segments_value == nullptr) bad("$", "not a PyTorch memory snapshot: no 'segments' key");
  } else if (root.kind == Kind::list) {
    segments_value = &root;  // torch.cuda.memory_snapshot(): the segment list alone
  } else {
    bad("$", "not a PyTorch memory snapshot: expected a dict with 'segments' and 'device_traces'");
  }
  list_at(*segments_value, "$['segments']");
  if (traces_value != nullptr && traces_value->kind != Kind::none) list_at(*traces_value, "$['device_traces']");
  else traces_value = nullptr;

  if (device < 0) {
    device = 0;
    bool found = false;
    for (const PyValue* segment : segments_value->items) {
      if (segment->kind == Kind::dict && segment->get("device") != nullptr) {
        device = integer_at(*segment, "device", "$['segments'][0]");
        found = true;
        break;
      }
    }
    if (!found && traces_value != nullptr) {
      for (std::size_t d = 0; d < traces_value->items.size(); ++d) {
        if (!traces_value->items[d]->items.empty()) {
          device = static_cast<std::int64_t>(d);
          break;
        }
      }
    }
  }
  if (device < 0) bad("$", "device must not be negative");

  // The latest alloc entry at each address that carries a label: PyTorch's blocks have no
  // metadata of their own, so a live block without remat's frames takes that entry's tag.
  const PyValue* device_trace = nullptr;
  if (traces_value != nullptr && static_cast<std::size_t>(device) < traces_value->items.size()) {
    device_trace = &list_at(*traces_value->items[static_cast<std::size_t>(device)], "$['device_traces'][device]");
  }
  std::map<std::uint64_t, const PyValue*> labelled_allocs;
  if (device_trace != nullptr) {
    for (const PyValue* entry : device_trace->items) {
      if (entry->kind != Kind::dict || string_at(*entry, "action", "") != "alloc") continue;
      const PyValue* address = entry->get(entry->get("addr") ? "addr" : "address");
      if (address == nullptr || address->kind != Kind::integer) continue;
      if (user_metadata_of(*entry).empty()) labelled_allocs.erase(address->unsigned_integer());
      else labelled_allocs[address->unsigned_integer()] = entry;
    }
  }

  ImportResult result;
  result.device = static_cast<std::uint64_t>(device);
  result.allocator_settings = allocator_settings_text(root);
  TagBuilder tags;
  nlohmann::ordered_json segments = nlohmann::ordered_json::array();
  std::map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> tag_live;  // tag -> (bytes, count)
  std::map<std::uint32_t, std::uint64_t> tag_requested;
  std::uint64_t allocated = 0, requested = 0, active = 0, reserved = 0, allocated_blocks = 0;
  std::vector<AddressRange> extents;        // this device's segments
  std::vector<std::size_t> extent_indices;  // their indices in the pickle's segment list
  std::size_t index = 0;
  for (const PyValue* segment : segments_value->items) {
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
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    std::uint64_t seg_allocated = 0, seg_active = 0, seg_requested = 0;
    std::uint64_t cursor = address;
    const PyValue* blocks_value = segment->get("blocks");
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
        const std::uint64_t block_requested = state == BlockState::inactive ? 0 : size_at(*block, "requested_size", bwhere, size);
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
          tag_live[tag].first += size;
          ++tag_live[tag].second;
          tag_requested[tag] += block_requested;
          ++allocated_blocks;
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
    std::string type = string_at(*segment, "segment_type", total <= (std::uint64_t{2} << 20) ? "small" : "large");
    if (type != "small" && type != "large") type = "large";
    nlohmann::ordered_json imported = {{"address", address},
                                       {"total_size", total},
                                       {"stream", size_at(*segment, "stream", where, 0)},
                                       {"segment_type", type},
                                       {"allocated_size", seg_allocated},
                                       {"active_size", seg_active},
                                       {"requested_size", seg_requested},
                                       {"blocks", std::move(blocks)}};
    const PyValue* expandable = segment->get("is_expandable");
    if (expandable != nullptr && expandable->kind == Kind::boolean && expandable->boolean) {
      imported["is_expandable"] = true;
    }
    segments.push_back(std::move(imported));
    allocated += seg_allocated;
    active += seg_active;
    requested += seg_requested;
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

  // The trace: actions keep their names; PyTorch's segment_map/unmap (expandable segments)
  // become segment_alloc/free; `snapshot` markers carry no memory change and are dropped.
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  std::uint64_t ooms = 0, alloc_events = 0, live = 0, peak = 0, reserved_live = 0, reserved_peak = 0;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> live_blocks;
  std::map<std::uint32_t, std::uint64_t> tag_now, tag_peak, tag_allocs;
  if (device_trace != nullptr) {
    const PyValue& trace = *device_trace;
    std::int64_t last_time = INT64_MIN;
    EventChecker checker;
    std::vector<std::size_t> checked;  // pickle index of each event the checker saw
    checker.name_events_by([&](std::uint64_t event) {
      return fmt::format("$['device_traces'][{}][{}]", device, checked[event - 1]);
    });
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
      }
      events.push_back({{"action", std::string(to_string(*parsed))}, {"time_us", time}, {"address", address}, {"size", size},
                        {"stream", stream}, {"tag", tag}});
      ++result.events;
    }
  }

  nlohmann::ordered_json tag_stats = nlohmann::ordered_json::array();
  std::map<std::uint32_t, bool> seen;
  for (const auto& [tag, v] : tag_live) seen[tag] = true;
  for (const auto& [tag, v] : tag_peak) seen[tag] = true;
  for (const auto& [tag, unused] : seen) {
    const auto current = tag_live.count(tag) ? tag_live[tag] : std::pair<std::uint64_t, std::uint64_t>{0, 0};
    tag_stats.push_back({{"tag", tag},
                         {"bytes", stat(current.first, tag_peak[tag], 0)},
                         {"requested_bytes", stat(tag_requested[tag], tag_requested[tag], 0)},
                         {"count", stat(current.second, current.second, tag_allocs[tag])}});
  }

  nlohmann::ordered_json tag_table = nlohmann::ordered_json::array();
  for (const Tag& tag : tags.tags()) {
    nlohmann::ordered_json recv = nullptr;
    if (tag.recv) recv = {{"stage", tag.recv->stage}, {"direction", std::string(1, tag.recv->direction)}, {"slot", tag.recv->slot}};
    tag_table.push_back({{"region", tag.region}, {"policy", to_string(tag.policy)}, {"phase", to_string(tag.phase)},
                         {"site", tag.site}, {"recv", recv}});
    if (tag.label != 0) tag_table.back()["label"] = tag.label;
    if (tag.category != 0) tag_table.back()["category"] = std::string(category_name(tag.category));
    if (tag.module != 0) tag_table.back()["module"] = tag.module;
  }

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
  s["stats"] = {{"allocated_bytes", stat(allocated, peak, 0)},
                {"requested_bytes", stat(requested, requested, 0)},
                {"active_bytes", stat(active, active, 0)},
                {"reserved_bytes", stat(reserved, reserved_peak, 0)},
                {"allocations", stat(allocated_blocks, allocated_blocks, alloc_events)},
                {"segments", stat(result.segments, result.segments, 0)},
                {"num_ooms", ooms},
                {"num_alloc_retries", 0},
                {"num_invalid_frees", 0}};
  s["names"] = tags.names();
  s["tags"] = std::move(tag_table);
  s["tag_stats"] = std::move(tag_stats);
  s["segments"] = std::move(segments);
  s["trace"] = {{"capacity", result.events}, {"dropped", 0}, {"events", std::move(events)}};
  result.text = s.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  check_as_remat_reads_it(result.text);
  return result;
}

}  // namespace remat::report
