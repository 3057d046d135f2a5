// Offload plans: each region saved (its bytes on the device, sparing its seconds), recomputed
// (nothing kept, nothing spared) or offloaded (its offload_bytes on the host, sparing its seconds
// less what its copies cost). A multiple-choice knapsack with two budgets.
//
// Where the host budget holds every offload worth making, it does not bind: each region then
// weighs save against its better fallback (offload or recompute), a 0/1 knapsack on the device
// budget that knapsack.cpp solves (proved wherever it proves it). Otherwise the Lagrangian
// relaxation of both budgets comes first: at a price per device byte and one per host byte, each
// region alone takes its best option; every pair of prices bounds the best plan from above, and
// the choices at prices where both budgets hold, topped up greedily, are incumbents. When the
// best incumbent meets the least bound, that is the proof; else a depth-first search over the
// regions, pruned by the bound at the best prices, ends within its node limit (proved) or leaves
// the incumbent standing, marked not exact. The searches by step peak take the relaxation's
// incumbent alone (unproved_offload_choices), dozens of times a search.

#include <remat/budget/offload_plan.hpp>

#include "knapsack.hpp"
#include "offload_plan_of.hpp"
#include "plannable.hpp"
#include "unproved_choices.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace remat::budget {

namespace {

constexpr int kPriceSteps = 60;
constexpr std::size_t kMostNodes = std::size_t{1} << 22;
// The search recurses once a region: deeper profiles keep the incumbent, marked not exact.
constexpr std::size_t kMostSearchDepth = 4096;
constexpr double kTolerance = 1e-12;

enum class Mode : std::uint8_t { none, save, offload };

struct Item : Weighed {  // a region with a choice to make
  explicit Item(const Weighed& weighed) : Weighed(weighed) {}
  // What offloading it gains at a price per byte of host memory: 0 where it cannot be offloaded.
  double offload_gain(double host_price) const {
    return can_offload ? offload_value - host_price * static_cast<double>(host_bytes) : 0;
  }
  bool can_offload = false;
  std::uint64_t host_bytes = 0;
  double offload_value = 0;  // its seconds less its copies' cost, more than 0
};

struct Choices {
  std::vector<Mode> mode;
  std::uint64_t device = 0, host = 0;
  double value = 0;  // seconds spared
};

class OffloadSolver {
 public:
  OffloadSolver(std::vector<Item> items, std::uint64_t device_capacity, std::uint64_t host_capacity)
      : items_(std::move(items)), device_(device_capacity), host_(host_capacity) {}

  // The best plan found: proved where `exact`, else `bound` is the least upper bound found; where
  // not `searching`, the incumbents of the relaxation alone (no depth-first search).
  Choices solve(bool searching, bool& exact, double& bound) {
    double scale = 0;
    for (const Item& item : items_) scale += item.save_value;
    tolerance_ = kTolerance * std::max(scale, 1e-300);
    best_ = priced(0, 0);
    if (best_.device <= device_ && best_.host <= host_) {  // every option worth taking fits
      exact = true;
      bound = best_.value;
      return best_;
    }
    best_.value = -1;
    double device_high = 0, host_high = 0;
    for (const Item& item : items_) {
      if (item.can_save) device_high = std::max(device_high, item.save_value / static_cast<double>(item.save_bytes));
      if (item.can_offload) host_high = std::max(host_high, item.offload_value / static_cast<double>(item.host_bytes));
    }
    device_high = device_high * 2 + 1e-300;
    host_high = host_high * 2 + 1e-300;
    bound_ = std::numeric_limits<double>::infinity();
    // The host price by bisection on whether the host budget holds at the device price that makes
    // the device budget hold.
    double lo = 0, hi = host_high;
    inner(0, device_high);
    inner(hi, device_high);
    for (int step = 0; step < kPriceSteps && hi - lo > hi * 1e-15; ++step) {
      const double mid = lo + (hi - lo) / 2;
      if (inner(mid, device_high).host <= host_) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    bound = std::max(bound_, best_.value);
    if (best_.value >= bound - tolerance_) {
      exact = true;
      return best_;
    }
    exact = searching && search();
    if (exact) bound = best_.value;
    return best_;
  }

 private:
  // Every item's best option at the prices: the choices and what they cost and spare; the bound
  // there is kept when it is the least yet.
  Choices priced(double device_price, double host_price) {
    Choices c;
    c.mode.assign(items_.size(), Mode::none);
    double bound = device_price * static_cast<double>(device_) + host_price * static_cast<double>(host_);
    for (std::size_t k = 0; k < items_.size(); ++k) {
      const Item& item = items_[k];
      double best = 0;
      take_if_better(item.save_gain(device_price), Mode::save, best, c.mode[k]);
      take_if_better(item.offload_gain(host_price), Mode::offload, best, c.mode[k]);
      bound += best;
      add(c, k, c.mode[k]);
    }
    if (bound < bound_) {
      bound_ = bound;
      device_price_ = device_price;
      host_price_ = host_price;
    }
    return c;
  }

  void add(Choices& c, std::size_t k, Mode mode) const {
    const Item& item = items_[k];
    if (mode == Mode::save) {
      c.device += item.save_bytes;
      c.value += item.save_value;
    } else if (mode == Mode::offload) {
      c.host += item.host_bytes;
      c.value += item.offload_value;
    }
  }

  void remove(Choices& c, std::size_t k) const {
    const Item& item = items_[k];
    if (c.mode[k] == Mode::save) {
      c.device -= item.save_bytes;
      c.value -= item.save_value;
    } else if (c.mode[k] == Mode::offload) {
      c.host -= item.host_bytes;
      c.value -= item.offload_value;
    }
    c.mode[k] = Mode::none;
  }

  // The choices at the host price and the least device price (by bisection) at which the device
  // budget holds; where the host budget holds too they are topped up and may be the incumbent.
  Choices inner(double host_price, double device_high) {
    double lo = 0, hi = device_high;
    Choices feasible = priced(hi, host_price);
    Choices at = priced(0, host_price);
    if (at.device <= device_) {
      feasible = std::move(at);
    } else {
      for (int step = 0; step < kPriceSteps && hi - lo > hi * 1e-15; ++step) {
        const double mid = lo + (hi - lo) / 2;
        at = priced(mid, host_price);
        if (at.device <= device_) {
          hi = mid;
          feasible = std::move(at);
        } else {
          lo = mid;
        }
      }
    }
    if (feasible.host <= host_) {
      Choices topped = feasible;
      top_up(topped);
      if (topped.value > best_.value) best_ = std::move(topped);
    }
    return feasible;
  }

  // Fills what both budgets have left: offloaded regions saved where the device has room (best
  // seconds per byte first, which frees their host bytes), then regions left out saved, then
  // offloaded, where they fit.
  void top_up(Choices& c) const {
    std::vector<std::size_t> order(items_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return items_[a].save_value * static_cast<double>(items_[b].save_bytes) >
             items_[b].save_value * static_cast<double>(items_[a].save_bytes);
    });
    for (const Mode from : {Mode::offload, Mode::none}) {
      for (const std::size_t k : order) {
        const Item& item = items_[k];
        if (c.mode[k] != from || !item.can_save || item.save_bytes > device_ - c.device) continue;
        remove(c, k);
        c.mode[k] = Mode::save;
        add(c, k, Mode::save);
      }
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return items_[a].offload_value * static_cast<double>(items_[b].host_bytes) >
             items_[b].offload_value * static_cast<double>(items_[a].host_bytes);
    });
    for (const std::size_t k : order) {
      const Item& item = items_[k];
      if (c.mode[k] != Mode::none || !item.can_offload || item.host_bytes > host_ - c.host) continue;
      c.mode[k] = Mode::offload;
      add(c, k, Mode::offload);
    }
  }

  // Depth-first over the items (most seconds first), each option tried best priced first, pruned
  // where the bound at the best prices cannot beat the incumbent by more than the tolerance. True
  // where it ended (best_ is then optimal).
  bool search() {
    const std::size_t n = items_.size();
    if (n > kMostSearchDepth) return false;
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::stable_sort(order_.begin(), order_.end(),
                     [&](std::size_t a, std::size_t b) { return items_[a].save_value > items_[b].save_value; });
    rest_.assign(n + 1, 0);
    for (std::size_t i = n; i-- > 0;) rest_[i] = rest_[i + 1] + best_priced(items_[order_[i]]);
    current_.mode.assign(n, Mode::none);
    current_.device = current_.host = 0;
    current_.value = 0;
    nodes_ = 0;
    return visit(0);
  }

  double best_priced(const Item& item) const {
    return std::max({0.0, item.save_gain(device_price_), item.offload_gain(host_price_)});
  }

  bool visit(std::size_t i) {
    if (++nodes_ > kMostNodes) return false;
    const double reach = current_.value + device_price_ * static_cast<double>(device_ - current_.device) +
                         host_price_ * static_cast<double>(host_ - current_.host) + rest_[i];
    if (reach <= best_.value + tolerance_) return true;
    if (i == order_.size()) {
      if (current_.value > best_.value) best_ = current_;
      return true;
    }
    const std::size_t k = order_[i];
    const Item& item = items_[k];
    struct Option {
      Mode mode;
      double priced;
    };
    Option options[3];
    int count = 0;
    if (item.can_save && item.save_bytes <= device_ - current_.device) {
      options[count++] = {Mode::save, item.save_gain(device_price_)};
    }
    if (item.can_offload && item.host_bytes <= host_ - current_.host) {
      options[count++] = {Mode::offload, item.offload_gain(host_price_)};
    }
    options[count++] = {Mode::none, 0};
    std::stable_sort(options, options + count, [](const Option& a, const Option& b) { return a.priced > b.priced; });
    for (int o = 0; o < count; ++o) {
      current_.mode[k] = options[o].mode;
      add(current_, k, options[o].mode);
      const bool ended = visit(i + 1);
      remove(current_, k);
      if (!ended) return false;
    }
    return true;
  }

  std::vector<Item> items_;
  std::uint64_t device_, host_;
  double tolerance_ = 0;
  Choices best_;
  double bound_ = std::numeric_limits<double>::infinity();
  double device_price_ = 0, host_price_ = 0;  // where bound_ was found
  std::vector<std::size_t> order_;
  std::vector<double> rest_;
  Choices current_;
  std::size_t nodes_ = 0;
};

}  // namespace

double offload_seconds(const RegionProfile& profile, const RegionCost& region) {
  if (!profile.host_copy) {
    throw BudgetError(
        "the profile has no copy bandwidth (host_copy), which offload plans are priced by: profile "
        "again with remat.profile_regions(), which measures it, or plan without a host budget");
  }
  if (region.members_offload_seconds) return *region.members_offload_seconds;
  const double bytes = static_cast<double>(region.offload_bytes);
  const double to_host = bytes / profile.host_copy->to_host_bytes_per_second;
  const double to_device = bytes / profile.host_copy->to_device_bytes_per_second;
  if (profile.device.rfind("cuda", 0) == 0) {
    return std::max(0.0, to_host - region.seconds) + std::max(0.0, to_device - region.seconds);
  }
  return to_host + to_device;
}

namespace {

// solve_offload's choices before they become a plan: searched where `searching` (else the
// relaxation's incumbent stands, exact or not), `bound` the most seconds any plan spares.
struct OffloadChoices {
  std::vector<Choice> choices;
  std::vector<bool> offloaded;
  std::vector<double> copy_seconds;
  bool exact = true;
  double bound = 0, value = 0;
};

OffloadChoices offload_choices(const RegionProfile& profile, std::uint64_t budget_bytes,
                               std::uint64_t host_budget_bytes, bool searching) {
  const std::uint64_t capacity = check_plannable(profile, budget_bytes);
  detail::check_offloadable(profile, host_budget_bytes);
  OffloadChoices solved;
  std::vector<Choice> choices(profile.regions.size(), Choice::recompute);
  std::vector<double> copy_seconds(profile.regions.size(), 0);
  std::vector<Item> items;
  std::uint64_t all_offloads = 0;  // every offload worth making, added up
  weigh_regions(profile, capacity, choices, [&](const Weighed& weighed) {
    const std::size_t r = weighed.region;
    const RegionCost& region = profile.regions[r];
    Item item(weighed);
    if (detail::offloadable_within(region, host_budget_bytes)) {
      copy_seconds[r] = offload_seconds(profile, region);
      item.offload_value = region.seconds - copy_seconds[r];
      item.can_offload = item.offload_value > 0;
      item.host_bytes = region.offload_bytes;
      if (item.can_offload) all_offloads += std::min(region.offload_bytes, UINT64_MAX - all_offloads);
    }
    if (item.can_save || item.can_offload) items.push_back(item);
  });

  std::vector<Mode> modes(items.size(), Mode::none);
  if (all_offloads <= host_budget_bytes) {
    // The host budget does not bind: save where the device has room for what saving spares beyond
    // the region's fallback (offloaded where that is worth it, else recomputed).
    std::vector<detail::KnapsackItem> knapsack;
    std::vector<std::size_t> knapsack_item;
    double fallback = 0;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const double rest = items[k].can_offload ? items[k].offload_value : 0;
      fallback += rest;
      modes[k] = items[k].can_offload ? Mode::offload : Mode::none;
      if (items[k].can_save && items[k].save_value - rest > 0) {
        knapsack.push_back({items[k].save_bytes, items[k].save_value - rest});
        knapsack_item.push_back(k);
      }
    }
    const detail::KnapsackChoice chosen = detail::solve_knapsack(knapsack, capacity);
    double taken = 0;
    for (std::size_t i = 0; i < knapsack.size(); ++i) {
      if (!chosen.taken[i]) continue;
      modes[knapsack_item[i]] = Mode::save;
      taken += knapsack[i].seconds;
    }
    solved.exact = chosen.proved_optimal;
    solved.value = fallback + taken;
    solved.bound = fallback + chosen.most_seconds;
  } else {
    OffloadSolver solver(items, capacity, host_budget_bytes);
    const Choices chosen = solver.solve(searching, solved.exact, solved.bound);
    modes = chosen.mode;
    solved.value = chosen.value;
  }

  std::vector<bool> offloaded(profile.regions.size(), false);
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (modes[k] == Mode::save) choices[items[k].region] = Choice::save;
    if (modes[k] == Mode::offload) {
      choices[items[k].region] = Choice::save;
      offloaded[items[k].region] = true;
    }
  }
  solved.choices = std::move(choices);
  solved.offloaded = std::move(offloaded);
  solved.copy_seconds = std::move(copy_seconds);
  return solved;
}

}  // namespace

Plan solve_offload(const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes) {
  OffloadChoices solved = offload_choices(profile, budget_bytes, host_budget_bytes, true);
  Plan plan = detail::offload_plan_of(profile, solved.choices, std::move(solved.offloaded), solved.copy_seconds,
                                      host_budget_bytes);
  plan.budget_bytes = budget_bytes;
  plan.exact = solved.exact;
  plan.least_recompute_seconds =
      solved.exact ? plan.recompute_seconds
                   : std::max(0.0, plan.recompute_seconds - std::max(0.0, solved.bound - solved.value));
  return plan;
}

namespace detail {

void check_offloadable(const RegionProfile& profile, std::uint64_t host_budget_bytes) {
  if (host_budget_bytes == 0) return;
  if (!profile.host_copy) (void)offload_seconds(profile, RegionCost{});  // refused, naming the fix
  std::uint64_t offloadable = 0;
  for (const RegionCost& region : profile.regions) {
    if (region.offload_bytes > UINT64_MAX - offloadable) {
      throw BudgetError("the regions' offload_bytes add up past 64 bits at region '" + region.name +
                        "'; the profile is not a real step's");
    }
    offloadable += region.offload_bytes;
  }
}

std::pair<std::vector<Choice>, std::vector<bool>> unproved_offload_choices(const RegionProfile& profile,
                                                                           std::uint64_t budget_bytes,
                                                                           std::uint64_t host_budget_bytes) {
  OffloadChoices solved = offload_choices(profile, budget_bytes, host_budget_bytes, false);
  return {std::move(solved.choices), std::move(solved.offloaded)};
}

Plan offload_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices, std::vector<bool> offloaded,
                     const std::vector<double>& copy_seconds, std::uint64_t host_budget_bytes) {
  Plan plan;
  plan.base_bytes = profile.base_bytes;
  plan.kept_bytes = profile.base_bytes;
  plan.host_budget_bytes = host_budget_bytes;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    RegionCost region = profile.regions[r];
    region.ops.clear();
    region.op_overhead_seconds = 0;
    if (offloaded[r]) {
      region.offload_seconds = copy_seconds[r];
      plan.host_bytes += region.offload_bytes;
      plan.offload_seconds += copy_seconds[r];
      plan.recompute_seconds += copy_seconds[r];
    } else if (choices[r] == Choice::save) {
      plan.kept_bytes += region.saved_bytes;
    } else {
      plan.recompute_seconds += region.seconds;
    }
    plan.regions.emplace_back(std::move(region), choices[r]);
  }
  plan.offloaded = std::move(offloaded);
  return plan;
}

}  // namespace detail

}  // namespace remat::budget
