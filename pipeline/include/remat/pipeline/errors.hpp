#pragma once
// The pipeline planner's exception: what was wrong (the rank, the position and the action
// where there is one), with which value, and how to fix it.

#include <stdexcept>
#include <string>

namespace remat::pipeline {

class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace remat::pipeline
