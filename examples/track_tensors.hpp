#pragma once
// The C++ examples' counterpart of remat_alloc.track(model, optimizer). LibTorch modules have no
// forward hooks, so each example gives the pieces of its step a category with
// remat::alloc::CategoryScope, and track_parameters re-tags what exists already: parameters by
// name (their storages in place), and each gradient as autograd hands it to the parameter (a
// tensor hook), so the dumps name every byte by category and module instead of "(untagged)".

#include <remat/alloc/allocator.hpp>

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace examples {

inline void track_parameters(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  using remat::alloc::Category;
  for (const auto& [name, parameter] : named) {
    remat::alloc::retag_category(parameter.storage().data(), Category::parameter, name);
    parameter.register_hook([name = name](const at::TensorBase& grad) {
      remat::alloc::retag_category(grad.storage().data(), Category::gradient, name);
    });
  }
}

inline void tag_inputs(const std::vector<at::Tensor>& tensors, const std::string& name) {
  for (const at::Tensor& t : tensors)
    remat::alloc::retag_category(t.storage().data(), remat::alloc::Category::input, name);
}

}  // namespace examples
