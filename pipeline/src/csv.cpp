#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/errors.hpp>
#include <remat/pipeline/validate.hpp>

#include <algorithm>
#include <cstdint>
#include <ios>
#include <istream>
#include <ostream>
#include <string>

namespace remat::pipeline {
namespace {

// Python's csv.field_size_limit() default: PyTorch's reader refuses a longer cell too.
constexpr std::size_t kFieldLimit = 131072;
// Far more cells than any real schedule (a generated one stays under a tenth of it); past
// this a file is refused before it can take gigabytes.
constexpr std::size_t kMaxCells = std::size_t{1} << 21;
// Rows are ranks, as many as `remat-report schedule --ranks` takes. Counted apart from cells
// because a blank line is a row with no cells: a file of newlines would otherwise take
// gigabytes before anything refused it.
constexpr std::size_t kMaxRows = std::size_t{1} << 16;
// Stages times microbatches, the limit generated schedules have too (see generators.cpp).
constexpr std::int64_t kMaxStageMicrobatches = std::int64_t{1} << 18;

std::string printable(std::string_view text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (const char ch : text.substr(0, 80)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (text.size() > 80) out += "...";
  return out;
}

std::string cell_name(std::size_t row, std::size_t cell) {
  return "rank " + std::to_string(row) + ", position " + std::to_string(cell);
}

// Python's csv.reader with the default (excel) dialect over a file opened with newline="", as
// PyTorch's _load_csv reads it: lines end at \n, \r or \r\n; a field that starts with a quote
// runs to the closing quote ("" inside is a quote, newlines are kept) and whatever follows it
// up to the comma is appended; a blank line is a row with no cells; a quote left open at the
// end of the file closes there. Streams in one pass, whatever the line length.
class PythonCsvReader {
 public:
  using OnField = void (*)(void*, std::size_t row, std::size_t cell, std::string_view text);

  PythonCsvReader(std::istream& in, void* context, OnField on_field)
      : in_(*in.rdbuf()), context_(context), on_field_(on_field) {}

  // Returns the number of rows.
  std::size_t read() {
    bool line_open = refuse_byte_order_mark();
    for (int c = in_.sbumpc(); c != kEof; c = in_.sbumpc()) {
      process(c);
      line_open = true;
      const bool line_ends = c == '\n' || (c == '\r' && in_.sgetc() != '\n');
      if (line_ends) {
        end_of_line();
        line_open = false;
      }
    }
    if (line_open) end_of_line();
    if (!field_.empty() || state_ == State::in_quoted_field) {
      save_field();
      next_row();
    }
    return row_;
  }

 private:
  static constexpr int kEof = std::char_traits<char>::eof();
  static constexpr int kEndOfLine = -2;
  enum class State { start_record, start_field, in_field, in_quoted_field, quote_in_quoted_field, eat_newline };

  // Returns whether it consumed the start of a line.
  bool refuse_byte_order_mark() {
    const int first = in_.sgetc();
    if (first != 0xEF && first != 0xFE && first != 0xFF) return false;
    std::string head;
    while (head.size() < 3 && in_.sgetc() != kEof) head += static_cast<char>(in_.sbumpc());
    if (head.substr(0, 3) == "\xEF\xBB\xBF") {
      throw PlanError(
          "the file starts with a UTF-8 byte-order mark, which PyTorch's _load_csv reads as part of the "
          "first action; save it without one");
    }
    if (head.substr(0, 2) == "\xFF\xFE" || head.substr(0, 2) == "\xFE\xFF") {
      throw PlanError("the file starts with a UTF-16 byte-order mark: it is UTF-16 text; convert it to UTF-8");
    }
    for (const char c : head) process(static_cast<unsigned char>(c));
    return true;
  }

  void end_of_line() {
    process(kEndOfLine);
    if (state_ == State::start_record) next_row();
  }

  void next_row() {
    if (++row_ > kMaxRows) {
      throw PlanError("more than " + std::to_string(kMaxRows) +
                      " rows: every row (a blank one too) is a rank, and no pipeline has this many");
    }
    cell_ = 0;
  }

  void add(int c) {
    if (field_.size() >= kFieldLimit) {
      throw PlanError(cell_name(row_, cell_) + ": a cell longer than " + std::to_string(kFieldLimit) +
                      " characters (Python's csv field limit, so PyTorch refuses it too): '" + printable(field_) + "'");
    }
    field_ += static_cast<char>(c);
  }

  void save_field() {
    if (++cells_ > kMaxCells) {
      throw PlanError(cell_name(row_, cell_) + ": more than " + std::to_string(kMaxCells) +
                      " cells; no pipeline schedule is this long");
    }
    on_field_(context_, row_, cell_++, field_);
    field_.clear();
  }

  static bool newline(int c) { return c == '\n' || c == '\r'; }

  void end_field(int c) {
    save_field();
    state_ = c == kEndOfLine ? State::start_record : State::eat_newline;
  }

  void process(int c) {
    switch (state_) {
      case State::start_record:
        if (c == kEndOfLine) return;  // a blank line: a row with no cells
        if (newline(c)) {
          state_ = State::eat_newline;
          return;
        }
        state_ = State::start_field;
        [[fallthrough]];
      case State::start_field:
        if (newline(c) || c == kEndOfLine) {
          end_field(c);
        } else if (c == '"') {
          state_ = State::in_quoted_field;
        } else if (c == ',') {
          save_field();
        } else {
          add(c);
          state_ = State::in_field;
        }
        return;
      case State::in_field:
        if (newline(c) || c == kEndOfLine) {
          end_field(c);
        } else if (c == ',') {
          save_field();
          state_ = State::start_field;
        } else {
          add(c);
        }
        return;
      case State::in_quoted_field:
        if (c == kEndOfLine) return;
        if (c == '"') {
          state_ = State::quote_in_quoted_field;
        } else {
          add(c);
        }
        return;
      case State::quote_in_quoted_field:
        if (c == '"') {
          add(c);
          state_ = State::in_quoted_field;
        } else if (c == ',') {
          save_field();
          state_ = State::start_field;
        } else if (newline(c) || c == kEndOfLine) {
          end_field(c);
        } else {
          add(c);
          state_ = State::in_field;
        }
        return;
      case State::eat_newline:
        if (c == kEndOfLine) state_ = State::start_record;
        return;  // lines end at their newline, so nothing else can follow one
    }
  }

  std::streambuf& in_;
  void* context_;
  OnField on_field_;
  State state_ = State::start_record;
  std::string field_;
  std::size_t row_ = 0;
  std::size_t cell_ = 0;
  std::size_t cells_ = 0;
};

bool plain_ascii(std::string_view text) {
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x7f || (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f')) {
      return false;
    }
  }
  return true;
}

struct Loading {
  std::vector<RankOrder> rows;
};

void on_field(void* context, std::size_t row, std::size_t cell, std::string_view text) {
  auto& rows = static_cast<Loading*>(context)->rows;
  if (rows.size() <= row) rows.resize(row + 1);
  if (!plain_ascii(text)) {
    throw PlanError(cell_name(row, cell) + ": '" + printable(text) +
                    "' is not a pipeline action (it holds a character outside printable ASCII)");
  }
  try {
    rows[row].push_back(parse_action(text));
  } catch (const PlanError& e) {
    throw PlanError(cell_name(row, cell) + ": " + e.what());
  }
}

// Stages and microbatches are numbered from 0 without gaps and each stage runs on one rank:
// infer their counts and the stage-to-rank mapping from the actions, naming the action that
// breaks the numbering.
void infer_shape(Schedule& schedule) {
  std::size_t leaves = 0;
  for (const RankOrder& order : schedule.ranks) {
    for (const auto& step : order) {
      if (step) leaves += step->sub_actions.empty() ? 1 : step->sub_actions.size();
    }
  }
  if (leaves == 0) throw PlanError("the CSV holds no actions");
  int max_stage = -1;
  int max_mb = -1;
  std::vector<int> first_rank;
  std::vector<std::size_t> first_position;
  for (std::size_t r = 0; r < schedule.ranks.size(); ++r) {
    const RankOrder& order = schedule.ranks[r];
    for (std::size_t position = 0; position < order.size(); ++position) {
      if (!order[position]) continue;
      const Action& step = *order[position];
      const Action* leaves_of_step = step.sub_actions.empty() ? &step : step.sub_actions.data();
      const std::size_t count = step.sub_actions.empty() ? 1 : step.sub_actions.size();
      for (std::size_t i = 0; i < count; ++i) {
        const Action& leaf = leaves_of_step[i];
        const std::string at = cell_name(r, position) + ", " + to_string(leaf);
        // Every stage runs every microbatch, so neither count can exceed the number of actions.
        if (static_cast<std::size_t>(leaf.stage) >= leaves) {
          throw PlanError(at + ": stage " + std::to_string(leaf.stage) + " cannot exist in a schedule of " +
                          std::to_string(leaves) +
                          " actions: stages are numbered 0, 1, 2, ... and each runs every microbatch");
        }
        if (leaf.microbatch && static_cast<std::size_t>(*leaf.microbatch) >= leaves) {
          throw PlanError(at + ": microbatch " + std::to_string(*leaf.microbatch) + " cannot exist in a schedule of " +
                          std::to_string(leaves) +
                          " actions: microbatches are numbered 0, 1, 2, ... and every stage runs each");
        }
        if (leaf.microbatch) max_mb = std::max(max_mb, *leaf.microbatch);
        const auto s = static_cast<std::size_t>(leaf.stage);
        if (s >= first_rank.size()) {
          first_rank.resize(s + 1, -1);
          first_position.resize(s + 1, 0);
        }
        max_stage = std::max(max_stage, leaf.stage);
        if (first_rank[s] < 0) {
          first_rank[s] = static_cast<int>(r);
          first_position[s] = position;
        } else if (first_rank[s] != static_cast<int>(r)) {
          throw PlanError(at + ": stage " + std::to_string(leaf.stage) + " already runs on rank " +
                          std::to_string(first_rank[s]) + " (position " + std::to_string(first_position[s]) +
                          "): a stage runs on one rank");
        }
      }
    }
  }
  for (int stage = 0; stage <= max_stage; ++stage) {
    if (first_rank[static_cast<std::size_t>(stage)] >= 0) continue;
    const auto top = static_cast<std::size_t>(max_stage);
    throw PlanError("no action runs stage " + std::to_string(stage) + ", yet the stages go up to " +
                    std::to_string(max_stage) + " (" +
                    cell_name(static_cast<std::size_t>(first_rank[top]), first_position[top]) +
                    "): stages are numbered 0.." + std::to_string(max_stage) + " without gaps");
  }
  const std::int64_t size = std::int64_t{max_stage + 1} * (max_mb + 1);
  if (size > kMaxStageMicrobatches) {
    throw PlanError(std::to_string(max_stage + 1) + " stages x " + std::to_string(max_mb + 1) +
                    " microbatches is too large to plan: stages x microbatches exceeds " +
                    std::to_string(kMaxStageMicrobatches) + ", the limit generated schedules have too");
  }
  schedule.stage_to_rank = std::move(first_rank);
  schedule.microbatches = max_mb + 1;
}

// Python's csv.writer, excel dialect: QUOTE_MINIMAL, "\r\n" after each row, and a row of one
// empty cell written as "" so that it reads back as a row.
void write_cell(std::ostream& out, const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) {
    out << text;
    return;
  }
  out << '"';
  for (const char c : text) {
    if (c == '"') out << '"';
    out << c;
  }
  out << '"';
}

}  // namespace

Schedule load_csv(std::istream& in, CsvFormat format, std::string_view source) {
  const std::string prefix = std::string(source) + ": ";
  try {
    Loading loading;
    std::size_t rows = 0;
    try {
      rows = PythonCsvReader(in, &loading, &on_field).read();
    } catch (const std::ios_base::failure& e) {
      // The reader takes bytes from the stream buffer, whose read errors (a directory opened as
      // a file, an I/O error) arrive as exceptions rather than as the stream's state.
      throw PlanError(std::string("reading failed: ") + e.what());
    }
    if (in.bad()) throw PlanError("reading failed");
    if (rows == 0) throw PlanError("the CSV is empty: it needs one row of actions per rank");
    loading.rows.resize(rows);
    Schedule schedule;
    schedule.ranks = std::move(loading.rows);
    infer_shape(schedule);
    validate_schedule(schedule, format);
    return schedule;
  } catch (const PlanError& e) {
    throw PlanError(prefix + e.what());
  }
}

void write_csv(std::ostream& out, const Schedule& schedule) {
  for (const RankOrder& order : schedule.ranks) {
    if (order.size() == 1 && !order.front()) {
      out << "\"\"";
    } else {
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (i > 0) out << ',';
        if (order[i]) write_cell(out, to_string(*order[i]));
      }
    }
    out << "\r\n";
  }
}

}  // namespace remat::pipeline
