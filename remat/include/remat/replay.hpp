#pragma once
// Record and replay of forward decisions across recompute. Work inside a checkpoint that
// recompute would reproduce bit for bit but that costs real time (a frozen router's top-k,
// a dispatch layout) is recorded in forward and taken back, in order, in recompute.
//
//   remat::RecomputeReplay<at::Tensor> router("router.topk");
//   CheckpointOptions options{.region_name = "moe", .contexts = {router.context_factory()}};
//   // inside the checkpointed function:
//   at::Tensor indices = router.record_or_replay([&] { return std::get<1>(logits.topk(k)); });

#include <remat/context.hpp>
#include <remat/errors.hpp>

#include <c10/core/GradMode.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace remat {

enum class ReplayMode { record, replay };

// A mode other than "record" or "replay", refused in the words of this runtime and of NeMo's
// channel ("Unsupported <channel> replay mode: '<mode>'"), which tests written for it match.
inline std::string invalid_replay_mode(std::string_view channel, std::string_view mode) {
  return "replay channel '" + std::string(channel) + "': mode '" + std::string(mode) +
         "' is not valid; pass \"record\" or \"replay\" (Unsupported " + std::string(channel) + " replay mode: '" +
         std::string(mode) + "')";
}

namespace detail {
// The checkpoint call whose forward or recompute runs on this thread (empty outside one), and
// the region of `checkpoint` whose body runs now, by its index in forward order (-1: none).
std::shared_ptr<const void> running_checkpoint();
std::int64_t running_region(const void* checkpoint);
// How many decisions code on this thread has recorded: a region that recorded one in forward has
// it taken back in recompute instead of running the ops that made it, so a per-op plan cannot
// match its ops there.
void count_recorded_decision();
std::uint64_t recorded_decisions();
}  // namespace detail

// An ordered log of decisions: forward records, recompute takes them back in order (per
// region, inside a checkpoint). One recorder belongs to one checkpoint call: a record scope
// opened on a recorder whose forward already ended (another call sharing it) is refused, so
// replay never hands one call the decisions of another.
template <typename T>
class RecomputeReplayRecorder {
 public:
  // Inside a checkpoint's scopes each decision is kept with the region that made it, and replay
  // hands a region back its own: recompute skips save regions (in the code, or chosen by a plan),
  // so a decision recorded in one is never asked for, and the region after it must not get it.
  void record(T value) {
    detail::count_recorded_decision();
    const std::int64_t region = region_now();
    if (region != kUnplaced) by_region_[region].push_back(records_.size());
    records_.push_back(std::move(value));
  }

  // The next recorded decision, or nothing when the log ran out (counted as a miss: the
  // caller recomputes). As NeMo's recorder, it may be driven directly, outside any scope,
  // and then takes the records in the order they were made.
  std::optional<T> take() {
    const std::int64_t region = replaying_in_forward_checkpoint() ? region_now() : kUnplaced;
    if (region != kUnplaced) {
      const auto found = by_region_.find(region);
      std::size_t& next = taken_by_region_[region];
      if (found == by_region_.end() || next >= found->second.size()) {
        ++misses_;
        return std::nullopt;
      }
      return records_[found->second[next++]];
    }
    if (cursor_ >= records_.size()) {
      ++misses_;
      return std::nullopt;
    }
    return records_[cursor_++];
  }

  void rewind() {
    cursor_ = 0;
    taken_by_region_.clear();
  }
  const std::vector<T>& records() const { return records_; }
  std::size_t size() const { return records_.size(); }
  std::size_t replay_misses() const { return misses_; }
  // The name of the channel of the last scope that bound it (empty before any), for messages.
  const std::string& channel() const { return channel_; }

  // Called by the channel's scopes.
  void begin_scope(ReplayMode mode, const std::string& channel) {
    channel_ = channel;
    if (mode == ReplayMode::record) {
      if (forward_ended_) {
        throw Error("replay channel '" + channel +
                    "': this recorder already holds the forward decisions of another "
                    "checkpoint call, so a second call recording into it would replay the first call's decisions; "
                    "give each checkpoint call its own recorder (checkpoint_context_fn() and context_factory() do)");
      }
      if (record_scopes_++ == 0) recorded_in_ = detail::running_checkpoint();
    }
    scopes_.push_back(detail::running_checkpoint());
  }
  void end_scope(ReplayMode mode) {
    scopes_.pop_back();
    if (mode == ReplayMode::record && --record_scopes_ == 0) forward_ended_ = true;
  }

 private:
  // The place of a record made outside any checkpoint's scope.
  static constexpr std::int64_t kUnplaced = std::numeric_limits<std::int64_t>::min();

  // The region of the checkpoint the innermost open scope belongs to, or kUnplaced.
  std::int64_t region_now() const {
    if (scopes_.empty()) return kUnplaced;
    const std::shared_ptr<const void> checkpoint = scopes_.back().lock();
    return checkpoint ? detail::running_region(checkpoint.get()) : kUnplaced;
  }
  // Replay keyed by region only where the scope replays the checkpoint call that recorded: a
  // recorder driven some other way (another checkpoint implementation's contexts) takes in order.
  bool replaying_in_forward_checkpoint() const {
    if (scopes_.empty()) return false;
    const std::shared_ptr<const void> now = scopes_.back().lock();
    return now && now == recorded_in_.lock();
  }

  std::vector<T> records_;
  std::unordered_map<std::int64_t, std::vector<std::size_t>> by_region_;  // indices into records_
  std::unordered_map<std::int64_t, std::size_t> taken_by_region_;
  std::size_t cursor_ = 0;
  std::size_t misses_ = 0;
  std::size_t record_scopes_ = 0;
  bool forward_ended_ = false;
  std::weak_ptr<const void> recorded_in_;          // the checkpoint call forward recorded in
  std::vector<std::weak_ptr<const void>> scopes_;  // per open scope, the checkpoint it opened in
  std::string channel_;
};

// A named channel whose recorder binding is thread-local, so pipeline worker threads stay
// independent. Bindings nest: a scope restores the outer binding when it ends.
template <typename T>
class RecomputeReplay {
 public:
  using Recorder = RecomputeReplayRecorder<T>;

  struct Binding {
    std::shared_ptr<Recorder> recorder;  // null: replay disabled inside the scope
    ReplayMode mode = ReplayMode::record;
  };

  class [[nodiscard]] Scope {
   public:
    Scope(const RecomputeReplay* channel, Binding binding) : channel_(channel) {
      if (binding.recorder) binding.recorder->begin_scope(binding.mode, channel_->name());
      channel_->stack().push_back(std::move(binding));
    }
    Scope(Scope&& other) noexcept : channel_(std::exchange(other.channel_, nullptr)) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope() {
      if (channel_ == nullptr) return;
      Binding binding = std::move(channel_->stack().back());
      channel_->stack().pop_back();
      if (binding.recorder) binding.recorder->end_scope(binding.mode);
    }

   private:
    const RecomputeReplay* channel_;
  };

  explicit RecomputeReplay(std::string name) : name_(std::move(name)) {}
  RecomputeReplay(const RecomputeReplay&) = delete;
  RecomputeReplay& operator=(const RecomputeReplay&) = delete;

  const std::string& name() const { return name_; }

  // The binding in force on this thread, if any scope is open. A scope opened with a null
  // recorder yields nothing, which disables replay inside it.
  std::optional<Binding> current() const {
    const auto& bindings = stack();
    if (bindings.empty() || !bindings.back().recorder) return std::nullopt;
    return bindings.back();
  }

  // Binds `recorder` for a scope; `mode` is "record" or "replay".
  Scope scope(std::shared_ptr<Recorder> recorder, std::string_view mode) const {
    if (mode == "record") return Scope(this, {std::move(recorder), ReplayMode::record});
    if (mode == "replay") return Scope(this, {std::move(recorder), ReplayMode::replay});
    throw Error(invalid_replay_mode(name_, mode));
  }

  // The common consumer: under replay take the recorded decision (or recompute it on a
  // miss), under record compute and record it, with no binding just compute. `compute`
  // runs with autograd off: a decision is not differentiated, and saving tensors for it
  // in forward but not in replay would break the order recompute matches them in.
  template <typename Compute>
  T record_or_replay(Compute&& compute) const {
    auto run = [&] {
      c10::NoGradGuard no_grad;
      return compute();
    };
    const std::optional<Binding> binding = current();
    if (binding && binding->mode == ReplayMode::replay) {
      if (std::optional<T> recorded = binding->recorder->take()) return std::move(*recorded);
      return run();
    }
    T value = run();
    if (binding) binding->recorder->record(value);
    return value;
  }

  // For CheckpointOptions::contexts: each checkpoint call gets a fresh recorder that
  // forward records into and every recompute rewinds and replays. `on_record_exit` runs on
  // the recorder once the forward context has exited.
  CheckpointContextFactory context_factory(std::function<void(Recorder&)> on_record_exit = {}) const {
    return [this, on_record_exit] { return std::make_unique<Context>(this, on_record_exit); };
  }

 private:
  class Context final : public CheckpointContext {
   public:
    Context(const RecomputeReplay* channel, std::function<void(Recorder&)> on_record_exit)
        : channel_(channel), recorder_(std::make_shared<Recorder>()), on_record_exit_(std::move(on_record_exit)) {}
    void enter_forward() override { scope_.emplace(channel_->scope(recorder_, "record")); }
    void exit_forward() override {
      scope_.reset();
      if (on_record_exit_) on_record_exit_(*recorder_);
    }
    void enter_recompute() override {
      recorder_->rewind();
      scope_.emplace(channel_->scope(recorder_, "replay"));
    }
    void exit_recompute() override { scope_.reset(); }

   private:
    const RecomputeReplay* channel_;
    std::shared_ptr<Recorder> recorder_;
    std::function<void(Recorder&)> on_record_exit_;
    std::optional<Scope> scope_;
  };

  std::vector<Binding>& stack() const {
    thread_local std::unordered_map<const RecomputeReplay*, std::vector<Binding>> bindings;
    return bindings[this];
  }

  std::string name_;
};

}  // namespace remat
