#include "reader/report_reader.hpp"

#include "core/errors.hpp"
#include "reader/dump_reader.hpp"

#include <fmt/format.h>

namespace remat::report {

using json::member;

namespace {

using json::string_field;
using json::u64_field;

// A string that must not be empty (names and labels).
std::string name_field(json::object parent, std::string_view key, const JsonPath& path) {
  std::string text(string_field(parent, key, path));
  if (text.empty()) throw InputError(path.key(key).str(), "must not be empty");
  return text;
}

// Calls `each(element, path)` for every item of the array member `key`.
template <typename Each>
void for_each_item(json::object parent, std::string_view key, const JsonPath& path, Each each) {
  const JsonPath array_path = path.key(key);
  std::size_t i = 0;
  for (json::element item : json::as_array(member(parent, key, path), array_path)) {
    each(item, array_path.index(i));
    ++i;
  }
}

SavedGroup read_saved_group(json::element value, const JsonPath& path) {
  const json::object object = json::as_object(value, path);
  SavedGroup group;
  group.label = name_field(object, "label", path);
  group.bytes = u64_field(object, "bytes", path);
  group.count = u64_field(object, "count", path);
  if (group.count == 0) throw InputError(path.key("count").str(), "must be at least 1 (a group has members)");
  group.storages = u64_field(object, "storages", path);
  return group;
}

OomHolder read_holder(json::element value, const JsonPath& path) {
  const json::object object = json::as_object(value, path);
  OomHolder holder;
  holder.name = name_field(object, "name", path);
  holder.bytes = u64_field(object, "bytes", path);
  holder.blocks = u64_field(object, "blocks", path);
  holder.saved_bytes = u64_field(object, "saved_bytes", path);
  if (holder.saved_bytes > holder.bytes) {
    throw InputError(path.key("saved_bytes").str(),
                     fmt::format("{} exceeds the holder's bytes ({}); saved bytes are a part of them",
                                 holder.saved_bytes, holder.bytes));
  }
  return holder;
}

}  // namespace

RematTraceDump read_remat_trace(json::object root) {
  const JsonPath path;
  RematTraceDump dump;
  dump.header = read_dump_header(root, path);
  for_each_item(root, "scopes", path, [&](json::element value, const JsonPath& scope_path) {
    const json::object object = json::as_object(value, scope_path);
    CheckpointScope scope;
    scope.name = name_field(object, "name", scope_path);
    for_each_item(object, "regions", scope_path, [&](json::element region_value, const JsonPath& region_path) {
      const json::object region = json::as_object(region_value, region_path);
      RegionDecision decision;
      decision.name = name_field(region, "name", region_path);
      const JsonPath decision_path = region_path.key("decision");
      const std::string_view text = json::string_field(region, "decision", region_path);
      if (text != "save" && text != "recompute") {
        throw InputError(decision_path.str(),
                         fmt::format("unknown decision '{}'; expected save or recompute", printable(text)));
      }
      decision.saved = text == "save";
      scope.regions.push_back(std::move(decision));
    });
    dump.scopes.push_back(std::move(scope));
  });
  return dump;
}

MemoryReportDump read_memory_report(json::object root) {
  const JsonPath path;
  MemoryReportDump dump;
  dump.header = read_dump_header(root, path);
  dump.checkpoint = name_field(root, "checkpoint", path);
  // Views add these up across regions and sites; so must they fit in 64 bits.
  std::uint64_t region_sum = 0, storage_sum = 0;
  for_each_item(root, "regions", path, [&](json::element value, const JsonPath& region_path) {
    const json::object object = json::as_object(value, region_path);
    ResidentRegion region;
    region.region = name_field(object, "region", region_path);
    region.bytes = u64_field(object, "bytes", region_path);
    region.storages = u64_field(object, "storages", region_path);
    if (__builtin_add_overflow(region_sum, region.bytes, &region_sum)) {
      throw InputError(region_path.key("bytes").str(),
                       "the regions' bytes add up to more than 2^64 - 1: the report is corrupt");
    }
    for_each_item(object, "tensors", region_path, [&](json::element tensor_value, const JsonPath& tensor_path) {
      const json::object t = json::as_object(tensor_value, tensor_path);
      ResidentTensor tensor;
      tensor.name = string_field(t, "name", tensor_path);
      for_each_item(t, "shape", tensor_path, [&](json::element dim, const JsonPath& dim_path) {
        tensor.shape.push_back(json::as_u64(dim, dim_path));
      });
      tensor.dtype = string_field(t, "dtype", tensor_path);
      tensor.storage_bytes = u64_field(t, "storage_bytes", tensor_path);
      if (__builtin_add_overflow(storage_sum, tensor.storage_bytes, &storage_sum)) {
        throw InputError(tensor_path.key("storage_bytes").str(),
                         "the tensors' storage bytes add up to more than 2^64 - 1: the report is corrupt");
      }
      tensor.site = string_field(t, "site", tensor_path);
      region.tensors.push_back(std::move(tensor));
    });
    dump.regions.push_back(std::move(region));
  });
  return dump;
}

SavedReportDump read_saved_report(json::object root) {
  const JsonPath path;
  SavedReportDump dump;
  dump.header = read_dump_header(root, path);
  dump.total_bytes = u64_field(root, "total_bytes", path);
  dump.region_bytes = u64_field(root, "region_bytes", path);
  dump.outside_bytes = u64_field(root, "outside_bytes", path);
  dump.regions = u64_field(root, "regions", path);
  for_each_item(root, "region_groups", path, [&](json::element value, const JsonPath& group_path) {
    dump.region_groups.push_back(read_saved_group(value, group_path));
  });
  for_each_item(root, "node_groups", path, [&](json::element value, const JsonPath& group_path) {
    dump.node_groups.push_back(read_saved_group(value, group_path));
  });
  return dump;
}

OomDump read_oom(json::object root) {
  const JsonPath path;
  OomDump dump;
  dump.header = read_dump_header(root, path);
  const JsonPath backend_path = path.key("backend");
  dump.backend = std::string(json::string_field(root, "backend", path));
  if (dump.backend != "cuda" && dump.backend != "host") {
    throw InputError(backend_path.str(),
                     fmt::format("unknown backend '{}'; expected cuda or host", printable(dump.backend)));
  }
  OomNumbers& n = dump.numbers;
  const JsonPath request_path = path.key("request");
  const json::object request = json::as_object(member(root, "request", path), request_path);
  n.requested_bytes = u64_field(request, "requested_bytes", request_path);
  n.rounded_bytes = u64_field(request, "rounded_bytes", request_path);
  n.segment_bytes = u64_field(request, "segment_bytes", request_path);

  const JsonPath memory_path = path.key("memory");
  const json::object memory = json::as_object(member(root, "memory", path), memory_path);
  n.memory.free_bytes = u64_field(memory, "device_free_bytes", memory_path);
  n.memory.total_bytes = u64_field(memory, "device_total_bytes", memory_path);
  n.reserved_bytes = u64_field(memory, "reserved_bytes", memory_path);
  n.allocated_bytes = u64_field(memory, "allocated_bytes", memory_path);
  n.requested_live_bytes = u64_field(memory, "requested_bytes", memory_path);
  n.active_bytes = u64_field(memory, "active_bytes", memory_path);
  n.segments = u64_field(memory, "segments", memory_path);
  if (const auto fraction = json::optional_member(memory, "memory_fraction")) {
    const JsonPath fraction_path = memory_path.key("memory_fraction");
    n.memory_fraction = json::as_number(*fraction, fraction_path);
    if (!(n.memory_fraction > 0.0 && n.memory_fraction <= 1.0)) {
      throw InputError(fraction_path.str(), fmt::format("{} is outside (0, 1]", n.memory_fraction));
    }
  }
  if (json::optional_member(memory, "reserved_limit_bytes")) {
    n.reserved_limit_bytes = u64_field(memory, "reserved_limit_bytes", memory_path);
  }
  if (const auto cause = json::optional_member(root, "cause")) {
    const JsonPath cause_path = path.key("cause");
    const std::string_view text = json::as_string(*cause, cause_path);
    using alloc::OomCause;
    for (const OomCause known :
         {OomCause::request_exceeds_device, OomCause::memory_fraction_cap, OomCause::device_full}) {
      if (text == alloc::to_string(known)) n.cause = known;
    }
    if (!n.cause) {
      throw InputError(cause_path.str(), fmt::format("unknown cause '{}'; expected request_exceeds_device, "
                                                     "memory_fraction_cap or device_full",
                                                     printable(text)));
    }
    if (n.cause == OomCause::memory_fraction_cap && n.reserved_limit_bytes == 0) {
      throw InputError(memory_path.key("reserved_limit_bytes").str(),
                       "missing, but the cause is memory_fraction_cap: the report must give the cap");
    }
  }

  const JsonPath fragmentation_path = path.key("fragmentation");
  const json::object fragmentation = json::as_object(member(root, "fragmentation", path), fragmentation_path);
  n.largest_free_block = u64_field(fragmentation, "largest_free_block", fragmentation_path);
  n.cached_free_bytes = u64_field(fragmentation, "cached_free_bytes", fragmentation_path);
  n.releasable_bytes = u64_field(fragmentation, "releasable_bytes", fragmentation_path);
  n.fragmented_free_bytes = u64_field(fragmentation, "fragmented_free_bytes", fragmentation_path);
  n.free_blocks_in_split_segments = u64_field(fragmentation, "free_blocks_in_split_segments", fragmentation_path);
  n.internal_bytes = u64_field(fragmentation, "internal_bytes", fragmentation_path);
  if (const auto pool_value = json::optional_member(fragmentation, "request_pool")) {  // absent in older reports
    const JsonPath pool_path = fragmentation_path.key("request_pool");
    const json::object figures = json::as_object(*pool_value, pool_path);
    const std::string_view name = string_field(figures, "pool", pool_path);
    if (name != "small" && name != "large") {
      throw InputError(pool_path.key("pool").str(),
                       fmt::format("unknown pool '{}'; expected small or large", printable(name)));
    }
    n.request_pool = alloc::PoolFreeSpace{name == "small", u64_field(figures, "free_bytes", pool_path),
                                          u64_field(figures, "fragmented_free_bytes", pool_path),
                                          u64_field(figures, "free_blocks_in_split_segments", pool_path)};
    // One pool's free blocks are some of both pools': figures past those are no report's
    const alloc::PoolFreeSpace& pool = *n.request_pool;
    const auto more_than = [&](std::string_view field, std::uint64_t value, std::string_view whole, std::uint64_t of) {
      if (value > of) {
        throw InputError(pool_path.key(field).str(), fmt::format("{} is more than fragmentation.{} ({}): one pool's "
                                                                 "free blocks are some of both pools'",
                                                                 value, whole, of));
      }
    };
    more_than("free_bytes", pool.free_bytes, "cached_free_bytes", n.cached_free_bytes);
    more_than("fragmented_free_bytes", pool.fragmented_free_bytes, "fragmented_free_bytes", n.fragmented_free_bytes);
    more_than("fragmented_free_bytes", pool.fragmented_free_bytes, "request_pool.free_bytes", pool.free_bytes);
    more_than("free_blocks_in_split_segments", pool.free_blocks_in_split_segments, "free_blocks_in_split_segments",
              n.free_blocks_in_split_segments);
  }

  dump.num_ooms = u64_field(root, "num_ooms", path);
  if (dump.num_ooms == 0) {
    throw InputError(path.key("num_ooms").str(), "is 0, but an OOM report counts the OOM it reports: at least 1");
  }
  dump.config = string_field(root, "config", path);

  const JsonPath holders_path = path.key("holders");
  const json::object holders = json::as_object(member(root, "holders", path), holders_path);
  // The allocator bills each live block's bytes to one holder of every grouping (receive slots
  // only to the blocks that back one) and lists the largest holders: a grouping's rows add up to
  // at most the allocated bytes.
  auto read_holders = [&](std::string_view key, std::vector<OomHolder>& into) {
    std::uint64_t listed = 0;  // the rows before, at most allocated_bytes
    for_each_item(holders, key, holders_path, [&](json::element value, const JsonPath& holder_path) {
      OomHolder holder = read_holder(value, holder_path);
      if (holder.bytes > n.allocated_bytes - listed) {
        throw InputError(holder_path.key("bytes").str(),
                         fmt::format("{} bytes, with the {} rows before, add up to more than "
                                     "$.memory.allocated_bytes ({}): each grouping of holders divides the allocated "
                                     "bytes among them, so its rows add up to at most that; write the dump again "
                                     "from the allocator or fix the figures",
                                     holder.bytes, into.size(), n.allocated_bytes));
      }
      listed += holder.bytes;
      into.push_back(std::move(holder));
    });
  };
  read_holders("by_region", dump.holders.by_region);
  read_holders("by_recv_slot", dump.holders.by_recv_slot);
  read_holders("by_site", dump.holders.by_site);
  read_holders("by_phase", dump.holders.by_phase);
  if (json::optional_member(holders, "by_label")) read_holders("by_label", dump.holders.by_label);
  if (json::optional_member(holders, "by_category")) read_holders("by_category", dump.holders.by_category);
  if (json::optional_member(holders, "by_module")) read_holders("by_module", dump.holders.by_module);

  for_each_item(root, "tag_stack", path, [&](json::element value, const JsonPath& entry_path) {
    dump.tag_stack.emplace_back(json::as_string(value, entry_path));
  });
  for_each_item(root, "last_events", path, [&](json::element value, const JsonPath& event_path) {
    const json::object object = json::as_object(value, event_path);
    OomEvent event;
    const JsonPath action_path = event_path.key("action");
    const std::string_view action = json::string_field(object, "action", event_path);
    if (auto a = action_from(action))
      event.action = *a;
    else
      throw InputError(action_path.str(), fmt::format("unknown action '{}'", printable(action)));
    event.time_us = json::i64_field(object, "time_us", event_path);
    event.address = u64_field(object, "address", event_path);
    event.size = u64_field(object, "size", event_path);
    event.stream = u64_field(object, "stream", event_path);
    event.region = string_field(object, "region", event_path);
    dump.last_events.push_back(std::move(event));
  });
  return dump;
}

}  // namespace remat::report
