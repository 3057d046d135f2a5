#pragma once
// The error every part of remat::budget throws: a budget that cannot be met or read, a malformed
// profile or plan dump. Messages name the value and the fix.

#include <stdexcept>

namespace remat::budget {

class BudgetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace remat::budget
