// Tracking's per-call work (tracking.hpp). A thread's modules nest, so the category and module in
// force when each forward began are a stack; backward sets "temporary of the module" from a
// pre-hook on each output node and puts back what was in force when the graph task ends. The engine asks
// in_tracked_forward() for every tensor autograd saves (engine.cpp).

#include <remat/tracking.hpp>

#include "engine.hpp"
#include "thread_state.hpp"

#include <remat/alloc/allocator.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace remat::tracking {
namespace {

thread_local std::vector<std::pair<alloc::Category, alloc::NameId>> t_entered;

// Sets "temporary of the module" when backward reaches the node; the backward's end puts back
// what was in force before it.
class EnteringModule final : public torch::autograd::FunctionPreHook {
 public:
  explicit EnteringModule(alloc::NameId module) : module_(module) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    detail::restore_category_when_backward_ends();
    alloc::set_category_by_id(alloc::Category::temporary, module_);
    return grads;
  }

  // Compiled autograd would need this hook traced into its graph; it is not, so say so plainly.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override { refuse_compiled_autograd(); }

 private:
  alloc::NameId module_;
};

}  // namespace

void refuse_compiled_autograd() { detail::refuse_tracking_under_compiled_autograd(); }

void enter_module(alloc::NameId module, bool root) {
  if (root) {
    detail::ensure_engine_installed();
    ++detail::tracked_forwards();
  }
  t_entered.push_back(alloc::current_category_id());
  alloc::set_category_by_id(alloc::Category::temporary, module);
}

void leave_module(bool root) {
  if (!t_entered.empty()) {
    const auto [category, module] = t_entered.back();
    t_entered.pop_back();
    alloc::set_category_by_id(category, module);
  }
  if (root && detail::tracked_forwards() > 0) --detail::tracked_forwards();
}

bool in_tracked_forward() noexcept { return detail::tracked_forwards() > 0; }

ActiveTracking::ActiveTracking() { detail::count_active_trackings(1); }

void ActiveTracking::end() {
  if (!active_) return;
  active_ = false;
  detail::count_active_trackings(-1);
}

namespace {

alloc::TagId as_input(alloc::TagId tag) {
  static const alloc::NameId input = alloc::intern_name("input");
  alloc::Tag changed = alloc::tag_of(tag);
  if (changed.category != alloc::Category::none && changed.category != alloc::Category::temporary &&
      changed.category != alloc::Category::other) {
    return tag;
  }
  changed.category = alloc::Category::input;
  changed.module = input;
  return alloc::intern_tag(changed);
}

}  // namespace

void tag_input(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  const void* ptr = tensor.storage().data();
  if (ptr == nullptr) return;
  bool done = false;
  alloc::for_each_device_allocator(
      [&](alloc::CachingAllocator& allocator) { done = done || allocator.retag_block(ptr, &as_input).has_value(); });
}

void hook_backward(const std::shared_ptr<torch::autograd::Node>& node, alloc::NameId module) {
  for (const auto& hook : node->pre_hooks()) {
    if (dynamic_cast<EnteringModule*>(hook.get()) != nullptr) return;  // an inner module's
  }
  node->add_pre_hook(std::make_unique<EnteringModule>(module));
}

bool RetagLog::retag(const at::Tensor& tensor, alloc::Category category, alloc::NameId module) {
  // A sparse tensor (an embedding's sparse gradient): its values; its indices may be another's
  // storage (the embedding's input ids)
  if (tensor.defined() && tensor.is_sparse()) return retag(tensor._values(), category, module);
  if (!tensor.defined() || !tensor.has_storage()) return true;
  const c10::Storage& storage = tensor.storage();
  const void* ptr = storage.data();
  if (ptr == nullptr) return true;  // nothing allocated (an empty tensor)
  std::lock_guard lock(mutex_);
  const auto known = entries_.find(ptr);
  const bool same_storage = known != entries_.end() && !known->second.storage.expired() &&
                            known->second.storage._unsafe_get_target() == storage.unsafeGetStorageImpl();
  if (same_storage && known->second.category == category && known->second.module == module) {
    return true;  // this storage already (a gradient accumulated into again)
  }
  alloc::CachingAllocator* owner = alloc::find_owner(ptr);
  const std::optional<alloc::TagId> tag = owner != nullptr ? owner->tag_of_block(ptr) : std::nullopt;
  if (!tag) return false;
  alloc::Tag changed = alloc::tag_of(*tag);
  changed.category = category;
  changed.module = module;
  if (!owner->retag_block(ptr, alloc::intern_tag(changed))) return false;
  Entry entry{storage.getWeakStorageImpl(), same_storage ? known->second.before : *tag, category, module};
  if (entries_.size() >= prune_at_) {  // gradients made anew each step leave dead entries behind
    forget_dead();
    prune_at_ = std::max<std::size_t>(64, 2 * entries_.size());
  }
  entries_.insert_or_assign(ptr, std::move(entry));
  return true;
}

void RetagLog::forget_dead() {
  std::erase_if(entries_, [](const auto& item) { return item.second.storage.expired(); });
}

void RetagLog::restore() {
  std::unordered_map<const void*, Entry> entries;
  {
    std::lock_guard lock(mutex_);
    entries.swap(entries_);
  }
  for (auto& [ptr, entry] : entries) {
    const c10::intrusive_ptr<c10::StorageImpl> storage = entry.storage.lock();
    if (!storage || storage->data() != ptr) continue;  // freed or moved since: nothing of ours to undo
    alloc::CachingAllocator* owner = alloc::find_owner(ptr);
    const std::optional<alloc::TagId> tag = owner != nullptr ? owner->tag_of_block(ptr) : std::nullopt;
    if (!tag) continue;
    const alloc::Tag now = alloc::tag_of(*tag);
    if (now.category == entry.category && now.module == entry.module) owner->retag_block(ptr, entry.before);
  }
}

std::size_t RetagLog::alive() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const auto& item) { return !item.second.storage.expired(); }));
}

}  // namespace remat::tracking
