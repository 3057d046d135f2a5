#pragma once
// The checkpoint runtime's exception: every misuse is reported with what was wrong and how
// to fix it, in the spelling of the language the caller writes.

#include <stdexcept>
#include <string>
#include <string_view>

namespace remat {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

enum class ApiSpelling { cpp, python };

// The Python extension switches messages to Python spelling when it loads.
void set_api_spelling(ApiSpelling spelling);
ApiSpelling api_spelling();

// A runtime function as the caller spells it: "remat::recompute_needs_tensor" from C++,
// "remat.recompute_needs_tensor" from Python.
std::string api_name(std::string_view function);

// An option as the caller spells it: "CheckpointOptions::recompute_state_hooks" from C++,
// "checkpoint(recompute_state_hooks=...)" from Python.
std::string option_name(std::string_view option);

}  // namespace detail
}  // namespace remat
