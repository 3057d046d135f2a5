#pragma once
// A tensor's layout without its data (TensorMeta): what forward records of each tensor it
// drops or packs, the placeholder recompute gets in place of a value forward did not keep (that
// layout, no data, and an error naming the fix on any read), and the layout a hook pair's
// unpacked copy is given back.

#include <ATen/core/Tensor.h>

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

// A nested tensor has no sizes: only its options are recorded; a sparse one, no strides.
TensorMeta meta_of(const at::Tensor& t);
// Nested (strided or jagged): no sizes the runtime can read.
bool is_nested(const at::Tensor& t);
// A strided tensor with a storage, not nested: one the runtime can match to reads by its storage,
// make a placeholder of and lay out again. Others (sparse, nested) a save region keeps as they are.
bool plain_strided(const at::Tensor& t);
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
// A tensor's version counter, where it has one (not for undefined or inference tensors).
std::optional<std::uint32_t> version_of(const at::Tensor& t);
// The dtype as PyTorch's Python API names it: "float32".
std::string dtype_name(at::ScalarType type);

}  // namespace remat::detail
