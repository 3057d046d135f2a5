// Pickles: what the writer produces the reader reads back; what builds objects is refused.
#include "core/errors.hpp"
#include "interop/pickle_reader.hpp"
#include "interop/pickle_writer.hpp"
#include "schema/schema_set.hpp"

#include "cli_runner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <vector>

namespace remat::report {
namespace {

TEST(Pickle, WriterOutputReadsBackWithSharedReferences) {
  PickleWriter w;
  w.begin_dict();
  w.string("sizes");
  w.begin_list();
  w.integer(-1);
  w.integer(255);
  w.integer(65535);
  w.integer(1LL << 40);
  w.unsigned_integer(18446744073709551615ull);
  w.end_list();
  w.string("frames");
  w.begin_list();
  w.string("layers.0::attention");
  w.end_list();
  const std::uint32_t id = w.remember();
  w.string("again");
  w.recall(id);
  w.string("pair");
  w.integer(1);
  w.real(2.5);
  w.tuple(2);
  w.end_dict();
  const std::string bytes = w.finish();

  // Python writes 2^64 - 1 in nine bytes (a zero byte keeps it positive): it reads as unsigned.
  const PickleDocument wide = read_pickle(bytes);
  const PyValue* wide_sizes = wide.root->get("sizes");
  ASSERT_NE(wide_sizes, nullptr);
  ASSERT_EQ(wide_sizes->items.size(), 5u);
  EXPECT_TRUE(wide_sizes->items[4]->above_int64);
  EXPECT_EQ(wide_sizes->items[4]->unsigned_integer(), 18446744073709551615ull);
  EXPECT_FALSE(wide_sizes->items[3]->above_int64);

  PickleWriter small;
  small.begin_dict();
  small.string("sizes");
  small.begin_list();
  for (std::int64_t v : {std::int64_t{-1}, std::int64_t{255}, std::int64_t{65535}, std::int64_t{1} << 40}) small.integer(v);
  small.end_list();
  small.string("frames");
  small.begin_list();
  small.string("layers.0::attention");
  small.end_list();
  const std::uint32_t frames_id = small.remember();
  small.string("again");
  small.recall(frames_id);
  small.end_dict();
  const PickleDocument doc = read_pickle(small.finish());
  const PyValue* sizes = doc.root->get("sizes");
  ASSERT_NE(sizes, nullptr);
  ASSERT_EQ(sizes->items.size(), 4u);
  EXPECT_EQ(sizes->items[0]->integer, -1);
  EXPECT_EQ(sizes->items[1]->integer, 255);
  EXPECT_EQ(sizes->items[2]->integer, 65535);
  EXPECT_EQ(sizes->items[3]->integer, std::int64_t{1} << 40);
  EXPECT_EQ(doc.root->get("again"), doc.root->get("frames"));
  EXPECT_EQ(doc.root->get("again")->items[0]->text, "layers.0::attention");
}

TEST(Pickle, ObjectConstructionIsRefusedWithItsOffset) {
  // protocol 2, GLOBAL os.system, ...
  const std::string evil = std::string("\x80\x02", 2) + "cos\nsystem\n";
  try {
    read_pickle(evil);
    FAIL() << "accepted a GLOBAL";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2: opcode 0x63 builds a Python object"), std::string::npos) << e.what();
  }
}

TEST(Pickle, TruncatedPickleIsAnError) {
  EXPECT_THROW(read_pickle(std::string("\x80\x02X\x10\x00\x00\x00" "abc", 10)), InputError);
  EXPECT_THROW(read_pickle(std::string("\x80\x02]", 3)), InputError);
}

TEST(Pickle, NineByteIntegersFitOnlyBelow2Pow64) {
  // LONG1 of 2^63 (Python: 00 .. 00 80 00) reads as unsigned; 2^64 (00 x8, 01) does not fit.
  const std::string two63 = std::string("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.", 14);
  const PickleDocument doc = read_pickle(two63);
  EXPECT_TRUE(doc.root->above_int64);
  EXPECT_EQ(doc.root->unsigned_integer(), std::uint64_t{1} << 63);
  const std::string two64 = std::string("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.", 14);
  try {
    read_pickle(two64);
    FAIL() << "accepted 2^64";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "byte 2: integer of 9 bytes does not fit in 64 bits (the largest accepted is 2^64 - 1, the "
                           "smallest -2^63)");
  }
  // Nine bytes with a nonzero top byte never fit, whatever they encode: refused, not truncated.
  EXPECT_THROW(read_pickle(std::string("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.", 14)), InputError);
}

// PyTorch's snapshot layout, written with the fields import reads.
struct TorchBlock {
  std::uint64_t address, size, requested;
  std::string state;
};
struct TorchSegment {
  std::uint64_t address, total;
  std::vector<TorchBlock> blocks;
};
struct TorchEvent {
  std::string action;
  std::uint64_t addr, size;
  std::uint64_t time_us;
  std::string file = "";
};

std::string torch_pickle(const std::vector<TorchSegment>& segments, const std::vector<TorchEvent>& events) {
  PickleWriter w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  for (const TorchSegment& segment : segments) {
    w.begin_dict();
    w.string("device");
    w.integer(0);
    w.string("address");
    w.unsigned_integer(segment.address);
    w.string("total_size");
    w.unsigned_integer(segment.total);
    w.string("stream");
    w.integer(0);
    w.string("blocks");
    w.begin_list();
    for (const TorchBlock& block : segment.blocks) {
      w.begin_dict();
      w.string("address");
      w.unsigned_integer(block.address);
      w.string("size");
      w.unsigned_integer(block.size);
      w.string("requested_size");
      w.unsigned_integer(block.requested);
      w.string("state");
      w.string(block.state);
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.string("device_traces");
  w.begin_list();
  w.begin_list();
  for (const TorchEvent& event : events) {
    w.begin_dict();
    w.string("action");
    w.string(event.action);
    w.string("addr");
    w.unsigned_integer(event.addr);
    w.string("size");
    w.unsigned_integer(event.size);
    w.string("stream");
    w.integer(0);
    w.string("time_us");
    w.unsigned_integer(event.time_us);
    w.string("frames");
    w.begin_list();
    if (!event.file.empty()) {
      w.begin_dict();
      w.string("filename");
      w.string(event.file);
      w.string("line");
      w.integer(1);
      w.string("name");
      w.string("f");
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kBase = 0x7f0000000000;

// Imports `pickle` and expects exit 2 with `message` after the pickle's name, and no output file.
void expect_import_refused(const std::string& pickle, const std::string& message) {
  const testing::TempDir dir;
  const std::string in = dir.write("s.pickle", pickle);
  const std::string out = dir.path("out.json");
  const testing::CliResult r = testing::run({"import", in, "-o", out});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "remat-report: " + in + ": " + message + "\n");
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(std::filesystem::exists(out)) << "import wrote a dump it refused";
}

// Imports `pickle`, expects success, and returns the written dump (which `validate` accepts).
nlohmann::json import_ok(const std::string& pickle) {
  const testing::TempDir dir;
  const std::string in = dir.write("s.pickle", pickle);
  const std::string out = dir.path("out.json");
  const testing::CliResult r = testing::run({"import", in, "-o", out});
  EXPECT_EQ(r.code, 0) << r.err;
  const testing::CliResult v = testing::run({"validate", out});
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  std::ifstream text(out);
  return nlohmann::json::parse(text);
}

TEST(TorchImport, ADeviceTheSnapshotHoldsNothingOfIsRefusedNamingTheDevicesItHolds) {
  // (Before, --device 3 wrote a dump of no segment and no event, exit 0.)
  const testing::TempDir dir;
  const std::string in = dir.write("s.pickle", torch_pickle({{kBase, 2 * kMiB, {}}}, {}));
  const std::string out = dir.path("out.json");
  testing::CliResult r = testing::run({"import", in, "-o", out, "--device", "3"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "remat-report: " + in +
                       ": $: the snapshot holds no segment or trace entry of device 3: it holds device(s) 0; pass "
                       "--device with one of them, or leave it out for the first\n");
  EXPECT_FALSE(std::filesystem::exists(out));
  r = testing::run({"import", in, "-o", out, "--device", "0"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(TorchImport, RefusesABlockOutsideItsSegmentNamingThePicklePath) {
  expect_import_refused(
      torch_pickle({{kBase, 20 * kMiB, {{1000000000, 8 * kMiB, 8 * kMiB, "active_allocated"}}}}, {}),
      "$['segments'][0]['blocks'][0]['address']: block at 0x3b9aca00 does not follow the previous block (expected "
      "0x7f0000000000): the blocks of the segment at 0x7f0000000000 must start at its address and follow each other "
      "without gaps");
  // A gap between blocks is the same fault, named at the second block.
  expect_import_refused(torch_pickle({{kBase, 20 * kMiB,
                                       {{kBase, 8 * kMiB, 8 * kMiB, "active_allocated"},
                                        {kBase + 9 * kMiB, 8 * kMiB, 0, "inactive"}}}},
                                     {}),
                        "$['segments'][0]['blocks'][1]['address']: block at 0x7f0000900000 does not follow the "
                        "previous block (expected 0x7f0000800000): the blocks of the segment at 0x7f0000000000 must "
                        "start at its address and follow each other without gaps");
}

TEST(TorchImport, RefusesBlocksPastTheSegmentEnd) {
  expect_import_refused(torch_pickle({{kBase, 2 * kMiB,
                                       {{kBase, kMiB, kMiB, "active_allocated"},
                                        {kBase + kMiB, 2 * kMiB, 0, "inactive"}}}},
                                     {}),
                        "$['segments'][0]['blocks'][1]['size']: block of 2097152 bytes at 0x7f0000100000 extends past "
                        "the end of its segment (0x7f0000200000, total_size 2097152)");
}

TEST(TorchImport, RefusesOverlappingSegments) {
  expect_import_refused(torch_pickle({{kBase, 2 * kMiB, {}}, {kBase + kMiB, 2 * kMiB, {}}}, {}),
                        "$['segments'][1]['address']: segment at 0x7f0000100000 (2097152 bytes) overlaps segments[0] "
                        "at 0x7f0000000000 (2097152 bytes): segments must not share bytes; the snapshot is corrupt");
}

TEST(TorchImport, RefusesASecondAllocAtALiveAddressNamingBothEntries) {
  expect_import_refused(torch_pickle({}, {{"snapshot", 0, 0, 1}, {"alloc", 0x1000, 512, 2}, {"alloc", 0x1000, 512, 3}}),
                        "$['device_traces'][0][2]['addr']: alloc at 0x1000 while the block allocated there by "
                        "$['device_traces'][0][1] is still live (no free_requested or free_completed between them): "
                        "events were lost or the dump is corrupt");
}

TEST(TorchImport, RefusesEventsOutOfTimeOrderInsteadOfRewritingThem) {
  expect_import_refused(torch_pickle({}, {{"alloc", 0x1000, 512, 5}, {"free_requested", 0x1000, 512, 2}}),
                        "$['device_traces'][0][1]['time_us']: events are out of time order (2 after 5)");
  // Equal times are in order.
  const nlohmann::json dump =
      import_ok(torch_pickle({}, {{"alloc", 0x1000, 512, 5}, {"free_requested", 0x1000, 512, 5}}));
  EXPECT_EQ(dump["trace"]["events"][1]["time_us"], 5);
}

TEST(TorchImport, RefusesRequestedSizeAboveAnActiveBlocksSize) {
  expect_import_refused(torch_pickle({{kBase, 2 * kMiB, {{kBase, kMiB, kMiB + 1, "active_allocated"}}}}, {}),
                        "$['segments'][0]['blocks'][0]['requested_size']: requested_size 1048577 exceeds the block "
                        "size 1048576: an active block holds at least the bytes requested of it; the snapshot is "
                        "corrupt");
}

TEST(TorchImport, IgnoresTheStaleRequestedSizeOfInactiveBlocks) {
  // PyTorch's split remainder keeps the requested_size of the block it was cut from.
  const nlohmann::json dump = import_ok(torch_pickle(
      {{kBase, 2 * kMiB, {{kBase, kMiB, kMiB - 8, "active_allocated"}, {kBase + kMiB, kMiB, 2 * kMiB, "inactive"}}}},
      {}));
  EXPECT_EQ(dump["segments"][0]["blocks"][0]["requested_size"], kMiB - 8);
  EXPECT_EQ(dump["segments"][0]["blocks"][1]["requested_size"], 0);
  EXPECT_EQ(dump["segments"][0]["requested_size"], kMiB - 8);
}

TEST(TorchImport, AcceptsAddressesFrom2Pow63AndRefusesSuchTimes) {
  const std::uint64_t high = (std::uint64_t{1} << 63) + 0x1000;
  const nlohmann::json dump = import_ok(torch_pickle(
      {{high, 2 * kMiB, {{high, 2 * kMiB, 2 * kMiB, "active_allocated"}}}}, {{"alloc", high, 2 * kMiB, 7}}));
  EXPECT_EQ(dump["segments"][0]["address"].get<std::uint64_t>(), high);
  EXPECT_EQ(dump["trace"]["events"][0]["address"].get<std::uint64_t>(), high);
  expect_import_refused(torch_pickle({}, {{"alloc", 0x1000, 512, high}}),
                        "$['device_traces'][0][0]['time_us']: 9223372036854779904 does not fit a signed 64-bit "
                        "integer (at most 2^63 - 1 = 9223372036854775807)");
}

TEST(TorchImport, RefusesWhatRematReportCouldNotReadBack) {
  // Two tags whose peaks, reached at different times, add up past 2^64 - 1: no pickle path is
  // at fault, so the written dump's check names its own.
  const std::uint64_t half = std::uint64_t{1} << 63;
  expect_import_refused(torch_pickle({}, {{"alloc", 0x1000, half, 1, "a.py"},
                                          {"free_requested", 0x1000, half, 2, "a.py"},
                                          {"alloc", 0x1000, half, 3, "b.py"}}),
                        "$: the snapshot imports into a dump remat-report cannot read ($.tag_stats[1]: the tags' "
                        "bytes or counts add up to more than 2^64 - 1: the snapshot is corrupt); nothing was written");
}

TEST(Schema, ErrorsNameTheJsonPathAndTheRule) {
  const SchemaSet schemas = SchemaSet::load("");
  simdjson::dom::parser parser;
  const simdjson::padded_string text(std::string(
      R"({"action":"grow","time_us":1,"address":-4,"size":3,"stream":0})"));
  const simdjson::dom::element event = parser.parse(text);
  std::vector<std::string> errors;
  schemas.validate("snapshot.schema.json#/$defs/event", event, JsonPath(), errors, 10);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0], "$.tag: missing required field");
  EXPECT_EQ(errors[1], "$.action: 'grow' is not one of alloc, free_requested, free_completed, segment_alloc, "
                       "segment_free, oom, retag");
  EXPECT_EQ(errors[2], "$.address: -4 is below the minimum 0");
}

TEST(Schema, UnsupportedKeywordsAreRefusedWhenUsedNotIgnored) {
  for (const auto& [schema, refusal] :
       {std::pair<std::string, std::string>{R"({"type":"object","patternProperties":{"^x":{}}})",
                                            "'patternProperties' is not supported"},
        {R"({"type":"object","additionalProperties":{"type":"integer"}})",
         "'additionalProperties' is supported as true or false only"}}) {
    SchemaSet schemas;
    schemas.add("x.schema.json", schema);
    simdjson::dom::parser parser;
    const simdjson::padded_string text(std::string("{}"));
    std::vector<std::string> errors;
    try {
      schemas.validate("x.schema.json", parser.parse(text), JsonPath(), errors, 10);
      ADD_FAILURE() << "an unsupported keyword was ignored: " << schema;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
    }
  }
}

TEST(Schema, AdditionalPropertiesFalseRefusesFieldsThePropertiesDoNotName) {
  SchemaSet schemas;
  schemas.add("x.schema.json",
              R"({"type":"object","additionalProperties":false,"properties":{"params":{"type":"integer"}}})");
  simdjson::dom::parser parser;
  std::vector<std::string> errors;
  const simdjson::padded_string known(std::string(R"({"params":1})"));
  schemas.validate("x.schema.json", parser.parse(known), JsonPath(), errors, 10);
  EXPECT_TRUE(errors.empty());
  const simdjson::padded_string unknown(std::string(R"({"params":1,"parms":2})"));
  schemas.validate("x.schema.json", parser.parse(unknown), JsonPath(), errors, 10);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "$.parms: not a field of this object (a field of another kind or version, or a misspelling)");
}

TEST(Schema, MinLengthCountsCharacters) {
  SchemaSet schemas;
  schemas.add("s.schema.json", R"({"type":"string","minLength":3})");
  simdjson::dom::parser parser;
  const simdjson::padded_string text(std::string("\"\u00e9\u00e9\""));
  std::vector<std::string> errors;
  schemas.validate("s.schema.json", parser.parse(text), JsonPath(), errors, 10);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "$: is 2 characters long, shorter than the minimum 3");
}

}  // namespace
}  // namespace remat::report
