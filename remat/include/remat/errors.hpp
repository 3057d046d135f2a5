#pragma once
// The checkpoint runtime's exception: every misuse is reported with what was wrong and how
// to fix it.

#include <stdexcept>
#include <string>

namespace remat {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace remat
