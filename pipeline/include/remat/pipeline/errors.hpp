#pragma once
// The pipeline's exceptions: what was wrong (the rank, the position and the action, the
// stage and slot where there is one), with which value, and how to fix it.

#include <stdexcept>
#include <string>

namespace remat::pipeline {

// A schedule, CSV or plan that cannot be used.
class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The runtime: rendezvous, communication, a stage set that does not fit the schedule, and a
// receive slot handed out while its holder is live.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace remat::pipeline
