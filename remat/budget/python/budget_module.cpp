// remat._budget: remat::budget for the remat package, so that profile.plan() and
// `remat-report advise` make the same plan from the same dump. Dumps cross as JSON text, which
// the C++ readers check field by field; a profile is read once into a Profile, which every
// function planning from one takes. Standard C++ over pybind11's headers; no
// LibTorch. Plans are made without the GIL (the arguments are C++ strings by then), so other Python threads run.

#include <remat/budget/budget_text.hpp>
#include <remat/budget/offload_plan.hpp>
#include <remat/budget/op_plan.hpp>
#include <remat/budget/plan.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace py = pybind11;

namespace remat::budget {
namespace {

// solve(profile), or solve of the profile grouped by pattern where `group`.
template <class Solve>
auto solved(const RegionProfile& profile, bool group, Solve&& solve) {
  return group ? solve(grouped(profile)) : solve(profile);
}

// The first eight names, comma separated, " ..." after them when there are more.
std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) text += (i == 0 ? "" : ", ") + names[i];
  return names.size() > 8 ? text + " ..." : text;
}

}  // namespace
}  // namespace remat::budget

PYBIND11_MODULE(_budget, m) {
  using namespace remat::budget;
  m.doc() = "Budget plans from region profiles (use remat.profile_regions and remat.RegionProfile)";
  py::register_exception<BudgetError>(m, "BudgetError", PyExc_ValueError);
  py::class_<RegionProfile>(m, "Profile",
                            "A region-profile dump, read and checked once: a 10,000-region profile with per-op "
                            "figures takes most of a second to read, a plan from it a fraction of that.")
      .def(py::init([](const std::string& text, const std::string& source) {
             py::gil_scoped_release release;
             return profile_from_json(text, source);
           }),
           py::arg("text"), py::arg("source") = "profile")
      .def("to_json", &profile_to_json, "The region-profile dump, as checked.");
  m.def(
      "plan",
      [](const RegionProfile& profile, std::uint64_t budget_bytes, bool group) {
        return solved(profile, group, [&](const RegionProfile& p) { return plan_to_json(solve(p, budget_bytes)); });
      },
      py::arg("profile"), py::arg("budget_bytes"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest plan within the budget, from a region-profile dump.");
  m.def(
      "plan_ops",
      [](const RegionProfile& profile, std::uint64_t budget_bytes) {
        return plan_to_json(solve_ops(profile, budget_bytes));
      },
      py::arg("profile"), py::arg("budget_bytes"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest per-op plan within the budget (regions saved, recomputed, or "
      "recomputed keeping some ops' outputs), from a region-profile dump with per-op figures.");
  m.def(
      "plan_ops_at",
      [](const RegionProfile& profile, const std::vector<std::uint64_t>& budgets) {
        std::vector<std::string> plans;
        for (const std::uint64_t budget : budgets) plans.push_back(plan_to_json(solve_ops(profile, budget)));
        return plans;
      },
      py::arg("profile"), py::arg("budgets"), py::call_guard<py::gil_scoped_release>(),
      "plan_ops at each budget, the profile read once.");
  m.def(
      "plan_offload",
      [](const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes, bool group) {
        return solved(profile, group, [&](const RegionProfile& p) {
          return plan_to_json(solve_offload(p, budget_bytes, host_budget_bytes));
        });
      },
      py::arg("profile"), py::arg("budget_bytes"), py::arg("host_budget_bytes"), py::arg("group") = false,
      py::call_guard<py::gil_scoped_release>(),
      "The remat_plan dump of the fastest plan (each region saved, recomputed or offloaded; by pattern when group) "
      "within the device budget and the host budget, from a region_profile dump with copy figures.");
  m.def(
      "plan_by_peak",
      [](const RegionProfile& profile, std::uint64_t peak_bytes, bool group) {
        return solved(profile, group, [&](const RegionProfile& p) { return plan_to_json(solve_peak(p, peak_bytes)); });
      },
      py::arg("profile"), py::arg("peak_bytes"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest plan whose predicted step peak is within peak_bytes.");
  m.def(
      "plan_by_peak_ops",
      [](const RegionProfile& profile, std::uint64_t peak_bytes) {
        return plan_to_json(solve_peak_ops(profile, peak_bytes));
      },
      py::arg("profile"), py::arg("peak_bytes"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest per-op plan whose predicted step peak, kept ops counted, is within "
      "peak_bytes.");
  m.def(
      "plan_ops_offload",
      [](const RegionProfile& profile, std::uint64_t budget_bytes, std::uint64_t host_budget_bytes) {
        return plan_to_json(solve_ops_offload(profile, budget_bytes, host_budget_bytes));
      },
      py::arg("profile"), py::arg("budget_bytes"), py::arg("host_budget_bytes"),
      py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest per-op plan with offload (regions saved, recomputed, recomputed keeping "
      "some ops' outputs, or offloaded) within the device budget and the host budget.");
  m.def(
      "plan_by_peak_ops_offload",
      [](const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes) {
        return plan_to_json(solve_peak_ops_offload(profile, peak_bytes, host_budget_bytes));
      },
      py::arg("profile"), py::arg("peak_bytes"), py::arg("host_budget_bytes"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest per-op plan with offload whose predicted step peak is within peak_bytes "
      "and whose offloaded bytes are within host_budget_bytes.");
  m.def(
      "plan_by_peak_offload",
      [](const RegionProfile& profile, std::uint64_t peak_bytes, std::uint64_t host_budget_bytes) {
        return plan_to_json(solve_peak_offload(profile, peak_bytes, host_budget_bytes));
      },
      py::arg("profile"), py::arg("peak_bytes"), py::arg("host_budget_bytes"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dump of the fastest plan (each region saved, recomputed or offloaded) whose predicted step "
      "peak is within peak_bytes and whose offloaded bytes are within host_budget_bytes.");
  m.def(
      "least_peak_offload",
      [](const RegionProfile& profile, std::uint64_t host_budget_bytes) {
        return least_step_peak_offload(profile, host_budget_bytes);
      },
      py::arg("profile"), py::arg("host_budget_bytes"), py::call_guard<py::gil_scoped_release>(),
      "The least step peak any plan reaches with host_budget_bytes for offloaded regions.");
  m.def(
      "least_peak",
      [](const RegionProfile& profile, bool group) {
        return solved(profile, group, [](const RegionProfile& p) { return least_step_peak(p); });
      },
      py::arg("profile"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "The least step peak any plan reaches, as predicted from the profile's step memory.");
  m.def(
      "predict_peak",
      [](const RegionProfile& profile, const std::map<std::string, bool>& recompute_by_region, bool group,
         const std::map<std::string, bool>& offloaded_by_region,
         const std::map<std::string, std::vector<std::uint32_t>>& kept_ops_by_region) {
        return solved(profile, group, [&](const RegionProfile& parsed) {
          std::vector<Choice> choices;
          std::vector<std::string> missing;
          for (const RegionCost& region : parsed.regions) {
            const auto found = recompute_by_region.find(region.name);
            if (found == recompute_by_region.end()) {
              missing.push_back(region.name);
            } else {
              choices.push_back(found->second ? Choice::recompute : Choice::save);
            }
          }
          if (!missing.empty()) {
            throw BudgetError("predict_peak: the plan does not name " + std::to_string(missing.size()) +
                              " region(s) of the profile" + (group ? " (grouped by pattern)" : "") + ": " +
                              listed(missing));
          }
          if (recompute_by_region.size() != parsed.regions.size()) {
            std::vector<std::string> unknown;
            for (const auto& [name, recompute] : recompute_by_region) {
              const bool known = std::any_of(parsed.regions.begin(), parsed.regions.end(),
                                             [&](const RegionCost& region) { return region.name == name; });
              if (!known) unknown.push_back(name);
            }
            throw BudgetError("predict_peak: the plan names " + std::to_string(unknown.size()) +
                              " region(s) the profile" + (group ? " (grouped by pattern)" : "") +
                              " does not have: " + listed(unknown));
          }
          std::vector<bool> offloaded;
          for (const RegionCost& region : parsed.regions) {
            const auto found = offloaded_by_region.find(region.name);
            offloaded.push_back(found != offloaded_by_region.end() && found->second);
          }
          if (!kept_ops_by_region.empty()) {
            KeptOps kept;
            for (const RegionCost& region : parsed.regions) {
              const auto found = kept_ops_by_region.find(region.name);
              kept.push_back(found == kept_ops_by_region.end() ? std::vector<std::uint32_t>{} : found->second);
            }
            return offloaded_by_region.empty() ? predict_step_peak(parsed, choices, kept)
                                               : predict_step_peak(parsed, choices, offloaded, kept);
          }
          if (offloaded_by_region.empty()) return predict_step_peak(parsed, choices);
          return predict_step_peak(parsed, choices, offloaded);
        });
      },
      py::arg("profile"), py::arg("recompute_by_region"), py::arg("group"),
      py::arg("offloaded_by_region") = std::map<std::string, bool>{},
      py::arg("kept_ops_by_region") = std::map<std::string, std::vector<std::uint32_t>>{},
      py::call_guard<py::gil_scoped_release>(),
      "The predicted step peak with each region of the profile (grouped by pattern when group) recomputed or "
      "saved as recompute_by_region says, offloaded where offloaded_by_region says so, and keeping the ops (by "
      "index) kept_ops_by_region names.");
  m.def(
      "frontier",
      [](const RegionProfile& profile, std::size_t steps, bool group) {
        std::vector<std::string> plans;
        const std::vector<Plan> spread =
            solved(profile, group, [&](const RegionProfile& p) { return frontier(p, steps); });
        for (const Plan& plan : spread) plans.push_back(plan_to_json(plan));
        return plans;
      },
      py::arg("profile"), py::arg("steps"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "The remat-plan dumps of the fastest plans at budgets spread from the least to everything saved.");
  m.def(
      "check_profile",
      [](const std::string& text, const std::string& source) {
        return profile_to_json(profile_from_json(text, source));
      },
      py::arg("text"), py::arg("source"), "The region-profile dump, checked and written again.");
  m.def(
      "check_plan",
      [](const std::string& text, const std::string& source) { return plan_to_json(plan_from_json(text, source)); },
      py::arg("text"), py::arg("source"), "The remat-plan dump, checked and written again.");
  m.def(
      "parse_budget", [](const std::string& text, const std::string& what) { return parse_budget(text, what); },
      py::arg("text"), py::arg("what"),
      "The bytes a budget string stands for (\"70GiB\", \"512 MiB\", \"80GB\"); BudgetError names the forms accepted.");
  m.def(
      "parse_host_budget",
      [](const std::string& text, const std::string& what) { return parse_host_budget(text, what); }, py::arg("text"),
      py::arg("what"), "As parse_budget, but zero (\"0B\", \"0 GiB\") is accepted: no offload.");
  m.attr("BUDGET_FORMS") = std::string(kBudgetForms);
  m.def("matches", &matches, py::arg("pattern"), py::arg("name"),
        "Whether a region name matches a plan's pattern (each '*' stands for a number: a run of digits).");
}
