// The trace of save/recompute decisions, the memory report, their dumps, and the CPU
// allocator guard that makes tensors carry tags.

#include "support.hpp"

#include <remat/alloc/tags.hpp>
#include <remat/diagnostics.hpp>

#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

using remat::testing::float_bytes;

namespace {

at::Tensor two_region_block(const std::string& name, const at::Tensor& x) {
  return remat::checkpoint({.region_name = name})([](const at::Tensor& in) {
    auto y = remat::region([](const at::Tensor& t) { return t.exp() * 3.0; }, "attention", false)(in);
    return remat::region([](const at::Tensor& t) { return t.sin().sum(); }, "mlp")(y);
  })(x);
}

TEST(Trace, FormatsOneScopeLinePerCheckpointAndOneLinePerRegion) {
  remat::collect_trace();
  auto x = at::rand({8}).requires_grad_(true);
  auto first = two_region_block("layers.0", x);
  auto loss = first + two_region_block("layers.1", x);
  const remat::RematTrace trace = remat::collect_trace();
  EXPECT_EQ(trace.format(),
            "remat trace: 2 checkpoint(s), 4 region(s)\n"
            "scope [layers.0]\n"
            "  attention: save\n"
            "  mlp: recompute\n"
            "scope [layers.1]\n"
            "  attention: save\n"
            "  mlp: recompute\n");
  EXPECT_TRUE(remat::collect_trace().scopes.empty());  // collecting clears
  const auto doc = nlohmann::json::parse(trace.to_json());
  EXPECT_EQ(doc["kind"], "remat-trace");
  EXPECT_EQ(doc["scopes"][1]["name"], "layers.1");
  EXPECT_EQ(doc["scopes"][1]["regions"][0]["decision"], "save");
  loss.backward();
}

TEST(MemoryReport, ListsWhatTheCheckpointKeepsPerRegionWithExactBytes) {
  constexpr std::int64_t N = 256;
  auto x = at::rand({N}).requires_grad_(true);
  remat::MemoryReport report;
  std::string text;
  auto loss = remat::checkpoint({.region_name = "m"})([&](const at::Tensor& in) {
    auto y = remat::region([](const at::Tensor& t) { return t.exp() * 3.0; }, "kept", false)(in);
    auto out = remat::region([](const at::Tensor& t, const at::Tensor& u) { return (t * u).sum(); }, "tail")(y, in);
    report = remat::current_memory_report();
    text = remat::format_current_memory_report();
    return out;
  })(x);
  ASSERT_EQ(report.regions.size(), 2u);
  EXPECT_EQ(report.checkpoint, "m");
  EXPECT_EQ(report.regions[0].region, "<inputs>");  // the tail region reads x again in recompute
  EXPECT_EQ(report.regions[0].bytes, float_bytes(N));
  EXPECT_EQ(report.regions[1].region, "m::kept");
  EXPECT_EQ(report.regions[1].bytes, float_bytes(2 * N));  // exp's saved result and the persisted output
  EXPECT_EQ(report.regions[1].storages, 2);
  ASSERT_EQ(report.regions[1].tensors.size(), 2u);
  EXPECT_EQ(report.regions[1].tensors[0].name, "saved.0");
  EXPECT_EQ(report.regions[1].tensors[0].shape, (std::vector<std::int64_t>{N}));
  EXPECT_EQ(report.regions[1].tensors[0].dtype, "float32");
  EXPECT_EQ(report.regions[1].tensors[1].name, "output.0");
  EXPECT_EQ(report.bytes, float_bytes(3 * N));
  EXPECT_EQ(text.rfind("m: 3.00 KiB resident in 3 storage(s)\n", 0), 0u) << text;
  EXPECT_NE(text.find("\n  1.00 KiB  saved.0   (256,)  float32\n"), std::string::npos) << text;
  const auto doc = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(doc["kind"], "memory-report");
  EXPECT_EQ(doc["regions"][1]["bytes"], float_bytes(2 * N));
  loss.backward();
}

TEST(MemoryReport, OutsideACheckpointIsAClearError) {
  try {
    remat::format_current_memory_report();
    FAIL();
  } catch (const remat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("only inside a checkpoint's forward"), std::string::npos);
  }
}

TEST(Dumps, AreWrittenAtomicallyAndParse) {
  auto x = at::rand({4}).requires_grad_(true);
  remat::collect_trace();
  two_region_block("dumped", x).backward();
  const auto path = std::filesystem::temp_directory_path() / ("remat-trace-" + std::to_string(getpid()) + ".json");
  remat::write_dump(path.string(), remat::collect_trace().to_json());
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  std::filesystem::remove(path);
  EXPECT_EQ(doc["scopes"][0]["name"], "dumped");
  EXPECT_GT(doc["pid"].get<long>(), 0);
}

TEST(CpuAllocatorGuard, TagsTensorsWhileInstalledAndRestoresThePreviousAllocator) {
  c10::Allocator* tagging = c10::GetCPUAllocator();
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), 100);
  at::Tensor tagged;
  {
    remat::CpuAllocatorGuard guard;
    EXPECT_EQ(c10::GetCPUAllocator(), tagging);
    auto region = remat::alloc::TagScope::region("guarded");
    tagged = at::empty({100}, at::kFloat);
    EXPECT_EQ(remat::live_bytes("guarded"), float_bytes(100));
  }
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  {
    auto region = remat::alloc::TagScope::region("guarded");
    auto untagged = at::empty({100}, at::kFloat);  // the default allocator: not counted
    EXPECT_EQ(remat::live_bytes("guarded"), float_bytes(100));
  }
  tagged = at::Tensor();  // freed through the tagging allocator even after the guard
  EXPECT_EQ(remat::live_bytes("guarded"), 0);
  c10::SetCPUAllocator(tagging, 100);
}

TEST(LiveBytes, PrefixCoversNestedRegionsByWholeComponents) {
  auto outer = remat::alloc::TagScope::region("lb.0");
  auto a = at::empty({10}, at::kFloat);
  auto inner = remat::alloc::TagScope::region("attention");
  auto b = at::empty({20}, at::kFloat);
  EXPECT_EQ(remat::live_bytes("lb.0"), float_bytes(30));
  EXPECT_EQ(remat::live_bytes("lb.0::attention"), float_bytes(20));
  EXPECT_EQ(remat::live_bytes("lb"), float_bytes(30));  // "." separates components too
  EXPECT_EQ(remat::live_bytes("l"), 0);
  EXPECT_EQ(remat::live_bytes("lb.00"), 0);
}

}  // namespace

// A budget plan in CheckpointOptions: the regions it names (by name or pattern) take its choice,
// the others keep theirs, and the gradients are those of the plain code.
TEST(BudgetPlan, RegionsTakeThePlansChoiceOverTheirOwn) {
  // Names of their own: the runtime remembers by name which checkpoints ran no save region, and
  // this plan leaves planned.0 without one.
  using remat::budget::Choice;
  const auto plan = std::make_shared<remat::budget::RegionChoices>(std::vector<std::pair<std::string, Choice>>{
      {"planned.*::attention", Choice::recompute}, {"planned.1::mlp", Choice::save}});
  auto block = [&](const std::string& name, const at::Tensor& x) {
    return remat::checkpoint({.region_name = name, .plan = plan})([](const at::Tensor& in) {
      auto y = remat::region([](const at::Tensor& t) { return t.exp() * 3.0; }, "attention", false)(in);
      auto z = remat::region([](const at::Tensor& t) { return t.sin() * 2.0; }, "mlp")(y);
      return remat::region([](const at::Tensor& t) { return t.cos().sum(); }, "head")(z);
    })(x);
  };
  remat::collect_trace();
  auto x = at::rand({8}).requires_grad_(true);
  auto first = block("planned.0", x);
  auto loss = first + block("planned.1", x);
  EXPECT_EQ(remat::collect_trace().format(),
            "remat trace: 2 checkpoint(s), 6 region(s)\n"
            "scope [planned.0]\n"
            "  attention: recompute\n"
            "  mlp: recompute\n"
            "  head: recompute\n"
            "scope [planned.1]\n"
            "  attention: recompute\n"
            "  mlp: save\n"
            "  head: recompute\n");
  loss.backward();
  auto reference = x.detach().clone().requires_grad_(true);
  auto plain = [](const at::Tensor& t) { return ((t.exp() * 3.0).sin() * 2.0).cos().sum(); };
  (plain(reference) + plain(reference)).backward();
  EXPECT_TRUE(at::equal(x.grad(), reference.grad()));
}
