#pragma once
// One step of a pipeline schedule, in PyTorch's notation (torch.distributed.pipelining's
// _Action): "0F1" (stage 0, forward, microbatch 1), "1B0", "2I3", "2W3", "1RECV_F0",
// "0SEND_B2", "3UNSHARD", "3RESHARD", "0REDUCE_GRAD", and the overlapped form DualPipeV
// uses, "(0F3;1B1)OVERLAP_F_B".

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat::pipeline {

// PyTorch's _ComputationType, with its text.
enum class ActionType {
  forward,          // "F"
  backward_input,   // "I"
  backward_weight,  // "W"
  unshard,          // "UNSHARD"
  reshard,          // "RESHARD"
  send_f,           // "SEND_F"
  recv_f,           // "RECV_F"
  send_b,           // "SEND_B"
  recv_b,           // "RECV_B"
  full_backward,    // "B"
  overlap_f_b,      // "OVERLAP_F_B"
  reduce_grad,      // "REDUCE_GRAD"
};
std::string_view to_string(ActionType type);

// B and I: the backwards that send a gradient to the previous stage (W sends nothing).
inline bool is_backward(ActionType type) {
  return type == ActionType::full_backward || type == ActionType::backward_input;
}

struct Action {
  int stage = 0;  // -1 for an overlapped container, as in PyTorch
  ActionType type = ActionType::forward;
  std::optional<int> microbatch;  // absent for UNSHARD, RESHARD, REDUCE_GRAD and containers
  std::vector<Action> sub_actions;  // the actions an OVERLAP_F_B container runs together

  // An action on one microbatch: Action::on(0, ActionType::forward, 1) is "0F1".
  static Action on(int stage, ActionType type, int microbatch);

  // F, B, I, W and OVERLAP_F_B (PyTorch's is_compute_op).
  bool is_compute() const;
  bool operator==(const Action& other) const;
  bool operator!=(const Action& other) const { return !(*this == other); }
};

// Exactly PyTorch's repr: "0F1", "3UNSHARD", "(0F3;1B1)OVERLAP_F_B".
std::string to_string(const Action& action);

// The reverse of to_string, as PyTorch's _Action.from_str: surrounding whitespace is ignored,
// an empty cell is no action (nullopt). Anything else that is not an action throws PlanError
// quoting the text.
std::optional<Action> parse_action(std::string_view text);

}  // namespace remat::pipeline
