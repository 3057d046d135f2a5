#include "support.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new remat::testing::TaggingAllocatorEnvironment());
  return RUN_ALL_TESTS();
}
