#include "interop/pickle_writer.hpp"

#include <cstring>

namespace remat::report {

namespace op {
constexpr std::uint8_t kProto = 0x80, kStop = '.', kNone = 'N', kTrue = 0x88, kFalse = 0x89, kBinInt = 'J',
                       kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = 0x8a, kBinFloat = 'G', kBinUnicode = 'X',
                       kEmptyDict = '}', kEmptyList = ']', kMark = '(', kSetItems = 'u', kAppends = 'e',
                       kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kBinPut = 'q', kLongBinPut = 'r',
                       kBinGet = 'h', kLongBinGet = 'j';
}

PickleWriter::PickleWriter() {
  op(op::kProto);
  op(2);
}

void PickleWriter::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xffu);
}

void PickleWriter::none() { op(op::kNone); }
void PickleWriter::boolean(bool value) { op(value ? op::kTrue : op::kFalse); }

void PickleWriter::integer(std::int64_t value) {
  if (value >= 0 && value < 256) {
    op(op::kBinInt1);
    out_ += static_cast<char>(value);
  } else if (value >= 0 && value < 65536) {
    op(op::kBinInt2);
    out_ += static_cast<char>(value & 0xff);
    out_ += static_cast<char>(value >> 8);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    op(op::kBinInt);
    u32(static_cast<std::uint32_t>(static_cast<std::int32_t>(value)));
  } else {
    // LONG1: little-endian two's complement, as few bytes as keep the sign.
    std::string bytes;
    auto v = static_cast<std::uint64_t>(value);
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((v >> (8 * i)) & 0xffu);
    while (bytes.size() > 1) {
      const auto last = static_cast<unsigned char>(bytes.back());
      const auto prev = static_cast<unsigned char>(bytes[bytes.size() - 2]);
      if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) bytes.pop_back();
      else break;
    }
    op(op::kLong1);
    out_ += static_cast<char>(bytes.size());
    out_ += bytes;
  }
}

void PickleWriter::unsigned_integer(std::uint64_t value) {
  if (value <= static_cast<std::uint64_t>(INT64_MAX)) {
    integer(static_cast<std::int64_t>(value));
    return;
  }
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((value >> (8 * i)) & 0xffu);
  bytes += '\0';  // keep it positive
  op(op::kLong1);
  out_ += static_cast<char>(bytes.size());
  out_ += bytes;
}

void PickleWriter::real(double value) {
  op(op::kBinFloat);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xffu);  // big-endian
}

void PickleWriter::string(std::string_view value) {
  op(op::kBinUnicode);
  u32(static_cast<std::uint32_t>(value.size()));
  out_ += value;
}

void PickleWriter::begin_dict() {
  op(op::kEmptyDict);
  op(op::kMark);
}
void PickleWriter::end_dict() { op(op::kSetItems); }
void PickleWriter::begin_list() {
  op(op::kEmptyList);
  op(op::kMark);
}
void PickleWriter::end_list() { op(op::kAppends); }

void PickleWriter::tuple(int count) { op(count == 1 ? op::kTuple1 : count == 2 ? op::kTuple2 : op::kTuple3); }

std::uint32_t PickleWriter::remember() {
  const std::uint32_t id = next_memo_++;
  if (id < 256) {
    op(op::kBinPut);
    out_ += static_cast<char>(id);
  } else {
    op(op::kLongBinPut);
    u32(id);
  }
  return id;
}

void PickleWriter::recall(std::uint32_t id) {
  if (id < 256) {
    op(op::kBinGet);
    out_ += static_cast<char>(id);
  } else {
    op(op::kLongBinGet);
    u32(id);
  }
}

std::string PickleWriter::take() {
  std::string taken;
  taken.swap(out_);
  return taken;
}

std::string PickleWriter::finish() {
  op(op::kStop);
  return std::move(out_);
}

}  // namespace remat::report
