#pragma once
// Ops kept inside recomputed regions: a per-op plan's third choice, carried out below autograd.
//
// A per-op plan may recompute a region yet keep the outputs of some of its ops, named by their
// index among the ops the region runs and their ATen name ("aten::mm"). While a KeptOps::Scope is
// open on a thread, every ATen op that thread dispatches below autograd passes through a dispatcher
// fallback of the runtime's (on DispatchKey::Fake, a key no kernel of PyTorch's uses), which:
// - in forward, numbers the ops as the profile numbered them (views and dtype or device copies
//   aside) and, at each kept index, checks the op is the one the plan names and holds its outputs
//   (aliases, no copy);
// - in recompute, checks each op against the one forward ran at its index (the same op, with
//   gradients on or off as then) and, at a kept index, that its tensor inputs have forward's shapes
//   and dtypes and that those forward read as leaves that take gradients (the weights trained) are
//   the same tensors, then hands back the held outputs instead of running the op. Autograd above sees the same values,
//   so gradients are those of no checkpointing.
// Forward writing into a held output later (an in-place op, in the region or after it) makes
// recompute run the op again rather than hand back a changed value: a write through the output, a
// view of it, or another tensor over its storage that a later op of the region returned with a
// version counter of its own (aten::_unsafe_view: a matmul of 3-d inputs returns its mm's output
// so, and `q = x @ w; q.mul_(0.5)` writes into the mm's output through it); random ops and ops whose
// output size depends on values are never kept. Ops a kernel runs inside another op are not seen,
// nor are ops traced rather than run (torch.compile compiling a function the region calls: under
// PyTorch's fake, proxy or functional modes, or on fake or meta tensors), as the profile's
// TorchDispatchMode does not see them. Unlike that mode, the fallback sees ops run while PyTorch
// sets dispatch modes aside (printing a tensor does): such code in a region shifts the numbering
// from the profile's, and the region is refused.
// A region whose ops differ from the plan's, or whose recompute runs other ops than its forward
// did, is refused with a c10::ValueError (Python's ValueError) naming the first difference.
//
// Nothing passes through the fallback while no scope is open: the key is in no tensor's key set.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace remat {

// The storage of an op output held for recompute now.
struct HeldOpOutput {
  std::string device;  // "cpu", "cuda:0"
  std::uintptr_t address = 0;
  std::uint64_t bytes = 0;
};

// Every storage held by every KeptOps now, each once.
std::vector<HeldOpOutput> held_op_outputs();

// Sets this thread's kept ops aside (true) or back (false), counted: while they are aside no op
// is numbered, held or handed back. torch.compile sets PyTorch's dispatch modes aside while it
// compiles a function (its tracing, its backend), so the profile never numbers those ops; the
// Python package calls this from torch.compile's compile start and end hooks to match.
void set_kept_ops_aside(bool aside);

// The kept ops of one region in one checkpoint call, and what forward held for recompute.
class KeptOps {
 public:
  // The shapes and dtypes of an op's tensor arguments.
  using Shapes = std::vector<std::pair<std::vector<std::int64_t>, c10::ScalarType>>;
  // A tensor argument that is a leaf taking gradients, and its storage then.
  struct TrainedInput {
    const c10::TensorImpl* tensor = nullptr;
    const c10::StorageImpl* storage = nullptr;
  };

  // `kept`: op index -> the ATen op's name as plans write it ("aten::mm", "aten::add.Tensor").
  // Throws remat::Error for an empty map, and where another library registered a fallback on the
  // dispatch key first.
  KeptOps(std::string region, std::map<std::uint32_t, std::string> kept);
  ~KeptOps();
  KeptOps(const KeptOps&) = delete;
  KeptOps& operator=(const KeptOps&) = delete;

  // The region's body runs while one is open on this thread: forward's (`recomputing` false)
  // starts over, holding the kept ops' outputs; recompute's hands them back. Call finish() once the
  // body returned (it checks forward ran every kept op, and may throw c10::ValueError); a scope
  // closed without finish() (the body raised) lets every held output go.
  class Scope {
   public:
    Scope(KeptOps& ops, bool recomputing);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    void finish();

    // One op of the region, its arguments on `stack` (the dispatcher's fallback calls this).
    void pass(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

   private:
    void close();
    // Runs the op through the scope opened before this one, or the kernels below.
    void next(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
    void hold(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack, std::uint32_t index,
              const std::string& want);
    // Forward, after an op that wrote nothing: notes its returns over a held output's storage that
    // are other tensors than the held ones (Held::aliases).
    void watch_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack);
    bool hand_back(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::uint32_t index);
    [[noreturn]] void refuse(const c10::OperatorHandle& op, std::uint32_t index, const std::string& how = {});

    KeptOps& ops_;
    bool recomputing_;
    std::uint32_t count_ = 0;  // recompute: the numbered ops run so far
    Scope* outer_;             // the scope open on this thread before this one
    bool open_ = true;
  };

  // Lets every held output go.
  void clear();
  const std::string& region() const { return region_; }

 private:
  friend std::vector<HeldOpOutput> held_op_outputs();
  struct Held {
    std::vector<c10::IValue> returns;     // the op's returns, as the dispatcher returned them
    std::vector<std::uint32_t> versions;  // of each returned tensor, in order
    Shapes inputs;                        // the shapes and dtypes of the op's tensor arguments
    // Per tensor argument, in the same order: one that is a leaf taking gradients (a weight
    // trained), else nulls
    std::vector<TrainedInput> trained;
    // Other tensors over a returned tensor's storage that later ops of the region returned (their
    // version counters are their own), and their versions then: writes through them count too.
    std::vector<at::Tensor> aliases;
    std::vector<std::uint32_t> alias_versions;
  };

  std::string region_;
  std::map<std::uint32_t, std::string> kept_;
  std::uint32_t last_;                    // the highest kept index
  // The numbered ops forward ran, in order, each with whether gradients were on
  std::vector<std::pair<c10::OperatorHandle, bool>> ran_;
  std::map<std::uint32_t, Held> held_;    // by op index
};

}  // namespace remat
