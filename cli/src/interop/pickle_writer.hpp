#pragma once
// Writes Python pickles (protocol 2) of plain data: dicts, lists, tuples, strings, ints,
// floats, booleans and None, with memo references for shared values.

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::report {

class PickleWriter {
 public:
  PickleWriter();

  void none();
  void boolean(bool value);
  void integer(std::int64_t value);
  void unsigned_integer(std::uint64_t value);
  void real(double value);
  void string(std::string_view value);

  // Containers: open, write the items (key, value, key, value for dicts), close.
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  // A tuple of the last `count` (1 to 3) values written.
  void tuple(int count);

  // Remembers the value just written; `recall` writes it again as a reference.
  std::uint32_t remember();
  void recall(std::uint32_t id);

  // The bytes written since the last call (or the start), for a pickle written out as it grows;
  // memo references stay valid across calls.
  std::string take();
  // Finishes the pickle and returns its bytes (those not taken yet).
  std::string finish();

 private:
  void op(std::uint8_t code) { out_ += static_cast<char>(code); }
  void u32(std::uint32_t v);

  std::string out_;
  std::uint32_t next_memo_ = 0;
};

}  // namespace remat::report
