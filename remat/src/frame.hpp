#pragma once
// Private state of the checkpoint runtime: one Frame per checkpoint call, and the
// thread-local view of which frame is running forward or recompute.

#include <remat/diagnostics.hpp>
#include <remat/remat.hpp>

#include <ATen/core/Tensor.h>

#include <any>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace remat::detail {

struct TensorMeta {
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t storage_offset = 0;
  std::int64_t storage_bytes = 0;
  at::TensorOptions options;
  bool requires_grad = false;
};

TensorMeta meta_of(const at::Tensor& t);
inline constexpr const char* kPlaceholderMarker = "remat placeholder";
// Same shape, strides and dtype as described, but no data: reading it raises an error that
// names `source` and the fix.
at::Tensor make_placeholder(const TensorMeta& meta, const std::string& source);
// The placeholder's message when `e` is a read of one.
std::optional<std::string> placeholder_error_of(const std::exception& e);
const c10::StorageImpl* storage_of(const at::Tensor& t);

struct InputRecord {
  TensorMeta meta;
  at::Tensor value;     // held during forward; afterwards only when recompute needs it
  bool needed = false;  // read by code that runs again in recompute
  // The caller's tensor's version counter (value's own is a new one once forward ends): an
  // in-place change would make recompute read a different value, which autograd refuses too.
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_entry = 0;
  // Whether the caller's tensor changed in place since forward began (false when its
  // version counter is disabled, as for inference tensors).
  bool changed_in_place() const { return version.enabled() && version.current_version() != version_at_entry; }
};

struct SaveRegionRecord {
  std::string name;
  std::vector<TensorMeta> metas;
  std::vector<at::Tensor> outputs;  // held during forward; afterwards only the persisted ones
  std::vector<bool> persisted;
  std::vector<std::optional<std::uint32_t>> versions;  // of the outputs when the region returned
  std::vector<std::any> state_after;  // state hook snapshots after the region ran
  std::shared_ptr<void> annotation;   // the caller's, see run_region
};

// What verify_recompute compares: an exact hash of the bytes, plus sums that say how large
// a difference is.
struct Fingerprint {
  std::string where;  // "region 'layers.0::mlp'" or "the checkpoint body"
  std::vector<std::int64_t> shape;
  std::uint64_t hash = 0;
  double sum = 0;
  double norm = 0;
};
Fingerprint fingerprint_of(const at::Tensor& t, std::string where);

struct KeptTensor {
  int save_region = -1;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor{c10::intrusive_ptr<c10::TensorImpl>()};
};

enum class Mode : std::uint8_t { none, forward, recompute };

struct Frame : std::enable_shared_from_this<Frame> {
  CheckpointOptions options;
  FlatFunction body;
  std::vector<InputRecord> inputs;
  std::vector<SaveRegionRecord> save_regions;
  std::vector<RegionDecision> regions;  // every region in forward order
  std::vector<std::any> state_at_entry;
  std::vector<KeptTensor> kept;  // for reports only
  std::vector<std::unique_ptr<CheckpointContext>> contexts;
  std::vector<Fingerprint> fingerprints;  // per dropped tensor, with verify_recompute

  // Tensors autograd saved outside save regions: dropped in forward, recreated by recompute
  // in the same order.
  std::size_t dropped = 0;
  std::vector<at::Tensor> recreated;
  std::vector<bool> filled;
  std::size_t missing = 0;  // slots recompute still has to fill
  // Autograd's sequence number when the last tensor was dropped. When forward created
  // graph nodes after it, recompute stops (by exception) once the last slot is filled
  // instead of running that work again.
  std::uint64_t sequence_at_last_drop = 0;
  bool stop_early = false;
  bool forward_finished = false;  // the body returned: recompute has a complete record
  // Backward may run through one checkpoint on several threads at once (retain_graph=True):
  // one thread recomputes and takes its tensors at a time.
  std::recursive_mutex backward_mutex;

  // Which inputs code outside save regions reads, learned from an op observer that is
  // removed as soon as every input is known to be read.
  std::size_t inputs_not_read = 0;
  std::uint64_t read_observer = 0;  // at::CallbackHandle; 0 when none is registered

  // Recompute progress.
  std::size_t recompute_packs = 0;
  std::size_t recompute_regions = 0;

  // Tensors are matched to inputs and save-region outputs by storage, so views count.
  void persist(const at::Tensor& t);    // keep the save-region output(s) behind t
  void note_read(const at::Tensor& t);  // read by code that recompute runs again
  void stop_observing_reads();

  void recompute();
  at::Tensor take_recreated(std::size_t index);
};

struct ThreadState {
  Frame* frame = nullptr;
  Mode mode = Mode::none;
  int save_region = -1;  // the save region whose body runs now (forward only)
  bool in_region = false;
  const std::string* region = nullptr;  // name of the region whose body runs now
  // Saved-tensor hooks on PyTorch's stack (Python's saved_tensors_hooks) when this forward or
  // recompute began: hooks pushed inside the body take the tensors saved under them.
  std::size_t user_hooks_depth = 0;
};

ThreadState& thread_state();

// Sets the thread state for a scope and puts the previous one back.
class ThreadStateScope {
 public:
  explicit ThreadStateScope(const ThreadState& next) : previous_(thread_state()) { thread_state() = next; }
  ~ThreadStateScope() { thread_state() = previous_; }
  ThreadStateScope(const ThreadStateScope&) = delete;
  ThreadStateScope& operator=(const ThreadStateScope&) = delete;

 private:
  ThreadState previous_;
};

// Makes `frame` the one new saved-variable hooks belong to, for a scope.
class FrameOwnerScope {
 public:
  explicit FrameOwnerScope(std::shared_ptr<Frame> frame);
  ~FrameOwnerScope();
  FrameOwnerScope(const FrameOwnerScope&) = delete;
  FrameOwnerScope& operator=(const FrameOwnerScope&) = delete;

 private:
  std::shared_ptr<Frame> previous_;
};

// Installs the autograd engine whose default saved-variable hooks consult the thread state
// (engine.cpp).
void ensure_engine_installed();

// Saved-tensor hooks on PyTorch's stack (Python's saved_tensors_hooks; always 0 in a C++
// program).
std::size_t user_hooks_depth();

// Records of finished checkpoint forwards for collect_trace().
void record_scope(CheckpointScope scope);

}  // namespace remat::detail
