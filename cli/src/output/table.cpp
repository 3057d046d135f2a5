#include "output/table.hpp"

#include "core/format.hpp"
#include "core/terminal_text.hpp"
#include "output/display_names.hpp"
#include "output/json_text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

namespace remat::report {

namespace {

constexpr const char* kBold = "\x1b[1m";
constexpr const char* kTitle = "\x1b[1;36m";
constexpr const char* kDim = "\x1b[2m";
constexpr const char* kReset = "\x1b[0m";

// Display width in terminal columns: one per code point (enough for names and paths).
std::size_t width_of(const std::string& text) {
  std::size_t width = 0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++width;
  }
  return width;
}

std::string raw_text(const Cell& cell) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return "";
        else if constexpr (std::is_same_v<T, std::string>)
          return v;
        else if constexpr (std::is_same_v<T, double>)
          return fmt::format("{}", v);
        else if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else
          return std::to_string(v);
      },
      cell.value);
}

nlohmann::ordered_json json_value(const Cell& cell) {
  return std::visit(
      [&](const auto& v) -> nlohmann::ordered_json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return nullptr;
        else if constexpr (std::is_same_v<T, std::string>)
          return v;
        else if constexpr (std::is_same_v<T, double>) {
          if (cell.display == Display::share) return std::round(v * 1e6) / 1e6;
          return v;
        } else
          return v;
      },
      cell.value);
}

}  // namespace

namespace {

std::string quoted_csv(const std::string& text) {
  if (text.find_first_of(",\"") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

bool is_number(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const char* begin = text.data() + (!text.empty() && text.front() == '+' ? 1 : 0);
  const auto [stop, error] = std::from_chars(begin, end, value);
  return error == std::errc() && stop == end && std::isfinite(value);
}

}  // namespace

std::string csv_field(const std::string& raw) {
  // OWASP's CSV injection advice: a spreadsheet runs a cell that starts with one of these as a
  // formula; an apostrophe makes it text. A number ("-5", "+1.5e3") stays a number.
  const bool formula = !raw.empty() && std::string_view("=+-@\t\r").find(raw.front()) != std::string_view::npos;
  const std::string text = escape_controls(raw);
  return quoted_csv(formula && !is_number(raw) ? "'" + text : text);
}

namespace {

// A number as written; text from a dump as csv_field writes it.
std::string csv_cell(const Cell& cell) {
  return std::holds_alternative<std::string>(cell.value) ? csv_field(raw_text(cell)) : quoted_csv(raw_text(cell));
}

}  // namespace

namespace {

void write_text_table(std::ostream& out, const Table& table, bool color) {
  if (!table.title.empty())
    out << (color ? kTitle : "") << escape_controls(table.title) << (color ? kReset : "") << '\n';
  if (table.text_lines) {
    for (const std::string& line : *table.text_lines) out << escape_controls(line) << '\n';
    return;
  }
  if (table.key_value) {
    std::size_t key_width = 0;
    for (const auto& row : table.rows) key_width = std::max(key_width, width_of(escape_controls(raw_text(row[0]))));
    for (const auto& row : table.rows) {
      const std::string key = escape_controls(raw_text(row[0]));
      out << "  " << key << std::string(key_width - width_of(key), ' ') << "  " << escape_controls(display_text(row[1]))
          << '\n';
    }
    return;
  }
  std::vector<const Column*> columns;
  std::vector<std::size_t> source;  // the row index of each shown column
  for (std::size_t c = 0; c < table.columns.size(); ++c) {
    if (!table.columns[c].in_text) continue;
    columns.push_back(&table.columns[c]);
    source.push_back(c);
  }
  const std::size_t n = columns.size();
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> widths(n);
  for (std::size_t c = 0; c < n; ++c) widths[c] = width_of(escape_controls(columns[c]->title));
  auto measure = [&](const std::vector<Cell>& row) {
    std::vector<std::string> text(n);
    for (std::size_t c = 0; c < n && source[c] < row.size(); ++c) {
      text[c] = escape_controls(display_text(row[source[c]]));
      widths[c] = std::max(widths[c], width_of(text[c]));
    }
    return text;
  };
  for (const auto& row : table.rows) cells.push_back(measure(row));
  std::vector<std::string> total;
  if (table.total) total = measure(*table.total);
  auto line = [&](const std::vector<std::string>& text) {
    std::string s;
    for (std::size_t c = 0; c < n; ++c) {
      const std::string pad(widths[c] - width_of(text[c]), ' ');
      if (c > 0) s += "  ";
      if (columns[c]->numeric)
        s += pad + text[c];
      else if (c + 1 < n)
        s += text[c] + pad;
      else
        s += text[c];
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  std::vector<std::string> header(n);
  for (std::size_t c = 0; c < n; ++c) header[c] = escape_controls(columns[c]->title);
  out << (color ? kBold : "") << line(header) << (color ? kReset : "") << '\n';
  std::size_t rule = 0;
  for (std::size_t c = 0; c < n; ++c) rule += widths[c] + (c > 0 ? 2 : 0);
  for (const auto& text : cells) out << line(text) << '\n';
  if (table.total) {
    out << (color ? kDim : "") << std::string(rule, '-') << (color ? kReset : "") << '\n';
    out << (color ? kBold : "") << line(total) << (color ? kReset : "") << '\n';
  }
}

nlohmann::ordered_json row_object(const Table& table, const std::vector<Cell>& row) {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (std::size_t c = 0; c < table.columns.size() && c < row.size(); ++c) {
    object[table.columns[c].key] = json_value(row[c]);
  }
  return object;
}

}  // namespace

std::string display_text(const Cell& cell) {
  if (std::holds_alternative<std::monostate>(cell.value)) return "-";
  switch (cell.display) {
    case Display::bytes:
      if (const auto* v = std::get_if<std::uint64_t>(&cell.value)) return human_bytes(*v);
      break;
    case Display::signed_bytes:
      if (const auto* v = std::get_if<std::int64_t>(&cell.value)) return human_signed_bytes(*v);
      if (const auto* v = std::get_if<std::uint64_t>(&cell.value))
        return fmt::format("{}{}", *v == 0 ? "" : "+", human_bytes(*v));
      break;
    case Display::share:
      if (const auto* v = std::get_if<double>(&cell.value)) return percent(*v);
      break;
    case Display::time_us:
      if (const auto* v = std::get_if<std::int64_t>(&cell.value)) return human_time_us(*v);
      break;
    case Display::address:
      if (const auto* v = std::get_if<std::uint64_t>(&cell.value)) return hex_address(*v);
      break;
    case Display::plain:
      if (const auto* v = std::get_if<double>(&cell.value)) return fmt::format("{:.4g}", *v);
      if (const auto* v = std::get_if<bool>(&cell.value)) return *v ? "yes" : "no";
      break;
    case Display::name:
      if (const auto* v = std::get_if<std::string>(&cell.value)) return shown_name(*v);
      break;
  }
  return raw_text(cell);
}

Table key_value_table(std::string id, std::string title) {
  Table table{.id = std::move(id),
              .title = std::move(title),
              .columns = {{"field", "field", false}, {"value", "value", false}}};
  table.key_value = true;
  return table;
}

void add_field(Table& table, const std::string& key, Cell value) {
  table.rows.push_back({Cell::text(key), std::move(value)});
}

void write_report(std::ostream& out, const Report& report, OutputFormat format, bool color) {
  switch (format) {
    case OutputFormat::text: {
      bool first = true;
      for (const Table& table : report.tables) {
        if (table.title.empty() && table.text_lines && table.text_lines->empty()) continue;  // for machines only
        if (!first) out << '\n';
        first = false;
        write_text_table(out, table, color);
      }
      for (const std::string& note : report.notes) {
        out << (color ? kDim : "") << "note: " << escape_controls(note) << (color ? kReset : "") << '\n';
      }
      break;
    }
    case OutputFormat::json: {
      nlohmann::ordered_json root = nlohmann::ordered_json::object();
      for (const Table& table : report.tables) {
        if (table.key_value) {
          nlohmann::ordered_json object = nlohmann::ordered_json::object();
          for (const auto& row : table.rows) object[raw_text(row[0])] = json_value(row[1]);
          root[table.id] = std::move(object);
          continue;
        }
        nlohmann::ordered_json rows = nlohmann::ordered_json::array();
        for (const auto& row : table.rows) rows.push_back(row_object(table, row));
        root[table.id] = std::move(rows);
        if (table.total) root[table.id + "_total"] = row_object(table, *table.total);
      }
      if (!report.notes.empty()) root["notes"] = report.notes;
      out << json_text(root, 2) << '\n';
      break;
    }
    case OutputFormat::csv: {
      bool first = true;
      for (const Table& table : report.tables) {
        if (!first) out << '\n';
        first = false;
        for (std::size_t c = 0; c < table.columns.size(); ++c) out << (c ? "," : "") << csv_field(table.columns[c].key);
        out << '\n';
        auto write_row = [&](const std::vector<Cell>& row) {
          for (std::size_t c = 0; c < table.columns.size(); ++c) {
            out << (c ? "," : "") << (c < row.size() ? csv_cell(row[c]) : "");
          }
          out << '\n';
        };
        for (const auto& row : table.rows) write_row(row);
        if (table.total) write_row(*table.total);
      }
      break;
    }
  }
}

}  // namespace remat::report
