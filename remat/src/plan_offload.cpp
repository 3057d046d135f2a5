// remat::plan_offloader: one CpuOffload per plan, for as long as the plan lives. Plans are held by
// the caller (CheckpointOptions::plan), so the offloaders are looked up by plan here, each beside a
// weak reference that tells a live plan from a new one made at a freed plan's address; an
// offloader whose plan is gone is let go at the next look-up (payloads still unpacked hold it).

#include <remat/budget/plan.hpp>
#include <remat/cpu_offload.hpp>

#include <algorithm>
#include <mutex>
#include <vector>

namespace remat {

namespace {

struct PlanOffloader {
  std::weak_ptr<const budget::RegionChoices> plan;
  std::shared_ptr<CpuOffload> offloader;
};

std::mutex g_mutex;
std::vector<PlanOffloader> g_offloaders;  // as many as plans in use: a handful

}  // namespace

std::shared_ptr<CpuOffload> plan_offloader(const std::shared_ptr<const budget::RegionChoices>& plan) {
  if (!plan || !plan->offloads_any()) return nullptr;
  const std::lock_guard<std::mutex> lock(g_mutex);
  std::erase_if(g_offloaders, [](const PlanOffloader& entry) { return entry.plan.expired(); });
  for (const PlanOffloader& entry : g_offloaders) {
    if (entry.plan.lock() == plan) return entry.offloader;
  }
  auto offloader = std::make_shared<CpuOffload>(CpuOffloadOptions{.prefetch = 1, .min_bytes = 0});
  g_offloaders.push_back({plan, offloader});
  return offloader;
}

}  // namespace remat
