#pragma once
// Differences between LibTorch versions live here. The runtime is built and tested against
// LibTorch 2.11 (the PyPI wheel); it uses saved-variable hooks from the engine and storages
// whose data access raises a custom message, which older releases lack.

#include <c10/core/StorageImpl.h>
#include <torch/version.h>

#include <string>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 5)
#error "remat's checkpoint runtime needs LibTorch 2.5 or newer (pip install torch==2.11.0)"
#endif

namespace remat::detail::compat {

// Makes every access to the storage's data raise `message`; metadata stays usable.
inline void raise_on_data_access(c10::StorageImpl& storage, std::string message) {
  storage.release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(message));
}

}  // namespace remat::detail::compat
