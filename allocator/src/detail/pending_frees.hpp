#pragma once
// Frees waiting on streams: a block freed while other streams still use it (record_stream)
// stays allocated until an event recorded on each of those streams completes. Each wait is an
// event and its block; the block counts the events it still waits for (Block::pending_events).

#include <remat/alloc/backend.hpp>

#include "block.hpp"

#include <cstddef>
#include <utility>
#include <vector>

namespace remat::alloc::detail {

class PendingFrees {
 public:
  // `block` waits for `event` too.
  void add(Event event, Block* block) {
    waits_.emplace_back(event, block);
    ++block->pending_events;
  }
  bool empty() const { return waits_.empty(); }

  // Drops the waits whose event completed (with `wait`, waits for each where the backend can);
  // `done(block)` is called for each block that waits for nothing more.
  template <class Done>
  void retire(Backend& backend, bool wait, Done&& done) {
    for (std::size_t i = 0; i < waits_.size();) {
      const auto [event, block] = waits_[i];
      if (!(wait ? backend.wait_event(event) : backend.event_completed(event))) {
        ++i;
        continue;
      }
      backend.destroy_event(event);
      waits_[i] = waits_.back();
      waits_.pop_back();
      if (--block->pending_events == 0) done(block);
    }
  }

 private:
  std::vector<std::pair<Event, Block*>> waits_;
};

}  // namespace remat::alloc::detail
