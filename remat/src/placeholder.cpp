// Tensor layouts, the placeholders recompute gets where forward kept no value, and the layout a
// pair's unpacked copy is given back (placeholder.hpp).

#include "placeholder.hpp"

#include "compat.hpp"

#include <remat/errors.hpp>
#include <remat/remat.hpp>

#include <ATen/core/TensorBody.h>
#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <c10/util/Exception.h>

namespace remat::detail {

TensorMeta meta_of(const at::Tensor& t) {
  TensorMeta meta;
  meta.options = t.options();
  meta.requires_grad = t.requires_grad();
  if (is_nested(t)) return meta;
  meta.sizes = t.sizes().vec();
  if (t.layout() != at::kStrided) return meta;
  meta.strides = t.strides().vec();
  meta.storage_offset = t.storage_offset();
  meta.storage_bytes = t.has_storage() ? static_cast<std::int64_t>(t.storage().nbytes()) : 0;
  return meta;
}

bool is_nested(const at::Tensor& t) { return t.defined() && (t.is_nested() || t.layout() == at::kJagged); }

bool plain_strided(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && !is_nested(t) && t.has_storage();
}

at::Tensor restore_layout(const at::Tensor& unpacked, const TensorMeta& meta, const std::string& what) {
  const at::Tensor t = unpacked.variable_data();
  if (t.sizes() != at::IntArrayRef(meta.sizes) || t.scalar_type() != meta.options.dtype().toScalarType() ||
      t.device() != meta.options.device()) {
    auto describe = [](at::ScalarType dtype, at::IntArrayRef sizes, const at::Device& device) {
      std::string out = dtype_name(dtype) + " [";
      for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
      return out + "] on " + device.str();
    };
    throw Error("the saved-tensor unpack hook returned " + describe(t.scalar_type(), t.sizes(), t.device()) +
                " for " + what + ", which was packed as " +
                describe(meta.options.dtype().toScalarType(), meta.sizes, meta.options.device()) +
                "; unpack must return the tensor its pack was given (or an equal copy)");
  }
  const bool same_layout = t.strides() == at::IntArrayRef(meta.strides) && t.storage_offset() == meta.storage_offset &&
                           static_cast<std::int64_t>(t.storage().nbytes()) == meta.storage_bytes;
  if (same_layout) return t;
  const std::int64_t elements = meta.storage_bytes / static_cast<std::int64_t>(t.element_size());
  at::Tensor laid_out = at::empty({elements}, t.options()).as_strided(meta.sizes, meta.strides, meta.storage_offset);
  laid_out.copy_(t);
  return laid_out.variable_data();
}

at::Tensor make_placeholder(const TensorMeta& meta, const std::string& source) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<std::size_t>(meta.storage_bytes),
                       c10::DataPtr(nullptr, meta.options.device()), /*allocator=*/nullptr, /*resizable=*/false);
  // Any access to the data throws this message; shape, strides and views still work.
  std::string message = kPlaceholderMarker;
  message += ": recompute read the data of ";
  message += source;
  message += ", which forward did not keep; call " + api_name("recompute_needs_tensor") +
             "(t) on that tensor in forward so its value is persisted";
  compat::raise_on_data_access(*storage.unsafeGetStorageImpl(), std::move(message));
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::computeDispatchKey(
                                                                          meta.options.dtype().toScalarType(),
                                                                          meta.options.layout(),
                                                                          meta.options.device()),
                                                   meta.options.dtype());
  impl->set_sizes_and_strides(meta.sizes, meta.strides, meta.storage_offset);
  return at::Tensor(std::move(impl));
}

std::optional<std::string> placeholder_error_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const auto start = what.find(kPlaceholderMarker);
  if (start == std::string::npos) return std::nullopt;
  const auto end = what.find('\n', start);
  return what.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return t.storage().unsafeGetStorageImpl();
}

std::optional<std::uint32_t> version_of(const at::Tensor& t) {
  if (!t.defined()) return std::nullopt;
  const c10::VariableVersion& version = t.unsafeGetTensorImpl()->version_counter();
  if (!version.enabled()) return std::nullopt;
  return version.current_version();
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(type);
  }
}

}  // namespace remat::detail

namespace remat {

bool is_placeholder(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  try {
    (void)t.storage().data();  // raises only for storages without data: placeholders among them
    return false;
  } catch (const c10::Error& e) {
    return detail::placeholder_error_of(e).has_value();
  }
}

}  // namespace remat
