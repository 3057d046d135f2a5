#pragma once
// Results as tables that render three ways: aligned text for people (bytes in binary units,
// color only on a terminal), JSON and CSV with raw numbers for machines. Text and CSV escape
// control characters (core/terminal_text.hpp); JSON keeps every string's exact value.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

namespace remat::report {

// `name`: a name from the dump, quoted in text when it reads like remat-report's own labels
// (output/display_names.hpp).
enum class Display : std::uint8_t { plain, bytes, signed_bytes, share, time_us, address, name };

struct Cell {
  std::variant<std::monostate, std::string, std::int64_t, std::uint64_t, double, bool> value;
  Display display = Display::plain;

  static Cell none() { return {}; }
  static Cell text(std::string s) { return {std::move(s), Display::plain}; }
  static Cell name(std::string s) { return {std::move(s), Display::name}; }
  static Cell flag(bool v) { return {v, Display::plain}; }
  static Cell count(std::uint64_t v) { return {v, Display::plain}; }
  static Cell integer(std::int64_t v) { return {v, Display::plain}; }
  static Cell bytes(std::uint64_t v) { return {v, Display::bytes}; }
  static Cell delta_bytes(std::int64_t v) { return {v, Display::signed_bytes}; }
  // An increase too large for delta_bytes (above 2^63 - 1), shown with its sign like one.
  static Cell increase_bytes(std::uint64_t v) { return {v, Display::signed_bytes}; }
  static Cell share(double v) { return {v, Display::share}; }
  static Cell time(std::int64_t v) { return {v, Display::time_us}; }
  static Cell address(std::uint64_t v) { return {v, Display::address}; }
  static Cell real(double v) { return {v, Display::plain}; }
};

struct Column {
  std::string title;  // for people
  std::string key;    // for JSON and CSV
  bool numeric = false;
  bool in_text = true;  // false: for JSON and CSV only
};

struct Table {
  std::string id;
  std::string title;
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;
  std::optional<std::vector<Cell>> total;
  // Two columns, key and value: JSON renders it as one object.
  bool key_value = false;
  // For people: these lines under the title instead of the grid (JSON and CSV keep the rows),
  // for reports whose text form is fixed elsewhere, such as the runtime's own formatters.
  std::optional<std::vector<std::string>> text_lines;
};

// A table of (field, value) pairs, such as a summary section.
Table key_value_table(std::string id, std::string title);
void add_field(Table& table, const std::string& key, Cell value);

struct Report {
  std::vector<Table> tables;
  std::vector<std::string> notes;
};

enum class OutputFormat : std::uint8_t { text, json, csv };

void write_report(std::ostream& out, const Report& report, OutputFormat format, bool color);
std::string display_text(const Cell& cell);
// One CSV field of text: control and invisible format characters escaped (a field is always one
// line), a leading apostrophe where a spreadsheet would run the text as a formula (it starts with
// =, +, -, @, a tab or a CR and is no number), quoted when it holds a comma or a double quote.
std::string csv_field(const std::string& text);

}  // namespace remat::report
