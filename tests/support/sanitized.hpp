#pragma once
// Bounds on a test's own time and memory in builds run under a sanitizer, whose instrumentation
// slows code down and whose shadow memory adds to every figure /proc reports.

namespace remat::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// How much looser a bound on time or resident memory is under a sanitizer: enough to absorb the
// instrumentation, far too little to hide a quadratic cost.
inline constexpr int kSanitizerAllowance = kSanitized ? 4 : 1;

}  // namespace remat::testing
