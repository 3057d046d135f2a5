// The saved-tensors report (remat/saved_report.hpp): what a loss keeps alive, billed to the
// checkpoints' regions and to autograd nodes, each storage once.

#include "engine.hpp"
#include "frame.hpp"
#include "memory_report.hpp"
#include "report_json.hpp"
#include "saved_registry.hpp"

#include <remat/alloc/bytes.hpp>

#include <remat/saved_report.hpp>

#include <c10/core/StorageImpl.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_set>

namespace remat {
namespace detail {
namespace {

// Bills storages once each, in the order offered, by the address of their data.
class Biller {
 public:
  // Bytes newly billed for `t` (0 when its storage was billed already).
  std::int64_t bill(const at::Tensor& t) {
    const c10::StorageImpl* storage = storage_of(t);
    if (storage == nullptr || !bill_address(reinterpret_cast<std::uintptr_t>(storage->data()))) return 0;
    return static_cast<std::int64_t>(storage->nbytes());
  }
  // Whether the storage at `address` is billed now for the first time.
  bool bill_address(std::uintptr_t address) { return address != 0 && billed_.insert(address).second; }

 private:
  std::unordered_set<std::uintptr_t> billed_;
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
  // Appended piece by piece: GCC 12 at -O3 reports a false overlap (-Wrestrict,
  // -Wstringop-overflow) in `const char* + std::string&&`.
  std::string label = first.prefix;
  const bool contiguous = indices.back() - indices.front() + 1 == static_cast<long>(indices.size());
  if (indices.size() == 1) {
    label += std::to_string(indices.front());
  } else if (contiguous) {
    label += std::to_string(indices.front());
    label += '-';
    label += std::to_string(indices.back());
  } else {
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i > 0) label += ',';
      label += std::to_string(indices[i]);
    }
  }
  label += first.suffix;
  return label;
}

std::vector<SavedGroup> fold_regions(const std::map<std::string, Usage>& regions) {
  struct Key {
    std::string prefix, suffix;
    std::int64_t bytes, storages;
    bool operator<(const Key& o) const {
      return std::tie(prefix, suffix, bytes, storages) < std::tie(o.prefix, o.suffix, o.bytes, o.storages);
    }
  };
  struct Members {
    NamePattern first;       // the lowest index
    std::string first_name;  // its full name
    std::vector<long> indices;
  };
  std::map<Key, Members> folded;
  std::vector<SavedGroup> out;
  for (const auto& [name, usage] : regions) {
    const NamePattern pattern = pattern_of(name);
    if (pattern.index < 0) {
      out.push_back({name, usage.bytes, 1, usage.storages, name});
      continue;
    }
    auto& slot = folded[{pattern.prefix, pattern.suffix, usage.bytes, usage.storages}];
    if (slot.indices.empty() || pattern.index < slot.first.index) {
      slot.first = pattern;
      slot.first_name = name;
    }
    slot.indices.push_back(pattern.index);
  }
  for (const auto& [key, members] : folded) {
    const auto n = static_cast<std::int64_t>(members.indices.size());
    out.push_back({fold_label(members.first, members.indices), key.bytes * n, n, key.storages * n, members.first_name});
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

SavedReport saved_report(const at::Tensor& loss, const SavedTensorsWalk* walk) {
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
  // Checkpoints first, so a storage they share with plain code is billed to them: those the
  // walk read, and those tracking recorded.
  std::vector<const detail::Frame*> frames;
  auto add_frame = [&](const detail::Frame* frame) {
    if (frame != nullptr && std::find(frames.begin(), frames.end(), frame) == frames.end()) frames.push_back(frame);
  };
  std::vector<std::shared_ptr<detail::Frame>> tracked_frames;  // held while billed
  if (walk != nullptr) {
    for (const auto& frame : walk->checkpoints()) add_frame(frame.get());
  }
  for (const detail::SavedEntry& entry : entries) {
    if (auto frame = entry.frame.lock()) {
      add_frame(frame.get());
      tracked_frames.push_back(std::move(frame));
    }
  }
  std::map<std::string, MemoryReport> first_report;  // per checkpoint name, for the details
  for (const detail::Frame* frame : frames) {
    MemoryReport kept = detail::memory_report_of(*frame);
    Usage& usage = regions[kept.checkpoint];
    for (const RegionResidency& region : kept.regions) {
      for (const ResidentTensor& t : region.tensors) {
        if (t.shares_storage || !biller.bill_address(t.address)) continue;
        usage.bytes += t.bytes;
        ++usage.storages;
      }
    }
    first_report.emplace(kept.checkpoint, std::move(kept));
  }
  // The nodes the walk read replace what tracking recorded of them. A node whose every storage
  // is billed already (a checkpoint keeps it) is not listed.
  std::map<std::string, std::set<std::pair<std::uint64_t, std::uint64_t>>> node_members;
  auto bill_node = [&](const std::string& name, std::pair<std::uint64_t, std::uint64_t> id,
                       const std::vector<at::Tensor>& tensors) {
    Usage usage;
    for (const at::Tensor& t : tensors) bill(usage, t);
    if (usage.bytes == 0) return;
    Usage& total = outside[name];
    total.bytes += usage.bytes;
    total.storages += usage.storages;
    node_members[name].insert(id);
  };
  if (walk != nullptr && !walk->nodes().empty()) {
    for (const SavedTensorsWalk::NodeSaves& saves : walk->nodes()) {
      bill_node(saves.node, {~std::uint64_t{0}, saves.id}, saves.tensors);
    }
  } else {
    for (const detail::SavedEntry& entry : entries) {
      if (!entry.checkpoint.empty() || !entry.tensor.defined()) continue;
      bill_node(nodes[{entry.thread, entry.sequence}], {entry.thread, entry.sequence}, {entry.tensor});
    }
  }

  SavedReport report;
  for (const auto& [name, usage] : regions) {
    report.region_bytes += usage.bytes;
    ++report.regions;
  }
  report.region_groups = detail::fold_regions(regions);
  detail::sort_groups(report.region_groups);
  for (const SavedGroup& group : report.region_groups) {
    const auto found = first_report.find(group.first_member);
    report.details.push_back(found != first_report.end() ? found->second : MemoryReport{});
  }
  for (const auto& [name, usage] : outside) {
    report.outside_bytes += usage.bytes;
    report.node_groups.push_back({name, usage.bytes, static_cast<std::int64_t>(node_members[name].size()),
                                  usage.storages});
  }
  report.total_bytes = report.region_bytes + report.outside_bytes;
  detail::sort_groups(report.node_groups);
  return report;
}

std::string SavedReport::format() const {
  using alloc::format_bytes;
  std::string out = "saved for backward: " + format_bytes(total_bytes) + " resident -- " + std::to_string(regions) +
                    " region(s) " + format_bytes(region_bytes) + ", outside regions " + format_bytes(outside_bytes) + "\n";
  if (!region_groups.empty()) out += "\nregions:\n";
  for (const SavedGroup& group : region_groups) {
    const std::int64_t each = group.storages / group.count;
    out += "  " + format_bytes(group.bytes / group.count) + "  x" + std::to_string(group.count) + "  " + group.label +
           "  (" + std::to_string(each) + (each == 1 ? " storage" : " storages") +
           (group.count > 1 ? " each)\n" : ")\n");
  }
  std::int64_t outside_storages = 0;
  for (const SavedGroup& group : node_groups) outside_storages += group.storages;
  if (!node_groups.empty()) {
    out += "\noutside regions: " + format_bytes(outside_bytes) + " in " + std::to_string(outside_storages) +
           (outside_storages == 1 ? " storage\n" : " storages\n");
  }
  for (const SavedGroup& group : node_groups) {
    std::string figure = format_bytes(group.bytes);
    if (figure.size() < 9) figure.insert(0, 9 - figure.size(), ' ');
    out += "  " + figure + "  " + group.label + " (x" + std::to_string(group.count) + ")\n";
  }
  if (!region_groups.empty()) out += "\nregion detail:\n";
  for (std::size_t i = 0; i < details.size() && i < region_groups.size(); ++i) {
    if (details[i].checkpoint.empty()) continue;
    out += "[x" + std::to_string(region_groups[i].count) + ": " + region_groups[i].label + "]\n" + details[i].format();
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
