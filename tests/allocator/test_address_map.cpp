// The map of values by address the pool and remat-report's replays share, against
// std::unordered_map, with the address 0 and addresses that share a home slot.
#include <remat/alloc/address_map.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <unordered_map>

namespace remat::alloc {
namespace {

void expect_same(const AddressMap<std::uint64_t>& map, const std::unordered_map<std::uint64_t, std::uint64_t>& reference) {
  ASSERT_EQ(map.size(), reference.size());
  for (const auto& [address, value] : reference) {
    const std::uint64_t* found = map.find(address);
    ASSERT_NE(found, nullptr) << address;
    EXPECT_EQ(*found, value);
  }
  std::map<std::uint64_t, std::uint64_t> visited;
  map.for_each([&](std::uint64_t address, std::uint64_t value) { EXPECT_TRUE(visited.emplace(address, value).second); });
  EXPECT_EQ(visited, (std::map<std::uint64_t, std::uint64_t>(reference.begin(), reference.end())));
}

TEST(AddressMap, AgreesWithUnorderedMapUnderRandomPutsAndErasesAcrossGrowth) {
  AddressMap<std::uint64_t> map;
  std::unordered_map<std::uint64_t, std::uint64_t> reference;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200000; ++i) {
    // 512-aligned addresses, 0 among them, and a few unaligned ones sharing their home slots.
    std::uint64_t address = (rng() % 5000) * 512;
    if (rng() % 16 == 0) address += 8;
    if (rng() % 2) {
      map.put(address, static_cast<std::uint64_t>(i));
      reference[address] = static_cast<std::uint64_t>(i);
    } else {
      ASSERT_EQ(map.erase(address), reference.erase(address) == 1) << address;
    }
  }
  expect_same(map, reference);
  // Past the first growth and back down.
  for (std::uint64_t k = 1; k <= 4000; ++k) {
    map.put(k * 4096 + (std::uint64_t{1} << 40), k);
    reference[k * 4096 + (std::uint64_t{1} << 40)] = k;
  }
  expect_same(map, reference);
  for (std::uint64_t k = 1; k <= 4000; k += 2) {
    EXPECT_TRUE(map.erase(k * 4096 + (std::uint64_t{1} << 40)));
    reference.erase(k * 4096 + (std::uint64_t{1} << 40));
  }
  expect_same(map, reference);
}

TEST(AddressMap, AddressZeroIsAKeyLikeAnyOther) {
  AddressMap<int> map;
  EXPECT_EQ(map.find(0), nullptr);
  EXPECT_FALSE(map.erase(0));
  map.put(0, 7);
  map.put(512, 8);
  ASSERT_NE(map.find(0), nullptr);
  EXPECT_EQ(*map.find(0), 7);
  EXPECT_EQ(map.size(), 2u);
  map.put(0, 9);  // replaces
  EXPECT_EQ(*map.find(0), 9);
  EXPECT_EQ(map.size(), 2u);
  EXPECT_TRUE(map.erase(0));
  EXPECT_EQ(map.find(0), nullptr);
  EXPECT_EQ(*map.find(512), 8);
  EXPECT_EQ(map.size(), 1u);
}

TEST(AddressMap, ErasingFromTheMiddleOfAProbeRunKeepsTheRestFindable) {
  AddressMap<int> map;
  // The same address above bit 9 and different low bits: one home slot, one probe run.
  for (int i = 1; i <= 6; ++i) map.put(0x10000 + static_cast<std::uint64_t>(i) * 8, i);
  EXPECT_TRUE(map.erase(0x10000 + 3 * 8));
  EXPECT_TRUE(map.erase(0x10000 + 1 * 8));
  for (int i : {2, 4, 5, 6}) {
    ASSERT_NE(map.find(0x10000 + static_cast<std::uint64_t>(i) * 8), nullptr) << i;
    EXPECT_EQ(*map.find(0x10000 + static_cast<std::uint64_t>(i) * 8), i);
  }
  EXPECT_EQ(map.find(0x10000 + 3 * 8), nullptr);
  EXPECT_EQ(map.size(), 4u);
}

}  // namespace
}  // namespace remat::alloc
