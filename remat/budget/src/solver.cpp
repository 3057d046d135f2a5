// The exact solver: a 0/1 knapsack that saves the regions whose seconds are worth their bytes.
//
// Regions that cost no bytes are saved and those that save no time, or do not fit at all, are
// recomputed; the rest go through a dynamic program over the Pareto front of (bytes, seconds)
// states, items taken best seconds-per-byte first, where a state is dropped as soon as even the
// fractional (linear) relaxation of what remains cannot lift it above the best plan found so far.
// The front stays small on profiles of real models (many regions of a few kinds), so thousands of
// regions take milliseconds; a profile whose front would outgrow kMaxStates keeps the states
// with the best bounds and says the plan is not proved optimal.

#include <remat/budget/plan.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>

namespace remat::budget {

namespace {

// Real profiles (layers of a few kinds of regions) keep a few hundred states on the front; 10,000
// regions whose bytes all differ a little can need millions.
constexpr std::size_t kMaxStates = std::size_t{1} << 12;

std::string bytes_text(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, kUnits[unit]);
  return std::string(text) + " (" + std::to_string(bytes) + " bytes)";
}

struct Item {
  std::uint64_t bytes;
  double seconds;
};

// A node of the taken-items forest: the item a state took last, and the state it grew from.
struct Node {
  std::int64_t parent;
  std::uint32_t item;
};

struct State {
  std::uint64_t bytes;
  double seconds;
  std::int64_t node;  // -1: nothing taken
};

// The 0/1 knapsack over `items` (all of positive bytes and seconds) with `capacity` bytes:
// which items to take, by index in `items`. Sets `exact` false when the front had to be cut, and
// `bound` to the most seconds any choice could take (the fractional relaxation's).
std::vector<bool> knapsack(const std::vector<Item>& items, std::uint64_t capacity, bool& exact, double& bound_seconds) {
  std::vector<bool> taken(items.size(), false);
  if (items.empty()) return taken;
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  // Best seconds per byte first; ties by fewer bytes, then profile order, so plans are stable.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const long double left = static_cast<long double>(items[a].seconds) * items[b].bytes;
    const long double right = static_cast<long double>(items[b].seconds) * items[a].bytes;
    if (left != right) return left > right;
    if (items[a].bytes != items[b].bytes) return items[a].bytes < items[b].bytes;
    return a < b;
  });
  const std::size_t n = order.size();
  // Suffix sums of bytes and seconds in that order: the fractional bound of items[i..).
  std::vector<long double> bytes_from(n + 1, 0), seconds_from(n + 1, 0);
  for (std::size_t i = n; i-- > 0;) {
    bytes_from[i] = bytes_from[i + 1] + items[order[i]].bytes;
    seconds_from[i] = seconds_from[i + 1] + items[order[i]].seconds;
  }
  auto bound = [&](std::size_t from, std::uint64_t room) -> long double {
    // The last k with bytes_from[from] - bytes_from[k] <= room: whole items from..k-1, then a
    // fraction of item k.
    std::size_t low = from, high = n;
    while (low < high) {
      const std::size_t mid = (low + high + 1) / 2;
      if (bytes_from[from] - bytes_from[mid] <= static_cast<long double>(room)) low = mid;
      else high = mid - 1;
    }
    long double value = seconds_from[from] - seconds_from[low];
    if (low < n) {
      const long double left = static_cast<long double>(room) - (bytes_from[from] - bytes_from[low]);
      value += left * items[order[low]].seconds / static_cast<long double>(items[order[low]].bytes);
    }
    return value;
  };

  bound_seconds = static_cast<double>(bound(0, capacity));
  // The greedy plan is the first incumbent: take each item that still fits, in ratio order.
  std::vector<bool> best(n, false);
  long double best_seconds = 0;
  {
    std::uint64_t room = capacity;
    for (std::size_t i = 0; i < n; ++i) {
      if (items[order[i]].bytes <= room) {
        room -= items[order[i]].bytes;
        best[i] = true;
        best_seconds += items[order[i]].seconds;
      }
    }
  }
  std::int64_t best_node = -2;  // -2: the greedy plan in `best`

  std::vector<Node> nodes;
  std::vector<State> states{{0, 0.0, -1}}, next, taking;
  const long double tolerance = 1e-12L;
  for (std::size_t i = 0; i < n; ++i) {
    const Item& item = items[order[i]];
    taking.clear();
    for (const State& state : states) {
      if (capacity - state.bytes < item.bytes) continue;
      nodes.push_back({state.node, static_cast<std::uint32_t>(i)});
      taking.push_back({state.bytes + item.bytes, state.seconds + item.seconds, static_cast<std::int64_t>(nodes.size() - 1)});
    }
    // Merge by bytes, keeping the Pareto front (more bytes only for more seconds), and drop
    // states that cannot beat the incumbent even fractionally.
    next.clear();
    std::size_t a = 0, b = 0;
    double front = -1;
    while (a < states.size() || b < taking.size()) {
      const bool from_taking =
          a == states.size() ||
          (b < taking.size() && (taking[b].bytes < states[a].bytes ||
                                 (taking[b].bytes == states[a].bytes && taking[b].seconds > states[a].seconds)));
      const State state = from_taking ? taking[b++] : states[a++];
      if (state.seconds <= front) continue;
      front = state.seconds;
      if (state.seconds > best_seconds) {
        best_seconds = state.seconds;
        best_node = state.node;
      }
      const long double reach = state.seconds + bound(i + 1, capacity - state.bytes);
      if (reach > best_seconds * (1 + tolerance) + tolerance) next.push_back(state);
    }
    if (next.size() > kMaxStates) {
      // Keep the states that could reach furthest; the plan is no longer proved optimal.
      std::vector<std::pair<long double, std::size_t>> reach(next.size());
      for (std::size_t s = 0; s < next.size(); ++s) {
        reach[s] = {next[s].seconds + bound(i + 1, capacity - next[s].bytes), s};
      }
      std::nth_element(reach.begin(), reach.begin() + kMaxStates, reach.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      std::vector<std::size_t> kept;
      for (std::size_t s = 0; s < kMaxStates; ++s) kept.push_back(reach[s].second);
      std::sort(kept.begin(), kept.end());
      std::vector<State> cut;
      for (const std::size_t s : kept) cut.push_back(next[s]);
      next.swap(cut);
      exact = false;
    }
    states.swap(next);
    if (states.empty()) break;
    // Nodes no state reaches any more are dropped now and then, so memory follows the front.
    if (nodes.size() > 8 * (states.size() + 1024)) {
      std::vector<std::int64_t> renumbered(nodes.size(), -1);
      std::vector<Node> kept;
      std::vector<std::int64_t> chain;
      auto keep = [&](std::int64_t node) -> std::int64_t {
        chain.clear();
        for (std::int64_t at = node; at >= 0 && renumbered[static_cast<std::size_t>(at)] < 0;
             at = nodes[static_cast<std::size_t>(at)].parent) {
          chain.push_back(at);
        }
        // Oldest first, so each parent is renumbered before its children.
        for (std::size_t c = chain.size(); c-- > 0;) {
          const Node old_node = nodes[static_cast<std::size_t>(chain[c])];
          const std::int64_t parent =
              old_node.parent < 0 ? old_node.parent : renumbered[static_cast<std::size_t>(old_node.parent)];
          kept.push_back({parent, old_node.item});
          renumbered[static_cast<std::size_t>(chain[c])] = static_cast<std::int64_t>(kept.size() - 1);
        }
        return node < 0 ? node : renumbered[static_cast<std::size_t>(node)];
      };
      for (State& state : states) state.node = keep(state.node);
      if (best_node >= 0) best_node = keep(best_node);
      nodes.swap(kept);
    }
  }
  if (best_node != -2) {
    std::fill(best.begin(), best.end(), false);
    for (std::int64_t node = best_node; node >= 0; node = nodes[static_cast<std::size_t>(node)].parent) {
      best[nodes[static_cast<std::size_t>(node)].item] = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i) taken[order[i]] = best[i];
  return taken;
}

}  // namespace

std::string_view to_string(Choice choice) { return choice == Choice::save ? "save" : "recompute"; }

std::uint64_t RegionProfile::all_saved_bytes() const {
  std::uint64_t total = base_bytes;
  for (const RegionCost& region : regions) total += region.saved_bytes;
  return total;
}

Plan solve(const RegionProfile& profile, std::uint64_t budget_bytes) {
  if (budget_bytes < profile.base_bytes) {
    throw BudgetError("a budget of " + bytes_text(budget_bytes) + " is below what the checkpoints keep with every "
                      "region recomputed, their inputs: " + bytes_text(profile.base_bytes) +
                      "; the smallest budget a plan can meet is " + std::to_string(profile.base_bytes) + " bytes");
  }
  Plan plan;
  plan.budget_bytes = budget_bytes;
  plan.base_bytes = profile.base_bytes;
  const std::uint64_t capacity = budget_bytes - profile.base_bytes;
  std::vector<Choice> choices(profile.regions.size(), Choice::recompute);
  std::vector<Item> items;
  std::vector<std::size_t> item_region;  // the region of each item
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (region.seconds <= 0) continue;  // recomputing it costs nothing
    if (region.saved_bytes == 0) {
      choices[r] = Choice::save;  // saving it costs nothing
      continue;
    }
    if (region.saved_bytes > capacity) continue;
    items.push_back({region.saved_bytes, region.seconds});
    item_region.push_back(r);
  }
  double most_saved_seconds = 0;
  const std::vector<bool> taken = knapsack(items, capacity, plan.exact, most_saved_seconds);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (taken[i]) choices[item_region[i]] = Choice::save;
  }
  plan.kept_bytes = profile.base_bytes;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    const RegionCost& region = profile.regions[r];
    if (choices[r] == Choice::save) plan.kept_bytes += region.saved_bytes;
    else plan.recompute_seconds += region.seconds;
    plan.regions.emplace_back(region, choices[r]);
  }
  // No plan recomputes less than the fractional relaxation leaves to recompute.
  double saved_seconds = 0;
  for (std::size_t i = 0; i < items.size(); ++i) saved_seconds += taken[i] ? items[i].seconds : 0;
  plan.least_recompute_seconds =
      plan.exact ? plan.recompute_seconds
                 : std::max(0.0, plan.recompute_seconds - (most_saved_seconds - saved_seconds));
  return plan;
}

std::vector<Plan> frontier(const RegionProfile& profile, std::size_t steps) {
  steps = std::max<std::size_t>(steps, 2);
  const std::uint64_t low = profile.base_bytes;
  const std::uint64_t high = profile.all_saved_bytes();
  std::vector<Plan> plans;
  for (std::size_t step = 0; step < steps; ++step) {
    const long double share = static_cast<long double>(step) / static_cast<long double>(steps - 1);
    const std::uint64_t budget =
        step + 1 == steps ? high : static_cast<std::uint64_t>(low + share * static_cast<long double>(high - low));
    if (!plans.empty() && plans.back().budget_bytes == budget) continue;  // a narrow range: each budget once
    plans.push_back(solve(profile, budget));
  }
  return plans;
}

RegionProfile grouped(const RegionProfile& profile) {
  RegionProfile out;
  out.base_bytes = profile.base_bytes;
  out.device = profile.device;
  out.timer = profile.timer;
  std::unordered_map<std::string, std::size_t> index;
  for (const RegionCost& region : profile.regions) {
    std::string pattern;
    for (std::size_t i = 0; i < region.name.size(); ++i) {
      if (std::isdigit(static_cast<unsigned char>(region.name[i])) == 0) {
        pattern += region.name[i];
      } else if (pattern.empty() || pattern.back() != '*' ||
                 std::isdigit(static_cast<unsigned char>(region.name[i - 1])) == 0) {
        pattern += '*';
      }
    }
    const auto [it, inserted] = index.emplace(pattern, out.regions.size());
    if (inserted) {
      out.regions.push_back({pattern, region.saved_bytes, region.seconds, region.count});
      continue;
    }
    RegionCost& group = out.regions[it->second];
    group.saved_bytes += region.saved_bytes;
    group.seconds += region.seconds;
    group.count += region.count;
  }
  return out;
}

bool matches(std::string_view pattern, std::string_view name) {
  // Glob matching with one backtrack point: the last '*' seen.
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

RegionChoices::RegionChoices(std::vector<std::pair<std::string, Choice>> choices) : choices_(std::move(choices)) {}

std::optional<Choice> RegionChoices::choice_for(std::string_view region) const {
  for (const auto& [name, choice] : choices_) {
    if (name == region) return choice;
  }
  for (const auto& [name, choice] : choices_) {
    if (name.find('*') != std::string::npos && matches(name, region)) return choice;
  }
  return std::nullopt;
}

}  // namespace remat::budget
