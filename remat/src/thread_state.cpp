// The thread's checkpoint state (thread_state.hpp).

#include "thread_state.hpp"

#include <remat/remat.hpp>

#include <ATen/SavedTensorHooks.h>

#include <utility>

namespace remat::detail {
namespace {

thread_local ThreadState t_state;
thread_local std::shared_ptr<Frame> t_frame_owner;
thread_local int t_tracked_forwards = 0;
thread_local CheckpointCaller* t_caller = nullptr;

}  // namespace

ThreadState& thread_state() { return t_state; }

const std::shared_ptr<Frame>& frame_owner() { return t_frame_owner; }

FrameOwnerScope::FrameOwnerScope(std::shared_ptr<Frame> frame)
    : previous_(std::exchange(t_frame_owner, std::move(frame))) {}
FrameOwnerScope::~FrameOwnerScope() { t_frame_owner = std::move(previous_); }

CallerScope::CallerScope(CheckpointCaller* caller) : previous_(std::exchange(t_caller, caller)) {}
CallerScope::~CallerScope() { t_caller = previous_; }

std::size_t user_hooks_depth() { return at::SavedTensorDefaultHooks::get_tls_state().stack.size(); }

int& tracked_forwards() { return t_tracked_forwards; }

}  // namespace remat::detail

namespace remat {

CheckpointCaller* checkpoint_caller() { return detail::t_caller; }

}  // namespace remat
