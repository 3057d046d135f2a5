#pragma once
// PyTorch's pluggable CUDA allocator over the tagging allocator, answering the memory calls
// PyTorch's own class refuses ("CUDAPluggableAllocator does not yet support ..."): statistics
// and their resets, snapshots, memory history, out-of-memory observers, allocation labels,
// cache and expandable-segment figures and the memory fraction. Every answer is read from the
// tagging allocator of the device asked about, so torch.cuda.memory_stats() and
// remat_alloc.memory_stats() give the same figures.

#include "cuda_allocator_entry_points.hpp"
#include "torch_memory_history.hpp"

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace remat::detail {

class TaggingCudaAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  explicit TaggingCudaAllocator(const CudaAllocatorEntryPoints& entry);
  ~TaggingCudaAllocator() override;
  TaggingCudaAllocator(const TaggingCudaAllocator&) = delete;
  TaggingCudaAllocator& operator=(const TaggingCudaAllocator&) = delete;

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // Every device's segments (with the stacks history gathered for live blocks) and, with
  // include_traces, each device's trace (TorchMemoryHistory says which events); blocks carry
  // no tags in PyTorch's format, their trace entries do.
  torch_alloc::SnapshotInfo snapshot(c10::MempoolId_t mempool, bool include_traces) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, torch_alloc::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     torch_alloc::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& metadata) override;
  // The label tag dimension: allocations made while it is set carry it, on every thread.
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
  void attachOutOfMemoryObserver(torch_alloc::OutOfMemoryObserver observer) override;
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  std::vector<torch_alloc::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;

 private:
  TorchMemoryHistory history_;
  std::mutex mutex_;                                                      // guards what follows
  std::deque<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;  // while history is on, newest last
  std::vector<int> observer_ids_;
};

}  // namespace remat::detail
