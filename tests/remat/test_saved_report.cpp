// The saved-for-backward report, allocation sites in memory reports, and an out-of-memory
// error in a checkpointed forward.

#include "support.hpp"

#include <remat/alloc/tags.hpp>
#include <remat/saved_report.hpp>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace {

// Two checkpointed layers whose save region keeps two 3x4 float32 tensors each (sin and
// cos save their inputs), then a tanh head that saves its 3x4 result: 240 B in all.
at::Tensor two_layers_and_a_head(const at::Tensor& x) {
  at::Tensor h = x.clone();  // x itself, a leaf that requires grad, is the caller's and not billed
  for (int i = 0; i < 2; ++i) {
    h = remat::checkpoint({.region_name = "layer." + std::to_string(i)})([](const at::Tensor& in) {
      return remat::region([](const at::Tensor& t) { return t.sin().cos(); }, "block", /*recompute=*/false)(in);
    })(h);
  }
  return h.tanh().sum();
}

TEST(SavedReport, BillsRegionsFoldedAndTheRestByNode) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  at::Tensor loss;
  {
    remat::SavedTensorsTracking tracking;
    loss = two_layers_and_a_head(x);
  }
  const remat::SavedReport report = remat::saved_report(loss);
  EXPECT_EQ(report.total_bytes, 240);
  EXPECT_EQ(report.region_bytes, 192);
  EXPECT_EQ(report.outside_bytes, 48);
  EXPECT_EQ(report.regions, 2);
  EXPECT_EQ(report.format(),
            "saved for backward: 240 B resident -- 2 region(s) 192 B, outside regions 48 B\n"
            "\n"
            "regions:\n"
            "  96 B  x2  layer.0-1  (2 storages each)\n"
            "\n"
            "outside regions: 48 B in 1 storage\n"
            "       48 B  TanhBackward0 (x1)\n"
            "\n"
            "region detail:\n"
            "[x2: layer.0-1]\n"
            "layer.0: 96 B resident in 2 storage(s)\n"
            "layer.0::block: 96 B\n"
            "  48 B  saved.0  (3, 4)  float32\n"
            "  48 B  saved.1  (3, 4)  float32\n");
  const auto doc = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(doc["kind"], "saved-report");
  EXPECT_EQ(doc["region_groups"][0]["label"], "layer.0-1");
  EXPECT_EQ(doc["region_groups"][0]["bytes"], 192);
  loss.backward();
  EXPECT_EQ(remat::saved_report(loss).total_bytes, 0);  // backward released everything
}

TEST(SavedReport, AStorageSharedByTwoSavesIsBilledOnce) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  at::Tensor loss;
  {
    remat::SavedTensorsTracking tracking;
    auto t = x * 2.0;
    loss = (t * t).sum() + t.sin().sum();  // mul saves t twice, sin saves t once more
  }
  const remat::SavedReport report = remat::saved_report(loss);
  EXPECT_EQ(report.total_bytes, 48);
  EXPECT_EQ(report.regions, 0);
}

TEST(SavedReport, FoldsIndicesWithGapsIntoACommaList) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  at::Tensor loss;
  {
    remat::SavedTensorsTracking tracking;
    at::Tensor h = x.clone();
    for (const int i : {0, 2, 3, 10}) {
      h = remat::checkpoint({.region_name = "layer." + std::to_string(i) + ".mlp"})([](const at::Tensor& in) {
        return remat::region([](const at::Tensor& t) { return t.sin().cos(); }, "block", /*recompute=*/false)(in);
      })(h);
    }
    loss = h.sum();
  }
  const remat::SavedReport report = remat::saved_report(loss);
  ASSERT_EQ(report.region_groups.size(), 1U);
  EXPECT_EQ(report.region_groups[0].label, "layer.0,2,3,10.mlp");
  EXPECT_EQ(report.region_groups[0].count, 4);
  EXPECT_EQ(report.region_groups[0].bytes, 4 * 96);
}

TEST(SavedReport, WithoutTrackingOnlyCheckpointsAreSeen) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  auto loss = two_layers_and_a_head(x);
  EXPECT_EQ(remat::saved_report(loss).total_bytes, 0);
}

TEST(Sites, MemoryReportNamesTheSiteAndViewsShareIt) {
  constexpr std::int64_t N = 64;
  auto x = at::rand({N}).requires_grad_(true);
  remat::MemoryReport report;
  auto loss = remat::checkpoint({.region_name = "sited"})([&](const at::Tensor& in) {
    auto y = remat::region(
        [](const at::Tensor& t) {
          REMAT_SITE("experts");
          auto e = t.exp();
          return e.view({8, 8});  // a view of the exp result
        },
        "moe", false)(in);
    auto out = remat::region([](const at::Tensor& t) { return t.sum(); }, "tail")(y);
    report = remat::current_memory_report();
    return out;
  })(x);
  ASSERT_EQ(report.regions.size(), 1u);
  const auto& tensors = report.regions[0].tensors;
  ASSERT_EQ(tensors.size(), 2u);  // the output view and exp's saved result share one storage
  EXPECT_EQ(report.regions[0].storages, 1);
  EXPECT_EQ(tensors[0].site, "experts");
  EXPECT_EQ(tensors[1].site, "experts");
  EXPECT_NE(report.format().find("@experts"), std::string::npos);
  loss.backward();
}

TEST(OutOfMemory, ADumpNamesTheRegionHoldingMostAndTheJobContinues) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("remat-ckpt-oom-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // 1024 MiB host capacity: a 0.0625 share caps this run at 64 MiB.
  remat::alloc::configure("memory_fraction:0.0625,oom_dump_interval_ms:0,oom_dump_dir:" + dir.string());
  auto x = at::rand({1024, 1024}).requires_grad_(true);  // 4 MiB
  bool caught = false;
  try {
    auto loss = remat::checkpoint({.region_name = "big"})([](const at::Tensor& in) {
      auto kept = remat::region(
          [](const at::Tensor& t) {
            std::vector<at::Tensor> parts;
            for (int i = 0; i < 10; ++i) parts.push_back(t * static_cast<double>(i));  // 40 MiB held here
            return at::stack(parts);  // and 40 MiB more: over the cap
          },
          "hog", false)(in);
      return kept.sum();
    })(x);
  } catch (const c10::OutOfMemoryError&) {
    caught = true;
  }
  remat::alloc::configure("memory_fraction:1,oom_dump_dir:,oom_dump_interval_ms:10000");
  ASSERT_TRUE(caught);
  std::vector<fs::path> dumps;
  for (const auto& entry : fs::directory_iterator(dir)) dumps.push_back(entry.path());
  ASSERT_EQ(dumps.size(), 1u);
  const auto doc = nlohmann::json::parse(std::ifstream(dumps[0]));
  EXPECT_EQ(doc["holders"]["by_region"][0]["name"], "big::hog");
  EXPECT_EQ(doc["tag_stack"][0], "region big");
  fs::remove_all(dir);
  // The job goes on: the same work fits once the cap is lifted.
  auto y = (x * 2.0).sum();
  y.backward();
  EXPECT_TRUE(at::allclose(x.grad(), at::full_like(x, 2.0)));
}

}  // namespace
