#pragma once
// The buffers a checkpoint's body changes in place in forward (a step counter, an exponential
// average, a recurrent memory, batch norm's running statistics, spectral norm's vectors): each
// recompute runs from the values forward read, and leaves the buffers as it found them, so that it
// makes what forward made and each buffer changes once, as without checkpointing. Versions are
// replayed with the values: recompute's writes leave the version counters where forward's did, so
// what autograd saved of a buffer in forward and in recompute checks out.
//
// Which buffers a body changes is learned as forward ends (their version counters moved), per
// checkpoint name: a buffer is copied as forward begins where that checkpoint changed it before,
// or did not see it yet with its module in that mode; one seen unchanged is not copied, and should
// a later forward change it, that call's recompute reads the changed value (said once per buffer).
// A module's parameter is taken as seen unchanged until a forward changes it (copying a model's
// weights at its first call would hold a layer's twice), then given back as a buffer is; one whose
// data forward assigned anew (`p.data = p.data * m + q.data * (1 - m)`, MoCo's update) is given
// back from the first call, its data then held (no copy).
//
// A buffer the body assigns anew (its HeldBuffer::slot holds another tensor as forward ends, or
// after a save region) needs no copy: forward's tensor is kept, the slot holds it while recompute
// runs (what a save region left there where recompute skips one, copied), and what the slot held
// as recompute began after.

#include <remat/remat.hpp>

#include <ATen/core/DimVector.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace remat::detail {

class WrittenBuffers {
 public:
  // What a checkpoint's forwards showed of a buffer so far.
  enum class Seen : std::uint8_t { not_yet, unchanged, changed };

  // Forward, as the body begins: the buffers its function holds.
  void forward_began(const std::string& checkpoint, const std::vector<HeldBuffer>& buffers);
  // Forward, after a save region ran (recompute skips it): copies what changed since forward
  // began or the last save region ended, for save_region_skipped.
  void save_region_ended(std::size_t save_region);
  // Forward, until the body returned: whether `t` shares its storage with a buffer copied as
  // forward began.
  bool watches(const at::Tensor& t) const;
  // Forward, as the body returned: learns which buffers it changed and lets go of the rest.
  void forward_ended(const std::string& checkpoint);
  // Recompute, before the body runs: puts forward's values (and versions) in, noting the ones now.
  void recompute_began();
  // Recompute, where it skips save region `save_region`: the values forward left after it.
  void save_region_skipped(std::size_t save_region);
  // Recompute, as it ends (also where it raised or stopped early): puts back what it found where
  // it left another version.
  void recompute_ended() noexcept;

 private:
  struct Watched {
    at::Tensor buffer;  // the tensor the module held as forward began
    std::shared_ptr<BufferSlot> slot;
    bool training = false;
    // HeldBuffer::changes_with: its version moving says the buffer changed too, and recompute
    // puts back what it found whatever the buffer's version
    at::Tensor changes_with;
    Seen seen = Seen::not_yet;  // what this checkpoint's forwards showed of it before this one
    // The versions of the buffer and of changes_with (0 where none): as forward began, and at
    // forward's start or the last save region's end
    std::pair<std::uint32_t, std::uint32_t> at_forward, marked;
    // What the slot held as forward began or the last save region ended
    const c10::TensorImpl* marked_held = nullptr;
    at::Tensor as_forward_read;  // undefined where the buffer was seen unchanged before
    bool parameter = false;      // HeldBuffer::parameter
    // A parameter whose data forward assigned anew (`p.data = ...`, which moves no version counter):
    // as_forward_read is its data then (no copy), and recompute runs with it (set_data)
    bool data_assigned = false;
    bool changed = false;        // in place, in forward
    bool assigned = false;       // the slot held another tensor in forward
    at::Tensor as_recompute_found;
    std::uint32_t version_found = 0;
    std::optional<at::Tensor> held_as_recompute_began;  // what the slot held (assigned ones)
    std::string name;
    std::pair<std::uint32_t, std::uint32_t> versions() const;
  };
  // What forward left of a buffer after a save region: its value (and version), or, where the
  // body assigned it anew there, what its slot held (a tensor copied).
  struct AfterSaveRegion {
    std::size_t save_region = 0;
    std::size_t watched = 0;
    at::Tensor value;
    std::uint32_t version = 0;
    bool in_slot = false;
    std::optional<at::Tensor> slot_value;
  };
  // A parameter of a checkpoint none of whose forwards changed one: its version as forward began
  // (watched, copied from the next call on, only where forward changes it)
  struct Parameter {
    at::Tensor tensor;
    std::uint32_t version = 0;
    bool training = false;
    std::string name;
    // Its data as forward began: the storage (held: `p.data = ...` in forward leaves it as forward
    // read it) and where in it the data lay
    c10::Storage storage;
    std::int64_t offset = 0;
    at::DimVector sizes, strides;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<Watched> watched_;
  std::vector<Parameter> parameters_;
  std::vector<AfterSaveRegion> after_save_regions_;
  bool recomputing_ = false;
};

}  // namespace remat::detail
