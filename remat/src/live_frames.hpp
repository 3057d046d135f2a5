#pragma once
// The frames of finished checkpoint forwards still alive (backward may recompute them), for the
// reports of what every live checkpoint keeps. Frames by pointer: a frame joins once its forward
// finished and leaves as it is destroyed.

#include <functional>

namespace remat::detail {

struct Frame;

void add_live_frame(Frame* frame);
void remove_live_frame(Frame* frame);

// Calls `visit` with each live frame, in the order they joined, while none can leave (a frame
// being destroyed waits, so `visit` must not destroy one).
void for_each_live_frame(const std::function<void(Frame&)>& visit);

}  // namespace remat::detail
