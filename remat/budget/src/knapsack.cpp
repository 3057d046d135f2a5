// The 0/1 knapsack of budget plans, in the order of what it takes to prove a choice optimal.
//
// Bytes are counted in units of their greatest common divisor (tensor sizes share large powers of
// two) and seconds relative to the largest item's, so that sums stay small and finite whatever the
// profile measured. Items go best seconds per byte first. The linear relaxation (whole items up to
// the break item, then the fraction of it that fits) bounds every choice from above; the greedy
// choice (each item that still fits, in that order) is the first incumbent; when the two meet,
// that is the proof.
//
// Otherwise a better incumbent comes first, since the closer it is to the bound, the fewer items
// the proof leaves open: exchanges of up to two taken items for up to two left ones that fill the
// unused units exactly (a profile whose seconds are proportional to its bytes is a subset sum,
// where no bound prunes anything and only a choice that fills the capacity exactly proves itself),
// then a search of the items around the break item. Where seconds are bytes times a rate plus a
// constant, the relaxation stays up to one item's constant above every choice, and a bound that
// also prices each item taken (no choice takes more items than the smallest that fit) replaces it.
// Each item whose flip away from the bound's choice cannot beat the incumbent (by the Lagrangian
// argument) keeps that choice, which leaves open only the items whose seconds per byte are close
// to the break item's. Those are solved exactly by a table over capacity units when the table is
// small (few items, or bytes that share a large divisor), else by a search over the Pareto front
// of (units, seconds) states, pruned by the relaxation of the items still to come and capped in
// width so that no profile takes more than a fraction of a second. Only that cap leaves a choice
// unproved, and the states it drops bound what the choice may have missed.

#include "knapsack.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>

namespace remat::budget::detail {
namespace {

// Choices closer than this share of all items' seconds count as equal: far below what measured
// seconds tell apart, far above the rounding of sums over a million items.
constexpr long double kTolerance = 1e-12L;
// The table takes about a nanosecond a cell (items times capacity units): this many cells take a
// fraction of a second; and its one row of this many units stays within tens of MiB.
constexpr std::uint64_t kMostTableCells = std::uint64_t{1} << 27;
constexpr std::uint64_t kMostTableUnits = std::uint64_t{1} << 22;
// States the front search carries from one item to the next, over all its items: its width is
// this over the core's items, and never below kLeastSearchWidth. The search around the break item
// carries a quarter of it before a proof, a 32nd where no proof follows (plans weighed by the dozen).
constexpr std::size_t kSearchWork = std::size_t{1} << 21;
constexpr std::size_t kLeastSearchWidth = 64;
// Items on each side of the incumbent that exact-fill exchanges choose from: this many nearest the
// break item and up to kFillSpread more spread over the rest (pairs of them number about 80,000 a
// side).
constexpr std::size_t kFillCandidates = 300;
constexpr std::size_t kFillSpread = 100;
// Steps of the search for the price per item that makes the counted bound least (each narrows the
// range to 0.618 of itself).
constexpr int kPriceSteps = 64;
// Items on each side of the break item searched for a better incumbent before the proof.
constexpr std::size_t kBreakNeighbours = 50;

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// The items that can fit, in units of their bytes' common divisor, best seconds per unit first.
struct Sorted {
  std::vector<std::uint64_t> units;
  std::vector<double> value;      // seconds over the largest item's seconds
  std::vector<std::size_t> item;  // index in the caller's items
  std::uint64_t capacity = 0;     // in units
  long double total_value = 0;
  long double largest_seconds = 0;  // what a value of 1 stands for
};

// A choice of sorted items that fits the capacity.
struct Incumbent {
  std::vector<bool> taken;  // by sorted position
  std::uint64_t units = 0;
  long double value = 0;
};

// An upper bound on every choice: the Lagrangian bound per_unit * capacity + per_item * (the most
// items that fit) + the sum of each item's positive reduced value (value - per_unit * units -
// per_item). With per_item 0 and per_unit the break item's ratio, it is the linear relaxation:
// the items before the break item and the fraction of it that fits.
struct Relaxation {
  std::size_t break_item = 0;  // of the linear relaxation: the first item that fits only in part
  long double per_unit = 0;
  long double per_item = 0;
  long double bound = 0;

  long double reduced(const Sorted& s, std::size_t p) const {
    return static_cast<long double>(s.value[p]) - per_unit * static_cast<long double>(s.units[p]) - per_item;
  }
};

// The items still open, the others as a relaxation chooses them: kept taken or left.
struct Core {
  std::vector<std::size_t> open;  // sorted positions, in order
  std::vector<std::size_t> kept;
  std::uint64_t kept_units = 0;
  long double kept_value = 0;
  long double flip_bound = 0;  // settled by the bound: the most a choice that flips one can reach
};

struct CoreChoice {
  std::vector<std::size_t> taken;  // sorted positions of open items
  long double value = 0;
  long double most = 0;  // no choice of open items within the room reaches more
};

Sorted sort_items(const std::vector<KnapsackItem>& items, const std::vector<std::size_t>& fitting,
                  std::uint64_t capacity) {
  std::uint64_t divisor = 0;
  double largest = 0;
  for (const std::size_t i : fitting) {
    divisor = std::gcd(divisor, items[i].bytes);
    largest = std::max(largest, items[i].seconds);
  }
  std::vector<std::size_t> order = fitting;
  // Best seconds per byte first; ties by fewer bytes, then the caller's order, so plans are stable.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const long double left = static_cast<long double>(items[a].seconds) * static_cast<long double>(items[b].bytes);
    const long double right = static_cast<long double>(items[b].seconds) * static_cast<long double>(items[a].bytes);
    if (left != right) return left > right;
    if (items[a].bytes != items[b].bytes) return items[a].bytes < items[b].bytes;
    return a < b;
  });
  Sorted sorted;
  sorted.capacity = capacity / divisor;
  sorted.largest_seconds = largest;
  for (const std::size_t i : order) {
    sorted.units.push_back(items[i].bytes / divisor);
    sorted.value.push_back(items[i].seconds / largest);
    sorted.item.push_back(i);
    sorted.total_value += sorted.value.back();
  }
  return sorted;
}

// Items that do not all fit (the caller handles those that do).
Relaxation relax(const Sorted& s) {
  Relaxation lp;
  std::uint64_t used = 0;
  std::size_t i = 0;
  for (; s.units[i] <= s.capacity - used; ++i) {
    used += s.units[i];
    lp.bound += s.value[i];
  }
  lp.break_item = i;
  lp.per_unit = static_cast<long double>(s.value[i]) / static_cast<long double>(s.units[i]);
  lp.bound += static_cast<long double>(s.capacity - used) * lp.per_unit;
  return lp;
}

// The bound with a price on each item taken as well, at the price that makes it least. No choice
// takes more items than the smallest that fit, so where seconds are bytes times a rate plus a
// constant (each region costs a launch) this bound is what a choice filling the capacity with
// that many items reaches, where the linear relaxation stays up to one item's constant above.
Relaxation counted(const Sorted& s, const Relaxation& lp) {
  std::vector<std::uint64_t> smallest = s.units;
  std::sort(smallest.begin(), smallest.end());
  std::size_t most_items = 0;
  for (std::uint64_t used = 0; most_items < smallest.size() && smallest[most_items] <= s.capacity - used;) {
    used += smallest[most_items++];
  }
  std::vector<std::size_t> order;
  // The bound at a price per item: the linear relaxation of the reduced values.
  auto at = [&](long double per_item) {
    Relaxation priced;
    priced.per_item = per_item;
    priced.bound = per_item * static_cast<long double>(most_items);
    order.clear();
    for (std::size_t p = 0; p < s.units.size(); ++p) {
      if (s.value[p] > per_item) order.push_back(p);
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return (s.value[a] - per_item) * static_cast<long double>(s.units[b]) >
             (s.value[b] - per_item) * static_cast<long double>(s.units[a]);
    });
    std::uint64_t used = 0;
    for (const std::size_t p : order) {
      if (s.units[p] <= s.capacity - used) {
        used += s.units[p];
        priced.bound += s.value[p] - per_item;
        continue;
      }
      priced.per_unit = (s.value[p] - per_item) / static_cast<long double>(s.units[p]);
      priced.bound += static_cast<long double>(s.capacity - used) * priced.per_unit;
      break;
    }
    return priced;
  };
  // The bound is convex in the price: a golden-section search between no price and the largest
  // value (where it only counts items) narrows to the least.
  const long double golden = 0.6180339887498948482L;
  long double low = 0, high = 1;
  long double left = high - golden * (high - low), right = low + golden * (high - low);
  Relaxation at_left = at(left), at_right = at(right);
  for (int step = 0; step < kPriceSteps; ++step) {
    if (at_left.bound <= at_right.bound) {
      high = right;
      right = left;
      at_right = at_left;
      left = high - golden * (high - low);
      at_left = at(left);
    } else {
      low = left;
      left = right;
      at_left = at_right;
      right = low + golden * (high - low);
      at_right = at(right);
    }
  }
  const Relaxation& best = at_left.bound <= at_right.bound ? at_left : at_right;
  return best.bound < lp.bound ? best : lp;
}

Incumbent greedy(const Sorted& s) {
  Incumbent inc;
  inc.taken.assign(s.units.size(), false);
  for (std::size_t i = 0; i < s.units.size(); ++i) {
    if (s.units[i] <= s.capacity - inc.units) {
      inc.taken[i] = true;
      inc.units += s.units[i];
      inc.value += s.value[i];
    }
  }
  return inc;
}

Core settle(const Sorted& s, const Relaxation& lp, const Incumbent& inc, long double tolerance) {
  Core core;
  for (std::size_t p = 0; p < s.units.size(); ++p) {
    // Leaving an item of positive reduced value, or taking one of negative, costs the bound
    // that much.
    const long double reduced = lp.reduced(s, p);
    const long double flipped = lp.bound - std::fabs(reduced);
    if (flipped > inc.value + tolerance) {
      core.open.push_back(p);
      continue;
    }
    core.flip_bound = std::max(core.flip_bound, flipped);
    if (reduced > 0) core.kept.push_back(p);
  }
  for (const std::size_t p : core.kept) {
    core.kept_units += s.units[p];
    core.kept_value += s.value[p];
  }
  return core;
}

// The items nearest the break item open: where a good incumbent is most likely to differ from the
// relaxation (not a proof: the items outside may still have to flip).
Core around_break(const Sorted& s, const Relaxation& lp) {
  Core core;
  const std::size_t first = lp.break_item > kBreakNeighbours ? lp.break_item - kBreakNeighbours : 0;
  const std::size_t end = std::min(s.units.size(), lp.break_item + kBreakNeighbours);
  for (std::size_t p = 0; p < first; ++p) {
    core.kept.push_back(p);
    core.kept_units += s.units[p];
    core.kept_value += s.value[p];
  }
  for (std::size_t p = first; p < end; ++p) core.open.push_back(p);
  return core;
}

// The core's kept items and the open ones `found` takes, as the incumbent when they beat it.
void adopt(const Sorted& s, const Core& core, const CoreChoice& found, Incumbent& inc) {
  if (core.kept_value + found.value <= inc.value) return;
  std::fill(inc.taken.begin(), inc.taken.end(), false);
  for (const std::size_t p : core.kept) inc.taken[p] = true;
  inc.units = core.kept_units;
  inc.value = core.kept_value + found.value;
  for (const std::size_t p : found.taken) {
    inc.taken[p] = true;
    inc.units += s.units[p];
  }
}

// One item's row of the table: best[c] over the cells it can improve, setting the bit of each
// cell it improved. Without `covering`, best[c] is the most value within c units, and the item
// reaches the cells from its own units up; with it, best[c] is the least value of items of at
// least c units together, and the item reaches every cell but 0.
template <bool covering>
void table_row(std::vector<double>& best, std::uint64_t* improved, std::size_t units, double value) {
  const std::size_t last = best.size() - 1;
  const std::size_t lowest = covering ? 1 : units;
  if (lowest > last) return;
  for (std::size_t word = last >> 6;; --word) {
    const std::size_t low = std::max(word << 6, lowest);
    const std::size_t high = std::min((word << 6) + 63, last);
    std::uint64_t bits = 0;
    // Downwards, so that best[c - units] still holds the value without this item.
    for (std::size_t c = high + 1; c-- > low;) {
      const double candidate = best[covering ? (c > units ? c - units : 0) : c - units] + value;
      const bool better = covering ? candidate < best[c] : candidate > best[c];
      best[c] = better ? candidate : best[c];
      bits |= std::uint64_t{better} << (c & 63);
    }
    improved[word] = bits;
    if (low == lowest) break;
  }
}

// The open items' best choice within `room` by a table over their units' common divisor: exact.
// When fewer units must stay out than may go in, the table covers the units left out instead.
// Nothing when the table would be too large.
std::optional<CoreChoice> table_choice(const Sorted& s, const std::vector<std::size_t>& open, std::uint64_t room) {
  CoreChoice choice;
  if (open.empty()) return choice;
  std::uint64_t divisor = 0;  // at least 1: every item has units
  for (const std::size_t p : open) divisor = std::gcd(divisor, s.units[p]);
  std::uint64_t total = 0;
  for (const std::size_t p : open) {
    const std::uint64_t units = s.units[p] / divisor;
    total = units > std::numeric_limits<std::uint64_t>::max() - total ? std::numeric_limits<std::uint64_t>::max()
                                                                      : total + units;
  }
  const std::uint64_t capacity = room / divisor;
  if (total <= capacity) {
    choice.taken = open;
    for (const std::size_t p : open) choice.value += s.value[p];
    choice.most = choice.value;
    return choice;
  }
  const std::uint64_t left_out = total - capacity;
  const bool covering = left_out < capacity;
  const std::uint64_t last = covering ? left_out : capacity;
  if (last >= kMostTableUnits || (last + 1) * open.size() > kMostTableCells) return std::nullopt;
  const std::size_t words = static_cast<std::size_t>(last / 64 + 1);
  std::vector<double> best(static_cast<std::size_t>(last + 1),
                           covering ? std::numeric_limits<double>::infinity() : 0.0);
  best[0] = 0;
  std::vector<std::uint64_t> improved(open.size() * words, 0);
  for (std::size_t k = 0; k < open.size(); ++k) {
    const std::size_t units = static_cast<std::size_t>(s.units[open[k]] / divisor);
    if (covering)
      table_row<true>(best, improved.data() + k * words, units, s.value[open[k]]);
    else
      table_row<false>(best, improved.data() + k * words, units, s.value[open[k]]);
  }
  std::vector<bool> chosen(open.size(), false);
  std::size_t cell = static_cast<std::size_t>(last);
  for (std::size_t k = open.size(); k-- > 0;) {
    if (((improved[k * words + (cell >> 6)] >> (cell & 63)) & 1) == 0) continue;
    chosen[k] = true;
    const std::size_t units = static_cast<std::size_t>(s.units[open[k]] / divisor);
    cell = cell > units ? cell - units : 0;
  }
  for (std::size_t k = 0; k < open.size(); ++k) {
    if (chosen[k] != covering) {  // covering chose the items left out
      choice.taken.push_back(open[k]);
      choice.value += s.value[open[k]];
    }
  }
  choice.most = choice.value;
  return choice;
}

// An exchange's side: up to two sorted positions and their units and value.
struct Exchange {
  std::uint64_t units = 0;
  long double value = 0;
  std::size_t first = kNone;
  std::size_t second = kNone;
};

std::vector<Exchange> exchanges_of(const Sorted& s, const std::vector<std::size_t>& positions) {
  std::vector<Exchange> out;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const std::size_t a = positions[i];
    out.push_back({s.units[a], s.value[a], a, kNone});
    for (std::size_t j = 0; j < i; ++j) {
      const std::size_t b = positions[j];
      if (s.units[a] > std::numeric_limits<std::uint64_t>::max() - s.units[b]) continue;
      out.push_back({s.units[a] + s.units[b], static_cast<long double>(s.value[a]) + s.value[b], a, b});
    }
  }
  return out;
}

// The items of `positions` (nearest the break item first) an exchange chooses from: the nearest,
// which change the value per unit least, and some spread over all, whose sizes differ more; at most
// two of each size (an exchange uses no more), or profiles of a few kinds of regions would offer
// one size only.
std::vector<std::size_t> candidates(const Sorted& s, const std::vector<std::size_t>& positions) {
  std::vector<std::size_t> chosen;
  std::unordered_map<std::uint64_t, int> of_size;
  std::size_t next = 0;
  for (; next < positions.size() && chosen.size() < kFillCandidates; ++next) {
    if (of_size[s.units[positions[next]]]++ < 2) chosen.push_back(positions[next]);
  }
  const std::size_t stride = std::max<std::size_t>(1, (positions.size() - next) / kFillSpread);
  for (; next < positions.size(); next += stride) {
    if (of_size[s.units[positions[next]]]++ < 2) chosen.push_back(positions[next]);
  }
  return chosen;
}

// Exchanges up to two taken items for up to two left ones that fill the incumbent's unused units
// exactly, the one that adds the most value; true when one did.
bool fill_exactly(const Sorted& s, Incumbent& inc) {
  const std::uint64_t unused = s.capacity - inc.units;
  if (unused == 0) return false;
  // The last taken are the cheapest to give back, the first left the best to take.
  std::vector<std::size_t> taken, left;
  for (std::size_t p = s.units.size(); p-- > 0;) {
    if (inc.taken[p]) taken.push_back(p);
  }
  for (std::size_t p = 0; p < s.units.size(); ++p) {
    if (!inc.taken[p]) left.push_back(p);
  }
  std::vector<Exchange> removals = exchanges_of(s, candidates(s, taken));
  removals.push_back({});  // taking without giving back
  // By units, the least value first, and one per units: the cheapest way to free them.
  std::sort(removals.begin(), removals.end(), [](const Exchange& x, const Exchange& y) {
    return x.units != y.units ? x.units < y.units : x.value < y.value;
  });
  removals.erase(std::unique(removals.begin(), removals.end(),
                             [](const Exchange& x, const Exchange& y) { return x.units == y.units; }),
                 removals.end());
  long double best_gain = 0;
  Exchange best_add, best_removal;
  for (const Exchange& add : exchanges_of(s, candidates(s, left))) {
    if (add.units < unused) continue;
    const std::uint64_t freed = add.units - unused;
    const auto removal = std::lower_bound(removals.begin(), removals.end(), freed,
                                          [](const Exchange& x, std::uint64_t units) { return x.units < units; });
    if (removal == removals.end() || removal->units != freed || add.value - removal->value <= best_gain) continue;
    best_gain = add.value - removal->value;
    best_add = add;
    best_removal = *removal;
  }
  if (best_gain <= 0) return false;
  for (const std::size_t p : {best_removal.first, best_removal.second}) {
    if (p != kNone) inc.taken[p] = false;
  }
  for (const std::size_t p : {best_add.first, best_add.second}) {
    if (p != kNone) inc.taken[p] = true;
  }
  inc.units = s.capacity;
  inc.value += best_gain;
  return true;
}

// The best choice of open items within `room` that beats `floor` (the incumbent's value less the
// kept items'), by the Pareto front of (units, value) states, item by item, carrying about `work`
// states in all; none taken when none beats it.
CoreChoice front_search(const Sorted& s, const std::vector<std::size_t>& open, std::uint64_t room, long double floor,
                        long double tolerance, std::size_t work) {
  const std::size_t n = open.size();
  // Units and value of open[..k): the relaxation of the items still to come, from differences.
  // Doubles round these sums by far less than the tolerance, and keep the search fast.
  std::vector<double> units_before(n + 1, 0), value_before(n + 1, 0);
  for (std::size_t k = 0; k < n; ++k) {
    units_before[k + 1] = units_before[k] + static_cast<double>(s.units[open[k]]);
    value_before[k + 1] = value_before[k] + s.value[open[k]];
  }
  // The most value open[from..) adds within `space`: whole items while they fit, then a fraction.
  auto reach = [&](std::size_t from, std::uint64_t space) {
    const double limit = units_before[from] + static_cast<double>(space);
    const std::size_t to = static_cast<std::size_t>(
        std::upper_bound(units_before.begin() + static_cast<std::ptrdiff_t>(from), units_before.end(), limit) -
        units_before.begin() - 1);
    double value = value_before[to] - value_before[from];
    if (to < n) value += (limit - units_before[to]) * s.value[open[to]] / static_cast<double>(s.units[open[to]]);
    return value;
  };

  struct State {
    std::uint64_t units;
    double value;
    double reach;  // value and what the items still to come could add
    std::uint32_t node;
  };
  // The taken items of a state: the open item it took last, and the node of the state before.
  struct Node {
    std::uint32_t parent;
    std::uint32_t open_index;
  };
  constexpr std::uint32_t kRoot = std::numeric_limits<std::uint32_t>::max();
  std::vector<Node> nodes;
  std::vector<State> states{{0, 0.0, 0.0, kRoot}}, taking, next;
  long double best = floor;
  std::uint32_t best_node = kRoot;
  long double dropped = floor;  // the most any state the width cut could have reached
  std::size_t carried = 0;
  for (std::size_t k = 0; k < n && !states.empty(); ++k) {
    const std::uint64_t units = s.units[open[k]];
    taking.clear();
    for (const State& state : states) {
      if (room - state.units < units) continue;
      nodes.push_back({state.node, static_cast<std::uint32_t>(k)});
      taking.push_back(
          {state.units + units, state.value + s.value[open[k]], 0.0, static_cast<std::uint32_t>(nodes.size() - 1)});
    }
    // Merge by units, keeping the front (more units only for more value), and drop states that
    // cannot beat the best choice even fractionally.
    next.clear();
    std::size_t a = 0, b = 0;
    double front = -1;
    while (a < states.size() || b < taking.size()) {
      const bool from_taking =
          a == states.size() ||
          (b < taking.size() && (taking[b].units < states[a].units ||
                                 (taking[b].units == states[a].units && taking[b].value > states[a].value)));
      State state = from_taking ? taking[b++] : states[a++];
      if (state.value <= front) continue;
      front = state.value;
      if (state.value > best) {
        best = state.value;
        best_node = state.node;
      }
      state.reach = state.value + reach(k + 1, room - state.units);
      if (state.reach > best + tolerance) next.push_back(state);
    }
    // What is left of the work, spread over the items left: a front that stays narrow is never cut.
    const std::size_t width = std::max(kLeastSearchWidth, (work - std::min(work, carried)) / (n - k));
    if (next.size() > width) {
      // Keep the states that could reach furthest; the rest bound what the search may miss.
      std::nth_element(next.begin(), next.begin() + static_cast<std::ptrdiff_t>(width), next.end(),
                       [](const State& x, const State& y) { return x.reach > y.reach; });
      for (std::size_t i = width; i < next.size(); ++i) dropped = std::max<long double>(dropped, next[i].reach);
      next.resize(width);
      std::sort(next.begin(), next.end(), [](const State& x, const State& y) { return x.units < y.units; });
    }
    carried += next.size();
    states.swap(next);
  }
  CoreChoice choice;
  choice.value = best;
  choice.most = std::max(best, dropped);
  for (std::uint32_t node = best_node; node != kRoot; node = nodes[node].parent) {
    choice.taken.push_back(open[nodes[node].open_index]);
  }
  return choice;
}

}  // namespace

KnapsackChoice solve_knapsack(const std::vector<KnapsackItem>& items, std::uint64_t capacity, bool prove) {
  KnapsackChoice choice;
  choice.taken.assign(items.size(), false);
  std::vector<std::size_t> fitting;
  bool all_fit = true;
  std::uint64_t room = capacity;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].bytes > capacity) continue;
    fitting.push_back(i);
    if (items[i].bytes > room)
      all_fit = false;
    else
      room -= items[i].bytes;
  }
  if (all_fit) {
    for (const std::size_t i : fitting) {
      choice.taken[i] = true;
      choice.most_seconds += items[i].seconds;
    }
    return choice;
  }
  const Sorted s = sort_items(items, fitting, capacity);
  const long double tolerance = kTolerance * s.total_value;
  const Relaxation lp = relax(s);
  Incumbent inc = greedy(s);
  const auto unproved = [&] { return lp.bound - inc.value > tolerance; };
  // A better incumbent first: the closer it is to the bound, the fewer items stay open.
  if (unproved() && prove) fill_exactly(s, inc);
  if (unproved()) {
    const Core near = around_break(s, lp);
    adopt(s, near,
          front_search(s, near.open, s.capacity - near.kept_units, inc.value - near.kept_value, tolerance,
                       prove ? kSearchWork / 4 : kSearchWork / 32),
          inc);
  }
  const Relaxation bound = unproved() && prove ? counted(s, lp) : lp;
  long double most = bound.bound;
  if (bound.bound - inc.value > tolerance && prove) {
    const Core core = settle(s, bound, inc, tolerance);
    std::optional<CoreChoice> found = table_choice(s, core.open, s.capacity - core.kept_units);
    if (!found) {
      found =
          front_search(s, core.open, s.capacity - core.kept_units, inc.value - core.kept_value, tolerance, kSearchWork);
    }
    adopt(s, core, *found, inc);
    most = std::min(most, std::max({inc.value, core.flip_bound, core.kept_value + found->most}));
  }
  choice.proved_optimal = most - inc.value <= tolerance;
  long double taken_value = 0;
  for (std::size_t p = 0; p < s.units.size(); ++p) {
    choice.taken[s.item[p]] = inc.taken[p];
    if (inc.taken[p]) taken_value += items[s.item[p]].seconds;
  }
  // In seconds again: the taken items' own when proved, else the bound scaled back.
  choice.most_seconds =
      static_cast<double>(choice.proved_optimal ? taken_value : std::max(taken_value, most * s.largest_seconds));
  return choice;
}

}  // namespace remat::budget::detail
