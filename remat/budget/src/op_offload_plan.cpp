// Per-op plans with offload (op_plan.hpp): each region saved, recomputed, recomputed keeping some
// of its ops' outputs, or offloaded, so that what the checkpoints keep on the device fits a budget,
// what the offloaded regions hold on the host fits a host budget, and the step spends the least
// time.
//
// Offload enters OpSolver (op_solver.hpp) as a region's fallback: at a price per host byte,
// offloading a region is worth v, its seconds less its copies' cost less the price times its
// offload bytes. Where v > 0 the region's other options are weighed against offloading it (its
// save spares its seconds less v, its kept ops their seconds less its op overhead and v), and a
// region that takes none of them is offloaded. At a host price of 0 that is the problem without
// its host budget: where that plan fits the host budget, it is OpSolver's plan, proved where
// OpSolver proves it. Otherwise the host budget is relaxed: every host price bounds the best plan
// from above (OpSolver's bound there, plus each fallback's v, plus the price times the host
// budget), and the least host price whose plan fits the host budget is found by bisection over
// OpSolver's Lagrangian plans (without its exact search), then solved once with it. The plans
// within both budgets, topped up with the offloads that still fit, are the incumbents; the best
// is proved where it meets the least bound, else marked not exact, with that bound.

#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>

#include "offload_plan_of.hpp"
#include "op_plan_of.hpp"
#include "op_solver.hpp"
#include "plannable.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

namespace remat::budget {

namespace {

using detail::OpGroup;
using detail::OpMode;
using detail::OpSolver;

constexpr int kHostPriceSteps = 24;
// Profiles whose plan the relaxation does not prove weigh every set of offloads up to these sizes.
constexpr std::size_t kEveryOffloadSetUpTo = 12;
constexpr std::size_t kEveryOffloadSetGroupsUpTo = 256;
// The sets of offloads the host price's bisection met that are weighed with the rest planned exactly:
// the best ones, up to 8, as many as this many groups in all allow (at least the best).
constexpr std::size_t kWeighedOffloadSets = 8;
constexpr std::size_t kWeighedOffloadSetGroups = 8192;
// The device price of each relaxation the host price's bisection weighs, to this share of itself.
constexpr double kDevicePricePrecision = 1e-6;

struct Offload {                 // a group's region offloaded: what it holds on the host, what it spares
  std::uint64_t host_bytes = 0;  // 0: not offloadable
  double value = 0;              // its seconds less its copies' cost, more than 0
};

struct Chosen {
  OpSolver::Choice choice;      // save and kept ops by group (an offloaded group's mode is none)
  std::vector<bool> offloaded;  // by group
  double value = 0;             // seconds spared, offloads' copies paid
  std::uint64_t host = 0;
};

class OpOffloadSolver {
 public:
  OpOffloadSolver(const RegionProfile& profile, std::vector<OpGroup> groups, std::vector<Offload> offloads,
                  std::uint64_t capacity, std::uint64_t host_capacity)
      : profile_(profile),
        groups_(std::move(groups)),
        offloads_(std::move(offloads)),
        capacity_(capacity),
        host_capacity_(host_capacity) {}

  // `seeds`: sets of offloads (by group) other solvers chose, weighed with the rest planned exactly.
  Chosen solve(const std::vector<std::vector<bool>>& seeds, bool& exact, double& bound) {
    double scale = 0;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      scale += std::max({groups_[k].save_value, ops_seconds(k, groups_[k].ops), offloads_[k].value});
    }
    const double tolerance = OpSolver::kTolerance * std::max(scale, 1e-300);
    // At a host price of 0, the plan without the host budget: where it fits the host budget too, it is
    // the plan (its relaxation first, which proves it outright where every option worth taking fits).
    AtPrice free = at(0, false);
    if (free.chosen.host <= host_capacity_ && !free.exact) free = at(0, true);
    if (free.chosen.host <= host_capacity_) {
      exact = free.exact;
      bound = free.bound;
      return free.chosen;
    }
    double least_bound = std::numeric_limits<double>::infinity();
    std::vector<std::pair<double, std::vector<bool>>> met;  // each plan considered: its value, its offloads
    Chosen best;
    best.value = -std::numeric_limits<double>::infinity();
    // Keeps the bound and, made to fit the host budget and topped up, the plan; whether it fit as made.
    const auto consider = [&](AtPrice& found) {
      least_bound = std::min(least_bound, found.bound);
      const bool fits = found.chosen.host <= host_capacity_;
      fit_host(found.chosen);
      top_up(found.chosen);
      met.emplace_back(found.chosen.value, found.chosen.offloaded);
      if (found.chosen.value > best.value) best = std::move(found.chosen);
      return fits;
    };
    double lo = 0, hi = 0;
    for (const Offload& offload : offloads_) {
      if (offload.host_bytes > 0) hi = std::max(hi, offload.value / static_cast<double>(offload.host_bytes));
    }
    hi = hi * 2 + 1e-300;  // no offload is worth its host bytes there: the plan offloads nothing
    consider(free);        // its offloads cut down to the host budget
    AtPrice top = at(hi, false);
    consider(top);
    for (int step = 0; step < kHostPriceSteps && hi - lo > hi * 1e-12; ++step) {
      const double mid = lo + (hi - lo) / 2;
      AtPrice found = at(mid, false);
      (consider(found) ? hi : lo) = mid;
    }
    AtPrice searched = at(hi, true);
    consider(searched);
    // The relaxation's choice beside a set of offloads need not be the best: the best sets met, the rest
    // planned exactly. (The best alone left a larger host budget's plan up to 58% slower than a smaller
    // one's on random 80-region profiles, 19 times in 1260; these 8, 7.7% and 6 times.)
    std::stable_sort(met.begin(), met.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const std::size_t weighed = std::clamp<std::size_t>(
        kWeighedOffloadSetGroups / std::max<std::size_t>(groups_.size(), 1), 1, kWeighedOffloadSets);
    std::vector<std::vector<bool>> sets;
    for (auto& plan : met) {
      if (sets.size() == weighed) break;
      if (std::find(sets.begin(), sets.end(), plan.second) == sets.end()) sets.push_back(std::move(plan.second));
    }
    for (const std::vector<bool>& set : sets) weigh_offloads(set, best);
    for (const std::vector<bool>& seed : seeds) weigh_offloads(seed, best);
    bound = std::max(least_bound, best.value);
    exact = best.value >= bound - tolerance;
    if (!exact && every_offload_set(best, tolerance)) {
      exact = true;
      bound = best.value;
    }
    return best;
  }

 private:
  struct AtPrice {
    Chosen chosen;
    bool exact = false;
    double bound = 0;  // no plan within both budgets spares more
  };

  double ops_seconds(std::size_t k, const std::vector<std::size_t>& kept) const {
    double seconds = 0;
    for (const std::size_t o : kept) seconds += profile_.regions[groups_[k].region].ops[o].seconds;
    return seconds;
  }

  // What group k spares as `chosen` runs it (0 for recompute).
  double value_of(const Chosen& chosen, std::size_t k) const {
    if (chosen.offloaded[k]) return offloads_[k].value;
    if (chosen.choice.mode[k] == OpMode::save) return groups_[k].save_value;
    if (chosen.choice.mode[k] == OpMode::ops) return ops_seconds(k, chosen.choice.kept[k]) - groups_[k].overhead;
    return 0;
  }

  // OpSolver's plan (solved: with its exact search, else its relaxation alone) with each offload
  // worth more than its host bytes at `host_price` as its region's fallback.
  AtPrice at(double host_price, bool solved) const {
    std::vector<OpGroup> priced = groups_;
    std::vector<bool> falls_back(groups_.size(), false);
    double fallbacks = 0;
    for (std::size_t k = 0; k < priced.size(); ++k) {
      const Offload& offload = offloads_[k];
      const double v = offload.value - host_price * static_cast<double>(offload.host_bytes);
      if (offload.host_bytes == 0 || v <= 0) continue;
      falls_back[k] = true;
      fallbacks += v;
      priced[k].overhead += v;
      priced[k].save_value -= v;
      priced[k].can_save = priced[k].can_save && priced[k].save_value > 0;
    }
    OpSolver solver(profile_, std::move(priced), capacity_);
    AtPrice found;
    if (solved) {
      found.chosen.choice = solver.solve(found.exact, found.bound);
    } else {
      OpSolver::Relaxed relaxation = solver.relaxed(kDevicePricePrecision);
      found.chosen.choice = std::move(relaxation.choice);
      found.exact = relaxation.fits_free;
      found.bound = relaxation.bound;
    }
    found.bound += fallbacks + host_price * static_cast<double>(host_capacity_);
    Chosen& chosen = found.chosen;
    chosen.offloaded.assign(groups_.size(), false);
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (falls_back[k] && chosen.choice.mode[k] == OpMode::none) {
        chosen.offloaded[k] = true;
        chosen.host += offloads_[k].host_bytes;
      }
      chosen.value += value_of(chosen, k);
    }
    return found;
  }

  // The plan that offloads the groups `offloaded` names (within the host budget) and plans the rest
  // with OpSolver, without offload: in `solver`, set up for the rest, whose choice with_offloads
  // then takes. The offloads' host bytes and seconds are in the plan returned.
  Chosen offloading(const std::vector<bool>& offloaded, std::optional<OpSolver>& solver) const {
    Chosen set;
    set.offloaded = offloaded;
    std::vector<OpGroup> rest = groups_;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (!offloaded[k]) continue;
      set.host += offloads_[k].host_bytes;
      set.value += offloads_[k].value;
      rest[k].can_save = false;  // offloaded: neither saved nor keeping ops
      rest[k].ops.clear();
    }
    solver.emplace(profile_, std::move(rest), capacity_);
    return set;
  }

  // `set` (from offloading) with the rest's choice solved; false where OpSolver did not prove it.
  bool with_rest_solved(Chosen& set, OpSolver& solver) const {
    bool proved = false;
    double bound = 0;
    set.choice = solver.solve(proved, bound);
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (!set.offloaded[k]) set.value += value_of(set, k);
    }
    return proved;
  }

  // Weighs, as an incumbent, the plan that offloads what `offloaded` names with the rest planned
  // exactly (another solver's offloads, or the best plan's own: the relaxation's choice of what to
  // keep beside them need not be the best).
  void weigh_offloads(const std::vector<bool>& offloaded, Chosen& best) const {
    std::optional<OpSolver> solver;
    Chosen set = offloading(offloaded, solver);
    if (set.host > host_capacity_) return;
    with_rest_solved(set, *solver);
    top_up(set);
    if (set.value > best.value) best = std::move(set);
  }

  // Where few regions can be offloaded and few weighed: every set of offloads within the host budget,
  // the rest planned by OpSolver, each set skipped where its relaxation's bound cannot beat `best`.
  // True where every set was weighed and proved (`best` is then the best plan).
  bool every_offload_set(Chosen& best, double tolerance) const {
    std::vector<std::size_t> offloadable;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (offloads_[k].host_bytes > 0) offloadable.push_back(k);
    }
    if (offloadable.size() > kEveryOffloadSetUpTo || groups_.size() > kEveryOffloadSetGroupsUpTo) return false;
    for (std::uint32_t mask = 0; mask < (std::uint32_t{1} << offloadable.size()); ++mask) {
      std::vector<bool> offloaded(groups_.size(), false);
      for (std::size_t i = 0; i < offloadable.size(); ++i) offloaded[offloadable[i]] = ((mask >> i) & 1) != 0;
      std::optional<OpSolver> solver;
      Chosen set = offloading(offloaded, solver);
      if (set.host > host_capacity_ || set.value + solver->relaxed().bound <= best.value + tolerance) continue;
      if (!with_rest_solved(set, *solver)) return false;
      if (set.value > best.value) best = std::move(set);
    }
    return true;
  }

  // Recomputes offloaded regions, least seconds per host byte first, until the rest fit the host budget.
  void fit_host(Chosen& chosen) const {
    if (chosen.host <= host_capacity_) return;
    std::vector<std::size_t> offloaded;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (chosen.offloaded[k]) offloaded.push_back(k);
    }
    std::stable_sort(offloaded.begin(), offloaded.end(), [&](std::size_t a, std::size_t b) {
      return offloads_[a].value * static_cast<double>(offloads_[b].host_bytes) <
             offloads_[b].value * static_cast<double>(offloads_[a].host_bytes);
    });
    for (const std::size_t k : offloaded) {
      if (chosen.host <= host_capacity_) break;
      chosen.offloaded[k] = false;
      chosen.host -= offloads_[k].host_bytes;
      chosen.value -= offloads_[k].value;
    }
  }

  // Offloads what the host budget has room for, best seconds per host byte first, where offloading
  // spares more than the region's choice (recompute, or recompute keeping ops, whose bytes leave the
  // device).
  void top_up(Chosen& chosen) const {
    std::vector<std::size_t> order(groups_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return offloads_[a].value * static_cast<double>(offloads_[b].host_bytes) >
             offloads_[b].value * static_cast<double>(offloads_[a].host_bytes);
    });
    for (const std::size_t k : order) {
      const Offload& offload = offloads_[k];
      if (offload.host_bytes == 0 || chosen.offloaded[k] || chosen.choice.mode[k] == OpMode::save ||
          offload.host_bytes > host_capacity_ - chosen.host) {
        continue;
      }
      const double gain = offload.value - value_of(chosen, k);
      if (gain <= 0) continue;
      chosen.choice.mode[k] = OpMode::none;
      chosen.choice.kept[k].clear();
      chosen.offloaded[k] = true;
      chosen.host += offload.host_bytes;
      chosen.value += gain;
    }
  }

  const RegionProfile& profile_;
  std::vector<OpGroup> groups_;
  std::vector<Offload> offloads_;  // by group
  std::uint64_t capacity_, host_capacity_;
};

}  // namespace

Plan solve_ops_offload(const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes) {
  const std::uint64_t capacity = check_plannable(profile, budget_bytes);
  detail::refuse_grouped_ops(profile);
  detail::check_offloadable(profile, host_budget_bytes);
  std::vector<Choice> choices(profile.regions.size(), Choice::recompute);
  std::vector<OpGroup> groups = detail::op_groups(profile, capacity, choices, /*every_region=*/true);
  std::vector<Offload> offloads(groups.size());
  std::vector<double> copy_seconds(profile.regions.size(), 0);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const RegionCost& region = profile.regions[groups[k].region];
    if (!detail::offloadable_within(region, host_budget_bytes)) continue;
    copy_seconds[groups[k].region] = offload_seconds(profile, region);
    const double value = region.seconds - copy_seconds[groups[k].region];
    if (value > 0) offloads[k] = {region.offload_bytes, value};
  }
  for (std::size_t k = groups.size(); k-- > 0;) {  // regions with no option but recompute
    if (groups[k].can_save || !groups[k].ops.empty() || offloads[k].host_bytes > 0) continue;
    groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(k));
    offloads.erase(offloads.begin() + static_cast<std::ptrdiff_t>(k));
  }
  // The plan by regions alone with offload: its offloads, with the rest planned per op, seed the search.
  std::vector<std::vector<bool>> seeds;
  if (host_budget_bytes > 0) {
    const Plan by_regions = solve_offload(profile, budget_bytes, host_budget_bytes);
    std::vector<bool> offloaded(groups.size(), false);
    for (std::size_t k = 0; k < groups.size(); ++k) offloaded[k] = by_regions.offloaded[groups[k].region];
    seeds.push_back(std::move(offloaded));
  }
  OpOffloadSolver solver(profile, groups, std::move(offloads), capacity, host_budget_bytes);
  bool exact = true;
  double bound = 0;
  const Chosen chosen = solver.solve(seeds, exact, bound);
  std::vector<std::vector<OpCost>> kept = detail::kept_ops_of(profile, groups, chosen.choice, choices);
  std::vector<bool> offloaded(profile.regions.size(), false);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    if (!chosen.offloaded[k]) continue;
    choices[groups[k].region] = Choice::save;
    offloaded[groups[k].region] = true;
  }
  Plan plan = detail::op_offload_plan_of(profile, choices, std::move(kept), offloaded, copy_seconds, host_budget_bytes);
  plan.budget_bytes = budget_bytes;
  plan.exact = exact;
  plan.least_recompute_seconds =
      exact ? plan.recompute_seconds : std::max(0.0, plan.recompute_seconds - std::max(0.0, bound - chosen.value));
  return plan;
}

Plan detail::op_offload_plan_of(const RegionProfile& profile, const std::vector<Choice>& choices,
                                std::vector<std::vector<OpCost>> kept, const std::vector<bool>& offloaded,
                                const std::vector<double>& copy_seconds, std::uint64_t host_budget_bytes) {
  Plan plan = op_plan_of(profile, choices, std::move(kept));  // counts an offloaded region as saved
  plan.host_budget_bytes = host_budget_bytes;
  plan.offloaded = offloaded;
  for (std::size_t r = 0; r < profile.regions.size(); ++r) {
    if (!offloaded[r]) continue;
    RegionCost& region = plan.regions[r].first;
    region.offload_seconds = copy_seconds[r];
    plan.kept_bytes -= region.saved_bytes;
    plan.host_bytes += region.offload_bytes;
    plan.offload_seconds += copy_seconds[r];
    plan.recompute_seconds += copy_seconds[r];
  }
  return plan;
}

}  // namespace remat::budget
