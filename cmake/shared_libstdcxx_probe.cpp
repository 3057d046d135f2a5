// Exits 0 when the C++ standard library was linked as the shared libstdc++.so, the one
// LibTorch's libraries load; 1 when the compiler linked a static copy into the program.
#include <link.h>

#include <cstring>
#include <iostream>

int main() {
  std::cout.flush();  // a reference into the standard library, so a shared one stays linked
  int shared = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* found) {
        if (std::strstr(info->dlpi_name, "libstdc++.so") != nullptr) *static_cast<int*>(found) = 1;
        return 0;
      },
      &shared);
  return shared ? 0 : 1;
}
