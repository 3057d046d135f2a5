#include "support/host_allocator.hpp"
#include "support/process_status.hpp"
#include "support/sanitized.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/tags.hpp>

#include <gtest/gtest.h>

#include <thread>

using namespace remat::alloc;
using namespace remat::alloc::testing;

namespace {

const TagStats* stats_of(const AllocatorSnapshot& snap, TagId tag) {
  for (const TagStatsEntry& entry : snap.tag_stats) {
    if (entry.tag == tag) return &entry.stats;
  }
  return nullptr;
}

}  // namespace

TEST(Tags, NestedRegionsComposeTheirPaths) {
  auto outer = TagScope::region("layers.0");
  auto inner = TagScope::region("attention");
  EXPECT_EQ(name_of(current_tag().region), "layers.0::attention");
}

TEST(Tags, RegionToPushIsThePartOfThePathPastTheRegionInForce) {
  EXPECT_EQ(region_path("layers.0", "attention"), "layers.0::attention");
  EXPECT_EQ(region_to_push("", "layers.0::attention"), "layers.0::attention");
  EXPECT_EQ(region_to_push("layers.0", "layers.0::attention"), "attention");
  EXPECT_EQ(region_to_push("outer::layers.0", "layers.0::attention"), "attention");
  EXPECT_EQ(region_to_push("layers.0::attention", "layers.0::attention"), "");
  // Whole components only: "xlayers.0" does not end in the component "layers.0".
  EXPECT_EQ(region_to_push("xlayers.0", "layers.0::attention"), "layers.0::attention");
  EXPECT_EQ(region_to_push("other", "layers.0::attention"), "layers.0::attention");
}

TEST(Tags, ARegionWithItsPolicyIsOneFrame) {
  auto outer = TagScope::region("layers.2");
  auto policy = TagScope::policy(Policy::save);
  const std::size_t depth = tag_stack_depth();
  TagId mlp = 0;
  {
    auto inner = TagScope::region("mlp", Policy::recompute);
    mlp = current_tag_id();
    EXPECT_EQ(tag_stack_depth(), depth + 1);
    EXPECT_EQ(name_of(current_tag().region), "layers.2::mlp");
    EXPECT_EQ(current_tag().policy, Policy::recompute);
    auto plain = TagScope::region("inner");  // a plain region keeps the policy in force
    EXPECT_EQ(current_tag().policy, Policy::recompute);
  }
  EXPECT_EQ(name_of(current_tag().region), "layers.2");
  EXPECT_EQ(current_tag().policy, Policy::save);
  auto again = TagScope::region("mlp", Policy::recompute);
  EXPECT_EQ(current_tag_id(), mlp);
  auto separate = TagScope::region("x");
  EXPECT_EQ(name_of(current_tag().region), "layers.2::mlp::x");
}

TEST(Tags, ScopesRestoreTheOuterTagOnExit) {
  const TagId before = current_tag_id();
  {
    auto region = TagScope::region("layers.1");
    auto phase = TagScope::phase(Phase::forward);
    auto policy = TagScope::policy(Policy::save);
    auto site = TagScope::site("experts");
    auto slot = TagScope::recv_slot({2, Direction::backward, 1});
    const Tag tag = current_tag();
    EXPECT_EQ(name_of(tag.region), "layers.1");
    EXPECT_EQ(tag.phase, Phase::forward);
    EXPECT_EQ(tag.policy, Policy::save);
    EXPECT_EQ(name_of(tag.site), "experts");
    EXPECT_TRUE(tag.has_recv);
    EXPECT_EQ(tag.recv, (RecvSlot{2, Direction::backward, 1}));
    EXPECT_EQ(tag_stack_depth(), 5u);
  }
  EXPECT_EQ(current_tag_id(), before);
  EXPECT_EQ(tag_stack_depth(), 0u);
}

TEST(Tags, EqualTagsInternToTheSameId) {
  TagId first = 0;
  {
    auto region = TagScope::region("same");
    first = current_tag_id();
  }
  auto region = TagScope::region("same");
  EXPECT_EQ(current_tag_id(), first);
  EXPECT_NE(first, 0u);
}

TEST(Tags, PopOnAnEmptyStackIsAClearError) {
  try {
    pop_tag(ScopeKind::region);
    FAIL();
  } catch (const TagStackError& e) {
    EXPECT_NE(std::string(e.what()).find("empty tag stack"), std::string::npos) << e.what();
  }
}

TEST(Tags, MismatchedPopNamesBothKindsAndLeavesTheStackUnchanged) {
  push_region("r");
  push_site("s");
  try {
    pop_tag(ScopeKind::region);
    FAIL();
  } catch (const TagStackError& e) {
    EXPECT_NE(std::string(e.what()).find("innermost scope is a site"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tag_stack_depth(), 2u);
  EXPECT_EQ(describe_tag_stack(), (std::vector<std::string>{"region r", "site s"}));
  pop_tag(ScopeKind::site);
  pop_tag(ScopeKind::region);
}

TEST(Tags, EmptyNamesAndNegativeSlotsAreRejected) {
  EXPECT_THROW(push_region(""), InvalidArgumentError);
  EXPECT_THROW(push_site(""), InvalidArgumentError);
  EXPECT_THROW(push_recv_slot({-1, Direction::forward, 0}), InvalidArgumentError);
  EXPECT_EQ(tag_stack_depth(), 0u);
}

TEST(Tags, EachThreadHasItsOwnStack) {
  auto region = TagScope::region("main-thread");
  TagId seen_in_worker = 99;
  std::thread worker([&] { seen_in_worker = current_tag_id(); });
  worker.join();
  EXPECT_EQ(seen_in_worker, 0u);
  EXPECT_EQ(name_of(current_tag().region), "main-thread");
}

TEST(Tags, BlocksKeepTheTagInForceAtAllocation) {
  HostAllocator a;
  void* p = nullptr;
  TagId tag = 0;
  {
    auto region = TagScope::region("layers.0");
    auto phase = TagScope::phase(Phase::forward);
    tag = current_tag_id();
    p = a.alloc(1000);
  }
  AllocatorSnapshot snap = a.allocator->snapshot();
  EXPECT_EQ(snap.segments[0].blocks[0].tag, tag);
  const TagStats* s = stats_of(snap, tag);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->bytes.current, 1024);
  EXPECT_EQ(s->requested_bytes.current, 1000);
  EXPECT_EQ(s->count.current, 1);
  a.free(p);  // freed outside the scope: still billed to the block's own tag
  snap = a.allocator->snapshot();
  s = stats_of(snap, tag);
  EXPECT_EQ(s->bytes.current, 0);
  EXPECT_EQ(s->bytes.peak, 1024);
  EXPECT_EQ(s->count.total_added, 1u);
}

TEST(Tags, PerTagBytesAddUpToTheGlobalFigures) {
  HostAllocator a;
  std::vector<void*> blocks;
  for (int layer = 0; layer < 3; ++layer) {
    auto region = TagScope::region("layers." + std::to_string(layer));
    for (int i = 0; i < 4; ++i) blocks.push_back(a.alloc(static_cast<std::size_t>(1000 * (i + 1) * (layer + 1))));
  }
  blocks.push_back(a.alloc(77));
  const AllocatorSnapshot snap = a.allocator->snapshot();
  std::int64_t bytes = 0;
  std::int64_t requested = 0;
  for (const TagStatsEntry& entry : snap.tag_stats) {
    bytes += entry.stats.bytes.current;
    requested += entry.stats.requested_bytes.current;
  }
  EXPECT_EQ(bytes, snap.stats.allocated_bytes.current);
  EXPECT_EQ(requested, snap.stats.requested_bytes.current);
  for (void* p : blocks) a.free(p);
}

// tag_stats() is the snapshot's per-tag part on its own: same tags, same figures, and a tag
// whose blocks were all freed stays listed with nothing live.
TEST(Tags, TagStatsMatchTheSnapshotsAndKeepFreedTags) {
  HostAllocator a;
  void* kept = nullptr;
  {
    auto region = TagScope::region("kept");
    kept = a.alloc(3000);
  }
  {
    auto region = TagScope::region("freed");
    a.free(a.alloc(5000));
  }
  const std::vector<TagStatsEntry> entries = a.allocator->tag_stats();
  const AllocatorSnapshot snap = a.allocator->snapshot();
  ASSERT_EQ(entries.size(), snap.tag_stats.size());
  ASSERT_EQ(entries.size(), 2u);
  for (const TagStatsEntry& entry : entries) {
    const TagStats* same = stats_of(snap, entry.tag);
    ASSERT_NE(same, nullptr);
    EXPECT_EQ(entry.stats.requested_bytes.current, same->requested_bytes.current);
    EXPECT_EQ(entry.stats.count.total_added, same->count.total_added);
    const bool is_kept = name_of(tag_of(entry.tag).region) == "kept";
    EXPECT_EQ(entry.stats.count.current, is_kept ? 1 : 0);
    EXPECT_EQ(entry.stats.requested_bytes.current, is_kept ? 3000 : 0);
    EXPECT_EQ(entry.stats.requested_bytes.peak, is_kept ? 3000 : 5000);
  }
  a.free(kept);
}

TEST(Tags, LiveBytesByRegionPrefixCoversNestedRegionsOnly) {
  HostAllocator a;
  std::vector<void*> blocks;
  {
    auto layer = TagScope::region("layers.0");
    blocks.push_back(a.alloc(100));
    auto attention = TagScope::region("attention");
    blocks.push_back(a.alloc(200));
  }
  {
    auto other = TagScope::region("layers.01");
    blocks.push_back(a.alloc(400));
  }
  EXPECT_EQ(a.allocator->live_requested_bytes("layers.0"), 300);
  EXPECT_EQ(a.allocator->live_requested_bytes("layers.0::attention"), 200);
  EXPECT_EQ(a.allocator->live_requested_bytes("layers.01"), 400);
  EXPECT_EQ(a.allocator->live_requested_bytes(""), 700);
  for (void* p : blocks) a.free(p);
  EXPECT_EQ(a.allocator->live_requested_bytes("layers.0"), 0);
}

TEST(Sites, MacroAndSourceLocationMarkAllocations) {
  HostAllocator a;
  void* p = nullptr;
  void* q = nullptr;
  int line = 0;
  {
    REMAT_SITE("experts");
    p = a.alloc(512);
  }
  {
    line = __LINE__ + 1;
    REMAT_SITE_HERE();
    q = a.alloc(512);
  }
  EXPECT_EQ(name_of(tag_of(*a.allocator->tag_of_block(p)).site), "experts");
  EXPECT_EQ(name_of(tag_of(*a.allocator->tag_of_block(q)).site), "test_tags.cpp:" + std::to_string(line));
  EXPECT_FALSE(a.allocator->tag_of_block(static_cast<char*>(p) + 256).has_value());  // not a block start
  EXPECT_EQ(tag_stack_depth(), 0u);
  a.free(p);
  a.free(q);
}

// A loop that misses a pop nests one scope deeper each step. Each kind of push must stop at a
// documented bound with a clear error, the memory it took must stay small (it grew with the
// square of the depth), and the stack must stay usable.
class RunawayPushes : public ::testing::TestWithParam<ScopeKind> {};

TEST_P(RunawayPushes, StopAtTheBoundInLittleMemoryAndLeaveTheStackUsable) {
  const ScopeKind kind = GetParam();
  std::size_t pushed = 0;
  std::string error;
  std::thread worker([&] {  // a fresh thread: its own stack and derived-tag cache
    const std::int64_t rss_before = remat::testing::process_status_kib("VmRSS");
    try {
      for (; pushed < 20'000; ++pushed) {
        switch (kind) {
          case ScopeKind::region: push_region("layer"); break;
          case ScopeKind::policy: push_policy(pushed % 2 ? Policy::save : Policy::recompute); break;
          case ScopeKind::phase: push_phase(Phase::forward); break;
          case ScopeKind::recv_slot: push_recv_slot({0, Direction::forward, static_cast<std::int32_t>(pushed)}); break;
          case ScopeKind::site: push_site("site." + std::to_string(pushed)); break;
        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
    const std::int64_t grown_kib = remat::testing::process_status_kib("VmRSS") - rss_before;
    EXPECT_LE(grown_kib, 16 * 1024 * remat::testing::kSanitizerAllowance) << pushed << " pushes";
    EXPECT_EQ(tag_stack_depth(), pushed) << "the refused push must leave the stack as it was";
    while (tag_stack_depth() > 0) pop_tag(kind);
    push_phase(Phase::backward);  // usable again
    EXPECT_EQ(current_tag().phase, Phase::backward);
    pop_tag(ScopeKind::phase);
  });
  worker.join();
  if (kind == ScopeKind::region) {
    // "layer::layer::..." reaches the path bound first.
    EXPECT_LT(pushed, kMaxTagDepth);
    EXPECT_NE(error.find("longer than 4096 bytes"), std::string::npos) << error;
    EXPECT_NE(error.find("pushed without its pop"), std::string::npos) << error;
    EXPECT_LT(error.size(), 600u) << "the path is quoted in part, not in full";
  } else {
    EXPECT_EQ(pushed, kMaxTagDepth);
    EXPECT_NE(error.find("1024 scopes deep"), std::string::npos) << error;
    EXPECT_NE(error.find("pop every push"), std::string::npos) << error;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryKind, RunawayPushes,
                         ::testing::Values(ScopeKind::region, ScopeKind::policy, ScopeKind::phase,
                                           ScopeKind::recv_slot, ScopeKind::site),
                         [](const auto& param_info) { return std::string(to_string(param_info.param)); });

TEST(Tags, NamesLongerThanTheBoundAreRefusedAndQuotedInPart) {
  const std::string huge(1 << 20, 'x');
  for (auto push : {+[](const std::string& n) { push_region(n); }, +[](const std::string& n) { push_site(n); }}) {
    try {
      push(huge);
      FAIL() << "a 1 MiB name was accepted";
    } catch (const InvalidArgumentError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("(1048576 bytes)"), std::string::npos) << message.substr(0, 200);
      EXPECT_LT(message.size(), 300u);
    }
  }
  EXPECT_EQ(tag_stack_depth(), 0u);
}
