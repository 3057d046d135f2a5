#pragma once
// The schedules PyTorch 2.11 wrote into tests/pipeline/reference (see make_reference.py there):
// index.csv's shapes with their files, and grid.csv's digests of many more shapes.

#include <remat/pipeline/csv.hpp>
#include <remat/pipeline/generators.hpp>
#include <remat/pipeline/schedule.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace remat::pipeline::testing {

inline std::string reference_path(const std::string& name) {
  return std::string(REMAT_PIPELINE_REFERENCE_DIR) + "/" + name;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(separator, begin);
    out.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

// The rows (ranks) of a reference CSV, each as its cells' text. PyTorch's writer never quotes
// an action, and no reference has a rank of one idle step, so splitting at commas suffices.
inline std::vector<std::vector<std::string>> reference_cells(const std::string& name) {
  std::vector<std::vector<std::string>> rows;
  std::string text = read_bytes(reference_path(name));
  for (const std::string& line : split(text, '\n')) {
    if (line.empty()) continue;
    rows.push_back(split(line.substr(0, line.size() - (line.back() == '\r' ? 1 : 0)), ','));
  }
  return rows;
}

inline std::vector<std::vector<std::string>> cells_of(const Schedule& schedule) {
  std::vector<std::vector<std::string>> rows;
  for (const RankOrder& order : schedule.ranks) {
    std::vector<std::string> row;
    for (const auto& step : order) row.push_back(step ? to_string(*step) : "");
    rows.push_back(std::move(row));
  }
  return rows;
}

// What our writer makes of a schedule.
inline std::string csv_of(const Schedule& schedule) {
  std::ostringstream out;
  write_csv(out, schedule);
  return out.str();
}

// Lines of a reference table, without its comment line and header, split at commas.
inline std::vector<std::vector<std::string>> table_rows(const std::string& name) {
  std::vector<std::vector<std::string>> rows;
  bool header = true;
  for (const std::string& line : split(read_bytes(reference_path(name)), '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    rows.push_back(split(line, ','));
  }
  return rows;
}

struct ReferenceShape {
  ScheduleKind kind;
  ScheduleShape shape;
  std::string compute_only;
  std::string compute_comms;
  std::string runtime;
  std::string pipeline_order;  // GPipe and 1F1B: PyTorch's pipeline_order attribute as it holds it
  std::string label() const { return compute_only.substr(0, compute_only.find('.')); }
};

inline std::vector<ReferenceShape> reference_shapes() {
  std::vector<ReferenceShape> out;
  for (const auto& row : table_rows("index.csv")) {
    ReferenceShape r{*parse_schedule_kind(row.at(0)),
                     {std::stoi(row.at(1)), std::stoi(row.at(2)), std::stoi(row.at(3))},
                     row.at(4),
                     row.at(5),
                     row.at(6),
                     row.size() > 7 ? row.at(7) : ""};
    out.push_back(std::move(r));
  }
  return out;
}

struct GridShape {
  ScheduleKind kind;
  ScheduleShape shape;
  bool refused = false;
  std::string compute_only, compute_comms, runtime;  // FNV-1a 64 digests, hex
  std::string label() const {
    return std::string(to_string(kind)) + " r" + std::to_string(shape.ranks) + " v" +
           std::to_string(*shape.virtual_stages) + " m" + std::to_string(shape.microbatches);
  }
};

inline std::vector<GridShape> grid_shapes() {
  std::vector<GridShape> out;
  for (const auto& row : table_rows("grid.csv")) {
    GridShape g{*parse_schedule_kind(row.at(0)),
                {std::stoi(row.at(1)), std::stoi(row.at(2)), std::stoi(row.at(3))},
                row.at(4) == "refused",
                row.at(4),
                row.at(5),
                row.at(6)};
    out.push_back(std::move(g));
  }
  return out;
}

inline std::string fnv1a64(const std::string& bytes) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  static const char* hex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<std::size_t>(i)] = hex[h & 15];
  return out;
}

}  // namespace remat::pipeline::testing
