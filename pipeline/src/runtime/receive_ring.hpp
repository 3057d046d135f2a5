#pragma once
// The receive buffers of one stage in one direction: a set per slot, allocated once through
// the tagging allocator and tagged with its receive slot, and an ownership guard that refuses
// to hand a slot to a microbatch while its previous holder still needs it.

#include <remat/pipeline/buffers.hpp>

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace remat::pipeline::detail {

class ReceiveRing {
 public:
  // slot_of_microbatch: each microbatch's slot (taken modulo `size`); nullopt where the stage
  // receives nothing for it.
  ReceiveRing(int stage, Direction direction, std::vector<std::optional<int>> slot_of_microbatch, int size,
              const std::vector<std::int64_t>& shape, at::ScalarType dtype, at::Device device, bool guard);

  int size() const { return static_cast<int>(buffers_.size()); }
  // The buffer `microbatch` receives into. Throws RuntimeError (naming the stage, direction,
  // slot and both microbatches) when the guard is on and the slot's holder has not released
  // it, or its buffer is still referenced (autograd saved it).
  at::Tensor acquire(int microbatch);
  void release(int microbatch);
  // Whether `tensor` shares storage with one of the ring's buffers.
  bool aliases(const at::Tensor& tensor) const;
  // Throws RuntimeError naming the holders left at the end of a step.
  void expect_all_released() const;

 private:
  int slot_of(int microbatch) const;

  int stage_;
  Direction direction_;
  std::vector<std::optional<int>> slot_of_microbatch_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::optional<int>> holders_;
  bool guard_;
};

}  // namespace remat::pipeline::detail
