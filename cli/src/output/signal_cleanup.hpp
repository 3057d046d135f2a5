#pragma once
// A temporary output file removed when SIGINT, SIGTERM or SIGHUP ends the process before the
// file is renamed into place: the handler unlinks a path copied in advance (unlink is
// async-signal-safe), then the signal takes its default course, so the exit status still says
// which signal it was. A signal the process ignores (nohup, a background job) stays ignored.

#include <string_view>

namespace remat::report {

// Removes `path` on those signals until forget_temporary_file(); one file at a time: false, and
// nothing watched, while another is, or for a path longer than the system's limit.
bool remove_on_signal(std::string_view path);
void forget_temporary_file();

}  // namespace remat::report
