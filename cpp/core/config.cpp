#include "core/config.hpp"

#include <limits>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/resolver_shared_memory.hpp"

namespace hisparse {
namespace {

// count x (1 + num_speculative_tokens), refused past INT32_MAX.
int32_t times_query_length(int64_t count, int32_t num_speculative_tokens, const char* count_name) {
  if (count < 1) invalid_argument(count_name, ": expected a positive count, got ", count);
  if (num_speculative_tokens < 0) {
    invalid_argument("num_speculative_tokens: expected 0 or more draft tokens per request, got ",
                     num_speculative_tokens);
  }
  const int64_t rows = count * (1 + static_cast<int64_t>(num_speculative_tokens));
  if (rows > std::numeric_limits<int32_t>::max()) {
    invalid_argument("num_speculative_tokens: ", count_name, " x (1 + num_speculative_tokens) = ", count, " x ",
                     1 + static_cast<int64_t>(num_speculative_tokens), " = ", rows, " exceeds INT32_MAX");
  }
  return static_cast<int32_t>(rows);
}

}  // namespace

int32_t default_max_union_rows(int32_t top_k, int32_t num_speculative_tokens) {
  return times_query_length(top_k, num_speculative_tokens, "top_k");
}

int32_t default_max_swap_rows(int32_t max_num_reqs, int32_t num_speculative_tokens) {
  return times_query_length(max_num_reqs, num_speculative_tokens, "max_num_reqs");
}

hs_config_t resolve_config(const hs_config_t& config) {
  hs_config_t c = config;
  if (c.top_k < 1) invalid_argument("top_k: expected a positive number of positions, got ", c.top_k);
  if (c.device_buffer_size < 1 || c.device_buffer_size > kMaxDeviceBufferSize) {
    invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize,
                     " (hot slots are int16), got ", c.device_buffer_size);
  }
  if (c.num_speculative_tokens < 0) {
    invalid_argument("num_speculative_tokens: expected 0 or more draft tokens per request, got ",
                     c.num_speculative_tokens);
  }
  if (c.max_union_rows < 0) {
    invalid_argument("max_union_rows: expected 0 (top_k x (1 + num_speculative_tokens)) or a row count, got ",
                     c.max_union_rows);
  }
  const bool default_union = c.max_union_rows == 0;
  if (default_union) c.max_union_rows = default_max_union_rows(c.top_k, c.num_speculative_tokens);
  if (c.max_union_rows < c.top_k || c.max_union_rows > c.device_buffer_size) {
    invalid_argument("max_union_rows: expected top_k (", c.top_k, ") <= max_union_rows <= device_buffer_size (",
                     c.device_buffer_size, "), got ", c.max_union_rows,
                     default_union ? " (the default top_k x (1 + num_speculative_tokens))" : "");
  }
  if (c.row_bytes <= 0 || c.row_bytes % 16 != 0) {
    invalid_argument("row_bytes: hisparse requires 16-byte aligned KV rows, got ", c.row_bytes, " B");
  }
  if (c.block_size < 1) invalid_argument("block_size: expected a positive number of tokens, got ", c.block_size);
  if (c.hot_block_size < 1) {
    invalid_argument("hot_block_size: expected a positive number of tokens, got ", c.hot_block_size);
  }
  require_flag(c.eager_host_mirror, "eager_host_mirror");
  return c;
}

void check_resolver_shape(int32_t device_buffer_size, int32_t max_union_rows) {
  if (device_buffer_size < 1 || device_buffer_size > kMaxDeviceBufferSize) {
    invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize, ", got ",
                     device_buffer_size);
  }
  if (max_union_rows < 1 || max_union_rows > device_buffer_size) {
    invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", device_buffer_size,
                     "), got ", max_union_rows);
  }
}

uint64_t resolver_shared_memory_limit(const Backend& backend, int device) {
  return backend.device_properties(device).max_shared_memory_per_block;
}

uint64_t resolver_workspace_bytes_on_device(const Backend& backend, int device, int64_t num_state_rows,
                                            int32_t device_buffer_size, int32_t max_union_rows) {
  return resolver_workspace_bytes(num_state_rows, device_buffer_size, max_union_rows,
                                  resolver_shared_memory_limit(backend, device));
}

// The hint pays for the fused gather's early-read helper blocks (tail-read
// helpers, from half the SMs on, read it where a launch has one and the
// state rows otherwise, so they are no reason to keep one); the resolve
// launcher (cpp/cuda/resolve_residency.cu, handoff_helper_blocks
// and reads_early; change them together) gives them to a launch
// whose requests have one token row each, whose batch is below half the SMs
// (one helper block per SM the batch leaves idle, at least one per request)
// and whose arrays fit shared memory. A group meets all three on every
// launch when it has no speculative rows, fewer than half the SMs in
// requests, and a shape without a workspace. There the hint took 0.88-0.97x
// the time at 1-64 requests missing 5-20% and cost at most 2% where steps
// miss almost nothing; where no helper reads it, its upkeep costs 1-3%
// (docs/performance.md, "Residency hint").
bool residency_hint_pays(const Backend& backend, int device, const hs_config_t& config, int32_t max_num_reqs) {
  if (config.num_speculative_tokens != 0) return false;
  const DeviceProperties d = backend.device_properties(device);
  if (2 * int64_t{max_num_reqs} >= d.multiprocessor_count) return false;
  return resolver_split_layout(config.device_buffer_size, config.max_union_rows, d.max_shared_memory_per_block)
             .in_workspace == 0;
}

}  // namespace hisparse
