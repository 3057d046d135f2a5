#include "frame.hpp"
#include "report_json.hpp"

#include <remat/diagnostics.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/dump.hpp>
#include <remat/alloc/tags.hpp>

#include <c10/core/StorageImpl.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <deque>
#include <iterator>
#include <unordered_set>

namespace remat {
namespace detail {
namespace {

// Bounded, so a job that never collects does not grow without limit: the oldest go first.
constexpr std::size_t kMaxScopes = 4096;
thread_local std::deque<CheckpointScope> t_scopes;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Views share their storage's block, so every view of one storage reports the same site.
std::string site_of(const at::Tensor& t) {
  if (!t.has_storage()) return {};
  const auto tag = alloc::find_block_tag(t.storage().data());
  if (!tag) return {};
  const alloc::Tag resolved = alloc::tag_of(*tag);
  return resolved.site != 0 ? alloc::name_of(resolved.site) : std::string();
}

// Adds `t` to a region's residency, counting each storage once.
class ResidencyBuilder {
 public:
  explicit ResidencyBuilder(std::string region) { residency_.region = std::move(region); }
  void add(const std::string& name, const at::Tensor& t) {
    const c10::StorageImpl* storage = storage_of(t);
    const std::int64_t bytes = t.has_storage() ? static_cast<std::int64_t>(t.storage().nbytes()) : 0;
    residency_.tensors.push_back(
        {name, t.sizes().vec(), std::string(c10::toString(t.scalar_type())), bytes, site_of(t)});
    if (storage != nullptr && seen_.insert(storage).second) {
      residency_.bytes += bytes;
      ++residency_.storages;
    }
  }
  RegionResidency take() { return std::move(residency_); }
  bool empty() const { return residency_.tensors.empty(); }

 private:
  RegionResidency residency_;
  std::unordered_set<const c10::StorageImpl*> seen_;
};

}  // namespace

nlohmann::json dump_header(std::string_view kind) {
  alloc::JsonWriter json;
  json.begin_object();
  alloc::write_dump_header(json, kind, 1, 0);
  json.end_object();
  return nlohmann::json::parse(json.str());
}

void record_scope(CheckpointScope scope) {
  if (t_scopes.size() == kMaxScopes) t_scopes.pop_front();
  t_scopes.push_back(std::move(scope));
}

}  // namespace detail

RematTrace collect_trace() {
  RematTrace trace;
  trace.scopes.assign(std::make_move_iterator(detail::t_scopes.begin()), std::make_move_iterator(detail::t_scopes.end()));
  detail::t_scopes.clear();
  return trace;
}

std::string RematTrace::format() const {
  std::size_t regions = 0;
  for (const CheckpointScope& scope : scopes) regions += scope.regions.size();
  std::string out = "remat trace: " + std::to_string(scopes.size()) + " checkpoint(s), " + std::to_string(regions) +
                    " region(s)\n";
  for (const CheckpointScope& scope : scopes) {
    out += "scope [" + scope.name + "]\n";
    for (const RegionDecision& region : scope.regions) {
      out += "  " + region.name + ": " + (region.saved ? "save" : "recompute") + "\n";
    }
  }
  return out;
}

std::string RematTrace::to_json() const {
  nlohmann::json doc = detail::dump_header("remat-trace");
  nlohmann::json list = nlohmann::json::array();
  for (const CheckpointScope& scope : scopes) {
    nlohmann::json regions = nlohmann::json::array();
    for (const RegionDecision& region : scope.regions) {
      regions.push_back({{"name", region.name}, {"decision", region.saved ? "save" : "recompute"}});
    }
    list.push_back({{"name", scope.name}, {"regions", std::move(regions)}});
  }
  doc["scopes"] = std::move(list);
  return doc.dump(2) + "\n";
}

MemoryReport current_memory_report() {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr) {
    throw Error("format_current_memory_report() works only inside a checkpoint's forward; call it from the "
                "checkpointed function (outside recompute)");
  }
  const detail::Frame& frame = *state.frame;
  MemoryReport report;
  report.checkpoint = frame.options.region_name;
  detail::ResidencyBuilder inputs("<inputs>");
  for (std::size_t i = 0; i < frame.inputs.size(); ++i) {
    if (frame.inputs[i].needed) inputs.add("input " + std::to_string(i), frame.inputs[i].value);
  }
  if (!inputs.empty()) report.regions.push_back(inputs.take());
  for (std::size_t r = 0; r < frame.save_regions.size(); ++r) {
    const detail::SaveRegionRecord& region = frame.save_regions[r];
    detail::ResidencyBuilder builder(frame.options.region_name + "::" + region.name);
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      if (region.persisted[o]) builder.add("output " + std::to_string(o), region.outputs[o]);
    }
    std::size_t saved = 0;
    for (const detail::KeptTensor& kept : frame.kept) {
      if (kept.save_region != static_cast<int>(r)) continue;
      if (auto impl = kept.tensor.lock()) builder.add("saved " + std::to_string(saved++), at::Tensor(std::move(impl)));
    }
    if (!builder.empty()) report.regions.push_back(builder.take());
  }
  return report;
}

std::string MemoryReport::format() const {
  std::int64_t total = 0;
  for (const RegionResidency& region : regions) total += region.bytes;
  std::string out = "memory kept for backward by checkpoint [" + checkpoint + "]: " + alloc::format_bytes(total) + "\n";
  for (const RegionResidency& region : regions) {
    out += "  " + region.region + ": " + alloc::format_bytes(region.bytes) + " in " + std::to_string(region.storages) +
           " storage(s)\n";
    for (const ResidentTensor& t : region.tensors) {
      out += "    " + t.name + "  " + detail::shape_text(t.shape) + "  " + t.dtype +
             (t.site.empty() ? "" : "  @" + t.site) + "\n";
    }
  }
  return out;
}

std::string MemoryReport::to_json() const {
  nlohmann::json doc = detail::dump_header("memory-report");
  doc["checkpoint"] = checkpoint;
  nlohmann::json list = nlohmann::json::array();
  for (const RegionResidency& region : regions) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ResidentTensor& t : region.tensors) {
      tensors.push_back(
          {{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}, {"storage_bytes", t.bytes}, {"site", t.site}});
    }
    list.push_back({{"region", region.region},
                    {"bytes", region.bytes},
                    {"storages", region.storages},
                    {"tensors", std::move(tensors)}});
  }
  doc["regions"] = std::move(list);
  return doc.dump(2) + "\n";
}

std::string format_current_memory_report() { return current_memory_report().format(); }

void write_dump(const std::string& path, const std::string& json) { alloc::write_file_atomically(path, json); }

}  // namespace remat
