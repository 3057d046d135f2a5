// What a checkpoint's graph reads from outside it (outside_reads.hpp).

#include "outside_reads.hpp"

#include "checkpoint_records.hpp"

#include <remat/alloc/allocator.hpp>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

namespace remat::detail {
namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::Node;

// The name of a node type PyTorch generates (torch::autograd::generated::ViewBackward0), read from
// its mangled type name without demangling it; empty for any other (a Python function's node).
std::string_view generated_name(const Node& node) {
  constexpr std::string_view prefix = "N5torch8autograd9generated";
  const std::string_view mangled = typeid(node).name();
  if (mangled.substr(0, prefix.size()) != prefix) return {};
  std::string_view rest = mangled.substr(prefix.size());
  std::size_t digits = 0;
  std::size_t length = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
    length = length * 10 + static_cast<std::size_t>(rest[digits] - '0');
    ++digits;
  }
  if (digits == 0 || rest.size() < digits + length) return {};
  return rest.substr(digits, length);
}

// Nodes of ops whose output holds its one input's values: views, casts and copies.
bool holds_its_input(const Node& node) {
  static constexpr std::array<std::string_view, 24> kNames = {
      "AliasBackward0",         "AsStridedBackward0",      "CloneBackward0",
      "DiagonalBackward0",      "ExpandBackward0",         "PermuteBackward0",
      "ReshapeAliasBackward0",  "SelectBackward0",         "SliceBackward0",
      "SplitBackward0",         "SplitWithSizesBackward0", "SqueezeBackward0",
      "SqueezeBackward1",       "SqueezeBackward2",        "TBackward0",
      "ToCopyBackward0",        "TransposeBackward0",      "UnbindBackward0",
      "UnfoldBackward0",        "UnsafeViewBackward0",     "UnsqueezeBackward0",
      "ViewAsComplexBackward0", "ViewAsRealBackward0",     "ViewBackward0"};
  const std::string_view name = generated_name(node);
  return !name.empty() && std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

const c10::TensorImpl* leaf_of_accumulator(const Node* node) {
  const auto* accumulator = dynamic_cast<const AccumulateGrad*>(node);
  return accumulator == nullptr ? nullptr : accumulator->variable.unsafeGetTensorImpl();
}

// The accumulator of the leaf whose values `node`'s output holds (through views, casts and
// copies), if any.
const AccumulateGrad* leaf_held(const Node* node) {
  for (int hops = 0; node != nullptr && hops < 8; ++hops) {
    if (const auto* accumulator = dynamic_cast<const AccumulateGrad*>(node)) return accumulator;
    if (!holds_its_input(*node) || node->num_outputs() == 0) return nullptr;
    const Node* next = nullptr;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function == nullptr) continue;
      if (next != nullptr) return nullptr;
      next = edge.function.get();
    }
    node = next;
  }
  return nullptr;
}

// Whether `node`'s output was computed from `leaf`: its accumulator is found within the first 64
// nodes behind it, first inputs first (fast weights made over several steps, p - lr * g again and
// again, reach it through their first inputs).
bool computed_from(const Node& node, const c10::TensorImpl* leaf) {
  constexpr std::size_t kNodes = 64;
  std::vector<const Node*> to_visit{&node};
  std::unordered_set<const Node*> seen{&node};
  while (!to_visit.empty() && seen.size() <= kNodes) {
    const Node* next = to_visit.back();
    to_visit.pop_back();
    if (leaf_of_accumulator(next) == leaf) return true;
    const auto& edges = next->next_edges();
    for (auto edge = edges.rbegin(); edge != edges.rend(); ++edge) {
      if (edge->function != nullptr && seen.insert(edge->function.get()).second)
        to_visit.push_back(edge->function.get());
    }
  }
  return false;
}

// Whether `a` and `b` compute the same thing: the same leaf, or nodes of one type whose inputs do,
// compared `depth` nodes deep (past it, the types alone). Two forwards' copies of a weight a module
// computes from its parameters (a weight norm's, a positional table's) are the same.
bool same_computation(const Node* a, const Node* b, int depth) {
  if (a == b) return true;
  if (a == nullptr || b == nullptr) return false;
  if (const c10::TensorImpl* leaf = leaf_of_accumulator(a)) return leaf == leaf_of_accumulator(b);
  if (typeid(*a) != typeid(*b) || a->num_outputs() != b->num_outputs()) return false;
  const auto& ours = a->next_edges();
  const auto& theirs = b->next_edges();
  if (ours.size() != theirs.size()) return false;
  if (depth == 0) return true;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    if (ours[i].input_nr != theirs[i].input_nr ||
        !same_computation(ours[i].function.get(), theirs[i].function.get(), depth - 1)) {
      return false;
    }
  }
  return true;
}

// The leaves forwards read, by address, held weakly (an address stays taken while a weak pointer
// holds it, so a dead leaf's is never another's); dead ones dropped as the record doubles.
struct LeavesForwardsRead {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>> leaves;
  std::size_t prune_at = 1024;
};

LeavesForwardsRead& leaves_forwards_read() {
  static auto* instance = new LeavesForwardsRead();  // read during shutdown too
  return *instance;
}

// "input 0 of AddmmBackward0".
std::string input_of(const OutsideRead& read) {
  const std::string type = c10::demangle(read.reader.name());
  return "input " + std::to_string(read.input) + " of " + type.substr(type.rfind(':') + 1);
}

}  // namespace

OutsideRead OutsideRead::of(const Node& reader, std::uint32_t input, const std::shared_ptr<Node>& read) {
  return {read, typeid(reader), input, reader.next_edge(input).input_nr};
}

void note_leaves_forwards_read(const std::vector<c10::intrusive_ptr<c10::TensorImpl>>& leaves) {
  if (leaves.empty()) return;
  LeavesForwardsRead& record = leaves_forwards_read();
  std::lock_guard lock(record.mutex);
  for (const c10::intrusive_ptr<c10::TensorImpl>& leaf : leaves) {
    record.leaves.try_emplace(leaf.get(), c10::weak_intrusive_ptr<c10::TensorImpl>(leaf));
  }
  if (record.leaves.size() >= record.prune_at) {
    for (auto it = record.leaves.begin(); it != record.leaves.end();) {
      it = it->second.expired() ? record.leaves.erase(it) : std::next(it);
    }
    record.prune_at = std::max<std::size_t>(1024, 2 * record.leaves.size());
  }
}

bool read_by_a_forward(const c10::TensorImpl* leaf) {
  LeavesForwardsRead& record = leaves_forwards_read();
  std::lock_guard lock(record.mutex);
  const auto found = record.leaves.find(leaf);
  return found != record.leaves.end() && !found->second.expired();
}

NodeSpan NodeSpan::up_to_now(std::uint64_t begin) {
  return {at::RecordFunction::currentThreadId(), begin, at::sequence_number::peek()};
}

bool NodeSpan::holds(const Node& node) const {
  return node.thread_id() == thread && node.sequence_nr() >= begin && node.sequence_nr() < end;
}

std::vector<const Node*> walk_outside_reads(
    const NodeSpan& span, const std::vector<const Node*>& roots,
    const std::function<void(const Node&, std::uint32_t, const std::shared_ptr<Node>&)>& read) {
  // Each node visited once, found by its number (a node given another's number, which
  // set_sequence_nr allows, in a set).
  std::vector<const Node*> by_number(span.end - span.begin, nullptr);
  std::unordered_set<const Node*> sharing_a_number;
  std::vector<const Node*> to_visit;
  std::vector<const Node*> visited;
  auto visit = [&](const Node* node) {
    const Node*& seen = by_number[node->sequence_nr() - span.begin];
    if (seen == node) return;
    if (seen == nullptr) {
      seen = node;
    } else if (!sharing_a_number.insert(node).second) {
      return;
    }
    to_visit.push_back(node);
  };
  for (const Node* root : roots) {
    if (root != nullptr && span.holds(*root)) visit(root);
  }
  while (!to_visit.empty()) {
    const Node* node = to_visit.back();
    to_visit.pop_back();
    visited.push_back(node);
    const auto& edges = node->next_edges();
    for (std::size_t i = 0; i < edges.size(); ++i) {
      const std::shared_ptr<Node>& next = edges[i].function;
      if (next == nullptr) continue;
      if (span.holds(*next)) {
        visit(next.get());
      } else {
        read(*node, static_cast<std::uint32_t>(i), next);
      }
    }
  }
  return visited;
}

std::optional<std::string> recompute_read_elsewhere(
    const std::vector<OutsideRead>& forward, const NodeSpan& forward_span, const std::vector<OutsideRead>& recompute,
    const std::vector<const Node*>& recompute_nodes, const NodeSpan& recompute_span,
    const std::vector<const c10::TensorImpl*>& inputs, const std::vector<at::Tensor>& held) {
  constexpr int kDepth = 4;
  // Each read as a leaf (views and casts of one counted as it) or another node.
  struct Read {
    const OutsideRead* edge;
    std::shared_ptr<Node> node;
    const AccumulateGrad* leaf;
  };
  auto resolve = [](const std::vector<OutsideRead>& reads) {
    std::vector<Read> out;
    out.reserve(reads.size());
    for (const OutsideRead& read : reads) {
      if (std::shared_ptr<Node> node = read.node.lock()) out.push_back({&read, node, leaf_held(node.get())});
    }
    return out;
  };
  const std::vector<Read> then = resolve(forward);
  const std::vector<Read> now = resolve(recompute);
  auto leaf_impl = [](const Read& read) { return read.leaf->variable.unsafeGetTensorImpl(); };
  std::unordered_set<const c10::TensorImpl*> leaves_then, leaves_now;
  std::unordered_set<const Node*> nodes_then;
  for (const Read& read : then) {
    if (read.leaf != nullptr) {
      leaves_then.insert(leaf_impl(read));
    } else {
      nodes_then.insert(read.node.get());
    }
  }
  for (const Read& read : now) {
    if (read.leaf != nullptr) leaves_now.insert(leaf_impl(read));
  }
  auto given = [&](const c10::TensorImpl* impl) {
    return std::find(inputs.begin(), inputs.end(), impl) != inputs.end();
  };
  auto computed_then = [&](const Node& node) {
    return std::any_of(then.begin(), then.end(), [&](const Read& t) {
      return t.leaf == nullptr && same_computation(&node, t.node.get(), kDepth);
    });
  };
  auto computed_again = [&](const Node& node) {
    return std::any_of(recompute_nodes.begin(), recompute_nodes.end(),
                       [&](const Node* ours) { return same_computation(ours, &node, kDepth); });
  };
  auto same_input = [](const Read& a, const Read& b) {
    return a.edge->reader == b.edge->reader && a.edge->input == b.edge->input;
  };
  // Whether two reads take values of one shape and type, as a weight swapped for another does.
  auto alike = [](const Read& a, const Read& b) {
    if (a.edge->read_input >= a.node->num_inputs() || b.edge->read_input >= b.node->num_inputs()) return false;
    const torch::autograd::InputMetadata& x = a.node->input_metadata(a.edge->read_input);
    const torch::autograd::InputMetadata& y = b.node->input_metadata(b.edge->read_input);
    return !x.is_nested_tensor() && !y.is_nested_tensor() && x.dtype() == y.dtype() &&
           x.shape_as_dim_vector().equals(y.shape_as_dim_vector());
  };
  for (const Read& read : now) {
    if (read.leaf == nullptr) {
      // A node made elsewhere than forward's body, before recompute began (on its thread, or
      // outside the body on forward's), that computes what no tensor forward read did.
      const std::uint64_t thread = read.node->thread_id();
      if (nodes_then.count(read.node.get()) != 0 || forward_span.holds(*read.node) ||
          (thread != recompute_span.thread && thread != forward_span.thread) || computed_then(*read.node)) {
        continue;
      }
      return "a tensor computed before recompute began (the output of " + read.node->name() + ") as " +
             input_of(*read.edge) + ", which forward did not read";
    }
    const c10::TensorImpl* leaf = leaf_impl(read);
    if (leaves_then.count(leaf) != 0 || given(leaf)) continue;
    auto what = [&] {
      return "a parameter (" + DroppedMeta::of(read.leaf->variable, -1).describe() + ") as " + input_of(*read.edge) +
             ", where forward read ";
    };
    // A leaf forward did not read. Where forward read a tensor computed from it that recompute does
    // not compute again (MAML's fast weights, p - lr * grad; a weight a parametrization caches is
    // computed again), a swap.
    for (const Read& t : then) {
      if (t.leaf == nullptr && computed_from(*t.node, leaf) && !computed_again(*t.node)) {
        return what() + "a tensor computed from it (the output of " + t.node->name() + ")";
      }
    }
    // Where it read, at the same input of the same kind of op, another leaf of its shape and type
    // over other memory that recompute does not read, both made outside the body (a leaf the body
    // makes is another in recompute; so is a leaf recompute makes over a tensor forward made).
    const auto& memory = read.leaf->variable;
    if (!memory.has_storage() || memory.storage().nbytes() == 0) continue;
    for (const Read& t : then) {
      if (t.leaf == nullptr || !same_input(t, read) || leaves_now.count(leaf_impl(t)) != 0 || given(leaf_impl(t))) {
        continue;
      }
      const at::Tensor& other = t.leaf->variable;
      if (!other.has_storage() || other.storage().nbytes() == 0 || other.storage().is_alias_of(memory.storage()) ||
          !alike(t, read)) {
        continue;
      }
      if (swapped_leaf(other, t.node.get() != t.leaf, memory, held)) {
        return what() + "another parameter (" + DroppedMeta::of(other, -1).describe() + ")";
      }
    }
  }
  return std::nullopt;
}

bool swapped_leaf(const at::TensorBase& forward_leaf, bool forward_read_a_view, const at::TensorBase& recompute_leaf,
                  const std::vector<at::Tensor>& held) {
  const c10::TensorImpl* impl = recompute_leaf.unsafeGetTensorImpl();
  if (forward_read_a_view || read_by_a_forward(impl) || held_by_the_body(impl, held)) return true;
  return made_outside(forward_leaf, alloc::Phase::forward) && made_outside(recompute_leaf, alloc::Phase::recompute) &&
         made_outside(recompute_leaf, alloc::Phase::forward);
}

bool held_by_the_body(const c10::TensorImpl* impl, const std::vector<at::Tensor>& held) {
  return std::any_of(held.begin(), held.end(), [&](const at::Tensor& t) { return t.unsafeGetTensorImpl() == impl; });
}

bool made_outside(const at::TensorBase& tensor, alloc::Phase body) {
  if (!tensor.has_storage() || tensor.storage().nbytes() == 0) return false;
  const std::optional<alloc::TagId> tag = alloc::find_block_tag(tensor.storage().data());
  return tag && alloc::tag_of(*tag).phase != body;
}

std::string swapped_weights_error(const std::string& checkpoint, const std::string& what) {
  return "recompute of checkpoint '" + checkpoint + "' read " + what +
         ": weights swapped in for forward or for backward alone (torch.func.functional_call, a "
         "reparametrization, a parameter assigned between forward and backward) make recompute give wrong "
         "gradients. Keep the swap in force through forward and backward, call the checkpoint outside the swapped "
         "call, or make its regions save regions (recompute=False). Where no weight was swapped, the body took "
         "another path in recompute than in forward (code under `if not is_recomputing()` that autograd saves "
         "tensors for, state a recompute hook does not restore): run the same ops with gradients in both";
}

}  // namespace remat::detail
