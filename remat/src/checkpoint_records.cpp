// What forward records of a dropped tensor, for recompute to check its own against
// (checkpoint_records.hpp).

#include "checkpoint_records.hpp"

#include <remat/errors.hpp>

namespace remat::detail {

DroppedMeta DroppedMeta::of(const at::Tensor& t, int region) {
  DroppedMeta meta;
  meta.sizes.assign(t.sizes().begin(), t.sizes().end());
  meta.dtype = t.scalar_type();
  meta.device = t.device();
  meta.region = region;
  return meta;
}

std::string DroppedMeta::describe() const {
  std::string out = dtype_name(dtype) + " [";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "] on " + device.str();
}

Fingerprint fingerprint_of(const at::Tensor& t, std::string where) {
  Fingerprint out;
  out.where = std::move(where);
  out.shape = t.sizes().vec();
  const at::Tensor bytes = t.detach().to(at::kCPU).contiguous();
  const auto* data = static_cast<const unsigned char*>(bytes.const_data_ptr());
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (std::size_t i = 0; i < bytes.nbytes(); ++i) hash = (hash ^ data[i]) * 1099511628211ULL;
  out.hash = hash;
  if (at::isFloatingType(bytes.scalar_type()) || at::isIntegralType(bytes.scalar_type(), /*includeBool=*/false)) {
    const at::Tensor values = bytes.to(at::kDouble);
    out.sum = values.sum().item<double>();
    out.norm = values.norm().item<double>();
  }
  return out;
}

std::optional<std::size_t> output_changed_after_forward(const SaveRegionRecord& record) {
  for (std::size_t o = 0; o < record.metas.size(); ++o) {
    const bool kept = record.packed[o] || record.outputs[o].defined();
    if (kept && record.versions[o] && record.version_counters[o].current_version() != *record.versions[o]) return o;
  }
  return std::nullopt;
}

void refuse_outputs_changed_after_forward(const SaveRegionRecord& record, const std::string& path) {
  const std::optional<std::size_t> changed = output_changed_after_forward(record);
  if (!changed) return;
  throw Error("output " + std::to_string(*changed) + " of save region '" + path +
              "' was changed in place after forward (an op such as h.mul_(2) between forward and "
              "backward); recompute would read the changed value and give wrong gradients: make that op "
              "out-of-place, or clone the output before changing it");
}

}  // namespace remat::detail
