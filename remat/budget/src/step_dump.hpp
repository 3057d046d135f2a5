#pragma once
// The step's memory in a region-profile dump ("step"), written and read (step_dump.cpp).

#include <remat/alloc/dump.hpp>
#include <remat/budget/step_peak.hpp>

#include "dump_fields.hpp"

#include <string_view>

namespace remat::budget::detail {

void write_step(alloc::JsonWriter& json, const StepMemory& step);
StepMemory read_step(const Json& value, std::string_view source);

}  // namespace remat::budget::detail
