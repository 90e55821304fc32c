#include "core/layout.hpp"

#include "core/error.hpp"

namespace hisparse {

HostLayout plan_host_layout(uint64_t page_size_bytes, int64_t block_size, int64_t max_model_len,
                            uint64_t host_budget_bytes) {
  if (page_size_bytes == 0 || page_size_bytes % 16 != 0) {
    invalid_argument("page_size_bytes: expected a positive multiple of 16 (rows are 16-byte aligned), got ",
                     page_size_bytes);
  }
  if (block_size < 1) invalid_argument("block_size: expected a positive number of tokens, got ", block_size);
  if (max_model_len < 1) invalid_argument("max_model_len: expected a positive number of tokens, got ", max_model_len);
  const uint64_t host_block_stride = page_size_bytes;
  const uint64_t host_num_blocks = host_budget_bytes / host_block_stride;
  if (host_num_blocks == 0) {
    invalid_argument("hisparse has no allocatable host blocks: host_budget_bytes=", host_budget_bytes,
                     " is less than one block of page_size_bytes=", page_size_bytes,
                     "; increase host_budget_bytes (hisparse plan --host-budget-gib).");
  }
  // Every computed page needs a host block, so one request at max_model_len
  // must fit alongside the pool's null block and a copy-on-write tail.
  const int64_t min_host_blocks = (max_model_len + block_size - 1) / block_size + 2;
  if (host_num_blocks < static_cast<uint64_t>(min_host_blocks)) {
    invalid_argument("hisparse host pool has ", host_num_blocks, " blocks but max_model_len=", max_model_len, " needs ",
                     min_host_blocks, "; increase host_budget_bytes (", host_budget_bytes,
                     "; hisparse plan --host-budget-gib) or lower max_model_len.");
  }
  HostLayout layout;
  layout.host_num_blocks = static_cast<int64_t>(host_num_blocks);
  layout.host_block_stride = static_cast<int64_t>(host_block_stride);
  layout.min_host_blocks = min_host_blocks;
  return layout;
}

}  // namespace hisparse
