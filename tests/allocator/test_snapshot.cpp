#include "support/host_allocator.hpp"

#include <remat/alloc/errors.hpp>
#include <remat/alloc/snapshot.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace remat::alloc;
using namespace remat::alloc::testing;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("remat-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST(Snapshot, DescribesSegmentsBlocksTagsAndStats) {
  HostAllocator a("trace_entries:32");
  void* p = nullptr;
  void* q = nullptr;
  {
    auto region = TagScope::region("layers.0");
    auto slot = TagScope::recv_slot({1, Direction::forward, 2});
    p = a.alloc(1000);
  }
  q = a.alloc(3 * MiB);
  const auto doc = nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()));

  EXPECT_EQ(doc["kind"], "snapshot");
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["device"], 0);
  EXPECT_EQ(doc["config"]["backend"], "host");
  EXPECT_EQ(doc["stats"]["allocated_bytes"]["current"], 1024 + 3 * MiB);
  EXPECT_EQ(doc["stats"]["reserved_bytes"]["current"], 22 * MiB);
  ASSERT_EQ(doc["segments"].size(), 2u);

  const auto& small = doc["segments"][0]["segment_type"] == "small" ? doc["segments"][0] : doc["segments"][1];
  EXPECT_EQ(small["total_size"], 2 * MiB);
  EXPECT_EQ(small["allocated_size"], 1024);
  ASSERT_EQ(small["blocks"].size(), 2u);
  const auto& block = small["blocks"][0];
  EXPECT_EQ(block["address"], addr(p));
  EXPECT_EQ(block["requested_size"], 1000);
  EXPECT_EQ(block["state"], "active_allocated");
  const auto& tag = doc["tags"][block["tag"].get<std::size_t>()];
  EXPECT_EQ(doc["names"][tag["region"].get<std::size_t>()], "layers.0");
  EXPECT_EQ(tag["recv"]["stage"], 1);
  EXPECT_EQ(tag["recv"]["direction"], "F");
  EXPECT_EQ(tag["recv"]["slot"], 2);
  EXPECT_EQ(small["blocks"][1]["state"], "inactive");

  EXPECT_EQ(doc["trace"]["capacity"], 32);
  EXPECT_EQ(doc["trace"]["events"].size(), 4u);  // two segment_alloc, two alloc
  a.free(p);
  a.free(q);
}

TEST(Snapshot, ShowsExpandableSegmentsAndPyTorchsSettings) {
  HostAllocator a("expandable_segments:True,roundup_power2_divisions:[256:1,>:4],large_segment_size_mb:40,"
                  "max_non_split_rounding_mb:64,garbage_collection_threshold:0.5,memory_fraction:0.9");
  void* p = a.alloc(30 * MiB);
  const auto doc = nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()));
  const auto& config = doc["config"];
  EXPECT_EQ(config["expandable_segments"], true);
  EXPECT_EQ(config["large_segment_size_mb"], 40);
  EXPECT_EQ(config["max_non_split_rounding_mb"], 64);
  EXPECT_EQ(config["garbage_collection_threshold"], 0.5);
  ASSERT_EQ(config["roundup_power2_divisions"].size(), 16u);
  EXPECT_EQ(config["roundup_power2_divisions"][8], 1);
  EXPECT_EQ(config["roundup_power2_divisions"][9], 4);
  EXPECT_EQ(config["roundup_power2_divisions"][15], 4);
  ASSERT_EQ(doc["segments"].size(), 1u);
  EXPECT_EQ(doc["segments"][0]["is_expandable"], true);
  EXPECT_EQ(doc["segments"][0]["total_size"], 40 * MiB);
  a.free(p);
  HostAllocator plain;
  void* q = plain.alloc(512);
  EXPECT_EQ(nlohmann::json::parse(snapshot_to_json(plain.allocator->snapshot()))["segments"][0]["is_expandable"],
            false);
  plain.free(q);
}

TEST(Snapshot, TraceDumpIsJsonLinesWithAHeader) {
  HostAllocator a("trace_entries:32");
  a.free(a.alloc(500));
  std::istringstream lines(trace_to_jsonl(a.allocator->snapshot()));
  std::string line;
  std::getline(lines, line);
  const auto header = nlohmann::json::parse(line);
  EXPECT_EQ(header["kind"], "trace");
  EXPECT_EQ(header["event_count"], 4);
  std::vector<nlohmann::json> events;
  while (std::getline(lines, line)) events.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(events.size(), 4u);
  std::vector<std::string> actions;
  for (const auto& event : events) actions.push_back(event["action"]);
  EXPECT_EQ(actions, (std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "free_completed"}));
  // The alloc records the block's size and the size asked for; the other actions have no request.
  EXPECT_EQ(events[1]["size"], 512);
  EXPECT_EQ(events[1]["requested"], 500);
  EXPECT_FALSE(events[0].contains("requested"));
  EXPECT_FALSE(events[2].contains("requested"));
}

// A replay of the trace (remat-report whatif) runs under the settings it was recorded with.
TEST(Snapshot, TraceDumpHeaderRecordsTheAllocatorSettings) {
  HostAllocator a("trace_entries:32,expandable_segments:True,roundup_power2_divisions:4");
  a.free(a.alloc(500));
  const std::string dump = trace_to_jsonl(a.allocator->snapshot());
  const auto header = nlohmann::json::parse(dump.substr(0, dump.find('\n')));
  ASSERT_TRUE(header.contains("config"));
  EXPECT_EQ(header["config"]["expandable_segments"], true);
  EXPECT_EQ(header["config"]["trace_entries"], 32);
  EXPECT_EQ(header["config"]["roundup_power2_divisions"][0], 4);
  EXPECT_EQ(header["config"], nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()))["config"]);
  const std::string text = header["config"]["text"];
  EXPECT_NE(text.find("expandable_segments:True"), std::string::npos) << text;
}

// The header says how many records the ring overwrote before the first event it holds.
TEST(Snapshot, TraceDumpHeaderCountsTheRecordsTheRingDropped) {
  HostAllocator a("trace_entries:4");
  EXPECT_NE(trace_to_jsonl(a.allocator->snapshot()).find("\"dropped_records\":0}"), std::string::npos);
  for (int i = 0; i < 5; ++i) a.free(a.alloc(512));  // a segment_alloc, then 5 allocs and 5 immediate frees
  std::istringstream lines(trace_to_jsonl(a.allocator->snapshot()));
  std::string line;
  std::getline(lines, line);
  const auto header = nlohmann::json::parse(line);
  EXPECT_EQ(header["dropped_records"], 11 - 4);
}

TEST(Snapshot, StringsAreEscaped) {
  HostAllocator a;
  auto region = TagScope::region("quote\"back\\slash\nnewline\x01");
  void* p = a.alloc(512);
  const auto doc = nlohmann::json::parse(snapshot_to_json(a.allocator->snapshot()));
  bool found = false;
  for (const auto& name : doc["names"]) found = found || name == "quote\"back\\slash\nnewline\x01";
  EXPECT_TRUE(found);
  a.free(p);
}

TEST(Snapshot, IsWrittenAtomicallyWithoutLeftovers) {
  const fs::path dir = fresh_dir("atomic");
  const fs::path path = dir / "snap.json";
  HostAllocator a;
  std::ofstream(path) << "old contents";
  write_snapshot(a.allocator->snapshot(), path.string());
  EXPECT_EQ(nlohmann::json::parse(read(path))["kind"], "snapshot");
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);
  fs::remove_all(dir);
}

// A dump is renamed into place, which would replace a FIFO or a device node itself: those are
// refused and left as they are. A symbolic link is followed: its file gets the dump, the link stays.
TEST(Snapshot, OnlyRegularFilesAreReplacedAndLinksAreFollowed) {
  const fs::path dir = fresh_dir("targets");
  HostAllocator a;
  const fs::path fifo = dir / "pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    write_snapshot(a.allocator->snapshot(), fifo.string());
    FAIL() << "a FIFO was replaced";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("it is a FIFO, and a dump replaces its target with a new file"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  try {
    write_snapshot(a.allocator->snapshot(), dir.string());
    FAIL() << "a directory was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("it is a directory"), std::string::npos) << e.what();
  }

  const fs::path target = dir / "real.json";
  std::ofstream(target) << "old contents";
  const fs::path link = dir / "latest.json";
  fs::create_symlink(target, link);
  write_snapshot(a.allocator->snapshot(), link.string());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(nlohmann::json::parse(read(target))["kind"], "snapshot");

  const fs::path dangling = dir / "dangling.json";
  fs::create_symlink(dir / "missing" / "x.json", dangling);
  EXPECT_THROW(write_snapshot(a.allocator->snapshot(), dangling.string()), IoError);
  EXPECT_TRUE(fs::is_symlink(dangling));
  fs::remove_all(dir);
}

// The temporary file must not need a longer name than the target: a 250-byte name is valid
// on common file systems (255 at most).
TEST(Snapshot, ATargetWithALongValidNameIsWritten) {
  const fs::path dir = fresh_dir("long-name");
  const fs::path path = dir / (std::string(245, 's') + ".json");
  HostAllocator a;
  write_snapshot(a.allocator->snapshot(), path.string());
  EXPECT_EQ(nlohmann::json::parse(read(path))["kind"], "snapshot");
  fs::remove_all(dir);
}

TEST(Snapshot, UnwritablePathIsAClearErrorAndKeepsTheOldFile) {
  HostAllocator a;
  try {
    write_snapshot(a.allocator->snapshot(), "/nonexistent-dir/for/sure/snap.json");
    FAIL();
  } catch (const IoError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent-dir/for/sure/snap.json"), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
  EXPECT_THROW(write_snapshot(a.allocator->snapshot(), ""), IoError);
  try {
    write_snapshot(a.allocator->snapshot(), std::string("/tmp/snap\0shot.json", 19));
    FAIL() << "a path with a NUL was cut and written";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a NUL character"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists("/tmp/snap"));
}
