#pragma once
// Small schedules written by hand in tests: one string per rank, actions separated by
// commas in PyTorch's notation, an empty cell for an idle step.

#include <remat/pipeline/action.hpp>
#include <remat/pipeline/schedule.hpp>

#include <string>
#include <vector>

namespace remat::pipeline::testing {

inline Schedule schedule_from_rows(const std::vector<std::string>& rows, std::vector<int> stage_to_rank,
                                   int microbatches) {
  Schedule schedule;
  schedule.stage_to_rank = std::move(stage_to_rank);
  schedule.microbatches = microbatches;
  for (const std::string& row : rows) {
    RankOrder order;
    std::size_t begin = 0;
    while (begin <= row.size()) {
      const std::size_t comma = row.find(',', begin);
      const std::size_t end = comma == std::string::npos ? row.size() : comma;
      order.push_back(parse_action(row.substr(begin, end - begin)));
      begin = end + 1;
    }
    schedule.ranks.push_back(std::move(order));
  }
  return schedule;
}

// Schedule1F1B for 3 stages and 4 microbatches (last rank's forwards numbered 0..M-1) in the
// order PyTorch 2.11's _PipelineScheduleRuntime runs it: idle steps dropped, then
// _add_send_recv (its UNSHARD, RESHARD and REDUCE_GRAD left out). Stage 1 holds 3 = S - s + 1
// forward inputs at once here.
inline Schedule one_f_one_b_3x4() {
  return schedule_from_rows(
      {"0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0RECV_B0,0B0,0F3,0SEND_F3,0RECV_B1,0B1,0RECV_B2,0B2,0RECV_B3,0B3",
       "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,1RECV_B0,1RECV_F2,1B0,1SEND_B0,1F2,1SEND_F2,1RECV_B1,1RECV_F3,1B1,"
       "1SEND_B1,1F3,1SEND_F3,1RECV_B2,1B2,1SEND_B2,1RECV_B3,1B3,1SEND_B3",
       "2RECV_F0,2F0,2RECV_F1,2B0,2SEND_B0,2F1,2RECV_F2,2B1,2SEND_B1,2F2,2RECV_F3,2B2,2SEND_B2,2F3,2B3,2SEND_B3"},
      {0, 1, 2}, 4);
}

// ScheduleGPipe for 2 stages and 3 microbatches in the same order.
inline Schedule gpipe_2x3() {
  return schedule_from_rows({"0F0,0SEND_F0,0F1,0SEND_F1,0F2,0SEND_F2,0RECV_B0,0B0,0RECV_B1,0B1,0RECV_B2,0B2",
                             "1RECV_F0,1F0,1RECV_F1,1F1,1RECV_F2,1F2,1B0,1SEND_B0,1B1,1SEND_B1,1B2,1SEND_B2"},
                            {0, 1}, 3);
}

}  // namespace remat::pipeline::testing
