#pragma once
// Private state of the checkpoint runtime: one Frame per checkpoint call, and the
// thread-local view of which frame is running forward or recompute.

#include "forward_modes.hpp"
#include "placeholder.hpp"

#include <remat/diagnostics.hpp>
#include <remat/remat.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <any>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat::detail {

struct InputRecord {
  TensorMeta meta;
  at::Tensor value;     // held during forward; afterwards only when recompute needs it
  bool needed = false;  // read by code that runs again in recompute
  PackedTensor packed;  // in place of value after forward, when the checkpoint has a hook pair
  // The caller's tensor's version counter (value's own is a new one once forward ends): an
  // in-place change would make recompute read a different value, which autograd refuses too.
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_entry = 0;
  // Whether the caller's tensor changed in place since forward began (false when its
  // version counter is disabled, as for inference tensors).
  bool changed_in_place() const { return version.enabled() && version.current_version() != version_at_entry; }
  bool held() const { return value.defined() || static_cast<bool>(packed); }
};

struct SaveRegionRecord {
  std::string name;
  std::vector<TensorMeta> metas;
  std::vector<at::Tensor> outputs;  // held during forward; afterwards only the persisted ones
  std::vector<bool> persisted;
  // The hook pair in force where the region ran and its captured context: persisted outputs
  // are packed through it when forward ends (packed[o] then stands in for outputs[o]).
  std::shared_ptr<SavedTensorHooks> hooks;
  std::any hooks_context;
  std::vector<PackedTensor> packed;
  // Per output persisted only because code that recompute runs again read it: the number of
  // tensors dropped when it was first read (kNotOnlyRead when something else needs it).
  static constexpr std::size_t kNotOnlyRead = static_cast<std::size_t>(-1);
  std::vector<std::size_t> read_at;
  std::vector<std::optional<std::uint32_t>> versions;  // of the outputs when the region returned
  // The outputs' own version counters (what is held after forward has new ones): a persisted
  // output changed in place between forward and backward would hand recompute another value.
  std::vector<c10::VariableVersion> version_counters;
  std::vector<std::any> state_after;  // state hook snapshots after the region ran
  // Autograd's sequence numbers of the graph nodes the region made: [first_node, end_node).
  std::uint64_t first_node = 0, end_node = 0;
  std::shared_ptr<void> annotation;   // the caller's, see run_region
};

struct KeptTensor {
  int save_region = -1;
  std::string name;  // given with name_saved_tensors(); "" for "saved.<i>"
  // A parameter (a leaf that requires grad) or a view of one, such as the weight.t() a matmul
  // saves: resident whatever the checkpoint does, so reports leave it out.
  bool parameter = false;
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor{c10::intrusive_ptr<c10::TensorImpl>()};
};

// Thrown once recompute has recreated every tensor backward needs (from the pack hook, or from
// a skipped save region that gave back the last ferried tensor). A
// std::exception, so that a layer between the hook and recompute (PyTorch's Python bindings,
// when the body is a Python function) turns it into an error of its own instead of unwinding
// through code that does not expect a foreign exception; recompute then ends the same way.
struct StopRecompute : std::exception {
  const char* what() const noexcept override { return "remat: recompute stopped early"; }
};

// A tensor a save region saved that is (a view of) one of its inputs recompute recreates:
// forward does not keep it; recompute takes it from that input as it reaches the skipped
// region (torch_remat re-derives such inputs the same way).
struct FerriedTensor {
  int save_region = -1;
  std::size_t input = 0;  // the region's input it shares a storage with
  TensorMeta input_meta;  // that input's layout in forward: recompute's must be the same
  TensorMeta saved_meta;  // the saved tensor's sizes, strides and offset in that storage
  // Whether the saved tensor's conjugate and negative bits differ from the input's (it was
  // x.conj() or a negative view of x): what recompute takes is flipped the same way.
  bool conjugate_flipped = false;
  bool negative_flipped = false;
};

// A tensor from outside the checkpoint (a parameter, a captured weight) that forward saved and
// dropped: recompute reads the same tensor again, so a change in place since forward would
// recreate other values. Recompute refuses to start, as autograd refuses to unpack a saved tensor
// changed since it was saved.
struct DroppedVersion {
  std::size_t index = 0;  // its dropped slot
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_save = 0;
};

enum class Mode : std::uint8_t { none, forward, recompute };

struct Frame : std::enable_shared_from_this<Frame> {
  Frame() = default;
  ~Frame();  // leaves the live frames, if forward registered it
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  CheckpointOptions options;
  FlatFunction body;
  std::vector<InputRecord> inputs;
  std::vector<SaveRegionRecord> save_regions;
  std::vector<RegionDecision> regions;  // every region in forward order
  std::uint64_t forward_number = 0;     // CheckpointScope::forward
  std::vector<std::any> state_at_entry;
  // The pair the checkpoint was called under (its own, or the one in force): needed inputs are
  // packed through it when forward ends.
  std::shared_ptr<SavedTensorHooks> input_hooks;
  std::any input_hooks_context;
  ForwardModes modes;            // autocast, default dtype and backend flags at entry: recompute's too
  std::vector<KeptTensor> kept;  // for reports only
  // Report names for tensors a save region is about to save (name_saved_tensors()), by the
  // exact tensor; cleared when the region returns.
  std::vector<std::pair<const c10::TensorImpl*, std::string>> pending_names;
  bool live = false;  // in the live frames (a finished forward whose frame backward may need)
  std::vector<std::unique_ptr<CheckpointContext>> contexts;
  std::vector<Fingerprint> fingerprints;   // per dropped tensor, with verify_recompute
  std::vector<DroppedMeta> dropped_metas;  // per dropped tensor
  std::vector<DroppedVersion> dropped_versions;  // of the dropped tensors made outside the checkpoint
  // Parameters (leaves that require grad) read by the graph nodes forward made outside save
  // regions, saved or not (a bias an add reads is not saved): recompute reads them again too.
  struct ReadParameter {
    DroppedMeta meta;
    c10::VariableVersion version{c10::VariableVersion::DISABLED};
    std::uint32_t version_at_forward = 0;
  };
  std::vector<ReadParameter> read_parameters;
  // Once forward returned `outputs`: fills read_parameters from the graph behind them.
  void note_read_parameters(const TensorList& outputs);
  // In recompute, before the body runs: refuses a tensor of dropped_versions or read_parameters
  // changed in place since forward.
  void check_read_again_unchanged() const;
  // Autograd's sequence number when forward began: graph nodes numbered below it were made
  // before the checkpoint.
  std::uint64_t sequence_at_entry = 0;
  // Whether `t` requires grad and was made outside the checkpoint's forward: a leaf (a
  // parameter), or the output of a graph node made before it.
  bool made_outside(const at::Tensor& t) const;

  // Tensors autograd saved outside save regions: dropped in forward, recreated by recompute
  // in the same order. Slots past `dropped` hold the ferried tensors, in their order.
  std::size_t dropped = 0;
  std::vector<FerriedTensor> ferried;
  std::vector<at::Tensor> recreated;
  std::vector<bool> filled;
  std::size_t missing = 0;                // slots recompute still has to fill
  std::size_t taken_since_recompute = 0;  // slots backward took since recompute last ran
  // Autograd's sequence number when the last tensor was dropped. When forward created
  // graph nodes after it, recompute stops (by exception) once the last slot is filled
  // instead of running that work again.
  std::uint64_t sequence_at_last_drop = 0;
  bool stop_early = false;
  bool forward_finished = false;  // the body returned: recompute has a complete record
  // Backward may run through one checkpoint on several threads at once (retain_graph=True):
  // one thread recomputes and takes its tensors at a time.
  std::recursive_mutex backward_mutex;

  // What code outside save regions reads (recompute runs it again): which inputs, and which
  // save-region outputs (a residual add of attention's output, say), learned from an op
  // observer that runs only while some input or output has not been seen read yet.
  std::size_t inputs_not_read = 0;
  std::size_t outputs_not_persisted = 0;
  std::uint64_t read_observer = 0;  // at::CallbackHandle; 0 when none is registered
  bool observing_needed() const { return inputs_not_read != 0 || outputs_not_persisted != 0; }

  // Recompute progress.
  std::size_t recompute_packs = 0;
  std::size_t recompute_regions = 0;
  // Set by the pack hook when recompute recreated something other than forward dropped; the
  // hook stops the body and recompute raises this.
  std::optional<std::string> recompute_mismatch;

  // "region 'layers.0::mlp'" or "the body of checkpoint 'layers.0'".
  std::string where(int region) const;
  // A region's name within this checkpoint: "layers.0::mlp".
  std::string region_path(const std::string& name) const;

  // Tensors are matched to inputs and save-region outputs by storage, so views count.
  // Keeps the save-region output(s) behind t; `by_read`: only because code that recompute runs
  // again read it.
  void persist(const at::Tensor& t, bool by_read = false);
  void note_read(const at::Tensor& t);  // read by code that recompute runs again
  void observe_reads_if_needed();
  void stop_observing_reads();

  // The inputs of the save region whose body runs now that recompute recreates (produced in
  // the checkpoint by differentiable code that runs again), by storage: set when the region
  // starts, forward only.
  std::vector<std::pair<std::size_t, at::Tensor>> recreated_region_inputs;
  void note_recreated_region_inputs(const TensorList& region_inputs);
  // When `t`, saved in save region `save_region`, shares a storage with one of those inputs:
  // its ferried slot (past `dropped` once forward ends).
  std::optional<std::size_t> ferry(const at::Tensor& t, int save_region);
  // In recompute, at skipped save region `save_region` with the inputs recompute gave it.
  void fill_ferried(int save_region, const TensorList& region_inputs);

  void recompute();
  at::Tensor take_recreated(std::size_t index);
  // torch_remat's contract for hook pairs: a checkpoint that recomputes does so before any
  // unpack of its pairs runs (a group offloader onloads at the top of the body under
  // is_recomputing()). Called by such an unpack; recomputes unless backward already took
  // recreated tensors since the last recompute.
  void recompute_before_unpacks();
  // After the body raised: drops everything the frame holds (its hooks may still hold it).
  void release_after_failed_forward();
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

}  // namespace remat::detail
