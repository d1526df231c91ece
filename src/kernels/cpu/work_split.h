// How the experts GEMMs share out their work among threads: by bytes streamed and flops done, not
// by expert count, so one expert holding half the pairs keeps every core busy.
//
// Each expert's rows are cut into chunks of at most rows_per_pass rows (an expert's weights are
// streamed once per chunk, so a chunk holds as many rows as the input buffers allow), and each
// chunk's panel pairs into work items of about equal cost:
//   cost of one pair of a chunk = pair_bytes * flops_per_byte + rows * pair_flops_per_row
// In decode every chunk is cut into at least min(num_threads, num_pairs) items, so all threads
// stream the same expert's weights side by side. In prefill (at least four chunks per thread), a
// chunk of more than one row block (row_multiple rows) is cut by cost alone: most then
// go to one thread whole, which gathers their rows once. Items are listed chunk by chunk, and
// threads take them in that order. Tested by tests/kernels/work_split_test.cc.
#pragma once

#include <cstdint>
#include <vector>

namespace moe::cpu {

// Rows of one expert: pair (or token) ids and the expert whose packed weights they multiply.
struct ExpertRows {
  int32_t expert = 0;  // index into the packed weight tables
  int32_t num_rows = 0;
  const int32_t* ids = nullptr;  // [num_rows]
};

struct WorkItem {
  int32_t chunk = 0;  // index into the chunk list
  int32_t pair_begin = 0;
  int32_t pair_end = 0;
};

struct WorkCosts {
  int64_t num_pairs = 0;          // panel pairs of the packed matrix
  double pair_bytes = 0;          // bytes of one pair
  double pair_flops_per_row = 0;  // 2 * 32 * k
  double flops_per_byte = 1;      // ExpertKernels::flops_per_byte
  int64_t rows_per_pass = 1;      // most rows of one chunk
  int64_t row_multiple = 1;       // chunk sizes are multiples of this, except an expert's last
};

// Writes the chunks of `groups` and their items. Both vectors are cleared first and reserved to a
// bound that depends only on the number of groups, of rows and of threads, never on how the rows
// fall: batches no larger than one seen before allocate nothing, whatever their routing.
void split_work(const ExpertRows* groups, int64_t num_groups, const WorkCosts& costs,
                int num_threads, std::vector<ExpertRows>& chunks, std::vector<WorkItem>& items);

}  // namespace moe::cpu
