#pragma once
// Marks of the default generators (the CPU generator's, and each CUDA device's that has a
// context), to tell whether anything drew random numbers between two points: a recompute that
// draws, in a checkpoint keeping no RNG state, draws other numbers than forward did. Taken on every
// recompute of such a checkpoint, so they are small values, not the generators' states: a draw
// moves the CPU engine's position, and one that runs past the end of its state makes the whole
// state anew, which its first word tells.

#include <cstdint>
#include <optional>
#include <vector>

namespace remat::detail {

struct CudaGeneratorMark {
  std::int8_t device = 0;  // c10::DeviceIndex
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // the Philox offset, which every draw moves
};

struct GeneratorMarks {
  std::uint64_t cpu_seed = 0;
  std::uint32_t cpu_left = 0, cpu_next = 0, cpu_first_word = 0;
  bool cpu_seeded = false;
  std::optional<float> cpu_float_normal;  // the cached second sample of normal()
  std::optional<double> cpu_double_normal;
  std::vector<CudaGeneratorMark> cuda;
};

GeneratorMarks generator_marks();

// Whether nothing drew random numbers (nor reseeded) between `before` and `after`.
bool same_generator_marks(const GeneratorMarks& before, const GeneratorMarks& after);

}  // namespace remat::detail
