#include "frame.hpp"
#include "report_json.hpp"
#include "saved_registry.hpp"

#include <remat/alloc/bytes.hpp>

#include <remat/saved_report.hpp>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace remat {
namespace detail {
namespace {

thread_local bool t_tracking = false;

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, SavedEntry> entries;
};

Registry& registry() {
  static auto* instance = new Registry();  // hooks may be destroyed during shutdown
  return *instance;
}

}  // namespace

bool saved_tracking_enabled() { return t_tracking; }
void set_saved_tracking(bool enabled) { t_tracking = enabled; }

SavedEntry entry_for_current_node() {
  SavedEntry entry;
  entry.thread = at::RecordFunction::currentThreadId();
  entry.sequence = at::sequence_number::peek() - 1;
  return entry;
}

void register_saved(const void* owner, SavedEntry entry) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries[owner] = std::move(entry);
}

void unregister_saved(const void* owner) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries.erase(owner);
}

std::vector<SavedEntry> saved_entries() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<SavedEntry> out;
  out.reserve(r.entries.size());
  for (const auto& [owner, entry] : r.entries) out.push_back(entry);
  return out;
}

namespace {

// Bills storages once each, in the order offered.
class Biller {
 public:
  // Bytes newly billed for `t` (0 when its storage was billed already).
  std::int64_t bill(const at::Tensor& t) {
    const c10::StorageImpl* storage = storage_of(t);
    if (storage == nullptr || !billed_.insert(storage).second) return 0;
    return static_cast<std::int64_t>(t.storage().nbytes());
  }

 private:
  std::unordered_set<const c10::StorageImpl*> billed_;
};

struct Usage {
  std::int64_t bytes = 0;
  std::int64_t storages = 0;
  std::int64_t nodes = 0;
};

// "layer.0" -> ("layer.", 0, ""); names without a number fold only with themselves.
struct NamePattern {
  std::string prefix;
  long index = -1;
  std::string suffix;
};

NamePattern pattern_of(const std::string& name) {
  const auto start = name.find_first_of("0123456789");
  if (start == std::string::npos) return {name, -1, ""};
  const auto end = name.find_first_not_of("0123456789", start);
  const std::string digits = name.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (digits.size() > 9) return {name, -1, ""};
  return {name.substr(0, start), std::stol(digits), end == std::string::npos ? "" : name.substr(end)};
}

std::string fold_label(const NamePattern& first, std::vector<long> indices) {
  std::sort(indices.begin(), indices.end());
  std::string middle;
  const bool contiguous = indices.back() - indices.front() + 1 == static_cast<long>(indices.size());
  if (indices.size() == 1) middle = std::to_string(indices[0]);
  else if (contiguous) middle = std::to_string(indices.front()) + "-" + std::to_string(indices.back());
  else {
    for (const long i : indices) middle += (middle.empty() ? "" : ",") + std::to_string(i);
  }
  return first.prefix + middle + first.suffix;
}

std::vector<SavedGroup> fold_regions(const std::map<std::string, Usage>& regions) {
  struct Key {
    std::string prefix, suffix;
    std::int64_t bytes, storages;
    bool operator<(const Key& o) const {
      return std::tie(prefix, suffix, bytes, storages) < std::tie(o.prefix, o.suffix, o.bytes, o.storages);
    }
  };
  std::map<Key, std::pair<NamePattern, std::vector<long>>> folded;
  std::vector<SavedGroup> out;
  for (const auto& [name, usage] : regions) {
    const NamePattern pattern = pattern_of(name);
    if (pattern.index < 0) {
      out.push_back({name, usage.bytes, 1, usage.storages});
      continue;
    }
    auto& slot = folded[{pattern.prefix, pattern.suffix, usage.bytes, usage.storages}];
    slot.first = pattern;
    slot.second.push_back(pattern.index);
  }
  for (const auto& [key, members] : folded) {
    const auto n = static_cast<std::int64_t>(members.second.size());
    out.push_back({fold_label(members.first, members.second), key.bytes * n, n, key.storages * n});
  }
  return out;
}

void sort_groups(std::vector<SavedGroup>& groups) {
  std::sort(groups.begin(), groups.end(), [](const SavedGroup& a, const SavedGroup& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
  });
}

}  // namespace
}  // namespace detail

SavedTensorsTracking::SavedTensorsTracking() : previous_(detail::saved_tracking_enabled()) {
  detail::ensure_engine_installed();
  detail::set_saved_tracking(true);
}

SavedTensorsTracking::~SavedTensorsTracking() { detail::set_saved_tracking(previous_); }

SavedReport saved_report(const at::Tensor& loss) {
  using detail::Usage;
  // The nodes behind the loss, by the (thread, sequence number) that identifies them.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::string> nodes;
  if (loss.defined() && loss.grad_fn()) {
    std::vector<torch::autograd::Node*> stack{loss.grad_fn().get()};
    std::unordered_set<torch::autograd::Node*> seen{loss.grad_fn().get()};
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      nodes[{node->thread_id(), node->sequence_nr()}] = node->name();
      for (const auto& edge : node->next_edges()) {
        torch::autograd::Node* next = edge.function.get();
        if (next != nullptr && seen.insert(next).second) stack.push_back(next);
      }
    }
  }

  std::vector<detail::SavedEntry> entries;
  for (detail::SavedEntry& entry : detail::saved_entries()) {
    if (nodes.count({entry.thread, entry.sequence}) != 0) entries.push_back(std::move(entry));
  }
  detail::Biller biller;
  std::map<std::string, Usage> regions;
  std::map<std::string, Usage> outside;
  auto bill = [&](Usage& usage, const at::Tensor& t) {
    const std::int64_t bytes = biller.bill(t);
    if (bytes > 0) {
      usage.bytes += bytes;
      ++usage.storages;
    }
  };
  // Checkpoints first, so a storage they share with plain code is billed to them.
  std::set<const detail::Frame*> frames_billed;
  for (const detail::SavedEntry& entry : entries) {
    if (entry.checkpoint.empty()) continue;
    Usage& usage = regions[entry.checkpoint];
    if (entry.tensor.defined()) bill(usage, entry.tensor);
    const auto frame = entry.frame.lock();
    if (frame && frames_billed.insert(frame.get()).second) {
      for (const detail::InputRecord& input : frame->inputs) bill(usage, input.value);
      for (const detail::SaveRegionRecord& region : frame->save_regions) {
        for (const at::Tensor& output : region.outputs) bill(usage, output);
      }
    }
  }
  std::map<std::string, std::set<std::pair<std::uint64_t, std::uint64_t>>> node_members;
  for (const detail::SavedEntry& entry : entries) {
    if (!entry.checkpoint.empty() || !entry.tensor.defined()) continue;
    const std::string& name = nodes[{entry.thread, entry.sequence}];
    bill(outside[name], entry.tensor);
    node_members[name].insert({entry.thread, entry.sequence});
  }

  SavedReport report;
  for (const auto& [name, usage] : regions) {
    report.region_bytes += usage.bytes;
    ++report.regions;
  }
  report.region_groups = detail::fold_regions(regions);
  for (const auto& [name, usage] : outside) {
    report.outside_bytes += usage.bytes;
    report.node_groups.push_back({name, usage.bytes, static_cast<std::int64_t>(node_members[name].size()),
                                  usage.storages});
  }
  report.total_bytes = report.region_bytes + report.outside_bytes;
  detail::sort_groups(report.region_groups);
  detail::sort_groups(report.node_groups);
  return report;
}

std::string SavedReport::format() const {
  std::string out = "saved for backward: " + alloc::format_bytes(total_bytes) + " resident -- " + std::to_string(regions) +
                    " region(s) " + alloc::format_bytes(region_bytes) + ", outside regions " + alloc::format_bytes(outside_bytes) +
                    "\n";
  for (const SavedGroup& group : region_groups) {
    out += "  " + alloc::format_bytes(group.bytes / group.count) + "  x" + std::to_string(group.count) + "  " + group.label +
           "  (" + std::to_string(group.storages / group.count) +
           (group.count > 1 ? " storages each)\n" : " storages)\n");
  }
  for (const SavedGroup& group : node_groups) {
    out += "  " + alloc::format_bytes(group.bytes) + "  " + group.label + " (x" + std::to_string(group.count) + ")\n";
  }
  return out;
}

std::string SavedReport::to_json() const {
  nlohmann::json doc = detail::dump_header("saved-report");
  doc["total_bytes"] = total_bytes;
  doc["region_bytes"] = region_bytes;
  doc["outside_bytes"] = outside_bytes;
  doc["regions"] = regions;
  auto groups = [](const std::vector<SavedGroup>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const SavedGroup& g : list) {
      out.push_back({{"label", g.label}, {"bytes", g.bytes}, {"count", g.count}, {"storages", g.storages}});
    }
    return out;
  };
  doc["region_groups"] = groups(region_groups);
  doc["node_groups"] = groups(node_groups);
  return doc.dump(2) + "\n";
}

}  // namespace remat
