#include "tagging_cuda_allocator.hpp"

#include "torch_memory_figures.hpp"

#include <remat/alloc/allocator.hpp>

#include <algorithm>
#include <chrono>
#include <unordered_map>

namespace remat::detail {
namespace {

alloc::CachingAllocator& allocator_of(c10::DeviceIndex device) { return alloc::device_allocator(device); }

std::time_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Tags' user_metadata texts, each written once per snapshot.
class TagTexts {
 public:
  const std::string& operator()(alloc::TagId tag) {
    auto it = texts_.find(tag);
    if (it == texts_.end()) it = texts_.emplace(tag, tag_user_metadata(alloc::tag_of(tag))).first;
    return it->second;
  }

 private:
  std::unordered_map<alloc::TagId, std::string> texts_;
};

}  // namespace

TaggingCudaAllocator::TaggingCudaAllocator(const CudaAllocatorEntryPoints& entry)
    : CUDAPluggableAllocator(
          [this, allocate = entry.allocate](std::size_t bytes, int device, cudaStream_t stream) {
            void* ptr = allocate(bytes, device, stream);
            history_.allocated(ptr);
            return ptr;
          },
          [this, deallocate = entry.deallocate](void* ptr, std::size_t bytes, int device, cudaStream_t) {
            history_.freed(ptr);
            deallocate(ptr, bytes, device);
          }) {
  set_record_stream_fn(
      [record_stream = entry.record_stream](void* ptr, cudaStream_t stream) { record_stream(ptr, stream); });
  set_reset_fn([empty_cache = entry.empty_cache] { empty_cache(); });
  set_memory_fraction_fn([set_memory_fraction = entry.set_memory_fraction](double fraction, int device) {
    set_memory_fraction(fraction, device);
  });
}

TaggingCudaAllocator::~TaggingCudaAllocator() {
  for (const int id : observer_ids_) alloc::remove_oom_observer(id);
}

c10::CachingDeviceAllocator::DeviceStats TaggingCudaAllocator::getDeviceStats(c10::DeviceIndex device) {
  return to_device_stats(allocator_of(device).stats(), alloc::current_config().max_split_size_bytes);
}

void TaggingCudaAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  allocator_of(device).reset_accumulated_stats();
}

void TaggingCudaAllocator::resetPeakStats(c10::DeviceIndex device) { allocator_of(device).reset_peak_stats(); }

torch_alloc::SnapshotInfo TaggingCudaAllocator::snapshot(c10::MempoolId_t mempool, bool include_traces) {
  torch_alloc::SnapshotInfo out;
  if (mempool != c10::MempoolId_t{0, 0}) return out;  // no private pools: nothing belongs to one
  TagTexts texts;
  const std::vector<alloc::CachingAllocator*> allocators = alloc::device_allocators_made();
  for (alloc::CachingAllocator* allocator : allocators) {
    const alloc::AllocatorSnapshot state = allocator->snapshot();
    for (const alloc::SegmentInfo& segment : state.segments) {
      out.segments.push_back(to_segment_info(segment, state.device));
      auto block = out.segments.back().blocks.begin();
      for (std::uint64_t address = segment.address; block != out.segments.back().blocks.end(); ++block) {
        if (block->allocated) block->context_when_allocated = history_.block_context(address);
        address += block->size;
      }
    }
    if (include_traces) {
      if (out.device_traces.size() <= static_cast<std::size_t>(state.device))
        out.device_traces.resize(state.device + 1);
      out.device_traces[state.device] = history_.entries(state, [&](alloc::TagId tag) { return texts(tag); });
    }
    if (allocator == allocators.front()) out.config_metadata = to_config_info(state.config);
  }
  std::lock_guard lock(mutex_);
  out.external_annotations.assign(annotations_.begin(), annotations_.end());
  return out;
}

bool TaggingCudaAllocator::isHistoryEnabled() { return history_.enabled(); }

void TaggingCudaAllocator::recordHistory(bool enabled, torch_alloc::CreateContextFn context_recorder,
                                         size_t alloc_trace_max_entries, torch_alloc::RecordContext when,
                                         bool clear_history, const std::vector<std::string>& skip_actions) {
  history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, skip_actions);
  std::lock_guard lock(mutex_);
  if (!enabled || clear_history) annotations_.clear();
}

void TaggingCudaAllocator::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& metadata) {
  if (!history_.enabled()) return;
  c10::CachingDeviceAllocator::AnnotationEntry entry(0, 0);
  entry.time_.t_ = now_us();
  for (const auto& [name, value] : metadata) entry.recordUserMetadata(name, value);
  std::lock_guard lock(mutex_);
  annotations_.push_back(std::move(entry));
  if (annotations_.size() > history_.max_entries()) annotations_.pop_front();
}

void TaggingCudaAllocator::setUserMetadata(const std::string& metadata) { alloc::set_label(metadata); }

std::string TaggingCudaAllocator::getUserMetadata() { return alloc::current_label(); }

void TaggingCudaAllocator::attachOutOfMemoryObserver(torch_alloc::OutOfMemoryObserver observer) {
  const int id = alloc::add_oom_observer([observer = std::move(observer)](const alloc::OomEvent& event) {
    observer(event.device, event.rounded_bytes, event.memory.total_bytes, event.memory.free_bytes);
  });
  std::lock_guard lock(mutex_);
  observer_ids_.push_back(id);
}

void TaggingCudaAllocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  alloc::CachingAllocator& allocator = allocator_of(device);
  // PyTorch's reading: a zero guess starts from what the device has free.
  if (*largest_block == 0) *largest_block = allocator.backend().memory_info().free_bytes;
  *largest_block = std::max(*largest_block, allocator.largest_free_block());
}

double TaggingCudaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  return allocator_of(device).config().memory_fraction;
}

std::vector<torch_alloc::StreamSegmentSize> TaggingCudaAllocator::getExpandableSegmentSizes(c10::DeviceIndex device) {
  std::vector<torch_alloc::StreamSegmentSize> out;
  for (const alloc::SegmentInfo& segment : allocator_of(device).snapshot().segments) {
    if (!segment.is_expandable) continue;
    out.emplace_back(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(segment.stream)), segment.is_small,
                     segment.total_size);
  }
  return out;
}

}  // namespace remat::detail
