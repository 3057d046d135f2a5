#pragma once
// What a checkpoint keeps for recompute when its forward ends: the inputs recompute reads
// again, each save region's record and the outputs recompute takes from it instead of running
// its body, and what recompute hands back in place of a skipped save region. The steps of a
// checkpoint call and a region call that use these are in runtime.cpp.

#include "frame.hpp"

#include <remat/remat.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::detail {

// A save region's tensor that views an input recompute makes again (the residual sum a norm
// saves, made by code between regions) is taken from that input in recompute (Frame::ferry),
// which spares its bytes where recompute runs anyway. Where nothing else is dropped, recompute
// would run the body up to that region for those tensors alone, keeping what the code before it
// reads (the output of attention that the residual add reads): forward keeps them instead, as
// autograd would without the checkpoint, and recompute never runs, where that keeps no more
// bytes than what recompute would need (else they are made again, as before). One saved under a
// hook pair is always taken from the input (keeping it would pass the pair by).
void keep_ferried_where_nothing_else_is_recomputed(Frame& frame);

// Where recompute has nothing to make (no tensor dropped or ferried), no input is read again:
// none is needed.
void settle_needed_inputs(Frame& frame);

// Keeps only the inputs recompute needs, through the checkpoint's hook pair where it has one.
void keep_needed_inputs(Frame& frame);

// Settles which save-region outputs recompute needs. An output changed in place after its region
// returned (h += y) is refused, since recompute would hand back the changed output and make the
// change twice; under a plan the region runs again in recompute instead.
void settle_persisted_outputs(Frame& frame);

// Keeps only the save-region outputs recompute needs, through each region's hook pair where it
// had one.
void keep_persisted_outputs(Frame& frame);

// Whether recompute makes `t` again: made by differentiable code of this checkpoint (outside a
// save region, or by one, whose output is then kept or made again).
bool made_in_checkpoint(const Frame& frame, const at::Tensor& t);

// Recompute skips a save region, so an in-place change it makes to its input would not happen
// again: code after the region would read the unchanged value. Under a plan, where the region is
// saved by the plan's choice, not the code's, it runs again in recompute instead (the reason
// returned), when recompute makes that input again; a tensor made before the checkpoint would be
// changed twice. "" where no input changed.
std::string rerun_for_changed_inputs(const Frame& frame, const std::string& name, const TensorList& inputs,
                                     const std::vector<std::optional<std::uint32_t>>& input_versions,
                                     const std::vector<bool>& made_here);

// What forward keeps of a save region that returned `outputs`: what recompute hands back in
// place of its body (see outputs_of_skipped_save_region).
void record_save_region(Frame& frame, const std::string& name, const TensorList& inputs, const TensorList& outputs,
                        std::uint64_t first_node, std::uint64_t end_node, std::shared_ptr<void>* annotation,
                        std::string rerun_reason);

// In recompute, in place of save region `save_index`'s body: its state after forward, the tensors
// recompute takes from its inputs, and its outputs as forward kept them (unpacked here, in
// forward order) or placeholders for those it did not keep.
TensorList outputs_of_skipped_save_region(Frame& frame, int save_index, const std::string& name,
                                          const TensorList& inputs, std::shared_ptr<void>* annotation);

}  // namespace remat::detail
