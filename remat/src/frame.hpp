#pragma once
// One checkpoint call (a Frame): its options and body, the records forward leaves
// (checkpoint_records.hpp), what it learns of the reads recompute repeats, the dropped tensors'
// slots, and recompute itself. Below the saved-tensor hooks that fill it (checkpoint_hooks.hpp)
// and the entry points that build it (runtime.cpp).

#include "checkpoint_records.hpp"
#include "forward_modes.hpp"
#include "outside_reads.hpp"
#include "written_buffers.hpp"

#include <remat/diagnostics.hpp>
#include <remat/kept_ops.hpp>
#include <remat/remat.hpp>

#include <ATen/core/Tensor.h>

#include <any>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat::detail {

// Thrown once recompute has recreated every tensor backward needs (from the pack hook, or from
// a skipped save region that gave back the last ferried tensor). A
// std::exception, so that a layer between the hook and recompute (PyTorch's Python bindings,
// when the body is a Python function) turns it into an error of its own instead of unwinding
// through code that does not expect a foreign exception; recompute then ends the same way.
struct StopRecompute : std::exception {
  const char* what() const noexcept override { return "remat: recompute stopped early"; }
};

struct Frame;
// How a body takes the same path in recompute as in forward (the end of the messages refusing one
// that did not).
std::string same_path_advice();
// Whether this thread records the checkpoint inputs ops read (remat/input_reads.hpp).
bool recording_input_reads();
// Throws what unwinds a recompute's body: through the raiser set with
// set_recompute_stop_raiser(), or StopRecompute.
[[noreturn]] void throw_recompute_stop();
// Stops `frame`'s recompute early: every tensor backward needs exists.
[[noreturn]] void stop_recompute(Frame& frame);

struct Frame : std::enable_shared_from_this<Frame> {
  Frame() = default;
  ~Frame();  // leaves the live frames, if it joined them
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  CheckpointOptions options;
  FlatFunction body;
  std::vector<InputRecord> inputs;
  std::vector<SaveRegionRecord> save_regions;
  std::vector<RegionDecision> regions;  // every region in forward order
  // The ops a per-op plan keeps in recomputed regions, by index in `regions`: what forward held
  // of them, which recompute takes instead of running them again.
  std::map<std::size_t, std::unique_ptr<KeptOps>> kept_ops;
  // The index in `regions` of the region whose body runs now in forward or recompute (-1:
  // none); replay recorders key their decisions by it (remat/replay.hpp).
  std::int64_t running_region = -1;
  std::uint64_t forward_number = 0;     // CheckpointScope::forward
  // Recompute's early stop was raised (stop_recompute()): a save after it means the body
  // caught the stop and went on.
  bool stop_raised = false;
  std::vector<std::any> state_at_entry;
  // The pair the checkpoint was called under (its own, or the one in force): needed inputs are
  // packed through it when forward ends.
  std::shared_ptr<SavedTensorHooks> input_hooks;
  std::any input_hooks_context;
  // The plan's offloader (plan_offloader()) where the plan offloads a region: such a region runs
  // with it in force in forward.
  std::shared_ptr<SavedTensorHooks> plan_offloader;
  ForwardModes modes;            // autocast, default dtype and backend flags at entry: recompute's too
  std::vector<KeptTensor> kept;  // for reports only
  WrittenBuffers written_buffers;  // those the body changes in forward (note_buffers_held_by_the_body)
  // Report names for tensors a save region is about to save (name_saved_tensors()), by the
  // exact tensor; cleared when the region returns.
  std::vector<std::pair<const c10::TensorImpl*, std::string>> pending_names;
  // Joins the live frames (live_frames.hpp) once forward finished: backward may still need it.
  void make_live();
  bool live = false;  // in the live frames
  std::vector<std::unique_ptr<CheckpointContext>> contexts;
  std::vector<Fingerprint> fingerprints;   // per dropped tensor, with verify_recompute
  std::vector<DroppedMeta> dropped_metas;  // per dropped tensor
  std::vector<DroppedVersion> dropped_versions;  // of the dropped tensors, at their save
  // Parameters (leaves that require grad) read by the graph nodes forward made outside save
  // regions, saved or not (a bias an add reads is not saved): recompute reads them again too.
  struct ReadParameter {
    DroppedMeta meta;
    c10::VariableVersion version{c10::VariableVersion::DISABLED};
    std::uint32_t version_at_forward = 0;
  };
  std::vector<ReadParameter> read_parameters;
  // What the same nodes read from outside the checkpoint (parameters, tensors computed before it;
  // not what computed its inputs, which recompute is given as leaves), and the span of the nodes
  // forward made.
  std::vector<OutsideRead> forward_reads;
  NodeSpan forward_span;
  // Once forward returned `outputs`: fills read_parameters and forward_reads from the graph behind
  // them.
  void note_forward_reads(const TensorList& outputs);
  // Once recompute filled the slots `filled_now`, given `args`: refuses a read forward did not
  // make (recompute_read_elsewhere).
  void refuse_reads_forward_did_not_make(const std::vector<std::size_t>& filled_now, const TensorList& args) const;
  // In recompute, before the body runs: refuses a tensor of dropped_versions or read_parameters
  // changed in place since forward.
  void check_read_again_unchanged() const;
  // Before recompute: under a plan, which saves a region by its own choice, a save region whose
  // kept output was changed in place after the checkpoint returned (h = checkpoint(layer)(h);
  // h.mul_(2)) runs again in recompute (its rerun_reason set), remaking the output as forward made
  // it, where recompute holds every checkpoint input it reads. Elsewhere check_read_again_unchanged
  // refuses the change.
  void rerun_save_regions_changed_after_forward();
  // Autograd's sequence number when forward began: graph nodes numbered below it were made
  // before the checkpoint.
  std::uint64_t sequence_at_entry = 0;
  // And when recompute's body began: what it reads numbered below was computed before recompute.
  std::uint64_t sequence_at_recompute = 0;

  // Tensors autograd saved outside save regions: dropped in forward, recreated by recompute
  // in the same order. Slots past `dropped` hold the ferried tensors, in their order.
  std::size_t dropped = 0;
  std::vector<FerriedTensor> ferried;
  std::size_t slots() const { return dropped + ferried.size(); }  // 0: recompute never runs
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
  bool forward_failed = false;    // the body raised (release_after_failed_forward())
  // Backward may run through one checkpoint on several threads at once (retain_graph=True):
  // one thread recomputes and takes its tensors at a time.
  std::recursive_mutex backward_mutex;

  // What code outside save regions reads (recompute runs it again): which inputs, and which
  // save-region outputs (a residual add of attention's output, say), learned from an op
  // observer that runs only while some input or output has not been seen read yet.
  std::size_t inputs_not_read = 0;
  std::size_t outputs_not_persisted = 0;
  std::uint64_t read_observer = 0;  // at::CallbackHandle; 0 when none is registered
  // Also while the thread records input reads (remat/input_reads.hpp), inside save regions too.
  bool observing_needed() const {
    return inputs_not_read != 0 || outputs_not_persisted != 0 || recording_input_reads();
  }

  // Recompute progress.
  std::vector<const c10::TensorImpl*> given_by_skipped_save_regions;  // their outputs, leaves of their own
  // Set while the checkpoint's own body has not begun (forward, recompute): it notes what it holds.
  bool body_starting = false;
  // The tensors the body held as recompute began (note_tensors_held_by_the_body), while it runs:
  // made before recompute.
  TensorList held_as_recompute_began;
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
  // again read it (undone at forward's end where recompute stops before that code: see
  // SaveRegionRecord::read_at).
  void persist(const at::Tensor& t, bool by_read = false);
  void note_read(const at::Tensor& t);  // read by code that recompute runs again
  void note_read_in_save_region(const at::Tensor& t);  // recorded only (record_input_reads)
  void observe_reads_if_needed();
  void stop_observing_reads();

  // The inputs of the save region whose body runs now that recompute recreates (produced in
  // the checkpoint by differentiable code that runs again), by storage: set when the region
  // starts, forward only.
  std::vector<std::pair<std::size_t, at::Tensor>> recreated_region_inputs;
  void note_recreated_region_inputs(const TensorList& region_inputs);
  // When `t`, saved in save region `save_region`, shares a storage with one of those inputs:
  // its ferried slot (past `dropped` once forward ends), holding `t` until forward ends where
  // `may_keep` (see FerriedTensor::held).
  std::optional<std::size_t> ferry(const at::Tensor& t, int save_region, bool may_keep, const std::string& name);
  // In recompute, at skipped save region `save_region` with the inputs recompute gave it.
  void fill_ferried(int save_region, const TensorList& region_inputs);

  void recompute();
  // Recompute's run, filling the slots `to_fill` (those not filled when it began).
  void recompute_slots(const std::vector<std::size_t>& to_fill);
  at::Tensor take_recreated(std::size_t index);
  // torch_remat's contract for hook pairs: a checkpoint that recomputes does so before any
  // unpack of its pairs runs (a group offloader onloads at the top of the body under
  // is_recomputing()). Called by such an unpack; recomputes unless backward already took
  // recreated tensors since the last recompute.
  void recompute_before_unpacks();
  // After the body raised: drops everything the frame holds (its hooks may still hold it).
  void release_after_failed_forward();
};

}  // namespace remat::detail
