#pragma once
// The process-wide allocators, one per device, as the C ABI and LibTorch integration use
// them. Configured from REMAT_ALLOC_CONF on first use, or by configure().

#include <remat/alloc/caching_allocator.hpp>
#include <remat/alloc/config.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace remat::alloc {

inline constexpr int kMaxDevices = 64;

// The allocator of `device`, created on first use. Throws ConfigError when
// REMAT_ALLOC_CONF is malformed, InvalidArgumentError for a device outside [0, 64).
CachingAllocator& device_allocator(int device);

// The allocator for host (CPU) memory: device 0's allocator when the backend is host,
// otherwise a host-backend allocator of its own (capacity host_capacity_mb).
CachingAllocator& cpu_allocator();

// The pool host copies of device memory come from (remat.CpuOffload): page-locked host memory
// (capacity host_capacity_mb) where the devices are CUDA, else cpu_allocator() itself.
CachingAllocator& pinned_host_allocator();

// Applies `text` (REMAT_ALLOC_CONF syntax) on top of the configuration in force. Keys that
// pick the backend or its capacity are accepted only while nothing is allocated.
void configure(std::string_view text);
Config current_config();
// Caps `device`'s reserved bytes at `fraction` (in (0, 1]) of its memory; throws
// InvalidArgumentError outside that range.
void set_memory_fraction(int device, double fraction);
// The backend a new allocator gets under the configuration in force (never automatic).
BackendKind effective_backend();

// The device a call without one means: the current CUDA device, or 0 on host.
int default_device() noexcept;

// Calls `fn` for each allocator created so far (devices, then a separate CPU allocator and
// the pinned host pool).
void for_each_device_allocator(const std::function<void(CachingAllocator&)>& fn);

// The devices' allocators made so far, by device (the CPU and pinned host pools only where
// the host backend makes the CPU allocator device 0's).
std::vector<CachingAllocator*> device_allocators_made();
// The allocator (CPU or device) whose live block starts at `ptr`, or nullptr.
CachingAllocator* find_owner(const void* ptr);
// record_stream on the allocator that owns `ptr`, whatever the current device; throws
// InvalidPointerError when no allocator does.
void record_stream_anywhere(void* ptr, Stream stream);
// The tag of the live block starting at `ptr` in any allocator (CPU and devices).
std::optional<TagId> find_block_tag(const void* ptr);
// CachingAllocator::retag_block on the allocator (CPU or device) whose live block starts at `ptr`;
// throws InvalidPointerError when none does.
TagId retag_block_anywhere(const void* ptr, TagId tag);
// Gives the live block at `ptr` the category `category` and the module path `module` (what
// remat_alloc.track does for a parameter's storage); false, changing nothing, when no remat
// allocator returned `ptr` (a CPU tensor made outside tag_cpu_tensors(), say).
bool retag_category(const void* ptr, Category category, std::string_view module);
// What a checkpoint keeps for backward: while this thread has a category set (it is tracked), the
// live block at `ptr`, when it has no category or is a temporary, becomes an activation of its
// module. False when nothing changed. Never throws: it runs in autograd's pack path.
bool categorize_as_activation(const void* ptr) noexcept;
// The same whatever category is in force: what autograd keeps outside a tracked model's forward
// while a tracking is active (a loss computed after the model, where none is in force).
bool name_as_activation(const void* ptr) noexcept;

using OomObserver = std::function<void(const OomEvent&)>;
// Observers run after the allocator's lock is released; one that throws is reported on
// stderr and the others still run. An out-of-memory error of an observer's own allocation does
// not call the observers again (it reaches that observer only). Returns an id for
// remove_oom_observer.
int add_oom_observer(OomObserver observer);
// Once it returns, the observer is not called again, except by calls already in flight on other
// threads, which finish (removal never waits for them, so it cannot deadlock); an observer may
// remove itself or another one. False for an unknown id.
bool remove_oom_observer(int id);

}  // namespace remat::alloc
