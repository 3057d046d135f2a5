// Pickles: what the writer produces the reader reads back; what builds objects is refused.
#include "core/errors.hpp"
#include "interop/pickle_reader.hpp"
#include "interop/pickle_writer.hpp"
#include "schema/schema_set.hpp"

#include <gtest/gtest.h>

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

  // Unsigned 2^64-1 does not fit the reader's int64: it is refused, with the offset.
  EXPECT_THROW(read_pickle(bytes), InputError);

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
                       "segment_free, oom");
  EXPECT_EQ(errors[2], "$.address: -4 is below the minimum 0");
}

TEST(Schema, UnsupportedKeywordsAreRefusedWhenUsedNotIgnored) {
  SchemaSet schemas;
  schemas.add("x.schema.json", R"({"type":"object","additionalProperties":false})");
  simdjson::dom::parser parser;
  const simdjson::padded_string text(std::string("{}"));
  std::vector<std::string> errors;
  try {
    schemas.validate("x.schema.json", parser.parse(text), JsonPath(), errors, 10);
    FAIL() << "an unsupported keyword was ignored";
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("'additionalProperties' is not supported"), std::string::npos) << e.what();
  }
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
