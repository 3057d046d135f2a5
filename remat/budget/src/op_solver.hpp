// Per-op plans: a multiple-choice knapsack over regions, each saved (its saved bytes, sparing its
// seconds), recomputed (nothing kept, nothing spared) or recomputed keeping some of its ops'
// outputs (their bytes, sparing their seconds less the region's op overhead, paid once).
//
// The Lagrangian relaxation comes first: at a price per byte, each region alone takes its best
// option (keeping exactly the ops worth more than their bytes at that price), and the price that
// makes the regions' choices fit the budget is found by bisection. Every price bounds the best
// plan from above (the price times the budget plus each region's best priced option); the least
// such bound is kept. The choice at the feasible price, topped up greedily with the ops and saves
// that still fit, is the first incumbent; when it meets the bound, that is the proof. Otherwise an
// exact search over the Pareto front of (bytes, seconds spared) states, region by region and op by
// op, drops every state whose bound at the best price cannot beat the incumbent; when it ends
// within its work limit its best state is optimal (proved), else the incumbent stands, marked not
// exact, with the bound as the best any plan could spare.
//
// Internal to the per-op solvers (op_plan.cpp, op_offload_plan.cpp).

#pragma once

#include <remat/budget/plan.hpp>

#include "plannable.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace remat::budget::detail {

struct OpGroup : Weighed {  // a region with a choice to make
  explicit OpGroup(const Weighed& weighed) : Weighed(weighed) {}
  std::vector<std::size_t> ops;  // usable ops, by index in the region's ops
  double overhead = 0;           // paid once where any op is kept
};

enum class OpMode : std::uint8_t { none, save, ops };

struct Priced {  // every group's best option at one price per byte
  std::vector<OpMode> mode;
  std::uint64_t bytes = 0;
  double value = 0;  // seconds spared, as the options really spare them
  double bound = 0;  // price * capacity + each group's best priced option
};

class OpSolver {
 public:
  // States the exact search may make over all its steps, and the taken-item records behind them:
  // a fraction of a second of work and 64 MiB at most.
  static constexpr std::size_t kMostStates = std::size_t{1} << 24;
  static constexpr std::size_t kMostNodes = std::size_t{1} << 23;
  static constexpr int kPriceSteps = 100;
  // Plans whose spared seconds are closer than this share of all that could be spared count as equal.
  static constexpr double kTolerance = 1e-12;

  OpSolver(const RegionProfile& profile, std::vector<OpGroup> groups, std::uint64_t capacity)
      : profile_(profile), groups_(std::move(groups)), capacity_(capacity) {}

  // The groups' choices: for each, save, none, or ops (kept, by index in the region's ops).
  struct Choice {
    std::vector<OpMode> mode;
    std::vector<std::vector<std::size_t>> kept;
    double value = 0;
    std::uint64_t bytes = 0;
  };

  // Each group's best option at `per_byte`, whatever the capacity.
  Choice at_price(double per_byte) const { return from_priced(per_byte, price(per_byte)); }

  // The least and the most seconds spared per byte kept of any option (PricedOpPlans::price_range).
  std::pair<double, double> price_range() const {
    double least = std::numeric_limits<double>::infinity(), most = 0;
    const auto include = [&](double ratio) {
      least = std::min(least, ratio);
      most = std::max(most, ratio);
    };
    for (const OpGroup& g : groups_) {
      if (g.can_save) include(g.save_value / static_cast<double>(g.save_bytes));
      for (const std::size_t o : g.ops) include(op(g, o).seconds / static_cast<double>(op(g, o).bytes));
    }
    return {std::min(least, most), most};
  }

  // The Lagrangian relaxation alone: at the least price per byte at which each group's best option
  // fits the capacity, that choice (not topped up); the least bound any price gave, and that price.
  // fits_free: every option worth taking fits (the choice is then optimal, the bound its value).
  // The price is bisected until within `precision` of itself.
  struct Relaxed {
    Choice choice;
    double bound = 0;
    double best_price = 0;
    bool fits_free = false;
  };
  Relaxed relaxed(double precision = 1e-15) const {
    Relaxed out;
    Priced free = price(0.0);
    if (free.bytes <= capacity_) {
      out.fits_free = true;
      out.choice = from_priced(0.0, free);
      out.bound = free.value;
      return out;
    }
    double lo = 0, hi = price_range().second * 2 + 1e-300;
    Priced feasible = price(hi);
    out.bound = feasible.bound;
    out.best_price = hi;
    for (int step = 0; step < kPriceSteps && hi - lo > hi * precision; ++step) {
      const double mid = lo + (hi - lo) / 2;
      Priced at = price(mid);
      if (at.bound < out.bound) {
        out.bound = at.bound;
        out.best_price = mid;
      }
      if (at.bytes <= capacity_) {
        hi = mid;
        feasible = std::move(at);
      } else {
        lo = mid;
      }
    }
    out.choice = from_priced(hi, feasible);
    return out;
  }

  Choice solve(bool& exact, double& bound) {
    double scale = 0;
    for (const OpGroup& g : groups_) scale += std::max(g.save_value, ops_value(g, 0.0));
    const double tolerance = kTolerance * std::max(scale, 1e-300);
    Relaxed relaxation = relaxed();
    if (relaxation.fits_free) {  // every option worth taking fits: optimal outright
      exact = true;
      bound = relaxation.bound;
      return relaxation.choice;
    }
    Choice incumbent = std::move(relaxation.choice);
    top_up(incumbent);
    bound = std::max(relaxation.bound, incumbent.value);
    if (incumbent.value >= bound - tolerance) {
      exact = true;
      return incumbent;
    }
    Choice searched;
    const bool ended = search(relaxation.best_price, incumbent.value + tolerance, searched);
    if (ended) {
      exact = true;
      if (searched.value > incumbent.value) {
        bound = searched.value;
        return searched;
      }
      bound = incumbent.value;
      return incumbent;
    }
    exact = false;
    return incumbent;
  }

 private:
  const OpCost& op(const OpGroup& g, std::size_t o) const { return profile_.regions[g.region].ops[o]; }

  // The ops option's priced value: each op worth more than its bytes at `per_byte`, less the overhead.
  double ops_value(const OpGroup& g, double per_byte) const {
    double total = 0;
    bool any = false;
    for (const std::size_t o : g.ops) {
      const double v = op(g, o).seconds - per_byte * static_cast<double>(op(g, o).bytes);
      if (v > 0) {
        total += v;
        any = true;
      }
    }
    return any ? total - g.overhead : 0;
  }

  Priced price(double per_byte) const {
    Priced at;
    at.mode.resize(groups_.size(), OpMode::none);
    at.bound = per_byte * static_cast<double>(capacity_);
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      const OpGroup& g = groups_[k];
      double best = 0;
      take_if_better(g.save_gain(per_byte), OpMode::save, best, at.mode[k]);
      take_if_better(ops_value(g, per_byte), OpMode::ops, best, at.mode[k]);
      at.bound += best;
      if (at.mode[k] == OpMode::save) {
        at.bytes += g.save_bytes;
        at.value += g.save_value;
      } else if (at.mode[k] == OpMode::ops) {
        at.value -= g.overhead;
        for (const std::size_t o : g.ops) {
          if (op(g, o).seconds > per_byte * static_cast<double>(op(g, o).bytes)) {
            at.bytes += op(g, o).bytes;
            at.value += op(g, o).seconds;
          }
        }
      }
    }
    return at;
  }

  Choice from_priced(double per_byte, const Priced& at) const {
    Choice c;
    c.mode = at.mode;
    c.kept.resize(groups_.size());
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (at.mode[k] != OpMode::ops) continue;
      for (const std::size_t o : groups_[k].ops) {
        if (op(groups_[k], o).seconds > per_byte * static_cast<double>(op(groups_[k], o).bytes)) {
          c.kept[k].push_back(o);
        }
      }
    }
    c.value = at.value;
    c.bytes = at.bytes;
    return c;
  }

  // Fills what the budget has left: regions saved where that spares more than their kept ops
  // (best seconds per byte first), then ops not kept yet (likewise; a region that keeps none pays
  // its overhead with its first), then regions saved again. At a price where many options have the
  // same seconds per byte, the price alone leaves them all out.
  void top_up(Choice& c) const {
    save_where_better(c);
    struct Candidate {
      std::size_t group, op;
      double ratio;
    };
    std::vector<Candidate> candidates;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (c.mode[k] == OpMode::save) continue;
      for (const std::size_t o : groups_[k].ops) {
        if (std::find(c.kept[k].begin(), c.kept[k].end(), o) != c.kept[k].end()) continue;
        const OpCost& cost = op(groups_[k], o);
        candidates.push_back({k, o, cost.seconds / static_cast<double>(cost.bytes)});
      }
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) { return a.ratio > b.ratio; });
    for (const Candidate& cand : candidates) {
      const OpCost& cost = op(groups_[cand.group], cand.op);
      if (cost.bytes > capacity_ - c.bytes) continue;
      const double gain = cost.seconds - (c.mode[cand.group] == OpMode::none ? groups_[cand.group].overhead : 0);
      if (gain <= 0) continue;
      c.mode[cand.group] = OpMode::ops;
      c.kept[cand.group].push_back(cand.op);
      c.bytes += cost.bytes;
      c.value += gain;
    }
    save_where_better(c);
    for (auto& kept : c.kept) std::sort(kept.begin(), kept.end());
  }

  void save_where_better(Choice& c) const {
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < groups_.size(); ++k) {
      if (groups_[k].can_save && c.mode[k] != OpMode::save) order.push_back(k);
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return groups_[a].save_value * static_cast<double>(groups_[b].save_bytes) >
             groups_[b].save_value * static_cast<double>(groups_[a].save_bytes);
    });
    for (const std::size_t k : order) {
      const OpGroup& g = groups_[k];
      if (!g.can_save || c.mode[k] == OpMode::save) continue;
      std::uint64_t bytes = 0;
      double value = c.mode[k] == OpMode::ops ? -g.overhead : 0;
      for (const std::size_t o : c.kept[k]) {
        bytes += op(g, o).bytes;
        value += op(g, o).seconds;
      }
      if (g.save_value <= value || g.save_bytes > capacity_ - (c.bytes - bytes)) continue;
      c.bytes = c.bytes - bytes + g.save_bytes;
      c.value = c.value - value + g.save_value;
      c.mode[k] = OpMode::save;
      c.kept[k].clear();
    }
  }

  struct State {
    std::uint64_t bytes;
    double value;
    std::uint32_t node;  // the last item taken on the way here (0: none)
  };
  struct Node {
    std::uint32_t parent;
    std::uint32_t item;
  };
  struct Item {
    std::uint32_t group;
    std::uint32_t op;  // kSave for the region's save
  };
  static constexpr std::uint32_t kSave = std::numeric_limits<std::uint32_t>::max();

  // The Pareto front of `front` with and without the item (bytes, value) taken: states by
  // bytes, each spare more than any with fewer bytes, within the capacity; `keep` says which may
  // still beat the incumbent. False where the node limit is reached.
  template <typename Keep>
  bool take(std::vector<State>& front, std::uint64_t bytes, double value, std::uint32_t item, Keep keep) {
    merged_.clear();
    std::size_t a = 0, b = 0;
    const std::size_t n = front.size();
    double best = -std::numeric_limits<double>::infinity();
    while (a < n || b < n) {
      bool from_taken = false;
      if (b < n && front[b].bytes > capacity_ - std::min(capacity_, bytes)) {
        b = n;  // the rest do not fit with the item
        continue;
      }
      if (a == n) {
        from_taken = true;
      } else if (b < n) {
        const std::uint64_t tb = front[b].bytes + bytes;
        from_taken = tb < front[a].bytes || (tb == front[a].bytes && front[b].value + value > front[a].value);
      }
      State s = from_taken ? State{front[b].bytes + bytes, front[b].value + value, front[b].node} : front[a];
      if (from_taken)
        ++b;
      else
        ++a;
      if (s.value <= best || !keep(s)) continue;
      best = s.value;
      if (from_taken) {
        if (nodes_.size() >= kMostNodes) return false;
        nodes_.push_back({s.node, item});
        s.node = static_cast<std::uint32_t>(nodes_.size() - 1);
      }
      merged_.push_back(s);
    }
    front.swap(merged_);
    states_ += front.size();
    return states_ <= kMostStates;
  }

  static void merge_fronts(std::vector<State>& into, const std::vector<State>& other, std::vector<State>& scratch) {
    scratch.clear();
    std::size_t a = 0, b = 0;
    double best = -std::numeric_limits<double>::infinity();
    while (a < into.size() || b < other.size()) {
      const bool from_other =
          a == into.size() ||
          (b < other.size() &&
           (other[b].bytes < into[a].bytes || (other[b].bytes == into[a].bytes && other[b].value > into[a].value)));
      const State s = from_other ? other[b++] : into[a++];
      if (s.value <= best) continue;
      best = s.value;
      scratch.push_back(s);
    }
    into.swap(scratch);
  }

  // The exact search, pruned by the bound at `per_byte` against `floor` (the incumbent's value and
  // the tolerance): true where it ended, with its best state in `out` where one passes the floor.
  bool search(double per_byte, double floor, Choice& out) {
    const std::size_t n = groups_.size();
    std::vector<double> rest(n + 1, 0);  // each later group's best priced option, added up
    for (std::size_t k = n; k-- > 0;) {
      const OpGroup& g = groups_[k];
      const double best = std::max({0.0, ops_value(g, per_byte), g.save_gain(per_byte)});
      rest[k] = rest[k + 1] + best;
    }
    const double cap = static_cast<double>(capacity_);
    nodes_.assign(1, Node{0, 0});
    items_.clear();
    states_ = 0;
    std::vector<State> front{State{0, 0, 0}};
    std::vector<State> branch, scratch;
    for (std::size_t k = 0; k < n; ++k) {
      const OpGroup& g = groups_[k];
      const auto after = [&](double later) {
        return [&, later](const State& s) {
          return s.value + per_byte * (cap - static_cast<double>(s.bytes)) + later > floor;
        };
      };
      // The ops branch: the front less the overhead, then each op taken or not.
      branch.clear();
      if (!g.ops.empty()) {
        std::vector<double> ops_rest(g.ops.size() + 1, 0);
        for (std::size_t j = g.ops.size(); j-- > 0;) {
          const OpCost& c = op(g, g.ops[j]);
          ops_rest[j] = ops_rest[j + 1] + std::max(0.0, c.seconds - per_byte * static_cast<double>(c.bytes));
        }
        for (const State& s : front) branch.push_back({s.bytes, s.value - g.overhead, s.node});
        for (std::size_t j = 0; j < g.ops.size(); ++j) {
          const OpCost& c = op(g, g.ops[j]);
          items_.push_back({static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(g.ops[j])});
          if (!take(branch, c.bytes, c.seconds, static_cast<std::uint32_t>(items_.size() - 1),
                    after(ops_rest[j + 1] + rest[k + 1]))) {
            return false;
          }
        }
      }
      if (g.can_save) {
        items_.push_back({static_cast<std::uint32_t>(k), kSave});
        if (!take(front, g.save_bytes, g.save_value, static_cast<std::uint32_t>(items_.size() - 1),
                  after(rest[k + 1]))) {
          return false;
        }
      } else {
        const auto keep = after(rest[k + 1]);
        std::erase_if(front, [&](const State& s) { return !keep(s); });
      }
      merge_fronts(front, branch, scratch);
    }
    if (front.empty() || front.back().value <= floor) return true;  // nothing beats the incumbent
    const State& best = front.back();
    out.mode.assign(n, OpMode::none);
    out.kept.assign(n, {});
    out.value = best.value;
    out.bytes = best.bytes;
    for (std::uint32_t node = best.node; node != 0; node = nodes_[node].parent) {
      const Item& item = items_[nodes_[node].item];
      if (item.op == kSave) {
        out.mode[item.group] = OpMode::save;
      } else {
        out.mode[item.group] = OpMode::ops;
        out.kept[item.group].push_back(item.op);
      }
    }
    for (auto& kept : out.kept) std::sort(kept.begin(), kept.end());
    return true;
  }

  const RegionProfile& profile_;
  std::vector<OpGroup> groups_;
  std::uint64_t capacity_;
  std::vector<Node> nodes_;
  std::vector<Item> items_;
  std::vector<State> merged_;
  std::size_t states_ = 0;
};

// The regions with a choice to make within `capacity`, as groups (with every_region, also those
// that can neither be saved nor keep an op); `choices` gets the others' choice.
std::vector<OpGroup> op_groups(const RegionProfile& profile, std::uint64_t capacity, std::vector<Choice>& choices,
                               bool every_region = false);

// The ops each group's choice keeps, as RegionCost::ops entries, one list per region of the profile;
// `choices` gets each group's save.
std::vector<std::vector<OpCost>> kept_ops_of(const RegionProfile& profile, const std::vector<OpGroup>& groups,
                                             const OpSolver::Choice& chosen, std::vector<Choice>& choices);

}  // namespace remat::budget::detail
