#pragma once
// The per-call work of tracking (remat_alloc.track) in C++, so that naming every byte of a step
// by category and module costs no Python call per module, saved tensor or gradient: a module's
// forward entering and leaving, the backward pre-hooks on its outputs' autograd nodes, what
// autograd saves inside a tracked forward named an activation, and gradients named as they are
// accumulated. Which modules, parameters and optimizers are tracked stays the caller's choice.

#include <remat/alloc/tags.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch::autograd {
struct Node;
}

namespace remat::tracking {

// A module's forward begins: the category and module in force are put aside on this thread and
// everything it allocates is a temporary of `module`. A root (the tracked model itself) also
// makes what autograd saves until its end an activation of the module that made it.
void enter_module(alloc::NameId module, bool root);
// The forward that entered last ends (also when it raised): what was in force comes back.
void leave_module(bool root);
// Whether a tracked model's forward runs on this thread outside checkpoints (what autograd
// saves then gets the engine's activation hooks).
bool in_tracked_forward() noexcept;
// A tracked model's tensor argument: its storage becomes an `input` (module "input") where it
// has no category, or is a temporary or other.
void tag_input(const at::Tensor& tensor);

// When backward reaches `node` (an output of module `module`), its work is a temporary of that
// module; a node hooked by an inner module already keeps the inner one. The backward's end puts
// back the category in force where it reached its first such node.
void hook_backward(const std::shared_ptr<torch::autograd::Node>& node, alloc::NameId module);

// Held by each tracking with remat's hooks while it is active; untrack ends it, as does dropping it.
// While there is one, what autograd saves outside checkpoints and tracked forwards is an activation
// too (a loss computed after the model), and what backward allocates from where it unpacks such a
// tensor until it reaches a tracked module is a temporary of "(backward)".
class ActiveTracking {
 public:
  ActiveTracking();
  ~ActiveTracking() { end(); }
  ActiveTracking(const ActiveTracking&) = delete;
  ActiveTracking& operator=(const ActiveTracking&) = delete;
  void end();  // once

 private:
  bool active_ = true;
};

// Throws c10::NotImplementedError (Python's NotImplementedError) saying that tracking does not
// work under compiled autograd, which cannot trace its C++ backward hooks (their compiled_args).
void refuse_compiled_autograd();

// The storages a tracking re-tagged, with the tag each had before, so they can be put back.
class RetagLog {
 public:
  // Gives `tensor`'s storage `category` and module `module`; false when no remat allocator made it.
  bool retag(const at::Tensor& tensor, alloc::Category category, alloc::NameId module);
  // Puts back the tag from before the first retag on each storage still alive, still at its
  // address and still as the log left it; forgets everything.
  void restore();
  // Storages re-tagged and still alive.
  std::size_t alive() const;

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    alloc::TagId before = 0;
    alloc::Category category = alloc::Category::none;
    alloc::NameId module = 0;
  };
  void forget_dead();  // callers hold mutex_

  mutable std::mutex mutex_;
  std::unordered_map<const void*, Entry> entries_;
  std::size_t prune_at_ = 64;
};

}  // namespace remat::tracking
