#include "runtime/receive_ring.hpp"

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/cpu_allocator.hpp>
#include <remat/pipeline/errors.hpp>

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <string>

namespace remat::pipeline::detail {
namespace {

alloc::Direction tag_direction(Direction direction) {
  return direction == Direction::forward ? alloc::Direction::forward : alloc::Direction::backward;
}

at::Tensor allocate_tagged(const std::vector<std::int64_t>& shape, at::ScalarType dtype, at::Device device) {
  if (device.is_cpu()) {
    return at::detail::empty_generic(shape, tagging_cpu_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                     dtype, std::nullopt);
  }
  at::Tensor buffer = at::empty(shape, at::TensorOptions().dtype(dtype).device(device));
  if (buffer.numel() > 0 && alloc::find_owner(buffer.data_ptr()) == nullptr) {
    throw RuntimeError("receive buffers on " + device.str() +
                       " did not come from the tagging allocator, so they cannot be tagged with their slots: "
                       "call remat::install_cuda_allocator() before the first CUDA tensor");
  }
  return buffer;
}

}  // namespace

ReceiveRing::ReceiveRing(int stage, Direction direction, std::vector<std::optional<int>> slot_of_microbatch, int size,
                         const std::vector<std::int64_t>& shape, at::ScalarType dtype, at::Device device, bool guard)
    : stage_(stage),
      direction_(direction),
      slot_of_microbatch_(std::move(slot_of_microbatch)),
      holders_(static_cast<std::size_t>(size)),
      guard_(guard) {
  buffers_.reserve(static_cast<std::size_t>(size));
  for (int slot = 0; slot < size; ++slot) {
    const auto tag = alloc::TagScope::recv_slot({stage, tag_direction(direction), slot});
    // What a stage receives forward is its input; a gradient received backward is backward's scratch.
    const alloc::CategoryScope category(
        tag_direction(direction) == alloc::Direction::forward ? alloc::Category::input : alloc::Category::temporary,
        "recv");
    buffers_.push_back(allocate_tagged(shape, dtype, device));
  }
}

int ReceiveRing::slot_of(int microbatch) const {
  const auto& slot = slot_of_microbatch_.at(static_cast<std::size_t>(microbatch));
  if (!slot || buffers_.empty()) {
    throw RuntimeError("stage " + std::to_string(stage_) + " has no " + std::string(to_string(direction_)) +
                       " receive buffer for microbatch " + std::to_string(microbatch) +
                       ": the schedule does not receive it there");
  }
  return *slot % size();
}

at::Tensor ReceiveRing::acquire(int microbatch) {
  const int slot = slot_of(microbatch);
  auto& holder = holders_[static_cast<std::size_t>(slot)];
  at::Tensor& buffer = buffers_[static_cast<std::size_t>(slot)];
  if (guard_) {
    const std::string where = "stage " + std::to_string(stage_) + " " + std::string(to_string(direction_)) +
                              " receive slot " + std::to_string(slot) + " (of " + std::to_string(size()) + ")";
    if (holder) {
      throw RuntimeError(where + " is needed by microbatch " + std::to_string(microbatch) + " while microbatch " +
                         std::to_string(*holder) +
                         " still holds it: the ring is smaller than the schedule needs; use the plan's ring size "
                         "(remat-report plan)");
    }
    if (buffer.storage().use_count() > 1) {
      throw RuntimeError(where + " is needed by microbatch " + std::to_string(microbatch) +
                         " while its buffer is still referenced (a tensor saved for backward, or kept by the stage): "
                         "a stage must not keep its input past the microbatch's backward");
    }
  }
  holder = microbatch;
  return buffer;
}

void ReceiveRing::release(int microbatch) {
  auto& holder = holders_[static_cast<std::size_t>(slot_of(microbatch))];
  if (holder == microbatch) holder.reset();
}

bool ReceiveRing::aliases(const at::Tensor& tensor) const {
  return std::any_of(buffers_.begin(), buffers_.end(),
                     [&](const at::Tensor& buffer) { return tensor.is_alias_of(buffer); });
}

void ReceiveRing::expect_all_released() const {
  for (std::size_t slot = 0; slot < holders_.size(); ++slot) {
    if (holders_[slot]) {
      throw RuntimeError("stage " + std::to_string(stage_) + " " + std::string(to_string(direction_)) +
                         " receive slot " + std::to_string(slot) + " is still held by microbatch " +
                         std::to_string(*holders_[slot]) + " at the end of the step: the schedule never consumed it");
    }
  }
}

}  // namespace remat::pipeline::detail
