// Out-of-memory reports: what they hold, where they go, and that producing them is safe.

#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/oom.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <thread>
#include <vector>

using namespace remat::alloc;
using namespace remat::alloc::testing;
namespace fs = std::filesystem;

namespace {

// The folders fresh_dir() made, removed when the test program ends.
struct MadeDirs {
  std::vector<fs::path> paths;
  ~MadeDirs() {
    for (const fs::path& path : paths) {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  }
};

fs::path fresh_dir(const std::string& name) {
  static MadeDirs made;
  const fs::path dir = fs::temp_directory_path() / ("remat-oom-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  made.paths.push_back(dir);
  return dir;
}

std::vector<fs::path> dumps_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// 30 MiB in layers.0 (saved), 20 MiB in layers.1, a 512 KiB receive buffer at site "recv":
// 52 MiB of a 64 MiB device reserved.
std::vector<void*> fill(HostAllocator& a) {
  std::vector<void*> blocks;
  {
    auto region = TagScope::region("layers.0");
    auto policy = TagScope::policy(Policy::save);
    blocks.push_back(a.alloc(30 * MiB));
  }
  {
    auto region = TagScope::region("layers.1");
    blocks.push_back(a.alloc(20 * MiB));
  }
  {
    auto slot = TagScope::recv_slot({1, Direction::forward, 0});
    auto site = TagScope::site("recv");
    blocks.push_back(a.alloc(MiB / 2));
  }
  return blocks;
}

}  // namespace

// A region that a user named "<untagged>" stays apart from untagged memory, and memory saved
// outside any region counts as saved nowhere: there is no region to switch to recompute.
TEST(OomReport, ARegionNamedLikeThePlaceholderIsNotMergedWithUntaggedMemory) {
  const fs::path dir = fresh_dir("placeholder");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 64);
  std::vector<void*> blocks{a.alloc(4 * MiB)};
  {
    auto region = TagScope::region("<untagged>");
    blocks.push_back(a.alloc(8 * MiB));
  }
  {
    auto policy = TagScope::policy(Policy::save);
    blocks.push_back(a.alloc(16 * MiB));
  }
  EXPECT_THROW(a.alloc(60 * MiB), OutOfMemoryError);
  const auto files = dumps_in(dir);
  ASSERT_EQ(files.size(), 1u);
  const auto doc = nlohmann::json::parse(std::ifstream(files[0]));
  const auto& regions = doc["holders"]["by_region"];
  ASSERT_EQ(regions.size(), 2u) << regions.dump();
  EXPECT_EQ(regions[0]["name"], "<untagged>");
  EXPECT_EQ(regions[0]["bytes"], 20 * MiB);
  EXPECT_EQ(regions[0]["saved_bytes"], 0);
  EXPECT_EQ(regions[1]["name"], "<untagged>");
  EXPECT_EQ(regions[1]["bytes"], 8 * MiB);
  for (void* p : blocks) a.free(p);
  fs::remove_all(dir);
}

TEST(OomReport, NamesTheHoldersTheRequestAndTheFailingThreadsTags) {
  const fs::path dir = fresh_dir("holders");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0,trace_entries:128", 64);
  auto blocks = fill(a);
  {
    auto region = TagScope::region("failing");
    auto phase = TagScope::phase(Phase::forward);
    EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  }
  const auto files = dumps_in(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::string name = files[0].filename().string();
  EXPECT_EQ(name.rfind("oom-", 0), 0u) << name;
  EXPECT_NE(name.find("-p" + std::to_string(::getpid()) + "-d0-"), std::string::npos) << name;
  EXPECT_EQ(files[0].extension(), ".json");

  const auto doc = nlohmann::json::parse(std::ifstream(files[0]));
  EXPECT_EQ(doc["kind"], "oom");
  EXPECT_EQ(doc["request"]["requested_bytes"], 30 * MiB);
  EXPECT_EQ(doc["memory"]["device_total_bytes"], 64 * MiB);
  EXPECT_EQ(doc["memory"]["allocated_bytes"], 50 * MiB + MiB / 2);
  const auto& regions = doc["holders"]["by_region"];
  ASSERT_EQ(regions.size(), 3u);
  EXPECT_EQ(regions[0]["name"], "layers.0");
  EXPECT_EQ(regions[0]["bytes"], 30 * MiB);
  EXPECT_EQ(regions[0]["saved_bytes"], 30 * MiB);
  EXPECT_EQ(regions[1]["name"], "layers.1");
  EXPECT_EQ(regions[2]["name"], "<untagged>");
  EXPECT_EQ(doc["holders"]["by_recv_slot"][0]["name"], "1F0");
  EXPECT_EQ(doc["holders"]["by_recv_slot"][0]["bytes"], MiB / 2);
  EXPECT_EQ(doc["holders"]["by_site"][0]["name"], "<no site>");
  EXPECT_EQ(doc["holders"]["by_site"][1]["name"], "recv");
  EXPECT_EQ(doc["tag_stack"], nlohmann::json({"region failing", "phase forward"}));
  EXPECT_EQ(doc["last_events"].back()["action"], "oom");
  EXPECT_EQ(doc["last_events"].back()["region"], "failing");
  EXPECT_GE(doc["fragmentation"]["largest_free_block"].get<std::int64_t>(), 0);
  for (void* p : blocks) a.free(p);
}

// The report gives the free blocks of the pool the request goes to apart from those of both
// pools: free small-pool blocks never hold a large request, nor large-pool blocks a small one.
TEST(OomReport, TheRequestsPoolIsCountedApart) {
  const fs::path dir = fresh_dir("pools");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 64);
  // Four 2 MiB small-pool segments of 512 KiB blocks, every other one freed: 4 MiB free in 8 blocks
  std::vector<void*> small;
  for (int i = 0; i < 16; ++i) small.push_back(a.alloc(MiB / 2));
  for (std::size_t i = 0; i < small.size(); i += 2) a.free(small[i]);
  // 20 + 16 MiB segments of their own and a 20 MiB shared segment holding 6 MiB: 64 MiB reserved
  std::vector<void*> large{a.alloc(20 * MiB), a.alloc(16 * MiB), a.alloc(6 * MiB)};
  auto read_report = [&](std::size_t index) {
    const auto files = dumps_in(dir);
    EXPECT_EQ(files.size(), index + 1);
    return nlohmann::json::parse(std::ifstream(files.at(index)));
  };

  EXPECT_THROW(a.alloc(16 * MiB), OutOfMemoryError);  // 18 MiB cached free, 14 of them in the large pool
  const auto large_request = read_report(0)["fragmentation"];
  EXPECT_EQ(large_request["cached_free_bytes"], 18 * MiB);
  EXPECT_EQ(large_request["fragmented_free_bytes"], 18 * MiB);
  EXPECT_EQ(large_request["free_blocks_in_split_segments"], 9);
  EXPECT_EQ(large_request["request_pool"], nlohmann::json({{"pool", "large"},
                                                           {"free_bytes", 14 * MiB},
                                                           {"fragmented_free_bytes", 14 * MiB},
                                                           {"free_blocks_in_split_segments", 1}}));

  EXPECT_THROW(a.alloc(MiB), OutOfMemoryError);  // no two free 512 KiB blocks side by side
  EXPECT_EQ(read_report(1)["fragmentation"]["request_pool"], nlohmann::json({{"pool", "small"},
                                                                             {"free_bytes", 4 * MiB},
                                                                             {"fragmented_free_bytes", 4 * MiB},
                                                                             {"free_blocks_in_split_segments", 8}}));
  for (std::size_t i = 1; i < small.size(); i += 2) a.free(small[i]);
  for (void* p : large) a.free(p);
}

TEST(OomReport, StderrLineNamesTopHoldersAndTheDumpPath) {
  const fs::path dir = fresh_dir("stderr");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 64);
  auto blocks = fill(a);
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("top holders: layers.0 30.00 MiB, layers.1 20.00 MiB"), std::string::npos) << err;
  EXPECT_NE(err.find("report: " + dumps_in(dir)[0].string()), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
  for (void* p : blocks) a.free(p);
}

TEST(OomReport, RankComesFromTheLauncherVariables) {
  const fs::path dir = fresh_dir("rank");
  ::setenv("RANK", "3", 1);
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 8);
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  ::unsetenv("RANK");
  const auto files = dumps_in(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].filename().string().find("-r3-p"), std::string::npos) << files[0];
}

TEST(OomReport, DirectoryFromTheEnvironmentWhenNotConfigured) {
  const fs::path dir = fresh_dir("env");
  ::setenv("REMAT_OOM_DUMP_DIR", dir.c_str(), 1);
  HostAllocator a("oom_dump_interval_ms:0", 8);
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  ::unsetenv("REMAT_OOM_DUMP_DIR");
  EXPECT_EQ(dumps_in(dir).size(), 1u);
}

TEST(OomReport, UnwritableDirectoryGivesAStderrMessageAndNothingElse) {
  HostAllocator a("oom_dump_dir:/nonexistent/remat/oom,oom_dump_interval_ms:0", 8);
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("no report written: cannot write '/nonexistent/remat/oom/oom-"), std::string::npos) << err;
  EXPECT_EQ(err.find("set REMAT_OOM_DUMP_DIR"), std::string::npos) << "the directory is set already: " << err;
  void* p = a.alloc(MiB);  // still usable
  a.free(p);
}

TEST(OomReport, WithoutADirectoryTheLineSaysHowToKeepReports) {
  ::unsetenv("REMAT_OOM_DUMP_DIR");
  HostAllocator a("oom_dump_interval_ms:0", 8);
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("no report written (set REMAT_OOM_DUMP_DIR or oom_dump_dir to keep one)"), std::string::npos)
      << err;
}

// The report, the error and the stderr line name the limit the request actually ran into.
struct CauseCase {
  std::string name;
  std::string conf;      // on a 64 MiB host device
  std::size_t request;   // after fill(): 52 MiB reserved
  std::string cause;
  std::string in_message;
};

class OomCauses : public ::testing::TestWithParam<CauseCase> {};

TEST_P(OomCauses, ReportErrorAndLineNameTheLimitThatApplied) {
  const CauseCase c = GetParam();
  const fs::path dir = fresh_dir("cause-" + c.name);
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0," + c.conf, 64);
  std::vector<void*> held;
  if (c.cause != "memory_fraction_cap") held = fill(a);
  std::string message;
  ::testing::internal::CaptureStderr();
  try {
    a.alloc(c.request);
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find(c.in_message), std::string::npos) << message;
  EXPECT_NE(err.find(c.in_message), std::string::npos) << err;
  const auto dumps = dumps_in(dir);
  ASSERT_EQ(dumps.size(), 1u);
  const auto doc = nlohmann::json::parse(std::ifstream(dumps[0]));
  EXPECT_EQ(doc["cause"], c.cause);
  if (c.cause == "memory_fraction_cap") {
    EXPECT_EQ(doc["memory"]["reserved_limit_bytes"], 16 * MiB);
    EXPECT_DOUBLE_EQ(doc["memory"]["memory_fraction"].get<double>(), 0.25);
  } else {
    EXPECT_FALSE(doc["memory"].contains("reserved_limit_bytes"));
  }
  for (void* p : held) a.free(p);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    EveryCause, OomCauses,
    ::testing::Values(
        CauseCase{"cap", "memory_fraction:0.25", 20 * MiB, "memory_fraction_cap",
                  "memory_fraction:0.25 caps reserved memory at 16777216 bytes (16.00 MiB)"},
        CauseCase{"full", "", 20 * MiB, "device_full", "free of 64.00 MiB"},
        CauseCase{"too_large", "", 100 * MiB, "request_exceeds_device", "larger than the whole device (64.00 MiB)"}),
    [](const auto& param_info) { return param_info.param.name; });

TEST(OomReport, DumpsAreRateLimited) {
  const fs::path dir = fresh_dir("rate");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:60000", 8);
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dumps_in(dir).size(), 1u);
  EXPECT_NE(err.find("rate limit"), std::string::npos) << err;
  EXPECT_EQ(a.stats().num_ooms, 2u);
}

TEST(OomReport, AThrowingHandlerIsContained) {
  HostAllocator a("oom_dump_interval_ms:0", 8);
  a.allocator->set_oom_handler([](const OomEvent&) { throw std::runtime_error("observer failed"); });
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("observer failed"), std::string::npos);
}

TEST(OomReport, HandlerSeesTheReportAndThePath) {
  const fs::path dir = fresh_dir("handler");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 64);
  auto blocks = fill(a);
  OomEvent seen;
  a.allocator->set_oom_handler([&](const OomEvent& event) { seen = event; });
  EXPECT_THROW(a.alloc(30 * MiB), OutOfMemoryError);
  ASSERT_TRUE(seen.report);
  EXPECT_EQ(seen.report->by_region[0].name, "layers.0");
  EXPECT_EQ(seen.dump_path, dumps_in(dir)[0].string());
  for (void* p : blocks) a.free(p);
}

TEST(OomReport, TwoThreadsFailingAtOnceBothGetErrorsAndConsistentDumps) {
  const fs::path dir = fresh_dir("threads");
  HostAllocator a("oom_dump_dir:" + dir.string() + ",oom_dump_interval_ms:0", 64);
  auto blocks = fill(a);
  std::barrier start(2);
  std::atomic<int> errors{0};
  auto fail = [&](const char* region) {
    auto scope = TagScope::region(region);
    start.arrive_and_wait();
    try {
      a.alloc(40 * MiB);
    } catch (const OutOfMemoryError&) {
      ++errors;
    }
  };
  ::testing::internal::CaptureStderr();
  std::thread t1(fail, "thread.a");
  std::thread t2(fail, "thread.b");
  t1.join();
  t2.join();
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(errors.load(), 2);
  const auto files = dumps_in(dir);
  ASSERT_EQ(files.size(), 2u);
  std::set<std::string> stacks;
  for (const auto& file : files) {
    const auto doc = nlohmann::json::parse(std::ifstream(file));
    std::int64_t held = 0;
    for (const auto& holder : doc["holders"]["by_region"]) held += holder["bytes"].get<std::int64_t>();
    EXPECT_EQ(held, doc["memory"]["allocated_bytes"].get<std::int64_t>());
    stacks.insert(doc["tag_stack"][0].get<std::string>());
  }
  EXPECT_EQ(stacks, (std::set<std::string>{"region thread.a", "region thread.b"}));
  for (void* p : blocks) a.free(p);
}

// The line on stderr is for a terminal and a log: names come escaped and cut to 64 bytes.
TEST(OomReport, TheStderrLineShowsHostileNamesEscapedAndCut) {
  OomReport report;
  report.backend = "host";
  report.by_region = {{"\x1b[31mred\x1b[0m\nnewline", 1024, 1, 0}, {std::string(3000, 'R'), 512, 1, 0}};
  const std::string line = oom_summary_line(report, "", "");
  EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_NE(line.find("\\x1B[31mred\\x1B[0m\\x0Anewline 1.00 KiB"), std::string::npos) << line;
  EXPECT_NE(line.find("... (3000 bytes) 512 B"), std::string::npos) << line;
  EXPECT_LT(line.size(), 600u) << line;
}

// Where memory has categories (remat_alloc.track), the line names the largest categories and
// modules too; without, it lists regions only.
TEST(OomReport, TheStderrLineNamesCategoriesAndModulesWhenMemoryHasThem) {
  OomReport report;
  report.backend = "host";
  report.by_region = {{"<untagged>", 7 * MiB, 9, 0}};
  EXPECT_EQ(oom_summary_line(report, "", "").find("by category"), std::string::npos);
  report.by_category = {{"optimizer_state", 4 * MiB, 4, 0},
                        {"parameter", 2 * MiB, 2, 0},
                        {"gradient", MiB, 2, 0},
                        {"temporary", 512, 1, 0}};
  report.by_module = {{"layers.0.mlp", 3 * MiB, 4, 0}, {"layers.1.mlp", 3 * MiB, 4, 0}};
  const std::string line = oom_summary_line(report, "", "");
  EXPECT_NE(line.find("; top holders: <untagged> 7.00 MiB; by category: optimizer_state 4.00 MiB, parameter "
                      "2.00 MiB, gradient 1.00 MiB; by module: layers.0.mlp 3.00 MiB, layers.1.mlp 3.00 MiB; no "
                      "report written"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("temporary"), std::string::npos) << line;  // three of each
}

// On the host backend the "device" is the configured capacity: the error says how to raise it.
TEST(OomReport, TheHostBackendNamesItsCapacitySetting) {
  HostAllocator a("", 64);
  try {
    a.alloc(100 * MiB);
    FAIL() << "a request over the capacity succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("larger than the whole device (64.00 MiB)"), std::string::npos) << message;
    EXPECT_NE(message.find("raise host_capacity_mb (REMAT_ALLOC_CONF, remat_configure or remat_alloc.configure; "
                           "the host backend holds 64.00 MiB now), or split the tensor"),
              std::string::npos)
        << message;
  }
}
