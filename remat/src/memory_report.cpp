// The memory a checkpoint keeps for backward, as a report (memory_report.hpp): of the running
// checkpoint, of every live one, and the names reports give the tensors a save region saves.

#include "memory_report.hpp"

#include "frame.hpp"
#include "live_frames.hpp"
#include "report_json.hpp"
#include "thread_state.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/bytes.hpp>
#include <remat/alloc/tags.hpp>

#include <c10/core/StorageImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <unordered_set>

namespace remat {
namespace detail {
namespace {

// Views share their storage's block, so every view of one storage reports the same site.
std::string site_of(const at::Tensor& t) {
  if (!t.has_storage()) return {};
  const auto tag = alloc::find_block_tag(t.storage().data());
  if (!tag) return {};
  const alloc::Tag resolved = alloc::tag_of(*tag);
  return resolved.site != 0 ? alloc::name_of(resolved.site) : std::string();
}

// What remat.CpuOffload copies to the host rather than keep (cpu_offload.cpp's keep_reason, less
// the size and device checks, which depend on how the offloader is made).
bool offloadable(const at::Tensor& t) {
  const auto parameter = [](const at::TensorBase& x) { return x.is_leaf() && x.requires_grad(); };
  return t.layout() == at::kStrided && !is_nested(t) && t.is_non_overlapping_and_dense() && t.numel() != 0 &&
         !parameter(t) && !(t.is_view() && parameter(t._base()));
}

// A report's residency, region by region, billing each storage once in the whole report (a
// storage two regions hold is billed to the first).
class ReportBuilder {
 public:
  // `tensors`, where given, collects every tensor the report lists, in its order.
  explicit ReportBuilder(std::string checkpoint, std::vector<at::Tensor>* tensors = nullptr) : tensors_(tensors) {
    report_.checkpoint = std::move(checkpoint);
  }
  void begin_region(std::string region) {
    report_.regions.emplace_back();
    report_.regions.back().region = std::move(region);
  }
  void add(std::string name, const at::Tensor& t, bool leaf_cast = false) {
    RegionResidency& region = report_.regions.back();
    const c10::StorageImpl* storage = storage_of(t);
    const std::int64_t bytes = storage != nullptr ? static_cast<std::int64_t>(storage->nbytes()) : 0;
    const bool first = storage == nullptr || billed_.insert(storage).second;
    // A nested tensor has no sizes PyTorch gives here: listed without a shape
    std::vector<std::int64_t> shape = is_nested(t) ? std::vector<std::int64_t>() : t.sizes().vec();
    region.tensors.push_back({std::move(name), std::move(shape), dtype_name(t.scalar_type()), bytes, site_of(t),
                              storage != nullptr ? reinterpret_cast<std::uintptr_t>(storage->data()) : 0,
                              t.device().str(), !first, offloadable(t), leaf_cast});
    if (tensors_ != nullptr) tensors_->push_back(t);
    if (storage == nullptr || !first) return;
    region.bytes += bytes;
    ++region.storages;
    report_.bytes += bytes;
    ++report_.storages;
  }
  // Regions that keep nothing are left out (they list no tensor).
  MemoryReport take() {
    std::erase_if(report_.regions, [](const RegionResidency& region) { return region.tensors.empty(); });
    return std::move(report_);
  }

 private:
  MemoryReport report_;
  std::vector<at::Tensor>* tensors_;
  std::unordered_set<const c10::StorageImpl*> billed_;
};

// "(3,)", "(3, 4)", "()": shapes as Python prints a tuple.
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

MemoryReport memory_report_of(const Frame& frame, std::vector<at::Tensor>* tensors) {
  ReportBuilder builder(frame.options.region_name, tensors);
  builder.begin_region("<inputs>");
  for (std::size_t i = 0; i < frame.inputs.size(); ++i) {
    const InputRecord& input = frame.inputs[i];
    if (input.needed && input.value.defined()) builder.add("input." + std::to_string(i), input.value);
  }
  for (std::size_t r = 0; r < frame.save_regions.size(); ++r) {
    const SaveRegionRecord& region = frame.save_regions[r];
    builder.begin_region(frame.region_path(region.name));
    std::size_t unnamed = 0;
    for (const KeptTensor& kept : frame.kept) {
      if (kept.save_region != static_cast<int>(r) || kept.parameter) continue;
      if (auto impl = kept.tensor.lock()) {
        builder.add(kept.name.empty() ? "saved." + std::to_string(unnamed++) : kept.name, at::Tensor(std::move(impl)),
                    kept.leaf_cast);
      }
    }
    for (std::size_t o = 0; o < region.outputs.size(); ++o) {
      if (region.persisted[o] && region.outputs[o].defined()) builder.add("output." + std::to_string(o), region.outputs[o]);
    }
  }
  MemoryReport report = builder.take();
  for (const SaveRegionRecord& region : frame.save_regions) {
    if (!region.rerun_reason.empty()) {
      report.rerun_regions.push_back({frame.region_path(region.name), region.rerun_reason});
    }
  }
  return report;
}

}  // namespace detail

MemoryReport current_memory_report() {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr) {
    throw Error(detail::api_name("current_memory_report") +
                "() works only inside a checkpoint's forward; call it from the checkpointed function (outside "
                "recompute: guard it with `if not " + detail::api_name("is_recomputing") + "()`)");
  }
  return detail::memory_report_of(*state.frame);
}

std::vector<MemoryReport> live_checkpoint_reports() {
  std::vector<MemoryReport> reports;
  detail::for_each_live_frame([&](detail::Frame& frame) { reports.push_back(detail::memory_report_of(frame)); });
  return reports;
}

std::optional<KeptTensors> newest_live_checkpoint(const std::string& checkpoint) {
  std::optional<KeptTensors> newest;
  // Built while the registry's lock keeps the frame alive; each same-named frame's replaces the last
  detail::for_each_live_frame([&](detail::Frame& frame) {
    if (frame.options.region_name != checkpoint) return;
    newest.emplace();
    newest->report = detail::memory_report_of(frame, &newest->tensors);
  });
  return newest;
}

void name_saved_tensors(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  const detail::ThreadState& state = detail::thread_state();
  if (state.mode != detail::Mode::forward || state.frame == nullptr || state.save_region < 0) return;
  for (const auto& [name, tensor] : named) {
    if (tensor.defined()) state.frame->pending_names.emplace_back(tensor.unsafeGetTensorImpl(), name);
  }
}

std::string MemoryReport::format() const {
  std::string out = checkpoint + ": " + alloc::format_bytes(static_cast<std::uint64_t>(bytes)) + " resident in " +
                    std::to_string(storages) + " storage(s)";
  // Columns aligned across the whole report.
  std::size_t byte_width = 0, name_width = 0, shape_width = 0;
  for (const RegionResidency& region : regions) {
    for (const ResidentTensor& t : region.tensors) {
      byte_width = std::max(byte_width, alloc::format_bytes(static_cast<std::uint64_t>(t.bytes)).size());
      name_width = std::max(name_width, t.name.size());
      shape_width = std::max(shape_width, detail::shape_text(t.shape).size());
    }
  }
  auto pad = [](std::string text, std::size_t width, bool right) {
    if (text.size() >= width) return text;
    const std::string fill(width - text.size(), ' ');
    return right ? fill + text : text + fill;
  };
  for (const RegionResidency& region : regions) {
    out += "\n" + region.region + ": " + alloc::format_bytes(static_cast<std::uint64_t>(region.bytes));
    for (const ResidentTensor& t : region.tensors) {
      // A tensor sharing a storage listed above carries no bytes of its own.
      const std::string figure = t.shares_storage ? "" : alloc::format_bytes(static_cast<std::uint64_t>(t.bytes));
      std::string row = "  " + pad(figure, byte_width, true) + "  " + pad(t.name, name_width, false) + "  " +
                        pad(detail::shape_text(t.shape), shape_width, false) + "  " + t.dtype;
      if (t.shares_storage) row += "  (shares a storage above)";
      if (!t.site.empty()) row += "  @" + t.site;
      out += "\n" + row;
    }
  }
  return out + "\n";
}

std::string MemoryReport::to_json() const {
  nlohmann::json doc = detail::dump_header("memory-report");
  doc["checkpoint"] = checkpoint;
  doc["bytes"] = bytes;
  doc["storages"] = storages;
  nlohmann::json list = nlohmann::json::array();
  for (const RegionResidency& region : regions) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ResidentTensor& t : region.tensors) {
      tensors.push_back({{"name", t.name},
                         {"shape", t.shape},
                         {"dtype", t.dtype},
                         {"storage_bytes", t.bytes},
                         {"site", t.site},
                         {"device", t.device},
                         {"shares_storage", t.shares_storage}});
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

}  // namespace remat
