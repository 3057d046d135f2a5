// libremat_pluggable.so: makes libremat_alloc.so PyTorch's CUDA allocator from Python with
// every hook wired, which torch.cuda.memory.CUDAPluggableAllocator cannot do:
//   - out-of-memory raises PyTorch's torch.OutOfMemoryError (a plain pluggable allocator
//     hands PyTorch a NULL pointer, which it wraps into a tensor as if it were memory);
//   - torch.cuda.empty_cache(), set_per_process_memory_fraction() and Tensor.record_stream()
//     reach the tagging allocator (a plain pluggable allocator ignores them);
//   - PyTorch's statistics, snapshot, history, label and OOM observer calls are answered
//     (TaggingCudaAllocator; a plain pluggable allocator refuses them).
// It allocates through libremat_alloc.so's C ABI and reads figures through its C++ API, so
// Python's remat_alloc (ctypes, same library) sees the same allocator, tags and statistics.
// C entry points, for ctypes:
//   int remat_pluggable_install(void)          0, or nonzero with the reason in
//   const char* remat_pluggable_last_error(void)   remat_pluggable_last_error()

#include "pluggable_allocator.hpp"
#include "torch_oom_message.hpp"

#include <remat/alloc/c_api.h>

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace {

thread_local std::string t_last_error;

// Raises the error libremat_alloc.so reported as the exception PyTorch turns into the
// matching Python error.
[[noreturn]] void raise(int status) {
  const std::string message = remat_last_error();
  if (status == REMAT_ERR_OUT_OF_MEMORY)
    C10_THROW_ERROR(OutOfMemoryError, remat::detail::torch_oom_message(message, true));
  C10_THROW_ERROR(Error, message);
}

void check(int status) {
  if (status != REMAT_OK) raise(status);
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

void* allocate(std::size_t bytes, int device, void* stream) {
  void* ptr = nullptr;
  check(remat_alloc_status(bytes, device, as_stream(stream), &ptr));
  return ptr;
}

// remat_free never fails loudly: a bad pointer is refused, counted and reported on stderr.
void deallocate(void* ptr, std::size_t bytes, int device) noexcept { remat_free(ptr, bytes, device, nullptr); }

void record_stream(void* ptr, void* stream) { check(remat_record_stream(ptr, as_stream(stream))); }

void empty_cache() { check(remat_empty_cache()); }

void set_memory_fraction(double fraction, int device) { check(remat_set_memory_fraction(device, fraction)); }

}  // namespace

extern "C" {

int remat_pluggable_install(void) {
  try {
    remat::detail::install_pluggable_allocator({.allocate = allocate,
                                                .deallocate = deallocate,
                                                .record_stream = record_stream,
                                                .empty_cache = empty_cache,
                                                .set_memory_fraction = set_memory_fraction});
    t_last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    t_last_error = e.what();
  } catch (...) {
    t_last_error = "unknown error while installing the allocator";
  }
  return 1;
}

const char* remat_pluggable_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
