#include <remat/alloc/backend.hpp>
#include <remat/alloc/errors.hpp>

#include <string>

namespace remat::alloc {
namespace {

[[noreturn]] void no_expandable_segments(const Backend& backend) {
  throw BackendError("the " + std::string(backend.name()) + " backend has no expandable segments; "
                     "set expandable_segments:false, or use the cuda, host or virtual backend");
}

}  // namespace

void* Backend::reserve(std::size_t) { no_expandable_segments(*this); }
bool Backend::map(void*, std::size_t) { no_expandable_segments(*this); }
void Backend::unmap(void*, std::size_t) { no_expandable_segments(*this); }
void Backend::release(void*, std::size_t) { no_expandable_segments(*this); }

}  // namespace remat::alloc
