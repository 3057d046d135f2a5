// The C ABI through the shared library, as PyTorch's CUDAPluggableAllocator uses it. Each
// test uses its own device index so that tests share the process-wide registry safely.

#include <remat/alloc/c_api.h>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class CApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_EQ(remat_configure("backend:host,host_capacity_mb:64"), REMAT_OK) << remat_last_error(); }
};

remat_stats stats_of(int device) {
  remat_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(remat_get_stats(device, &s), REMAT_OK) << remat_last_error();
  return s;
}

cudaStream_t stream(std::uintptr_t id) { return reinterpret_cast<cudaStream_t>(id); }

}  // namespace

TEST_F(CApi, SymbolsLoadedByNameHaveThePluggableAllocatorSignatures) {
  void* lib = dlopen(REMAT_ALLOC_SHARED_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  // Exactly the casts PyTorch applies to the symbols it looks up.
  using AllocFn = void* (*)(size_t, int, cudaStream_t);
  using FreeFn = void (*)(void*, size_t, int, cudaStream_t);
  auto alloc_fn = reinterpret_cast<AllocFn>(dlsym(lib, "remat_alloc"));
  auto free_fn = reinterpret_cast<FreeFn>(dlsym(lib, "remat_free"));
  ASSERT_NE(alloc_fn, nullptr);
  ASSERT_NE(free_fn, nullptr);
  void* p = alloc_fn(12345, 1, stream(3));
  ASSERT_NE(p, nullptr) << remat_last_error();
  EXPECT_EQ(stats_of(1).requested_bytes, 12345);
  free_fn(p, 12345, 1, stream(3));
  EXPECT_EQ(stats_of(1).allocated_bytes, 0);
  EXPECT_EQ(stats_of(1).num_invalid_frees, 0u);
  dlclose(lib);
}

TEST_F(CApi, ExportsTheCAbiAndTheAllocatorsCppApiOnly) {
  void* lib = dlopen(REMAT_ALLOC_SHARED_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr);
  EXPECT_NE(dlsym(lib, "remat_last_error"), nullptr);
  // remat::alloc::device_allocator(int): the Python extension links the C++ API from here.
  EXPECT_NE(dlsym(lib, "_ZN5remat5alloc16device_allocatorEi"), nullptr);
  // A standard-library instantiation the library uses stays internal.
  EXPECT_EQ(dlsym(lib, "_ZNSt6vectorIN5remat5alloc11SegmentInfoESaIS2_EE17_M_realloc_insertIJS2_EEEvN9__gnu_cxx17__"
                       "normal_iteratorIPS2_S4_EEDpOT_"),
            nullptr);
  dlclose(lib);
}

TEST_F(CApi, CapacityExhaustedReturnsNullCountsTheOomAndKeepsThePoolUsable) {
  void* held = remat_alloc(50 * MiB, 2, nullptr);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(remat_alloc(30 * MiB, 2, nullptr), nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("out of memory"), std::string::npos) << remat_last_error();
  EXPECT_EQ(stats_of(2).num_ooms, 1u);
  EXPECT_EQ(stats_of(2).allocated_bytes, static_cast<int64_t>(50 * MiB));
  remat_free(held, 50 * MiB, 2, nullptr);
  void* again = remat_alloc(30 * MiB, 2, nullptr);
  EXPECT_NE(again, nullptr);
  remat_free(again, 30 * MiB, 2, nullptr);
}

TEST_F(CApi, OomObserversSeeTheFailureAndCanBeRemoved) {
  struct Seen {
    std::atomic<int> calls{0};
    size_t requested = 0;
    std::string message;
  } seen;
  const int id = remat_register_oom_observer(
      [](const remat_oom_info* info, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->requested = info->requested_bytes;
        s->message = info->message;
        ++s->calls;
      },
      &seen);
  ASSERT_GT(id, 0) << remat_last_error();
  EXPECT_EQ(remat_alloc(100 * MiB, 3, nullptr), nullptr);
  EXPECT_EQ(seen.calls.load(), 1);
  EXPECT_EQ(seen.requested, 100 * MiB);
  EXPECT_NE(seen.message.find("device 3"), std::string::npos) << seen.message;
  EXPECT_EQ(remat_unregister_oom_observer(id), REMAT_OK);
  EXPECT_EQ(remat_alloc(100 * MiB, 3, nullptr), nullptr);
  EXPECT_EQ(seen.calls.load(), 1);
  EXPECT_EQ(remat_unregister_oom_observer(id), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_register_oom_observer(nullptr, nullptr), -REMAT_ERR_INVALID_ARGUMENT);
}

// An observer whose own allocation fails is not called again for it: that recursion has no end.
// Its failure reaches it, and the original request still fails once, for the caller.
TEST_F(CApi, AnObserversOwnOomDoesNotCallTheObserversAgain) {
  constexpr int kDevice = 13;
  struct Seen {
    std::atomic<int> calls{0};
    bool own_failed = false;
  } seen;
  const int id = remat_register_oom_observer(
      [](const remat_oom_info*, void* user) {
        auto* s = static_cast<Seen*>(user);
        ++s->calls;
        s->own_failed = remat_alloc(200 * MiB, kDevice, nullptr) == nullptr;
      },
      &seen);
  ASSERT_GT(id, 0) << remat_last_error();
  EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);
  EXPECT_EQ(seen.calls.load(), 1);
  EXPECT_TRUE(seen.own_failed);
  EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);  // the next failure is observed again
  EXPECT_EQ(seen.calls.load(), 2);
  EXPECT_EQ(remat_unregister_oom_observer(id), REMAT_OK);
}

// An observer removing itself (or another) during a dispatch: the removed one is not called
// after, the others still are, and nothing is freed under the dispatch.
TEST_F(CApi, ObserversMayRemoveThemselvesAndEachOtherDuringADispatch) {
  constexpr int kDevice = 14;
  struct Ids {
    int self = 0;
    int other = 0;
    int self_calls = 0;
    int other_calls = 0;
  } ids;
  ids.self = remat_register_oom_observer(
      [](const remat_oom_info*, void* user) {
        auto* s = static_cast<Ids*>(user);
        ++s->self_calls;
        EXPECT_EQ(remat_unregister_oom_observer(s->self), REMAT_OK);
        EXPECT_EQ(remat_unregister_oom_observer(s->other), REMAT_OK);  // registered after: not called now
        EXPECT_EQ(remat_alloc(200 * MiB, kDevice, nullptr), nullptr);  // and no re-entry
      },
      &ids);
  ids.other = remat_register_oom_observer(
      [](const remat_oom_info*, void* user) { ++static_cast<Ids*>(user)->other_calls; }, &ids);
  ASSERT_GT(ids.self, 0) << remat_last_error();
  ASSERT_GT(ids.other, 0) << remat_last_error();
  EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);
  EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);
  EXPECT_EQ(ids.self_calls, 1);
  EXPECT_EQ(ids.other_calls, 0);
  EXPECT_EQ(remat_unregister_oom_observer(ids.self), REMAT_ERR_INVALID_ARGUMENT);
}

// Removal from another thread returns at once, while the observer still runs there: that call
// finishes (its function stays alive), and no later failure calls the observer.
TEST_F(CApi, RemovalDoesNotWaitForAnObserverRunningOnAnotherThread) {
  constexpr int kDevice = 15;
  struct Shared {
    std::atomic<bool> inside{false};
    std::atomic<bool> release{false};
    std::atomic<bool> returned{false};
    std::atomic<int> calls{0};
  } shared;
  const int id = remat_register_oom_observer(
      [](const remat_oom_info*, void* user) {
        auto* s = static_cast<Shared*>(user);
        ++s->calls;
        s->inside = true;
        for (int i = 0; i < 10000 && !s->release; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        s->returned = true;
      },
      &shared);
  ASSERT_GT(id, 0) << remat_last_error();
  std::thread failing([] { EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr); });
  while (!shared.inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(remat_unregister_oom_observer(id), REMAT_OK);
  EXPECT_FALSE(shared.returned.load());  // removal returned while the observer still ran
  shared.release = true;
  failing.join();
  EXPECT_TRUE(shared.returned.load());
  EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);
  EXPECT_EQ(shared.calls.load(), 1);
}

// Two threads inside two observers, each removing the other: both removals return (removal that
// waited for the other thread deadlocked here), and neither observer is called after.
namespace mutual {
thread_local int t_which = -1;  // the observer this thread's failure acts in
struct Shared {
  int ids[2] = {0, 0};
  std::atomic<int> inside{0};
  std::atomic<int> removed{0};
};
struct Observer {
  Shared* shared;
  int me;
};
void observe(const remat_oom_info*, void* user) {
  auto* o = static_cast<Observer*>(user);
  if (t_which != o->me) return;
  ++o->shared->inside;
  for (int i = 0; i < 10000 && o->shared->inside < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (remat_unregister_oom_observer(o->shared->ids[1 - o->me]) == REMAT_OK) ++o->shared->removed;
}
}  // namespace mutual

TEST_F(CApi, ObserversOnTwoThreadsMayRemoveEachOther) {
  constexpr int kDevice = 16;
  mutual::Shared shared;
  mutual::Observer observers[2] = {{&shared, 0}, {&shared, 1}};
  for (int i = 0; i < 2; ++i) {
    shared.ids[i] = remat_register_oom_observer(mutual::observe, &observers[i]);
    ASSERT_GT(shared.ids[i], 0) << remat_last_error();
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([i] {
      mutual::t_which = i;
      EXPECT_EQ(remat_alloc(100 * MiB, kDevice, nullptr), nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(shared.inside.load(), 2);
  EXPECT_EQ(shared.removed.load(), 2);
  EXPECT_EQ(remat_unregister_oom_observer(shared.ids[0]), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_unregister_oom_observer(shared.ids[1]), REMAT_ERR_INVALID_ARGUMENT);
}

TEST_F(CApi, ZeroBytesGiveNullWithoutAnOom) {
  EXPECT_EQ(remat_alloc(0, 4, nullptr), nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("zero-byte"), std::string::npos);
  EXPECT_EQ(stats_of(4).num_ooms, 0u);
  remat_free(nullptr, 0, 4, nullptr);  // PyTorch frees the null pointer of an empty tensor
  EXPECT_EQ(stats_of(4).num_invalid_frees, 0u);
}

TEST_F(CApi, SizeNearSizeMaxReturnsNull) {
  EXPECT_EQ(remat_alloc(std::numeric_limits<size_t>::max(), 5, nullptr), nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("exceeds"), std::string::npos) << remat_last_error();
  void* p = remat_alloc(64, 5, nullptr);
  EXPECT_NE(p, nullptr);
  remat_free(p, 64, 5, nullptr);
}

TEST_F(CApi, ResetAccumulatedStatsZeroesTheTotalsAndKeepsLiveFiguresAndPeaks) {
  constexpr int kDevice = 12;
  void* kept = remat_alloc(4 * MiB, kDevice, nullptr);
  void* freed = remat_alloc(1000, kDevice, nullptr);
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(freed, nullptr);
  remat_free(freed, 1000, kDevice, nullptr);
  remat_free(kept, 1, kDevice, nullptr);  // wrong size: refused, counted as an invalid free
  ASSERT_EQ(remat_reset_accumulated_stats(kDevice), REMAT_OK) << remat_last_error();
  remat_stats s = stats_of(kDevice);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.num_frees, 0u);  // not the live block counted as a negative free
  EXPECT_EQ(s.num_segment_allocs, 0u);
  EXPECT_EQ(s.num_segment_frees, 0u);
  EXPECT_EQ(s.num_invalid_frees, 1u);  // PyTorch has no such count to reset
  EXPECT_EQ(s.live_blocks, 1);
  EXPECT_EQ(s.allocated_bytes, static_cast<int64_t>(4 * MiB));
  EXPECT_EQ(s.allocated_bytes_peak, static_cast<int64_t>(4 * MiB + 1024));
  remat_free(kept, 4 * MiB, kDevice, nullptr);
  EXPECT_EQ(stats_of(kDevice).num_frees, 1u);
  EXPECT_EQ(remat_reset_accumulated_stats(-1), REMAT_ERR_INVALID_ARGUMENT);
}

TEST_F(CApi, BadFreesAreRefusedCountedAndExplained) {
  void* p = remat_alloc(1000, 6, nullptr);
  int local = 0;
  remat_free(&local, 4, 6, nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("never returned"), std::string::npos) << remat_last_error();
  remat_free(p, 999, 6, nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("allocated with size 1000"), std::string::npos);
  EXPECT_EQ(stats_of(6).allocated_bytes, 1024);
  remat_free(p, 1000, 6, nullptr);
  remat_free(p, 1000, 6, nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("double free"), std::string::npos) << remat_last_error();
  EXPECT_EQ(stats_of(6).num_invalid_frees, 3u);
  EXPECT_EQ(stats_of(6).allocated_bytes, 0);
}

TEST_F(CApi, TagPushesAndPopsAreCheckedAndVisibleInSnapshots) {
  ASSERT_EQ(remat_push_region("layers.3"), REMAT_OK);
  ASSERT_EQ(remat_push_phase("backward"), REMAT_OK);
  ASSERT_EQ(remat_push_recv_slot(1, 'B', 0), REMAT_OK);
  ASSERT_EQ(remat_push_site("experts"), REMAT_OK);
  void* p = remat_alloc(2048, 7, nullptr);
  EXPECT_EQ(remat_pop_region(), REMAT_ERR_TAG_STACK);  // innermost is the site
  EXPECT_EQ(remat_pop_site(), REMAT_OK);
  EXPECT_EQ(remat_pop_recv_slot(), REMAT_OK);
  EXPECT_EQ(remat_pop_phase(), REMAT_OK);
  EXPECT_EQ(remat_pop_region(), REMAT_OK);
  EXPECT_EQ(remat_pop_region(), REMAT_ERR_TAG_STACK);
  EXPECT_NE(std::string(remat_last_error()).find("empty tag stack"), std::string::npos);

  int64_t live = 0;
  ASSERT_EQ(remat_live_bytes(7, "layers.3", &live), REMAT_OK);
  EXPECT_EQ(live, 2048);

  const auto path = std::filesystem::temp_directory_path() / ("remat-capi-" + std::to_string(getpid()) + ".json");
  ASSERT_EQ(remat_dump_snapshot_device(path.c_str(), 7), REMAT_OK) << remat_last_error();
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  std::filesystem::remove(path);
  const auto& block = doc["segments"][0]["blocks"][0];
  const auto& tag = doc["tags"][block["tag"].get<size_t>()];
  EXPECT_EQ(doc["names"][tag["region"].get<size_t>()], "layers.3");
  EXPECT_EQ(doc["names"][tag["site"].get<size_t>()], "experts");
  EXPECT_EQ(tag["phase"], "backward");
  EXPECT_EQ(tag["recv"]["direction"], "B");
  remat_free(p, 2048, 7, nullptr);
}

TEST_F(CApi, TheLabelIsSetReadBackAndWrittenInSnapshots) {
  size_t needed = 99;
  ASSERT_EQ(remat_get_label(nullptr, 0, &needed), REMAT_OK) << remat_last_error();
  EXPECT_EQ(needed, 1u);  // "" and its NUL
  ASSERT_EQ(remat_set_label("step 12"), REMAT_OK) << remat_last_error();
  ASSERT_EQ(remat_push_region("layers.4"), REMAT_OK);
  void* p = remat_alloc(4096, 9, nullptr);
  ASSERT_EQ(remat_pop_region(), REMAT_OK);

  ASSERT_EQ(remat_get_label(nullptr, 0, &needed), REMAT_OK);
  EXPECT_EQ(needed, 8u);
  char small[4] = "abc";
  EXPECT_EQ(remat_get_label(small, sizeof small, &needed), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(small, "");
  EXPECT_STREQ(remat_last_error(),
               "label buffer of 4 bytes is too small for the label (8 bytes with its NUL); pass a buffer of *needed "
               "bytes");
  char buffer[8];
  ASSERT_EQ(remat_get_label(buffer, sizeof buffer, nullptr), REMAT_OK);
  EXPECT_STREQ(buffer, "step 12");
  EXPECT_EQ(remat_get_label(nullptr, 5, &needed), REMAT_ERR_INVALID_ARGUMENT);

  EXPECT_EQ(remat_set_label(nullptr), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(remat_last_error(), "label is NULL; pass a NUL-terminated string");
  EXPECT_EQ(remat_set_label(std::string(5000, 'L').c_str()), REMAT_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(remat_get_label(buffer, sizeof buffer, nullptr), REMAT_OK);
  EXPECT_STREQ(buffer, "step 12");  // a refused label leaves the one in force

  ASSERT_EQ(remat_set_label(""), REMAT_OK);
  ASSERT_EQ(remat_get_label(buffer, sizeof buffer, &needed), REMAT_OK);
  EXPECT_STREQ(buffer, "");
  void* q = remat_alloc(4096, 9, nullptr);

  const auto path = std::filesystem::temp_directory_path() / ("remat-capi-label-" + std::to_string(getpid()) + ".json");
  ASSERT_EQ(remat_dump_snapshot_device(path.c_str(), 9), REMAT_OK) << remat_last_error();
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  std::filesystem::remove(path);
  const auto& blocks = doc["segments"][0]["blocks"];
  const auto& labelled = doc["tags"][blocks[0]["tag"].get<size_t>()];
  EXPECT_EQ(doc["names"][labelled["label"].get<size_t>()], "step 12");
  EXPECT_EQ(doc["names"][labelled["region"].get<size_t>()], "layers.4");
  EXPECT_FALSE(doc["tags"][blocks[1]["tag"].get<size_t>()].contains("label"));
  remat_free(p, 4096, 9, nullptr);
  remat_free(q, 4096, 9, nullptr);
}

TEST_F(CApi, CategoriesAreSetRetaggedByAddressAndRestored) {
  constexpr int device = 9;
  ASSERT_EQ(remat_set_category(REMAT_CATEGORY_TEMPORARY, "layers.0.mlp"), REMAT_OK) << remat_last_error();
  int category = -1;
  char module[64];
  ASSERT_EQ(remat_get_category(&category, module, sizeof module, nullptr), REMAT_OK);
  EXPECT_EQ(category, REMAT_CATEGORY_TEMPORARY);
  EXPECT_STREQ(module, "layers.0.mlp");
  void* p = remat_alloc(4096, device, nullptr);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(remat_set_category(REMAT_CATEGORY_NONE, nullptr), REMAT_OK);
  ASSERT_EQ(remat_block_category(p, &category, module, sizeof module, nullptr), REMAT_OK) << remat_last_error();
  EXPECT_EQ(category, REMAT_CATEGORY_TEMPORARY);
  EXPECT_STREQ(module, "layers.0.mlp");

  // Kept for backward: the category changes, the module stays when none is given.
  std::uint32_t previous = 0;
  ASSERT_EQ(remat_retag_block(p, REMAT_CATEGORY_ACTIVATION, nullptr, &previous), REMAT_OK) << remat_last_error();
  ASSERT_EQ(remat_block_category(p, &category, module, sizeof module, nullptr), REMAT_OK);
  EXPECT_EQ(category, REMAT_CATEGORY_ACTIVATION);
  EXPECT_STREQ(module, "layers.0.mlp");
  ASSERT_EQ(remat_set_block_tag(p, previous), REMAT_OK) << remat_last_error();
  ASSERT_EQ(remat_block_category(p, &category, nullptr, 0, nullptr), REMAT_OK);
  EXPECT_EQ(category, REMAT_CATEGORY_TEMPORARY);

  // Bad input: an unknown category, a tag id never made, a pointer the allocator did not return.
  EXPECT_EQ(remat_set_category(42, "x"), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remat_last_error()).find("category 42 is not valid"), std::string::npos) << remat_last_error();
  EXPECT_EQ(remat_retag_block(p, -1, nullptr, nullptr), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_set_block_tag(p, 0xFFFFFFF0u), REMAT_ERR_INVALID_ARGUMENT);
  int not_ours = 0;
  EXPECT_EQ(remat_retag_block(&not_ours, REMAT_CATEGORY_PARAMETER, "w", nullptr), REMAT_ERR_INVALID_POINTER);
  EXPECT_NE(std::string(remat_last_error()).find("tag_cpu_tensors()"), std::string::npos) << remat_last_error();
  remat_free(p, 4096, device, nullptr);
  EXPECT_EQ(remat_block_tag(p, &previous), REMAT_ERR_INVALID_POINTER);
}

TEST_F(CApi, BadArgumentsAreErrorsNotCrashes) {
  EXPECT_EQ(remat_push_region(nullptr), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_push_region(""), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_push_recv_slot(0, 'X', 0), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remat_last_error()).find("'F'"), std::string::npos);
  EXPECT_EQ(remat_push_phase("sideways"), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_push_policy("maybe"), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_push_phase("\x1b]0;title\x07"), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remat_last_error()).find("phase '\\x1B]0;title\\x07' is not valid"), std::string::npos)
      << remat_last_error();
  EXPECT_EQ(remat_push_policy(std::string(10000, 'P').c_str()), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_LT(std::string(remat_last_error()).size(), 300u) << remat_last_error();
  EXPECT_EQ(remat_set_memory_fraction(0, 1.0000001), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remat_last_error()).find("memory fraction 1.0000001 "), std::string::npos)
      << remat_last_error();
  EXPECT_EQ(remat_get_stats(0, nullptr), REMAT_ERR_INVALID_ARGUMENT);
  remat_stats small{};
  small.struct_size = 8;
  EXPECT_EQ(remat_get_stats(0, &small), REMAT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(remat_alloc(64, -1, nullptr), nullptr);
  EXPECT_NE(std::string(remat_last_error()).find("out of range"), std::string::npos);
  EXPECT_EQ(remat_dump_snapshot(nullptr), REMAT_ERR_INVALID_ARGUMENT);
}

TEST_F(CApi, MalformedConfigurationIsRejectedAndChangesNothing) {
  EXPECT_EQ(remat_configure("backend:host,bogus:1"), REMAT_ERR_CONFIG);
  EXPECT_NE(std::string(remat_last_error()).find("unknown key 'bogus'"), std::string::npos) << remat_last_error();
  EXPECT_EQ(remat_configure("memory_fraction:2"), REMAT_ERR_CONFIG);
  EXPECT_EQ(remat_configure(nullptr), REMAT_ERR_INVALID_ARGUMENT);
  void* p = remat_alloc(60 * MiB, 8, nullptr);  // capacity is still 64 MiB
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(remat_configure("host_capacity_mb:128"), REMAT_ERR_STATE);  // blocks are live
  EXPECT_NE(std::string(remat_last_error()).find("live blocks"), std::string::npos) << remat_last_error();
  remat_free(p, 60 * MiB, 8, nullptr);
}

TEST_F(CApi, SnapshotToAnUnwritablePathFailsWithTheReason) {
  EXPECT_EQ(remat_dump_snapshot("/proc/remat-cannot-write-here.json"), REMAT_ERR_IO);
  EXPECT_NE(std::string(remat_last_error()).find("/proc/remat-cannot-write-here.json"), std::string::npos);
}

TEST_F(CApi, RecordStreamDefersReuseOnTheHostBackend) {
  // Default device on the host backend is 0.
  ASSERT_EQ(remat_host_hold_stream(0, stream(9)), REMAT_OK);
  void* p = remat_alloc(512, 0, stream(1));
  ASSERT_EQ(remat_record_stream(p, stream(9)), REMAT_OK);
  remat_free(p, 512, 0, stream(1));
  EXPECT_EQ(stats_of(0).active_bytes, 512);
  ASSERT_EQ(remat_host_complete_stream(0, stream(9)), REMAT_OK);
  ASSERT_EQ(remat_empty_cache(), REMAT_OK);
  EXPECT_EQ(stats_of(0).active_bytes, 0);
  EXPECT_EQ(stats_of(0).reserved_bytes, 0);
  int local = 0;
  EXPECT_EQ(remat_record_stream(&local, stream(9)), REMAT_ERR_INVALID_POINTER);
}

TEST_F(CApi, LastErrorIsPerThread) {
  EXPECT_EQ(remat_pop_site(), REMAT_ERR_TAG_STACK);
  std::string other;
  std::thread([&] { other = remat_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(remat_last_error()), "");
}

// fork() while another thread is inside the allocator: the child must not inherit its lock
// held (it would spin forever in its first allocation, as fork-based DataLoader workers did).
TEST_F(CApi, AChildForkedWhileAnotherThreadAllocatesCanAllocate) {
  constexpr int kDevice = 11;
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) {
      remat_push_region("churn");
      void* p = remat_alloc(4096, kDevice, nullptr);
      remat_free(p, 4096, kDevice, nullptr);
      remat_pop_region();
    }
  });
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 200 && hung == 0; ++i) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      remat_push_region("child");
      void* p = remat_alloc(4096, kDevice, nullptr);
      remat_free(p, 4096, kDevice, nullptr);
      remat_pop_region();
      ::_exit(p != nullptr ? 0 : 1);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(child, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
        ++hung;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (hung == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) ++failed;
  }
  stop = true;
  churn.join();
  EXPECT_EQ(hung, 0) << "a child hung in its first allocation";
  EXPECT_EQ(failed, 0);
}
