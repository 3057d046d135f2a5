#include <remat/pipeline/action.hpp>
#include <remat/pipeline/errors.hpp>

#include <array>
#include <cctype>
#include <charconv>
#include <utility>

namespace remat::pipeline {
namespace {

// Longest text first where one is a prefix of another ("REDUCE_GRAD" before "RESHARD" is
// not needed; "RECV_F" is tried before nothing shorter starting alike).
constexpr std::array<std::pair<std::string_view, ActionType>, 11> kTypes = {{
    {"UNSHARD", ActionType::unshard},
    {"RESHARD", ActionType::reshard},
    {"REDUCE_GRAD", ActionType::reduce_grad},
    {"SEND_F", ActionType::send_f},
    {"RECV_F", ActionType::recv_f},
    {"SEND_B", ActionType::send_b},
    {"RECV_B", ActionType::recv_b},
    {"F", ActionType::forward},
    {"I", ActionType::backward_input},
    {"W", ActionType::backward_weight},
    {"B", ActionType::full_backward},
}};

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

[[noreturn]] void malformed(std::string_view text, std::string_view why) {
  std::string shown(text.substr(0, 80));
  if (text.size() > 80) shown += "...";
  throw PlanError("'" + shown + "' is not a pipeline action (" + std::string(why) +
                  "); write [stage][type][microbatch] such as 2F0, 1RECV_F3 or 3UNSHARD, or (0F3;1B1)OVERLAP_F_B");
}

// Digits at the front of `text`, consumed; nullopt when there are none.
std::optional<int> take_number(std::string_view& text, std::string_view whole) {
  std::size_t n = 0;
  while (n < text.size() && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  if (n == 0) return std::nullopt;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + n, value);
  if (error != std::errc() || end != text.data() + n) malformed(whole, "the number does not fit an int");
  text.remove_prefix(n);
  return value;
}

Action parse_single(std::string_view text, std::string_view whole) {
  std::string_view rest = text;
  const std::optional<int> stage = take_number(rest, whole);
  if (!stage) malformed(whole, "it does not start with a stage index");
  for (const auto& [name, type] : kTypes) {
    if (rest.substr(0, name.size()) != name) continue;
    rest.remove_prefix(name.size());
    Action action;
    action.stage = *stage;
    action.type = type;
    action.microbatch = take_number(rest, whole);
    if (!rest.empty()) malformed(whole, "unexpected '" + std::string(rest.substr(0, 20)) + "' after the action");
    return action;
  }
  malformed(whole, "unknown action type after the stage index");
}

}  // namespace

std::string_view to_string(ActionType type) {
  switch (type) {
    case ActionType::forward: return "F";
    case ActionType::backward_input: return "I";
    case ActionType::backward_weight: return "W";
    case ActionType::unshard: return "UNSHARD";
    case ActionType::reshard: return "RESHARD";
    case ActionType::send_f: return "SEND_F";
    case ActionType::recv_f: return "RECV_F";
    case ActionType::send_b: return "SEND_B";
    case ActionType::recv_b: return "RECV_B";
    case ActionType::full_backward: return "B";
    case ActionType::overlap_f_b: return "OVERLAP_F_B";
    case ActionType::reduce_grad: return "REDUCE_GRAD";
  }
  return "?";
}

Action Action::on(int stage, ActionType type, int microbatch) {
  Action action;
  action.stage = stage;
  action.type = type;
  action.microbatch = microbatch;
  return action;
}

bool Action::is_compute() const {
  return type == ActionType::forward || type == ActionType::full_backward || type == ActionType::backward_input ||
         type == ActionType::backward_weight || type == ActionType::overlap_f_b;
}

bool Action::operator==(const Action& other) const {
  return stage == other.stage && type == other.type && microbatch == other.microbatch &&
         sub_actions == other.sub_actions;
}

std::string to_string(const Action& action) {
  if (!action.sub_actions.empty()) {
    std::string out = "(";
    for (std::size_t i = 0; i < action.sub_actions.size(); ++i) {
      if (i > 0) out += ';';
      out += to_string(action.sub_actions[i]);
    }
    return out + ")" + std::string(to_string(action.type));
  }
  std::string out = std::to_string(action.stage) + std::string(to_string(action.type));
  if (action.microbatch) out += std::to_string(*action.microbatch);
  return out;
}

std::optional<Action> parse_action(std::string_view text) {
  const std::string_view whole = trim(text);
  if (whole.empty()) return std::nullopt;
  if (whole.front() == '(') {
    const std::size_t close = whole.find(')');
    if (close == std::string_view::npos) malformed(whole, "'(' without ')'");
    const std::string_view type_text = whole.substr(close + 1);
    if (type_text != to_string(ActionType::overlap_f_b)) {
      malformed(whole, "a group in parentheses must be followed by OVERLAP_F_B");
    }
    Action container;
    container.stage = -1;
    container.type = ActionType::overlap_f_b;
    std::string_view inner = whole.substr(1, close - 1);
    while (!inner.empty()) {
      const std::size_t semicolon = inner.find(';');
      const std::string_view part = trim(inner.substr(0, semicolon));
      if (!part.empty()) container.sub_actions.push_back(parse_single(part, whole));
      inner = semicolon == std::string_view::npos ? std::string_view{} : inner.substr(semicolon + 1);
    }
    if (container.sub_actions.empty()) malformed(whole, "an OVERLAP_F_B group of no actions");
    return container;
  }
  return parse_single(whole, whole);
}

}  // namespace remat::pipeline
