#pragma once
// The tagging allocator's figures in PyTorch's own types: its statistics as the DeviceStats
// torch.cuda.memory_stats() reads, its segments, blocks and trace as the SnapshotInfo
// torch.cuda.memory._snapshot() pickles, and a tag as the user_metadata text of a trace entry.
// Plain conversions with no state; TaggingCudaAllocator calls them.

#include <remat/alloc/allocator_snapshot.hpp>
#include <remat/alloc/stats.hpp>
#include <remat/alloc/tags.hpp>

#include <c10/cuda/CUDACachingAllocator.h>

#include <string>

namespace remat::detail {

namespace torch_alloc = c10::cuda::CUDACachingAllocator;

torch_alloc::DeviceStats to_device_stats(const alloc::AllocatorStats& stats, std::size_t max_split_size);

// A segment of `device` with its blocks, in address order; contexts are left empty.
torch_alloc::SegmentInfo to_segment_info(const alloc::SegmentInfo& segment, int device);

torch_alloc::TraceEntry::Action to_trace_action(alloc::TraceAction action);

torch_alloc::AllocatorConfigInfo to_config_info(const alloc::Config& config);

// What a trace entry's user_metadata says of `tag`: "" for the untagged tag, the label alone
// when the tag is only a label (what torch.cuda.memory._set_memory_metadata set, verbatim), and
// otherwise a JSON object of the tag's dimensions that are set, named as in a snapshot's tag
// table: {"region": "layers.0::attn", "phase": "forward", "label": "step 3"}.
std::string tag_user_metadata(const alloc::Tag& tag);

}  // namespace remat::detail
