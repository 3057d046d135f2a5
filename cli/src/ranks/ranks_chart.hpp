#pragma once
// The job's ranks as a picture (remat-report ranks --svg / --html): each rank's peak allocated
// as a bar in rank order, stacked by what its tag groups held at that peak, the job's median
// as a line, ranks that ran out of memory marked. More ranks than the plot has pixels share a
// bar, which shows the highest of them. The HTML page holds the same picture and the hottest
// ranks as a table. Both files are self-contained; every name from a dump is escaped.

#include "ranks/ranks_report.hpp"

#include <string>

namespace remat::report {

std::string ranks_svg(const RanksRun& run);
std::string ranks_html(const RanksRun& run);

}  // namespace remat::report
