// Categories: what memory is for (parameter, gradient, ...), set per thread for the allocations
// that follow, or given to a live block afterwards (retag), counted per tag and written in dumps.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <thread>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

// The category is per thread: every test leaves this thread's cleared.
class Categories : public ::testing::Test {
 protected:
  void SetUp() override { set_category(Category::none, ""); }
  void TearDown() override { set_category(Category::none, ""); }
};

Tag tag_of_block(const HostAllocator& a, void* ptr) { return tag_of(*a.allocator->tag_of_block(ptr)); }

std::int64_t live_bytes_of(const HostAllocator& a, Category category) {
  std::int64_t total = 0;
  for (const TagStatsEntry& entry : a.allocator->tag_stats()) {
    if (tag_of(entry.tag).category == category) total += entry.stats.bytes.current;
  }
  return total;
}

}  // namespace

TEST_F(Categories, SetCategoryTagsThisThreadsAllocationsOnly) {
  HostAllocator a;
  set_category(Category::temporary, "layers.0.mlp");
  auto region = TagScope::region("layers.0");
  void* here = a.alloc(1000);
  void* there = nullptr;
  std::thread worker([&] { there = a.alloc(2000); });
  worker.join();
  const Tag mine = tag_of_block(a, here);
  EXPECT_EQ(mine.category, Category::temporary);
  EXPECT_EQ(name_of(mine.module), "layers.0.mlp");
  EXPECT_EQ(name_of(mine.region), "layers.0");  // the stack's tag stays under the category
  EXPECT_EQ(tag_of_block(a, there).category, Category::none);
  EXPECT_EQ(tag_of_block(a, there).module, 0u);
  a.free(here);
  a.free(there);
}

TEST_F(Categories, RetagMovesALiveBlocksBytesBetweenCategories) {
  HostAllocator a;
  void* weight = a.alloc(3 * MiB);
  void* other = a.alloc(1 * MiB);
  const TagId before = *a.allocator->tag_of_block(weight);
  const TagId parameter = with_category(before, Category::parameter, "layers.0.weight");
  EXPECT_EQ(a.allocator->retag_block(weight, parameter), before);
  EXPECT_EQ(live_bytes_of(a, Category::parameter), 3 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(live_bytes_of(a, Category::none), 1 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(name_of(tag_of_block(a, weight).module), "layers.0.weight");
  // Keeping the module: only the category changes.
  const TagId activation = with_category(parameter, Category::activation, std::nullopt);
  EXPECT_EQ(name_of(tag_of(activation).module), "layers.0.weight");
  // Back to the tag it had; the freed block leaves no bytes behind under either tag.
  EXPECT_EQ(a.allocator->retag_block(weight, before), parameter);
  EXPECT_EQ(live_bytes_of(a, Category::parameter), 0);
  a.free(weight);
  EXPECT_EQ(live_bytes_of(a, Category::none), 1 * static_cast<std::int64_t>(MiB));
  // A pointer the allocator did not return (or freed) is not retagged.
  EXPECT_FALSE(a.allocator->retag_block(weight, parameter).has_value());
  a.free(other);
}

TEST_F(Categories, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const char* name :
       {"parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "other", "none"}) {
    EXPECT_EQ(to_string(category_from_string(name)), name);
  }
  try {
    category_from_string("weights");
    FAIL() << "an unknown category was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'weights' is not valid; pass parameter"), std::string::npos) << e.what();
  }
  EXPECT_THROW(set_category(Category::temporary, std::string(kMaxTagNameBytes + 1, 'm')), InvalidArgumentError);
}

TEST_F(Categories, SnapshotTagTablesWriteCategoryAndModuleOnlyWhenSet) {
  HostAllocator a;
  void* plain = a.alloc(1000);
  set_category(Category::gradient, "lm_head.weight");
  void* grad = a.alloc(2000);
  const auto doc = nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()));
  const auto& names = doc["names"];
  const auto& tags = doc["tags"];
  const auto plain_tag = tags[*a.allocator->tag_of_block(plain)];
  const auto grad_tag = tags[*a.allocator->tag_of_block(grad)];
  EXPECT_FALSE(plain_tag.contains("category"));
  EXPECT_FALSE(plain_tag.contains("module"));
  EXPECT_EQ(grad_tag["category"], "gradient");
  EXPECT_EQ(names[grad_tag["module"].get<std::size_t>()], "lm_head.weight");
  a.free(plain);
  a.free(grad);
}

TEST_F(Categories, OomReportsHoldersByCategoryAndModule) {
  HostAllocator a("oom_dump_interval_ms:0", 64);
  void* untracked = a.alloc(8 * MiB);
  set_category(Category::optimizer_state, "layers.0.weight");
  void* state = a.alloc(20 * MiB);
  set_category(Category::activation, "layers.0");
  void* kept = a.alloc(12 * MiB);
  const std::shared_ptr<const OomReport> report = a.oom_report_of(60 * MiB);
  ASSERT_NE(report, nullptr);
  ASSERT_EQ(report->by_category.size(), 3u);
  EXPECT_EQ(report->by_category[0].name, "optimizer_state");
  EXPECT_EQ(report->by_category[0].bytes, 20 * MiB);
  EXPECT_EQ(report->by_category[1].name, "activation");
  EXPECT_EQ(report->by_category[2].name, "<no category>");
  EXPECT_EQ(report->by_module[0].name, "layers.0.weight");
  EXPECT_EQ(report->by_module[1].name, "layers.0");
  const auto doc = nlohmann::json::parse(oom_report_to_json(*report));
  EXPECT_EQ(doc["holders"]["by_category"][0]["bytes"], 20 * MiB);
  EXPECT_EQ(doc["holders"]["by_module"][2]["name"], "<no module>");
  a.free(untracked);
  a.free(state);
  a.free(kept);
}

// Labels (test_labels.cpp) are grouped the same way: no memory with one, no group.
TEST_F(Categories, OomReportsWithoutCategoriesOrLabelsHaveNoGroupsForThem) {
  set_label("");  // the label is process-wide: none in force here
  HostAllocator a("oom_dump_interval_ms:0", 64);
  void* p = a.alloc(8 * MiB);
  const std::shared_ptr<const OomReport> report = a.oom_report_of(60 * MiB);
  ASSERT_NE(report, nullptr);
  EXPECT_TRUE(report->by_category.empty());
  EXPECT_TRUE(report->by_label.empty());
  const auto holders = nlohmann::json::parse(oom_report_to_json(*report))["holders"];
  EXPECT_FALSE(holders.contains("by_category"));
  EXPECT_FALSE(holders.contains("by_module"));
  EXPECT_FALSE(holders.contains("by_label"));
  a.free(p);
}

TEST_F(Categories, BytesPerCategoryAreKeptNowAndAtThePeak) {
  HostAllocator a;
  auto at = [](const std::array<std::int64_t, 8>& bytes, Category c) { return bytes[static_cast<std::size_t>(c)]; };
  set_category(Category::parameter, "w");
  void* weight = a.alloc(4 * MiB);
  set_category(Category::temporary, "layers.0");
  void* scratch = a.alloc(6 * MiB);  // the peak: 10 MiB
  a.free(scratch);
  set_category(Category::gradient, "w");
  void* grad = a.alloc(2 * MiB);
  AllocatorStats s = a.allocator->stats();
  EXPECT_EQ(at(s.category_bytes, Category::parameter), 4 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(at(s.category_bytes, Category::temporary), 0);
  EXPECT_EQ(at(s.category_bytes, Category::gradient), 2 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(at(s.category_bytes_at_peak, Category::temporary), 6 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(at(s.category_bytes_at_peak, Category::gradient), 0);
  EXPECT_EQ(at(s.category_requested_bytes_at_peak, Category::parameter), 4 * static_cast<std::int64_t>(MiB));
  // A retag moves the bytes held now; a new peak period starts from what is held.
  a.allocator->retag_block(grad,
                           with_category(*a.allocator->tag_of_block(grad), Category::optimizer_state, std::nullopt));
  a.allocator->reset_peak_stats();
  s = a.allocator->stats();
  EXPECT_EQ(at(s.category_bytes, Category::gradient), 0);
  EXPECT_EQ(at(s.category_bytes_at_peak, Category::optimizer_state), 2 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(at(s.category_bytes_at_peak, Category::temporary), 0);
  a.free(weight);
  a.free(grad);
}
