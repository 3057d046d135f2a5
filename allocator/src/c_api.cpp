// The C boundary: every entry point catches everything, turns it into a status code and
// keeps the message as the thread's last error.

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/c_api.h>
#include <remat/alloc/errors.hpp>
#include <remat/alloc/host_backend.hpp>
#include <remat/alloc/snapshot.hpp>
#include <remat/alloc/version.hpp>

#include "message_text.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <type_traits>

using namespace remat::alloc;

// PyTorch casts the symbols it loads to exactly these types; a mismatch would be silent.
static_assert(std::is_same_v<decltype(&remat_alloc), void* (*)(size_t, int, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&remat_free), void (*)(void*, size_t, int, cudaStream_t)>);

namespace {

// A plain array, not a std::string: LibTorch frees tensors from static destructors, after
// the thread's thread_local destructors have run, and a free that fails then still records
// its message here. Longer messages are cut.
thread_local char t_last_error[2048];

void set_last_error(const char* message) {
  std::snprintf(t_last_error, sizeof t_last_error, "%s", message);
}

int fail(int code, const char* message) {
  set_last_error(message);
  return code;
}

// Runs `body`, mapping exceptions to status codes.
template <typename Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    t_last_error[0] = '\0';
    return REMAT_OK;
  } catch (const Error& e) {
    return fail(static_cast<int>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(REMAT_ERR_OUT_OF_MEMORY, "host memory exhausted while handling the request");
  } catch (const std::exception& e) {
    return fail(REMAT_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(REMAT_ERR_INTERNAL, "unknown internal error");
  }
}

const char* require_text(const char* text, const char* what) {
  if (text == nullptr) {
    throw InvalidArgumentError(std::string(what) + " is NULL; pass a NUL-terminated string");
  }
  return text;
}

Stream as_stream(cudaStream_t stream) { return reinterpret_cast<Stream>(stream); }

HostBackend& host_backend(int device) {
  auto* host = dynamic_cast<HostBackend*>(&device_allocator(device).backend());
  if (host == nullptr) {
    throw StateError("device " + std::to_string(device) +
                     " does not use the host backend; stream holding is a host-backend testing aid");
  }
  return *host;
}

// Copies `text` with its NUL into buffer as remat_get_label describes; `what` names it in messages.
void copy_out(const std::string& text, char* buffer, size_t size, size_t* needed, const char* what) {
  if (buffer == nullptr && size != 0) {
    throw InvalidArgumentError(std::string(what) + " buffer is NULL with size " + std::to_string(size) +
                               "; pass a buffer of that size, or size 0 to ask for the size needed");
  }
  if (needed != nullptr) *needed = text.size() + 1;
  if (buffer == nullptr) return;
  if (size < text.size() + 1) {
    if (size > 0) buffer[0] = '\0';
    throw InvalidArgumentError(std::string(what) + " buffer of " + std::to_string(size) + " bytes is too small for the " +
                               what + " (" + std::to_string(text.size() + 1) +
                               " bytes with its NUL); pass a buffer of *needed bytes");
  }
  text.copy(buffer, text.size());
  buffer[text.size()] = '\0';
}

Category require_category(int category) {
  if (category < 0 || category >= kCategoryCount) {
    throw InvalidArgumentError("category " + std::to_string(category) +
                               " is not valid; pass one of REMAT_CATEGORY_NONE (0) to REMAT_CATEGORY_OTHER (7)");
  }
  return static_cast<Category>(category);
}

TagId require_live_tag(const void* ptr) {
  const std::optional<TagId> tag = find_block_tag(ptr);
  if (!tag) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", ptr);
    throw InvalidPointerError(std::string(text) +
                              " is not the start of a live block of any remat allocator; pass a storage's data pointer "
                              "that the allocator returned (CPU tensors only under tag_cpu_tensors())");
  }
  return *tag;
}

}  // namespace

extern "C" {

int remat_alloc_status(size_t size, int device, cudaStream_t stream, void** out) {
  if (out == nullptr) return fail(REMAT_ERR_INVALID_ARGUMENT, "allocation output is NULL; pass a pointer to a void*");
  *out = nullptr;
  const int status = guarded([&] { *out = device_allocator(device).allocate(size, as_stream(stream)); });
  if (status == REMAT_OK && size == 0) {
    set_last_error("zero-byte request: returned NULL and allocated nothing");
  }
  return status;
}

void* remat_alloc(size_t size, int device, cudaStream_t stream) {
  void* ptr = nullptr;
  remat_alloc_status(size, device, stream, &ptr);
  return ptr;
}

void remat_free(void* ptr, size_t size, int device, cudaStream_t) {
  if (ptr == nullptr) return;
  const int status = guarded([&] { device_allocator(device).deallocate(ptr, size); });
  if (status != REMAT_OK) std::fprintf(stderr, "remat: %s\n", t_last_error);
}

int remat_configure(const char* conf) {
  return guarded([&] { configure(require_text(conf, "configuration text")); });
}

int remat_push_region(const char* name) { return guarded([&] { push_region(require_text(name, "region name")); }); }
int remat_pop_region(void) { return guarded([] { pop_tag(ScopeKind::region); }); }

int remat_push_recv_slot(int stage, char direction, int slot) {
  return guarded([&] {
    if (direction != 'F' && direction != 'B') {
      throw InvalidArgumentError("receive direction " + detail::quote(std::string_view(&direction, 1)) +
                                 " is not valid; pass 'F' (forward activations) or 'B' (gradients)");
    }
    push_recv_slot({stage, direction == 'F' ? Direction::forward : Direction::backward, slot});
  });
}
int remat_pop_recv_slot(void) { return guarded([] { pop_tag(ScopeKind::recv_slot); }); }

int remat_push_site(const char* name) { return guarded([&] { push_site(require_text(name, "site name")); }); }
int remat_pop_site(void) { return guarded([] { pop_tag(ScopeKind::site); }); }

int remat_push_phase(const char* phase) {
  return guarded([&] {
    const std::string_view text = require_text(phase, "phase");
    for (const Phase candidate : {Phase::forward, Phase::recompute, Phase::backward, Phase::offloaded, Phase::other}) {
      if (text == to_string(candidate)) return push_phase(candidate);
    }
    throw InvalidArgumentError("phase " + detail::quote(text) + " is not valid; pass forward, recompute, backward, offloaded or other");
  });
}
int remat_pop_phase(void) { return guarded([] { pop_tag(ScopeKind::phase); }); }

int remat_push_policy(const char* policy) {
  return guarded([&] {
    const std::string_view text = require_text(policy, "policy");
    for (const Policy candidate : {Policy::save, Policy::recompute, Policy::none}) {
      if (text == to_string(candidate)) return push_policy(candidate);
    }
    throw InvalidArgumentError("policy " + detail::quote(text) + " is not valid; pass save, recompute or none");
  });
}
int remat_pop_policy(void) { return guarded([] { pop_tag(ScopeKind::policy); }); }

int remat_set_label(const char* label) { return guarded([&] { set_label(require_text(label, "label")); }); }

int remat_get_label(char* buffer, size_t size, size_t* needed) {
  return guarded([&] {
    if (buffer == nullptr && size != 0) {
      throw InvalidArgumentError("label buffer is NULL with size " + std::to_string(size) +
                                 "; pass a buffer of that size, or size 0 to ask for the size needed");
    }
    const std::string label = current_label();
    if (needed != nullptr) *needed = label.size() + 1;
    if (buffer == nullptr) return;
    if (size < label.size() + 1) {
      buffer[0] = '\0';
      throw InvalidArgumentError("label buffer of " + std::to_string(size) + " bytes is too small for the label (" +
                                 std::to_string(label.size() + 1) +
                                 " bytes with its NUL); pass a buffer of *needed bytes");
    }
    label.copy(buffer, label.size());
    buffer[label.size()] = '\0';
  });
}

int remat_set_category(int category, const char* module) {
  return guarded([&] { set_category(require_category(category), module != nullptr ? module : ""); });
}

int remat_get_category(int* category, char* module, size_t size, size_t* needed) {
  return guarded([&] {
    const auto [current, path] = current_category();
    if (category != nullptr) *category = static_cast<int>(current);
    copy_out(path, module, size, needed, "module");
  });
}

int remat_retag_block(const void* ptr, int category, const char* module, uint32_t* previous_tag) {
  return guarded([&] {
    const Category wanted = require_category(category);
    const TagId tag = with_category(require_live_tag(ptr), wanted,
                                    module != nullptr ? std::optional<std::string_view>(module) : std::nullopt);
    const TagId previous = retag_block_anywhere(ptr, tag);
    if (previous_tag != nullptr) *previous_tag = previous;
  });
}

int remat_categorize_as_activation(const void* ptr, int* changed) {
  const bool done = categorize_as_activation(ptr);
  if (changed != nullptr) *changed = done ? 1 : 0;
  return REMAT_OK;
}

int remat_block_tag(const void* ptr, uint32_t* tag) {
  return guarded([&] {
    const TagId found = require_live_tag(ptr);
    if (tag != nullptr) *tag = found;
  });
}

int remat_set_block_tag(const void* ptr, uint32_t tag) {
  return guarded([&] {
    if (tag >= interned_tags().size()) {
      throw InvalidArgumentError("tag id " + std::to_string(tag) +
                                 " was never interned; pass an id from remat_block_tag or remat_retag_block");
    }
    retag_block_anywhere(ptr, tag);
  });
}

int remat_block_category(const void* ptr, int* category, char* module, size_t size, size_t* needed) {
  return guarded([&] {
    const Tag tag = tag_of(require_live_tag(ptr));
    if (category != nullptr) *category = static_cast<int>(tag.category);
    copy_out(name_of(tag.module), module, size, needed, "module");
  });
}

int remat_category_bytes(int device, int64_t* bytes, int64_t* requested_bytes, int64_t* bytes_at_peak,
                         int64_t* requested_bytes_at_peak) {
  return guarded([&] {
    const AllocatorStats s = device_allocator(device).stats();
    auto copy = [](const std::array<std::int64_t, 8>& from, int64_t* to) {
      if (to != nullptr) std::copy(from.begin(), from.end(), to);
    };
    copy(s.category_bytes, bytes);
    copy(s.category_requested_bytes, requested_bytes);
    copy(s.category_bytes_at_peak, bytes_at_peak);
    copy(s.category_requested_bytes_at_peak, requested_bytes_at_peak);
  });
}

int remat_dump_snapshot_device(const char* path, int device) {
  return guarded([&] { write_snapshot(device_allocator(device).snapshot(), require_text(path, "snapshot path")); });
}

int remat_dump_snapshot(const char* path) { return remat_dump_snapshot_device(path, default_device()); }

int remat_dump_trace(const char* path) {
  return guarded([&] { write_trace(device_allocator(default_device()).snapshot(), require_text(path, "trace path")); });
}

int remat_empty_cache(void) {
  return guarded([] { for_each_device_allocator([](CachingAllocator& allocator) { allocator.empty_cache(); }); });
}

int remat_record_stream(void* ptr, cudaStream_t stream) {
  return guarded([&] { record_stream_anywhere(ptr, as_stream(stream)); });
}

int remat_set_memory_fraction(int device, double fraction) {
  return guarded([&] { set_memory_fraction(device, fraction); });
}

int remat_get_stats(int device, remat_stats* out) {
  return guarded([&] {
    if (out == nullptr) throw InvalidArgumentError("stats output is NULL; pass a remat_stats with struct_size set");
    if (out->struct_size < sizeof(remat_stats)) {
      throw InvalidArgumentError("remat_stats.struct_size is " + std::to_string(out->struct_size) + ", expected " +
                                 std::to_string(sizeof(remat_stats)) + "; set it to sizeof(remat_stats)");
    }
    const AllocatorStats s = device_allocator(device).stats();
    *out = remat_stats{};
    out->struct_size = sizeof(remat_stats);
    out->allocated_bytes = s.allocated_bytes.current;
    out->allocated_bytes_peak = s.allocated_bytes.peak;
    out->requested_bytes = s.requested_bytes.current;
    out->requested_bytes_peak = s.requested_bytes.peak;
    out->active_bytes = s.active_bytes.current;
    out->active_bytes_peak = s.active_bytes.peak;
    out->reserved_bytes = s.reserved_bytes.current;
    out->reserved_bytes_peak = s.reserved_bytes.peak;
    out->live_blocks = s.allocations.current;
    out->segments = s.segments.current;
    out->num_allocs = s.allocations.total_added;
    out->num_frees = s.allocations.total_subtracted();
    out->num_segment_allocs = s.segments.total_added;
    out->num_segment_frees = s.segments.total_subtracted();
    out->num_ooms = s.num_ooms;
    out->num_alloc_retries = s.num_alloc_retries;
    out->num_invalid_frees = s.num_invalid_frees;
  });
}

int remat_reset_peak_stats(int device) { return guarded([&] { device_allocator(device).reset_peak_stats(); }); }

int remat_take_window_peak(int device, int64_t* out) {
  return guarded([&] {
    if (out == nullptr) throw InvalidArgumentError("window peak output is NULL; pass a pointer to an int64_t");
    *out = device_allocator(device).take_requested_window_peak();
  });
}

int remat_reset_accumulated_stats(int device) {
  return guarded([&] { device_allocator(device).reset_accumulated_stats(); });
}

int remat_live_bytes(int device, const char* region_prefix, int64_t* out) {
  return guarded([&] {
    if (out == nullptr) throw InvalidArgumentError("live-bytes output is NULL; pass a pointer to an int64_t");
    *out = device_allocator(device).live_requested_bytes(require_text(region_prefix, "region prefix"));
  });
}

int remat_register_oom_observer(remat_oom_observer_fn fn, void* user_data) {
  int id = 0;
  const int status = guarded([&] {
    if (fn == nullptr) throw InvalidArgumentError("observer function is NULL; pass a function pointer");
    id = add_oom_observer([fn, user_data](const OomEvent& event) {
      remat_oom_info info{};
      info.device = event.device;
      info.requested_bytes = event.requested_bytes;
      info.rounded_bytes = event.rounded_bytes;
      info.device_free_bytes = event.memory.free_bytes;
      info.device_total_bytes = event.memory.total_bytes;
      info.reserved_bytes = event.reserved_bytes;
      info.allocated_bytes = event.allocated_bytes;
      info.message = event.message.c_str();
      info.dump_path = event.dump_path.c_str();
      fn(&info, user_data);
    });
  });
  return status == REMAT_OK ? id : -status;
}

int remat_unregister_oom_observer(int id) {
  return guarded([&] {
    if (!remove_oom_observer(id)) {
      throw InvalidArgumentError("no out-of-memory observer has id " + std::to_string(id) +
                                 "; pass an id returned by remat_register_oom_observer");
    }
  });
}

int remat_host_hold_stream(int device, cudaStream_t stream) {
  return guarded([&] { host_backend(device).hold_stream(as_stream(stream)); });
}

int remat_host_complete_stream(int device, cudaStream_t stream) {
  return guarded([&] { host_backend(device).complete_stream(as_stream(stream)); });
}

const char* remat_last_error(void) { return t_last_error; }

const char* remat_version(void) { return kVersion; }

}  // extern "C"
