/* C ABI of libremat_alloc.so. remat_alloc/remat_free are what PyTorch's
 * CUDAPluggableAllocator calls; the rest configure, tag, query and dump. Functions that
 * return int give 0 on success and a REMAT_ERR_* code otherwise; remat_last_error() then
 * holds the message for the calling thread. Nothing throws across this boundary. */
#ifndef REMAT_ALLOC_C_API_H
#define REMAT_ALLOC_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define REMAT_API __declspec(dllexport)
#else
#define REMAT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as the CUDA runtime's, without needing its headers. */
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

enum {
  REMAT_OK = 0,
  REMAT_ERR_INVALID_ARGUMENT = 1,
  REMAT_ERR_CONFIG = 2,
  REMAT_ERR_OUT_OF_MEMORY = 3,
  REMAT_ERR_INVALID_POINTER = 4,
  REMAT_ERR_TAG_STACK = 5,
  REMAT_ERR_IO = 6,
  REMAT_ERR_BACKEND = 7,
  REMAT_ERR_STATE = 8,
  REMAT_ERR_INTERNAL = 99
};

/* PyTorch CUDAPluggableAllocator entry points. remat_alloc returns NULL for size 0 and
 * on out-of-memory (after releasing the cache and retrying). remat_free(NULL, ...) does
 * nothing; a bad pointer or size is refused, counted and reported via remat_last_error.
 * remat_free checks `size` against the size given to remat_alloc unless it is 0: a free
 * with size 0 skips the check. */
REMAT_API void* remat_alloc(size_t size, int device, cudaStream_t stream);
REMAT_API void remat_free(void* ptr, size_t size, int device, cudaStream_t stream);
/* remat_alloc with its status, for integrations that must tell out-of-memory apart from
 * other failures (PyTorch's own out-of-memory error is raised from it): REMAT_OK with *out
 * set (NULL for size 0), or a REMAT_ERR_* code (REMAT_ERR_OUT_OF_MEMORY when the request
 * cannot be met) with *out NULL. */
REMAT_API int remat_alloc_status(size_t size, int device, cudaStream_t stream, void** out);

/* "key:value,..." as in REMAT_ALLOC_CONF, applied over the configuration in force. */
REMAT_API int remat_configure(const char* conf);

REMAT_API int remat_push_region(const char* name);
REMAT_API int remat_pop_region(void);
/* direction is 'F' (forward activations) or 'B' (gradients). */
REMAT_API int remat_push_recv_slot(int stage, char direction, int slot);
REMAT_API int remat_pop_recv_slot(void);
REMAT_API int remat_push_site(const char* name);
REMAT_API int remat_pop_site(void);
/* phase: "forward", "recompute", "backward" or "other". */
REMAT_API int remat_push_phase(const char* phase);
REMAT_API int remat_pop_phase(void);
/* policy: "save", "recompute" or "none". */
REMAT_API int remat_push_policy(const char* policy);
REMAT_API int remat_pop_policy(void);
/* The label of every allocation that follows, on every thread, on top of each thread's tags
 * (PyTorch's torch.cuda.memory._set_memory_metadata); "" clears it. A label longer than a
 * site name may be is refused and the label in force kept. */
REMAT_API int remat_set_label(const char* label);
/* Copies the label in force ("" when none) with its terminating NUL into buffer and sets
 * *needed (when needed is not NULL) to its size with the NUL. buffer may be NULL when size is
 * 0, to ask for *needed; a non-NULL buffer smaller than that gives REMAT_ERR_INVALID_ARGUMENT
 * and holds "" (size > 0). */
REMAT_API int remat_get_label(char* buffer, size_t size, size_t* needed);

/* Categories: what memory is for in a training step (remat_alloc.track assigns them). NONE: no
 * category assigned. */
enum {
  REMAT_CATEGORY_NONE = 0,
  REMAT_CATEGORY_PARAMETER = 1,
  REMAT_CATEGORY_GRADIENT = 2,
  REMAT_CATEGORY_OPTIMIZER_STATE = 3,
  REMAT_CATEGORY_ACTIVATION = 4, /* kept by autograd for backward */
  REMAT_CATEGORY_TEMPORARY = 5,
  REMAT_CATEGORY_INPUT = 6,
  REMAT_CATEGORY_OTHER = 7
};
/* The category and module path ("" or NULL: none) of every allocation that follows on the
 * calling thread, on top of its tags. Set, not pushed: save the previous value
 * (remat_get_category) to nest. An unknown category is refused and the one in force kept. */
REMAT_API int remat_set_category(int category, const char* module);
/* The calling thread's category, and its module copied as remat_get_label copies the label
 * (module may be NULL with size 0). */
REMAT_API int remat_get_category(int* category, char* module, size_t size, size_t* needed);
/* Gives the live block that starts at ptr (in any remat allocator, CPU or device) the category
 * `category` and, unless module is NULL, the module path `module` ("" clears it), keeping the
 * rest of its tag; its bytes move to the new tag's statistics. *previous_tag (when not NULL)
 * receives the tag id it had, for remat_set_block_tag. REMAT_ERR_INVALID_POINTER when no
 * allocator has a live block at ptr. */
REMAT_API int remat_retag_block(const void* ptr, int category, const char* module, uint32_t* previous_tag);
/* What autograd keeps for backward (a saved-tensor pack hook's one call): while the calling
 * thread has a category set, the live block at ptr becomes an activation of its module when it
 * has no category or is a temporary. *changed (when not NULL) says whether it did; a pointer no
 * allocator returned is not an error here (*changed 0). */
REMAT_API int remat_categorize_as_activation(const void* ptr, int* changed);
/* The tag id of the live block at ptr, and sets it back (tag ids from remat_retag_block or
 * remat_block_tag; an id never interned is refused). */
REMAT_API int remat_block_tag(const void* ptr, uint32_t* tag);
REMAT_API int remat_set_block_tag(const void* ptr, uint32_t tag);
/* The category of the live block at ptr, and its module copied as remat_get_label copies the
 * label (module may be NULL with size 0). */
REMAT_API int remat_block_category(const void* ptr, int* category, char* module, size_t size, size_t* needed);

/* device's bytes per category (arrays of 8, indexed by REMAT_CATEGORY_*; any may be NULL): held
 * now (rounded block sizes, and the sizes requested) and when its allocated bytes last reached
 * their peak (remat_reset_peak_stats starts a new peak). */
REMAT_API int remat_category_bytes(int device, int64_t* bytes, int64_t* requested_bytes, int64_t* bytes_at_peak,
                                   int64_t* requested_bytes_at_peak);

/* Snapshot of the default device (current CUDA device, or 0 on host). */
REMAT_API int remat_dump_snapshot(const char* path);
REMAT_API int remat_dump_snapshot_device(const char* path, int device);
/* The trace ring of the default device as JSON Lines (kind "trace"). */
REMAT_API int remat_dump_trace(const char* path);
/* Returns cached segments of every device to the backend. */
REMAT_API int remat_empty_cache(void);
REMAT_API int remat_record_stream(void* ptr, cudaStream_t stream);
/* Caps device's reserved bytes at fraction, in (0, 1], of its memory. */
REMAT_API int remat_set_memory_fraction(int device, double fraction);

typedef struct remat_stats {
  size_t struct_size; /* caller sets sizeof(remat_stats) */
  int64_t allocated_bytes;
  int64_t allocated_bytes_peak;
  int64_t requested_bytes;
  int64_t requested_bytes_peak;
  int64_t active_bytes;
  int64_t active_bytes_peak;
  int64_t reserved_bytes;
  int64_t reserved_bytes_peak;
  int64_t live_blocks;
  int64_t segments;
  uint64_t num_allocs;
  uint64_t num_frees;
  uint64_t num_segment_allocs;
  uint64_t num_segment_frees;
  uint64_t num_ooms;
  uint64_t num_alloc_retries;
  uint64_t num_invalid_frees;
} remat_stats;

REMAT_API int remat_get_stats(int device, remat_stats* out);
REMAT_API int remat_reset_peak_stats(int device);
/* The most requested bytes held on `device` since the previous call (or since its allocator
   began), into *out; the next window starts now. The peak statistics (remat_get_stats, PyTorch's
   max_memory_allocated) are not touched: one reader takes windows (remat_alloc.PeakWindow). */
REMAT_API int remat_take_window_peak(int device, int64_t* out);
/* Zeroes the totals (num_allocs, num_frees, num_segment_allocs, num_segment_frees) and the counts
   of OOMs and retries, as torch.cuda.reset_accumulated_memory_stats; current figures and peaks stay. */
REMAT_API int remat_reset_accumulated_stats(int device);
/* Requested bytes live under regions equal to or nested in `region_prefix` (whole components:
   "layers" covers "layers.0" and "layers::mlp", "layers.1" does not cover "layers.10"). */
REMAT_API int remat_live_bytes(int device, const char* region_prefix, int64_t* out);

typedef struct remat_oom_info {
  int device;
  size_t requested_bytes;
  size_t rounded_bytes;
  size_t device_free_bytes;
  size_t device_total_bytes;
  int64_t reserved_bytes;
  int64_t allocated_bytes;
  const char* message;
  const char* dump_path; /* the OOM report written, or "" */
} remat_oom_info;
typedef void (*remat_oom_observer_fn)(const remat_oom_info* info, void* user_data);

/* Observers are called without the allocator's lock, on the failing thread. Returns an id
 * (> 0) or a negative REMAT_ERR_* code. */
REMAT_API int remat_register_oom_observer(remat_oom_observer_fn fn, void* user_data);
/* Returns at once, never waiting for other threads (an observer may remove itself or another):
 * after it the observer is not called again, except by calls already in flight on other threads,
 * so fn and user_data must stay valid until those returned. */
REMAT_API int remat_unregister_oom_observer(int id);

/* Host backend only: hold a simulated stream (its events stay pending) or complete it. */
REMAT_API int remat_host_hold_stream(int device, cudaStream_t stream);
REMAT_API int remat_host_complete_stream(int device, cudaStream_t stream);

/* The calling thread's last error message ("" when none). Valid until its next call. */
REMAT_API const char* remat_last_error(void);
REMAT_API const char* remat_version(void);

#ifdef __cplusplus
}
#endif

#endif /* REMAT_ALLOC_C_API_H */
