#pragma once
// What a checkpoint's graph reads from outside it. The nodes one thread made over a span of its
// autograd sequence numbers (the checkpoint's forward, or its recompute) are walked from given
// roots; each edge leaving them is a read: a leaf's gradient accumulator, or a node made elsewhere.
// Forward's reads are noted when it returns; recompute's, when it ends, must be among them, or
// weights were swapped in for forward or backward alone (the check Frame::recompute makes, which
// sees what no op saves: a bias, a weight whose input takes no gradient).

#include <remat/alloc/tags.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <vector>

namespace c10 {
struct TensorImpl;
}
namespace torch::autograd {
struct Node;
}

namespace remat::detail {

// The nodes one thread made between two of its sequence numbers (numbers count per thread).
struct NodeSpan {
  std::uint64_t thread = 0;  // at::RecordFunction::currentThreadId() of the thread that made them
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  // The span from `begin` to now on this thread.
  static NodeSpan up_to_now(std::uint64_t begin);
  bool holds(const torch::autograd::Node& node) const;
};

// An edge from a node of a span to a node outside it.
struct OutsideRead {
  std::weak_ptr<torch::autograd::Node> node;  // what is read
  std::type_index reader;                     // the type of the span's node that reads it
  std::uint32_t input = 0;                    // which of the reader's edges
  std::uint32_t read_input = 0;               // which input of `node` that edge gives a gradient
  static OutsideRead of(const torch::autograd::Node& reader, std::uint32_t input,
                        const std::shared_ptr<torch::autograd::Node>& read);
};

// Visits each node of `span` reachable from `roots` once and calls `read` for each edge that leaves
// the span (to a leaf's gradient accumulator, or a node another span or thread made). Returns the
// nodes visited.
std::vector<const torch::autograd::Node*> walk_outside_reads(
    const NodeSpan& span, const std::vector<const torch::autograd::Node*>& roots,
    const std::function<void(const torch::autograd::Node& reader, std::uint32_t input,
                             const std::shared_ptr<torch::autograd::Node>& read)>& read);

// Notes leaves a checkpoint's forward read as they are (its parameters), held weakly past the
// checkpoint: a leaf some forward read was made before any later recompute (a late-binding
// closure's recompute reads the last layer's weights after that layer's checkpoint is gone).
void note_leaves_forwards_read(const std::vector<c10::intrusive_ptr<c10::TensorImpl>>& leaves);
bool read_by_a_forward(const c10::TensorImpl* leaf);

// What recompute read that forward did not, where that means weights swapped in, as a phrase
// ("a parameter (float32 [8] on cpu) as input 0 of AddmmBackward0, where forward read a tensor
// computed from it (the output of SubBackward0)"): a parameter where forward read a tensor computed
// from it that recompute (its `recompute_nodes`) does not compute again; a parameter over other
// memory where forward read another, of its shape and type, at the same input of the same kind of
// op, both made outside the body (swapped_leaf, given `held`); a tensor made before recompute
// began (on recompute's thread, or outside the body on forward's) computed otherwise than every
// tensor forward read. Views and casts of a leaf count as the leaf (autocast's cached casts, a
// sharded parameter's views made again for backward). The checkpoint's `inputs` (as forward and
// recompute were given them, with the outputs of save regions recompute skips) and nodes of
// threads other than these two are not compared.
std::optional<std::string> recompute_read_elsewhere(
    const std::vector<OutsideRead>& forward, const NodeSpan& forward_span, const std::vector<OutsideRead>& recompute,
    const std::vector<const torch::autograd::Node*>& recompute_nodes, const NodeSpan& recompute_span,
    const std::vector<const c10::TensorImpl*>& inputs, const std::vector<at::Tensor>& held);

// Whether `forward_leaf`, which forward read, and `recompute_leaf`, which recompute read in its
// place, were both made outside the body, so that one was swapped for the other: where forward read
// its leaf through a view or cast made before the checkpoint (`forward_read_a_view`), where
// recompute's existed before recompute began (some forward read it, read_by_a_forward, or the body
// held it as recompute began, held_by_the_body), or by the phases the allocator tagged both in. A
// leaf the body makes is new to every forward and to the body.
bool swapped_leaf(const at::TensorBase& forward_leaf, bool forward_read_a_view, const at::TensorBase& recompute_leaf,
                  const std::vector<at::Tensor>& held);

// Whether `impl` is among `held`, the tensors the body's function held as recompute began
// (note_tensors_held_by_the_body).
bool held_by_the_body(const c10::TensorImpl* impl, const std::vector<at::Tensor>& held);

// Whether the allocator tagged `tensor`'s storage as made in a phase other than `body` (the body's
// forward or recompute): a leaf the body makes (torch.utils.checkpoint's placeholder, a probe that
// takes a gradient) is another leaf in recompute. False where no remat allocator tagged it.
bool made_outside(const at::TensorBase& tensor, alloc::Phase body);

// The error for weights swapped in: "recompute of checkpoint 'NAME' read WHAT: weights swapped
// in for forward or for backward alone ... " and how to keep the swap in force.
std::string swapped_weights_error(const std::string& checkpoint, const std::string& what);

}  // namespace remat::detail
