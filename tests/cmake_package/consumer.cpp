#include <remat/alloc/allocator.hpp>
#include <remat/alloc/tags.hpp>

#include <cstdio>

int main() {
  remat::alloc::configure("backend:host,host_capacity_mb:16");
  auto& allocator = remat::alloc::device_allocator(0);
  void* p = nullptr;
  {
    auto region = remat::alloc::TagScope::region("consumer");
    p = allocator.allocate(1000, 0);
  }
  const auto live = allocator.live_requested_bytes("consumer");
  allocator.deallocate(p);
  std::printf("live bytes in region consumer: %lld\n", static_cast<long long>(live));
  return live == 1000 ? 0 : 1;
}
