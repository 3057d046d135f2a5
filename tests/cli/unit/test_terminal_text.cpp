// Names from a dump never reach a terminal as control sequences: text and CSV escape C0
// controls, DEL and C1 controls as \u00XX, JSON keeps the exact string (escaped the same way),
// and messages on stderr are escaped too.
#include "cli_runner.hpp"
#include "core/terminal_text.hpp"
#include "output/chart_style.hpp"
#include "output/table.hpp"

#include <sstream>

#include <nlohmann/json.hpp>

namespace remat::report::testing {
namespace {

// A region retitling the terminal and turning it red, a site with an 8-bit CSI (U+009B) and
// DEL, a host with a bell.
const std::string kRegion = "evil\x1b]0;owned\x07\x1b[31m";
const std::string kSite =
    "site\xc2\x9b"
    "2J\x7f";
const std::string kHost = "host\x07";

std::string hostile_trace() {
  const nlohmann::json header = {
      {"kind", "trace"},
      {"schema_version", 1},
      {"producer", "test"},
      {"created_at", "2026-01-01T00:00:00Z"},
      {"host", kHost},
      {"pid", 1},
      {"rank", 0},
      {"device", 0},
      {"names", {"", kRegion, kSite}},
      {"tags",
       {{{"region", 0}, {"policy", "none"}, {"phase", "other"}, {"site", 0}, {"recv", nullptr}},
        {{"region", 1}, {"policy", "save"}, {"phase", "forward"}, {"site", 2}, {"recv", nullptr}}}},
      {"event_count", nullptr}};
  return header.dump() + "\n" + event("segment_alloc", 0, 4096, 8192, 0) + "\n" + event("alloc", 1, 4096, 512, 1) +
         "\n" + event("alloc", 2, 8192, 256, 0) + "\n";
}

// Bytes a terminal acts on: C0 controls but the newline, DEL, and UTF-8 encoded C1 controls.
std::string first_control(const std::string& text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) return "byte " + std::to_string(i) + ": " + std::to_string(c);
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      return "C1 control at byte " + std::to_string(i);
    }
  }
  return {};
}

TEST(TerminalText, EscapesC0ControlsDelAndC1ControlsAndKeepsLetters) {
  EXPECT_EQ(escape_controls("plain layers.0"), "plain layers.0");
  EXPECT_EQ(escape_controls("a\x1b[31mb"), "a\\u001b[31mb");
  EXPECT_EQ(escape_controls("bell\x07 tab\t nl\n"), "bell\\u0007 tab\\u0009 nl\\u000a");
  EXPECT_EQ(escape_controls("del\x7f"), "del\\u007f");
  EXPECT_EQ(escape_controls("csi\xc2\x9b"
                            "31m"),
            "csi\\u009b31m");
  EXPECT_EQ(escape_controls("caf\xc3\xa9 \xe2\x80\x94 ok"), "caf\xc3\xa9 \xe2\x80\x94 ok");
  EXPECT_EQ(escape_controls("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(escape_controls(std::string("nul\0x", 5)), "nul\\u0000x");
}

TEST(TerminalText, NoTextOrCsvOutputCarriesAControlCharacter) {
  TempDir dir;
  const std::string file = dir.write("hostile.jsonl", hostile_trace());
  const std::vector<std::vector<std::string>> commands = {
      {"summary", file},
      {"summary", file, "--csv"},
      {"memory", file},
      {"memory", file, "--csv"},
      {"memory", file, "--by", "site"},
      {"memory", file, "--by", "site", "--csv"},
      {"segments", file},
      {"trace", file},
      {"trace", file, "--csv"},
      {"diff", file, file},
      {"diff", file, file, "--csv"},
      {"validate", file},
      {"timeline", file, "-o", dir.path("t.svg")},
      {"export", file, "--to", "torch-snapshot", "-o", dir.path("t.pickle")}};
  for (const std::vector<std::string>& command : commands) {
    const CliResult r = run(command);
    EXPECT_EQ(r.code, 0) << command[0] << ": " << r.err;
    EXPECT_EQ(first_control(r.out), "") << command[0] << " " << command.back() << ": " << r.out;
    EXPECT_EQ(first_control(r.err), "") << command[0] << ": " << r.err;
  }
  const CliResult memory = run({"memory", file});
  EXPECT_NE(memory.out.find("evil\\u001b]0;owned\\u0007\\u001b[31m"), std::string::npos) << memory.out;
  const CliResult sites = run({"memory", file, "--by", "site", "--csv"});
  EXPECT_NE(sites.out.find("site\\u009b2J\\u007f,false,"), std::string::npos) << sites.out;
  const CliResult summary = run({"summary", file});
  EXPECT_NE(summary.out.find("  host            host\\u0007\n"), std::string::npos) << summary.out;
}

TEST(TerminalText, JsonKeepsTheExactStringsAndStaysValid) {
  TempDir dir;
  const std::string file = dir.write("hostile.jsonl", hostile_trace());
  const CliResult memory = run({"memory", file, "--json"});
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_EQ(first_control(memory.out), "");
  bool found = false;
  const nlohmann::json parsed = nlohmann::json::parse(memory.out);
  for (const nlohmann::json& row : parsed["memory"]) found |= row["region"] == kRegion;
  EXPECT_TRUE(found) << memory.out;

  const CliResult sites = run({"memory", file, "--by", "site", "--json"});
  ASSERT_EQ(sites.code, 0) << sites.err;
  EXPECT_NE(sites.out.find("\"site\\u009b2J\\u007f\""), std::string::npos) << sites.out;
  EXPECT_EQ(nlohmann::json::parse(sites.out)["memory"][0]["site"], kSite);

  const CliResult trace = run({"trace", file, "--json"});
  ASSERT_EQ(trace.code, 0) << trace.err;
  EXPECT_EQ(first_control(trace.out), "");
  EXPECT_EQ(nlohmann::json::parse(trace.out)["events"][1]["region"], kRegion);

  const CliResult summary = run({"summary", file, "--json"});
  ASSERT_EQ(summary.code, 0) << summary.err;
  EXPECT_EQ(nlohmann::json::parse(summary.out)["dump"]["host"], kHost);
}

TEST(TerminalText, MessagesOnStderrAreEscaped) {
  TempDir dir;
  const std::string file = dir.write("t.jsonl", trace_text({event(R"(tele\u001b[2Jport)", 1, 4096, 512, 1)}));
  const CliResult r = run({"trace", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(first_control(r.err), "") << r.err;
  EXPECT_NE(r.err.find("unknown action 'tele\\u001b[2Jport'"), std::string::npos) << r.err;

  const std::string odd_name = dir.write("odd\x1b[31m.jsonl", trace_text({event("alloc", 1, 4096, 512, 1)}));
  const CliResult valid = run({"validate", odd_name});
  EXPECT_EQ(valid.code, 0) << valid.err;
  EXPECT_EQ(first_control(valid.out), "") << valid.out;
  EXPECT_NE(valid.out.find("odd\\u001b[31m.jsonl: valid trace dump"), std::string::npos) << valid.out;
}

TEST(TerminalText, ANewlineInAPathIsEscapedInMessagesNotTurnedIntoASpace) {
  TempDir dir;
  const std::string file = dir.path("two\nlines.json");
  const CliResult r = run({"summary", file});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "remat-report: cannot open " + dir.path("two\\u000alines.json") + ": No such file or directory\n");
}

TEST(TerminalText, EscapesCharactersThatReorderOrHideText) {
  // RLO, ZWSP, LRI, PDI, RLM and the Arabic letter mark: shown as escapes, never obeyed.
  EXPECT_EQ(escape_controls("file\xe2\x80\xae"
                            "gpj.exe"),
            "file\\u202egpj.exe");
  EXPECT_EQ(escape_controls("a\xe2\x80\x8b"
                            "b"),
            "a\\u200bb");
  EXPECT_EQ(escape_controls("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  EXPECT_EQ(escape_controls("\xe2\x80\x8f\xd8\x9c"), "\\u200f\\u061c");
  EXPECT_EQ(escape_controls("\xe2\x80\x94 \xe2\x80\xaf \xd8\xa7"),
            "\xe2\x80\x94 \xe2\x80\xaf \xd8\xa7");  // dash, NNBSP, alef
  EXPECT_FALSE(has_no_controls("x\xe2\x80\xaa"));
  EXPECT_EQ(xml_escape("<a\xe2\x80\xae"
                       "b>"),
            "&lt;a\\u202eb&gt;");
  EXPECT_EQ(xml_escape("caf\xc3\xa9 \xe2\x80\x94"), "caf\xc3\xa9 \xe2\x80\x94");
}

TEST(TerminalText, CsvCellsThatASpreadsheetWouldRunAreText) {
  EXPECT_EQ(csv_field("=cmd|'/c calc'!A1"), "'=cmd|'/c calc'!A1");
  EXPECT_EQ(csv_field("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(csv_field("+x"), "'+x");
  EXPECT_EQ(csv_field("-x"), "'-x");
  EXPECT_EQ(csv_field("\tx"), "'\\u0009x");
  EXPECT_EQ(csv_field("\rx"), "'\\u000dx");
  EXPECT_EQ(csv_field("=1+2,3"), "\"'=1+2,3\"");
  EXPECT_EQ(csv_field("-5"), "-5");  // numbers stay numbers
  EXPECT_EQ(csv_field("+1.5e3"), "+1.5e3");
  EXPECT_EQ(csv_field("layers.0"), "layers.0");

  Report report;
  Table table{.id = "t", .title = "T", .columns = {{"name", "name", false}, {"delta", "delta", true}}};
  table.rows.push_back({Cell::name("=HYPERLINK(\"x\")"), Cell::delta_bytes(-4096)});
  table.rows.push_back({Cell::text("-3"), Cell::real(-0.5)});
  report.tables.push_back(table);
  std::ostringstream out;
  write_report(out, report, OutputFormat::csv, false);
  EXPECT_NE(out.str().find("\"'=HYPERLINK(\"\"x\"\")\",-4096\n"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("\n-3,-0.5\n"), std::string::npos) << out.str();
}

TEST(TerminalText, NoSnapshotNameReachesCsvAsAFormula) {
  TempDir dir;
  nlohmann::json snapshot = nlohmann::json::parse(data_text("snapshot-peak.json"));
  ASSERT_TRUE(snapshot.contains("names")) << "the fixture's shape changed";
  ASSERT_EQ(snapshot["names"][2], "layers.0");
  snapshot["names"][2] = "=cmd|'/c calc'!A1";
  const std::string file = dir.write("evil.json", snapshot.dump());
  const CliResult r = run({"memory", file, "--csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n'=cmd|'/c calc'!A1,"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n=cmd"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace remat::report::testing
