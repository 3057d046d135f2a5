// What the first bytes of an input say is checked before anything is loaded whole: zero-filled
// files, byte-order marks, archives and pickles are refused at once by every subcommand with a
// message that says what the input holds; a NUL byte later on is refused where it is met.
#include "cli_runner.hpp"

#include "core/errors.hpp"
#include "reader/input_file.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

namespace remat::report::testing {
namespace {

void expect_message(const CliResult& r, const std::string& line) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "remat-report: " + line + "\n");
}

TEST(InputStart, AZeroFilledFileIsRefusedAtByteZeroWithoutReadingIt) {
  TempDir dir;
  const std::string file = dir.path("zeros.json");
  { std::ofstream(file, std::ios::binary); }
  ASSERT_EQ(::truncate(file.c_str(), std::int64_t{256} << 20), 0);  // 256 MiB, sparse
  expect_message(run({"summary", file}),
                 file +
                     ": byte 0: starts with NUL bytes (4096 or more of them): not a JSON dump (a preallocated or "
                     "zero-filled file, or one whose writer stopped before writing?)");
  expect_message(run({"memory", dir.write("few.json", std::string(10, '\0'))}),
                 dir.path("few.json") +
                     ": byte 0: starts with NUL bytes (10 of them): not a JSON dump (a preallocated or zero-filled "
                     "file, or one whose writer stopped before writing?)");
}

TEST(InputStart, AByteOrderMarkIsRefusedWithHowToRemoveIt) {
  TempDir dir;
  const std::string file = dir.write("bom.json", "\xef\xbb\xbf" + data_text("snapshot-end.json"));
  expect_refused_by_every_command(file, dir,
                                  file +
                                      ": byte 0: starts with a UTF-8 byte-order mark: remove it (JSON text must not "
                                      "start with one), e.g. `tail -c +4 " +
                                      file + " > FIXED.json`");
  const std::string utf16 = dir.write("utf16.json", std::string("\xff\xfe{\0", 4));
  expect_message(run({"summary", utf16}), utf16 +
                                              ": byte 0: starts with a UTF-16 byte-order mark: the file is UTF-16 "
                                              "text; convert it to UTF-8, e.g. `iconv -f UTF-16 -t UTF-8 " +
                                              utf16 + " > FIXED.json`");
}

TEST(InputStart, CompressedDumpsSayHowToDecompressThem) {
  TempDir dir;
  struct Case {
    std::string bytes, what;
  };
  const Case cases[] = {
      {"\x1f\x8b\x08\x00", "is gzip-compressed: decompress it first, e.g. `gzip -dc {} | remat-report COMMAND -`"},
      {"\x28\xb5\x2f\xfd", "is zstd-compressed: decompress it first, e.g. `zstd -dc {} | remat-report COMMAND -`"},
      {std::string("\xfd"
                   "7zXZ\0",
                   6),
       "is xz-compressed: decompress it first, e.g. `xz -dc {} | remat-report COMMAND -`"},
      {"BZh91AY", "is bzip2-compressed: decompress it first, e.g. `bzip2 -dc {} | remat-report COMMAND -`"},
      {"PK\x03\x04", "is a zip archive: extract the dump from it and pass that"},
  };
  for (const Case& c : cases) {
    const std::string file = dir.write("dump.bin", c.bytes + "rest");
    std::string what = c.what;
    if (const auto at = what.find("{}"); at != std::string::npos) what.replace(at, 2, file);
    expect_message(run({"summary", file}), file + ": byte 0: " + what);
  }
}

TEST(InputStart, AnythingButAnObjectIsNotADump) {
  TempDir dir;
  const std::string array = dir.write("a.json", "  [1, 2]");
  expect_message(run({"summary", array}),
                 array +
                     ": byte 2: a remat dump is a JSON object and starts with '{', but this input starts with '[' "
                     "(a JSON array)");
  const std::string blank = dir.write("b.json", " \n\t\n");
  expect_message(run({"summary", blank}), blank + ": holds only whitespace; expected a remat JSON dump");
}

TEST(InputStart, LeadingBlankLinesAreFineAndOffsetsCountThem) {
  TempDir dir;
  const std::string ok = dir.write("ok.json", "\n\n  " + data_text("snapshot-end.json"));
  EXPECT_EQ(run({"validate", ok}).code, 0);
  const std::string text = "\n\n{\"kind\":\"snapshot\",\"schema_version\":1,,}";
  const std::string bad = dir.write("bad.json", text);
  const CliResult r = run({"summary", bad});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(bad + ": byte " + std::to_string(text.find(",,") + 1) + ":"), std::string::npos) << r.err;
}

TEST(InputStart, ANulByteInsideATraceIsRefusedWhereItIs) {
  TempDir dir;
  const std::string header = trace_text({event("alloc", 1, 4096, 512, 1)});
  const std::string file = dir.write("t.jsonl", header + std::string("{\"action\":\0", 11) + "\n");
  expect_message(run({"memory", file}), file + ": byte " + std::to_string(header.size() + 10) +
                                            ": NUL byte: a JSON dump is text and never holds one (a binary, truncated "
                                            "or zero-filled file?)");
}

TEST(InputStart, ACarriageReturnLineFeedTraceReads) {
  TempDir dir;
  std::string text = trace_text({event("alloc", 1, 4096, 512, 1), event("free_requested", 2, 4096, 512, 1)});
  for (std::size_t at = 0; (at = text.find('\n', at)) != std::string::npos; at += 2) text.replace(at, 1, "\r\n");
  const CliResult r = run({"validate", dir.write("crlf.jsonl", text)});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(InputStart, APrettyPrintedTraceSaysTracesAreJsonLines) {
  TempDir dir;
  const std::string file = dir.write("t.json", "{\n  \"kind\": \"trace\",\n  \"schema_version\": 1\n}\n");
  expect_message(run({"summary", file}), file +
                                             ": a trace dump is JSON Lines: its header object on the first line, "
                                             "then one record a line; this file's first line is not a complete "
                                             "JSON object");
}

TEST(InputStart, ImportRefusesWhatIsNotAPickleBeforeReadingIt) {
  TempDir dir;
  const std::string json = data_path("snapshot-end.json");
  expect_message(run({"import", json, "-o", dir.path("o.json")}),
                 json +
                     ": byte 0: this is JSON, not a pickle: `remat-report import` converts PyTorch snapshot "
                     "pickles; `remat-report summary " +
                     json + "` reads a remat JSON dump");
  const std::string zeros = dir.path("zeros.pickle");
  { std::ofstream(zeros, std::ios::binary); }
  ASSERT_EQ(::truncate(zeros.c_str(), std::int64_t{256} << 20), 0);
  expect_message(run({"import", zeros, "-o", dir.path("o.json")}),
                 zeros +
                     ": byte 0: starts with NUL bytes (4096 or more of them): not a pickle (a preallocated or "
                     "zero-filled file, or one whose writer stopped before writing?)");
  const std::string text = dir.write("notes.txt", "hello");
  expect_message(run({"import", text, "-o", dir.path("o.json")}),
                 text +
                     ": byte 0: not a pickle: a PyTorch snapshot pickle (torch.cuda.memory._dump_snapshot) starts "
                     "with byte 0x80, this input with 0x68");
}

TEST(InputStart, ADirectoryIsNamedAsOne) {
  TempDir dir;
  expect_message(run({"summary", dir.path("")}), dir.path("") + " is a directory; pass a dump file inside it");
}

// `advise` and `predict` read their profiles whole, and `ranks --predicted` its prediction: their
// first bytes are checked as every dump's are, with the same messages.
TEST(InputStart, ProfilesAndPredictionsGetTheFirstBytesCheckOfEveryDump) {
  TempDir dir;
  const std::string stage = data_path("stage-profile-1.json");
  const auto commands = [&](const std::string& file) {
    return std::vector<std::vector<std::string>>{
        {"advise", file},
        {"predict", file, stage, "--schedule", "1f1b", "--ranks", "2", "--microbatches", "4"},
        {"ranks", data_path("snapshot-end.json"), "--predicted", file}};
  };
  const std::string nul =
      " starts with NUL bytes (100 of them): not a JSON dump (a preallocated or zero-filled "
      "file, or one whose writer stopped before writing?)";
  struct Case {
    std::string name, text, message;
  };
  for (const Case& c :
       {Case{"empty.json", "", ": file is empty (0 bytes); expected a remat JSON dump"},
        Case{"zeros.json", std::string(100, '\0'), ": byte 0:" + nul},
        Case{"bom.json", "\xef\xbb\xbf" + data_text("region-profile.json"),
             ": byte 0: starts with a UTF-8 byte-order mark: remove it (JSON text must not start with one), e.g. "
             "`tail -c +4 {} > FIXED.json`"},
        Case{"blank.json", " \n\t\n", ": holds only whitespace; expected a remat JSON dump"},
        Case{"array.json", "\n [1]",
             ": byte 2: a remat dump is a JSON object and starts with '{', but this input starts with '[' (a JSON "
             "array)"}}) {
    const std::string file = dir.write(c.name, c.text);
    std::string message = file + c.message;
    if (const auto at = message.find("{}"); at != std::string::npos) message.replace(at, 2, file);
    for (const std::vector<std::string>& command : commands(file)) expect_message(run(command), message);
  }
  // A BOM'ed stage profile is refused too, the first bytes read from a stream as from a file.
  const std::string bom_stage = dir.write("bom-stage.json", "\xef\xbb\xbf" + data_text("stage-profile-0.json"));
  const CliResult r = run(commands(bom_stage)[1]);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(bom_stage + ": byte 0: starts with a UTF-8 byte-order mark"), std::string::npos) << r.err;
  const std::string fifo = dir.path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << std::string(5000, '\0'); });
  expect_message(run({"advise", fifo}),
                 fifo +
                     ": byte 0: starts with NUL bytes (4096 or more of them): not a JSON dump (a preallocated or "
                     "zero-filled file, or one whose writer stopped before writing?)");
  writer.join();
}

TEST(InputStart, SmallInputsAreReadWholeWithinTheirBoundOrRefusedSayingWhatToPass) {
  TempDir dir;
  const std::string fits = dir.write("fits.json", std::string(64, 'x'));
  EXPECT_EQ(read_text_input(fits, 64, "a thing", "a thing's dump"), std::string(64, 'x'));
  const auto refusal = [](const std::string& argument, std::uint64_t largest) {
    try {
      (void)read_text_input(argument, largest, "a thing", "a thing's dump");
    } catch (const InputError& error) {
      return std::string(error.what());
    }
    return std::string("(read)");
  };
  EXPECT_EQ(refusal(fits, 63), fits + " is 64 bytes, more than a thing holds; pass a thing's dump");
  EXPECT_EQ(refusal(dir.path(""), 64), dir.path("") + " is a directory; pass a thing's dump");
  EXPECT_EQ(refusal(dir.path("absent.json"), 64),
            "cannot read " + dir.path("absent.json") + ": No such file or directory; pass a thing's dump");
  // A stream's size is unknown: it is bounded as it is read.
  const std::string fifo = dir.path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << std::string(100, 'y'); });
  EXPECT_EQ(refusal(fifo, 64), fifo + " holds more than 64 bytes, more than a thing holds; pass a thing's dump");
  writer.join();
}

}  // namespace
}  // namespace remat::report::testing
