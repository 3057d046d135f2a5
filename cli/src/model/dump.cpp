#include "model/dump.hpp"

#include <array>

namespace remat::report {

namespace {
constexpr std::array<std::string_view, 3> kPolicies = {"none", "save", "recompute"};
constexpr std::array<std::string_view, 5> kPhases = {"other", "forward", "recompute", "backward", "offloaded"};
constexpr std::array<std::string_view, kActionCount> kActions = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "retag"};
constexpr std::array<std::string_view, 3> kBlockStates = {"active_allocated", "active_pending_free", "inactive"};

template <typename Enum, std::size_t N>
std::optional<Enum> lookup(const std::array<std::string_view, N>& table, std::string_view text) {
  for (std::size_t i = 0; i < N; ++i) {
    if (table[i] == text) return static_cast<Enum>(i);
  }
  return std::nullopt;
}
}  // namespace

std::string_view to_string(Policy policy) { return kPolicies[static_cast<std::size_t>(policy)]; }
std::string_view to_string(Phase phase) { return kPhases[static_cast<std::size_t>(phase)]; }
std::string_view to_string(Action action) { return kActions[static_cast<std::size_t>(action)]; }
std::string_view to_string(BlockState state) { return kBlockStates[static_cast<std::size_t>(state)]; }
std::optional<Policy> policy_from(std::string_view text) { return lookup<Policy>(kPolicies, text); }
std::optional<Phase> phase_from(std::string_view text) { return lookup<Phase>(kPhases, text); }
std::optional<Action> action_from(std::string_view text) { return lookup<Action>(kActions, text); }
std::optional<BlockState> block_state_from(std::string_view text) {
  return lookup<BlockState>(kBlockStates, text);
}

}  // namespace remat::report
