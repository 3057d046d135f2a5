// The label: one process-wide tag dimension (PyTorch's _set_memory_metadata) laid over every
// thread's tag stack.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/oom.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <thread>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

// The label is process-wide: every test leaves it cleared, whatever it asserts.
class Labels : public ::testing::Test {
 protected:
  void SetUp() override { set_label(""); }
  void TearDown() override { set_label(""); }
};

std::string label_of_block(const HostAllocator& a, void* ptr) {
  return name_of(tag_of(*a.allocator->tag_of_block(ptr)).label);
}

const TagStats* stats_of(const AllocatorSnapshot& snap, TagId tag) {
  for (const TagStatsEntry& entry : snap.tag_stats) {
    if (entry.tag == tag) return &entry.stats;
  }
  return nullptr;
}

}  // namespace

TEST_F(Labels, ALabelSetOnOneThreadTagsAllocationsOnEveryThread) {
  HostAllocator a;
  set_label("step 3");
  void* here = a.alloc(1000);
  void* there = nullptr;
  std::string label_there;
  std::thread worker([&] {
    label_there = current_label();
    auto region = TagScope::region("worker");
    there = a.alloc(2000);
  });
  worker.join();
  EXPECT_EQ(label_there, "step 3");
  EXPECT_EQ(label_of_block(a, here), "step 3");
  EXPECT_EQ(label_of_block(a, there), "step 3");
  EXPECT_EQ(name_of(tag_of(*a.allocator->tag_of_block(there)).region), "worker");

  // Set on a worker, seen on this thread.
  std::thread setter([] { set_label("step 4"); });
  setter.join();
  EXPECT_EQ(current_label(), "step 4");
  void* later = a.alloc(3000);
  EXPECT_EQ(label_of_block(a, later), "step 4");
  for (void* p : {here, there, later}) a.free(p);
}

TEST_F(Labels, PushesUnderALabelKeepLabelFreeFramesAndCarryTheLabel) {
  auto region = TagScope::region("layers.0");
  const TagId unlabelled = current_tag_id();
  set_label("warmup");
  EXPECT_NE(current_tag_id(), unlabelled);
  EXPECT_EQ(name_of(current_tag().label), "warmup");
  {
    auto site = TagScope::site("experts");
    const Tag tag = current_tag();
    EXPECT_EQ(name_of(tag.region), "layers.0");
    EXPECT_EQ(name_of(tag.site), "experts");
    EXPECT_EQ(name_of(tag.label), "warmup");
    EXPECT_EQ(tag_of(current_tag_id()), tag);
    EXPECT_EQ(describe_tag_stack(), (std::vector<std::string>{"region layers.0", "site experts"}));
  }
  const Tag back = tag_of(current_tag_id());
  EXPECT_EQ(name_of(back.region), "layers.0");
  EXPECT_EQ(back.site, 0u);
  EXPECT_EQ(name_of(back.label), "warmup");
  set_label("");
  EXPECT_EQ(current_tag_id(), unlabelled);
}

TEST_F(Labels, ChangingOrClearingTheLabelRetagsTheNextAllocation) {
  HostAllocator a;
  auto region = TagScope::region("loop");
  set_label("a");
  void* first = a.alloc(512);
  set_label("b");
  void* second = a.alloc(512);
  set_label("a");
  void* third = a.alloc(512);
  set_label("");
  EXPECT_EQ(current_label(), "");
  void* fourth = a.alloc(512);
  EXPECT_EQ(label_of_block(a, first), "a");
  EXPECT_EQ(label_of_block(a, second), "b");
  EXPECT_EQ(label_of_block(a, third), "a");
  EXPECT_EQ(tag_of(*a.allocator->tag_of_block(fourth)).label, 0u);
  EXPECT_EQ(*a.allocator->tag_of_block(first), *a.allocator->tag_of_block(third));
  for (void* p : {first, second, third, fourth}) a.free(p);
}

TEST_F(Labels, PerTagStatisticsSplitOneRegionByLabel) {
  HostAllocator a;
  auto region = TagScope::region("layers.1");
  set_label("forward 0");
  const TagId forward0 = current_tag_id();
  void* p = a.alloc(1000);
  void* q = a.alloc(3000);
  set_label("forward 1");
  const TagId forward1 = current_tag_id();
  void* r = a.alloc(5000);
  a.free(q);
  const AllocatorSnapshot snap = a.allocator->snapshot();
  const TagStats* s0 = stats_of(snap, forward0);
  const TagStats* s1 = stats_of(snap, forward1);
  ASSERT_NE(s0, nullptr);
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(s0->requested_bytes.current, 1000);
  EXPECT_EQ(s0->requested_bytes.peak, 4000);
  EXPECT_EQ(s0->count.total_added, 2u);
  EXPECT_EQ(s1->requested_bytes.current, 5000);
  EXPECT_EQ(s1->count.current, 1);
  EXPECT_EQ(a.allocator->live_requested_bytes("layers.1"), 6000);
  a.free(p);
  a.free(r);
}

TEST_F(Labels, ALabelLongerThanANameMayBeIsRefusedAndTheLabelKept) {
  set_label("kept");
  const std::string huge(kMaxTagNameBytes + 1, 'x');
  try {
    set_label(huge);
    FAIL() << "a label of " << huge.size() << " bytes was accepted";
  } catch (const InvalidArgumentError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("label 'xxxx"), std::string::npos) << message;
    EXPECT_NE(message.find("(4097 bytes) is longer than 4096 bytes; pass a shorter label"), std::string::npos)
        << message;
  }
  EXPECT_EQ(current_label(), "kept");
  set_label(std::string(kMaxTagNameBytes, 'y'));  // at the bound: accepted
  EXPECT_EQ(current_label().size(), kMaxTagNameBytes);
}

TEST_F(Labels, SnapshotsWriteTheLabelOnlyForTagsThatHaveOne) {
  HostAllocator a;
  void* plain = nullptr;
  void* labelled = nullptr;
  {
    auto region = TagScope::region("layers.2");
    plain = a.alloc(1000);
    set_label("eval");
    labelled = a.alloc(1000);
    set_label("");
  }
  const auto doc = nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()));
  const auto& tags = doc["tags"];
  const auto& names = doc["names"];
  const auto& plain_tag = tags[*a.allocator->tag_of_block(plain)];
  const auto& labelled_tag = tags[*a.allocator->tag_of_block(labelled)];
  EXPECT_FALSE(plain_tag.contains("label"));
  EXPECT_EQ(names[plain_tag["region"].get<std::size_t>()], "layers.2");
  ASSERT_TRUE(labelled_tag.contains("label"));
  EXPECT_EQ(names[labelled_tag["label"].get<std::size_t>()], "eval");
  EXPECT_EQ(names[labelled_tag["region"].get<std::size_t>()], "layers.2");
  a.free(plain);
  a.free(labelled);
}

TEST_F(Labels, OomReportsHoldersByLabelWhenAnyMemoryHasOne) {
  HostAllocator a("oom_dump_interval_ms:0", 64);
  void* unlabelled = a.alloc(8 * MiB);
  set_label("optimizer step");
  void* labelled = a.alloc(20 * MiB);
  const std::shared_ptr<const OomReport> report = a.oom_report_of(60 * MiB);
  ASSERT_NE(report, nullptr);
  ASSERT_EQ(report->by_label.size(), 2u);
  EXPECT_EQ(report->by_label[0].name, "optimizer step");
  EXPECT_EQ(report->by_label[0].bytes, 20 * MiB);
  EXPECT_EQ(report->by_label[1].name, "<no label>");
  EXPECT_EQ(report->by_label[1].bytes, 8 * MiB);
  const auto doc = nlohmann::json::parse(oom_report_to_json(*report));
  EXPECT_EQ(doc["holders"]["by_label"][0]["name"], "optimizer step");
  EXPECT_EQ(doc["holders"]["by_label"][0]["blocks"], 1);
  a.free(unlabelled);
  a.free(labelled);
}
