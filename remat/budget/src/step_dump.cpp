// The step's memory in a region-profile dump ("step"): the storages, checkpoint calls and
// segments a plan's step peak is predicted from, written and read back with every storage and
// call number checked against the lists they index.

#include "step_dump.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget::detail {

namespace {

// A step's byte figure above this is no real measurement (no device or host holds a pebibyte);
// bounding each keeps the sums a step peak is predicted from far from 2^64 (which it still checks).
constexpr std::uint64_t kLargestStepBytes = std::uint64_t{1} << 50;

std::uint64_t bytes_of(const Json& value, std::string_view source, const std::string& path) {
  const std::uint64_t bytes = count_of(value, source, path);
  if (bytes > kLargestStepBytes) {
    refuse(source, path,
           "is " + std::to_string(bytes) +
               " bytes, past 1125899906842624 (1 PiB), which no step "
               "allocates: the dump was edited or damaged; profile the step again");
  }
  return bytes;
}

std::uint64_t bytes_in(const Json& object, const char* key, std::string_view source, const std::string& path) {
  return bytes_of(member(object, key, source, path), source, path + "." + key);
}

void write_numbers(alloc::JsonWriter& json, const std::vector<std::uint32_t>& numbers) {
  json.begin_array();
  for (const std::uint32_t number : numbers) json.value(static_cast<std::uint64_t>(number));
  json.end_array();
}

void write_ids(alloc::JsonWriter& json, const char* key, const std::vector<std::uint32_t>& ids) {
  json.key(key);
  write_numbers(json, ids);
}

// The list at `at`, of storage or segment numbers (`what`).
std::vector<std::uint32_t> numbers_in(const Json& list, std::string_view source, const std::string& at,
                                      const std::string& what) {
  if (!list.is_array()) refuse(source, at, "must be a list of " + what + " numbers");
  std::vector<std::uint32_t> numbers;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::uint64_t number = count_of(list[i], source, at + "[" + std::to_string(i) + "]");
    if (number > UINT32_MAX)
      refuse(source, at + "[" + std::to_string(i) + "]", "is past the largest " + what + " number");
    numbers.push_back(static_cast<std::uint32_t>(number));
  }
  return numbers;
}

std::vector<std::uint32_t> ids_of(const Json& object, const char* key, std::string_view source,
                                  const std::string& path) {
  return numbers_in(member(object, key, source, path), source, path + "." + key, "storage");
}

std::int64_t call_of(const Json& value, std::string_view source, const std::string& path) {
  if (!value.is_number_integer() || value.get<std::int64_t>() < -1) {
    refuse(source, path, "must be a checkpoint call's number, or -1 for none, got " + value.dump());
  }
  return value.get<std::int64_t>();
}

const Json& list_of(const Json& object, const char* key, std::string_view source, const std::string& path) {
  const Json& list = member(object, key, source, path);
  if (!list.is_array()) refuse(source, path + "." + key, "must be a list");
  return list;
}

// Calls read(entry, its path) for each entry of the list object[key], refusing one that is not an
// object.
template <typename Read>
void for_each_entry(const Json& object, const char* key, std::string_view source, const std::string& path, Read read) {
  const Json& list = list_of(object, key, source, path);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = path + "." + key + "[" + std::to_string(i) + "]";
    if (!list[i].is_object()) refuse(source, at, "must be an object");
    read(list[i], at);
  }
}

// A region's "ops": each op's index (ascending, each once) and the storages it made.
std::vector<StepOp> ops_of(const Json& region, std::string_view source, const std::string& path) {
  std::vector<StepOp> ops;
  for_each_entry(region, "ops", source, path, [&](const Json& entry, const std::string& at) {
    const std::uint64_t index = count_of(member(entry, "index", source, at), source, at + ".index");
    if (index > UINT32_MAX) refuse(source, at + ".index", "is past the largest op index");
    if (!ops.empty() && index <= ops.back().index) {
      refuse(source, at + ".index",
             "is " + std::to_string(index) + ", not after the op before it (" + std::to_string(ops.back().index) +
                 "): a region's ops are listed once each, in the order it ran them; profile the step again");
    }
    ops.push_back({static_cast<std::uint32_t>(index), ids_of(entry, "outputs", source, at)});
  });
  return ops;
}

}  // namespace

void write_step(alloc::JsonWriter& json, const StepMemory& step) {
  json.key("step").begin_object();
  json.field("start_bytes", step.start_bytes).field("end_bytes", step.end_bytes).field("peak_bytes", step.peak_bytes);
  json.key("storages").begin_array();
  for (const std::uint64_t bytes : step.storages) json.value(bytes);
  json.end_array();
  if (!step.freed_in.empty()) {
    json.key("freed_in").begin_array();
    for (const std::int64_t segment : step.freed_in) json.value(segment);
    json.end_array();
  }
  json.key("checkpoints").begin_array();
  for (const StepCheckpoint& call : step.checkpoints) {
    json.begin_object().field("name", std::string_view(call.name));
    write_ids(json, "inputs", call.inputs);
    write_ids(json, "kept_inputs", call.kept_inputs);
    if (call.body_inputs) write_ids(json, "body_inputs", *call.body_inputs);
    write_ids(json, "outputs", call.outputs);
    if (!call.create_graph_backwards.empty()) {
      json.key("create_graph_backwards").begin_array();
      for (const auto& [begun, ended] : call.create_graph_backwards) write_numbers(json, {begun, ended});
      json.end_array();
    }
    json.key("regions").begin_array();
    for (const StepRegion& region : call.regions) {
      json.begin_object().field("name", std::string_view(region.name));
      write_ids(json, "kept", region.kept);
      write_ids(json, "inputs", region.inputs);
      write_ids(json, "outputs", region.outputs);
      json.field("transient_bytes", region.transient_bytes);
      if (!region.offload_kept.empty()) write_ids(json, "offload_kept", region.offload_kept);
      if (!region.ops.empty()) {
        json.key("ops").begin_array();
        for (const StepOp& op : region.ops) {
          json.begin_object().field("index", static_cast<std::uint64_t>(op.index));
          write_ids(json, "outputs", op.outputs);
          json.end_object();
        }
        json.end_array();
      }
      if (!region.autocast_cached.empty()) write_ids(json, "autocast_cached", region.autocast_cached);
      if (!call.create_graph_backwards.empty()) write_ids(json, "saved", region.saved);
      json.end_object();
    }
    json.end_array().end_object();
  }
  json.end_array();
  json.key("segments").begin_array();
  for (const StepSegment& segment : step.segments) {
    json.begin_object().field("peak_bytes", segment.peak_bytes).field("start_bytes", segment.start_bytes);
    write_ids(json, "live", segment.live);
    json.field("forward", segment.forward).field("backward", segment.backward).end_object();
  }
  json.end_array();
  if (!step.autocast_cleared.empty()) write_ids(json, "autocast_cleared", step.autocast_cleared);
  if (step.autocast_held_in_backward) json.field("autocast_held_in_backward", true);
  json.end_object();
}

StepMemory read_step(const Json& value, std::string_view source) {
  const std::string path = "$.step";
  if (!value.is_object()) refuse(source, path, "must be an object (the step's memory)");
  StepMemory step;
  step.start_bytes = bytes_in(value, "start_bytes", source, path);
  step.end_bytes = bytes_in(value, "end_bytes", source, path);
  step.peak_bytes = bytes_in(value, "peak_bytes", source, path);
  const Json& storages = list_of(value, "storages", source, path);
  for (std::size_t i = 0; i < storages.size(); ++i) {
    step.storages.push_back(bytes_of(storages[i], source, path + ".storages[" + std::to_string(i) + "]"));
  }
  if (value.contains("freed_in")) {
    const Json& freed = list_of(value, "freed_in", source, path);
    for (std::size_t i = 0; i < freed.size(); ++i) {
      if (!freed[i].is_number_integer() || freed[i].get<std::int64_t>() < -1) {
        refuse(source, path + ".freed_in[" + std::to_string(i) + "]",
               "must be the number of the segment the step freed the storage in, or -1 for none, got " +
                   freed[i].dump());
      }
      step.freed_in.push_back(freed[i].get<std::int64_t>());
    }
  }
  for_each_entry(value, "checkpoints", source, path, [&](const Json& entry, const std::string& at) {
    StepCheckpoint call;
    call.name = text_of(member(entry, "name", source, at), source, at + ".name");
    call.inputs = ids_of(entry, "inputs", source, at);
    call.kept_inputs = ids_of(entry, "kept_inputs", source, at);
    if (entry.contains("body_inputs")) call.body_inputs = ids_of(entry, "body_inputs", source, at);
    call.outputs = ids_of(entry, "outputs", source, at);
    if (entry.contains("create_graph_backwards")) {
      const Json& backwards = list_of(entry, "create_graph_backwards", source, at);
      for (std::size_t i = 0; i < backwards.size(); ++i) {
        const std::string in = at + ".create_graph_backwards[" + std::to_string(i) + "]";
        const std::vector<std::uint32_t> segments = numbers_in(backwards[i], source, in, "segment");
        const std::uint32_t last = call.create_graph_backwards.empty() ? 0 : call.create_graph_backwards.back().second;
        if (segments.size() != 2 || segments[0] >= segments[1] || segments[0] < last) {
          refuse(source, in,
                 "must be two segment numbers, the first below the second and not before the backward listed before "
                 "it (where the call's backward run with create_graph=True began, and where that backward ended); "
                 "profile the step again");
        }
        call.create_graph_backwards.emplace_back(segments[0], segments[1]);
      }
    }
    for_each_entry(entry, "regions", source, at, [&](const Json& listed, const std::string& in) {
      StepRegion region;
      region.name = text_of(member(listed, "name", source, in), source, in + ".name");
      region.kept = ids_of(listed, "kept", source, in);
      region.inputs = ids_of(listed, "inputs", source, in);
      region.outputs = ids_of(listed, "outputs", source, in);
      region.transient_bytes = bytes_in(listed, "transient_bytes", source, in);
      if (listed.contains("offload_kept")) region.offload_kept = ids_of(listed, "offload_kept", source, in);
      if (listed.contains("ops")) region.ops = ops_of(listed, source, in);
      if (listed.contains("autocast_cached")) {
        region.autocast_cached = ids_of(listed, "autocast_cached", source, in);
      }
      if (listed.contains("saved")) region.saved = ids_of(listed, "saved", source, in);
      call.regions.push_back(std::move(region));
    });
    step.checkpoints.push_back(std::move(call));
  });
  if (list_of(value, "segments", source, path).empty()) {
    refuse(source, path + ".segments",
           "is empty, but a profiled step has at least one segment (from its start to its "
           "end) and no step peak is predicted without: profile the step again");
  }
  for_each_entry(value, "segments", source, path, [&](const Json& entry, const std::string& at) {
    StepSegment segment;
    segment.peak_bytes = bytes_in(entry, "peak_bytes", source, at);
    segment.start_bytes = bytes_in(entry, "start_bytes", source, at);
    segment.live = ids_of(entry, "live", source, at);
    segment.forward = call_of(member(entry, "forward", source, at), source, at + ".forward");
    segment.backward = call_of(member(entry, "backward", source, at), source, at + ".backward");
    step.segments.push_back(std::move(segment));
  });
  if (value.contains("autocast_cleared")) step.autocast_cleared = ids_of(value, "autocast_cleared", source, path);
  if (const auto held = value.find("autocast_held_in_backward"); held != value.end()) {
    if (!held->is_boolean()) {
      refuse(source, path + ".autocast_held_in_backward", "must be true or false, got " + held->dump());
    }
    step.autocast_held_in_backward = held->get<bool>();
  }
  return step;
}

}  // namespace remat::budget::detail
