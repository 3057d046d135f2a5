#pragma once
// The dumps' vocabulary read back from its names. The names are the allocator's own to_string
// (tags.hpp, trace.hpp, allocator_snapshot.hpp): remat-report's readers and the Python dump
// writer take them from here instead of spelling them again. PyTorch's memory snapshot spells a
// few of them its own way; those spellings are here too, so that every reader of a snapshot maps
// them alike.

#include <remat/alloc/allocator_snapshot.hpp>
#include <remat/alloc/tags.hpp>
#include <remat/alloc/trace.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace remat::alloc {

// How many values each named enum has (its values are 0 to count - 1).
template <typename Enum>
struct NamedEnum;
template <>
struct NamedEnum<Policy> : std::integral_constant<int, kPolicyCount> {};
template <>
struct NamedEnum<Phase> : std::integral_constant<int, kPhaseCount> {};
template <>
struct NamedEnum<Category> : std::integral_constant<int, kCategoryCount> {};
template <>
struct NamedEnum<TraceAction> : std::integral_constant<int, kTraceActionCount> {};
template <>
struct NamedEnum<BlockState> : std::integral_constant<int, kBlockStateCount> {};

// Every name of `Enum`, indexed by value.
template <typename Enum>
const std::array<std::string_view, NamedEnum<Enum>::value>& names_of() {
  static const auto names = [] {
    std::array<std::string_view, NamedEnum<Enum>::value> all{};
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = to_string(static_cast<Enum>(i));
    return all;
  }();
  return names;
}

// The value called `text`, or nullopt where no value is.
template <typename Enum>
std::optional<Enum> from_name(std::string_view text) {
  const auto& names = names_of<Enum>();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

// PyTorch's spellings that differ from ours: its expandable segments' segment_map and
// segment_unmap are our segment_alloc and segment_free, its older `free` our free_requested, and
// its documented active_awaiting_free our active_pending_free (its C++ writes ours).
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 3> kTorchTraceActions = {{
    {"segment_map", "segment_alloc"},
    {"segment_unmap", "segment_free"},
    {"free", "free_requested"},
}};
inline constexpr std::array<std::pair<std::string_view, std::string_view>, 1> kTorchBlockStates = {{
    {"active_awaiting_free", "active_pending_free"},
}};

// `text` as our name: PyTorch's spelling mapped through `aliases`, any other text as it is.
template <std::size_t N>
std::string_view our_name(std::string_view text,
                          const std::array<std::pair<std::string_view, std::string_view>, N>& aliases) {
  for (const auto& [theirs, ours] : aliases) {
    if (text == theirs) return ours;
  }
  return text;
}

// A PyTorch snapshot's trace action or block state; nullopt for what has no counterpart here
// (its `snapshot` markers, say).
inline std::optional<TraceAction> trace_action_from_torch(std::string_view text) {
  return from_name<TraceAction>(our_name(text, kTorchTraceActions));
}
inline std::optional<BlockState> block_state_from_torch(std::string_view text) {
  return from_name<BlockState>(our_name(text, kTorchBlockStates));
}

}  // namespace remat::alloc
