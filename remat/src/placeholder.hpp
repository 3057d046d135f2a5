#pragma once
// What forward leaves where it drops or packs a tensor (placeholder.cpp): the tensor's layout,
// a placeholder with that layout and no data, what recompute must recreate in its place, and
// the fingerprint verify_recompute compares.

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace remat::detail {

struct TensorMeta {
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t storage_offset = 0;
  std::int64_t storage_bytes = 0;
  at::TensorOptions options;
  bool requires_grad = false;
};

TensorMeta meta_of(const at::Tensor& t);
// What a hook pair's unpack gave back for a tensor that was `meta` when packed (`what` names it
// in errors): refused when its shape, dtype or device differ, laid out again as it was (strides,
// offset, storage size) when only the layout differs, as a copying pair's contiguous copy does,
// so that recompute sees the tensor forward saw.
at::Tensor restore_layout(const at::Tensor& unpacked, const TensorMeta& meta, const std::string& what);
inline constexpr const char* kPlaceholderMarker = "remat placeholder";
// Same shape, strides and dtype as described, but no data: reading it raises an error that
// names `source` and the fix.
at::Tensor make_placeholder(const TensorMeta& meta, const std::string& source);
// The placeholder's message when `e` is a read of one.
std::optional<std::string> placeholder_error_of(const std::exception& e);
const c10::StorageImpl* storage_of(const at::Tensor& t);
// The dtype as PyTorch's Python API names it: "float32".
std::string dtype_name(at::ScalarType type);

// What verify_recompute compares: an exact hash of the bytes, plus sums that say how large
// a difference is.
struct Fingerprint {
  std::string where;  // "region 'layers.0::mlp'" or "the checkpoint body"
  std::vector<std::int64_t> shape;
  std::uint64_t hash = 0;
  double sum = 0;
  double norm = 0;
};
Fingerprint fingerprint_of(const at::Tensor& t, std::string where);

// What recompute must recreate in place of a dropped tensor: checked on every recompute (as
// torch.utils.checkpoint's default determinism check), so a body that takes another path
// fails naming the tensor instead of handing backward the wrong one.
struct DroppedMeta {
  c10::SmallVector<std::int64_t, 6> sizes;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;
  int region = -1;  // index into Frame::regions; -1 for the checkpoint body outside regions

  static DroppedMeta of(const at::Tensor& t, int region);
  bool operator==(const DroppedMeta& other) const {
    return sizes == other.sizes && dtype == other.dtype && device == other.device;
  }
  std::string describe() const;  // "float32 [32, 64] on cpu"
};

}  // namespace remat::detail
