#include "core/index_group.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

#include "core/aliasing.hpp"
#include "core/config.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/resolve_residency_args.hpp"

namespace hisparse {
namespace {

constexpr uint64_t kTensorAlignment = 256;  // cudaMalloc's own alignment
constexpr size_t kHostMirrorBytes = 4096;   // one page, registered on its own

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

bool is_matrix(hs_index_group_tensor_t which) {
  switch (which) {
    case HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES:
    case HS_INDEX_GROUP_LRU_SLOTS:
    case HS_INDEX_GROUP_ATTENTION_INDICES:
    case HS_INDEX_GROUP_HOT_ROWS:
    case HS_INDEX_GROUP_RESOLVED_SLOTS:
    case HS_INDEX_GROUP_MISS_MASK:
    case HS_INDEX_GROUP_SWAP_HOST_ROWS:
    case HS_INDEX_GROUP_SWAP_DEVICE_ROWS: return true;
    default: return false;
  }
}

}  // namespace

IndexGroupOptions resolve_index_group_options(const IndexGroupOptions& options) {
  IndexGroupOptions o = options;
  if (o.max_num_reqs < 1) {
    invalid_argument("max_num_reqs: expected at least one request state row, got ", o.max_num_reqs);
  }
  if (o.device_buffer_size < 1 || o.device_buffer_size > kMaxDeviceBufferSize) {
    invalid_argument("device_buffer_size: expected 1 <= device_buffer_size <= ", kMaxDeviceBufferSize,
                     " (hot slots are int16 in lru_slots), got ", o.device_buffer_size);
  }
  if (o.top_k < 1) invalid_argument("top_k: expected a positive number of positions, got ", o.top_k);
  const bool default_swap_rows = o.max_swap_rows == 0;
  if (default_swap_rows) o.max_swap_rows = default_max_swap_rows(o.max_num_reqs, o.num_speculative_tokens);
  if (o.max_swap_rows < 1) {
    invalid_argument("max_swap_rows: expected at least one token row of shared top-k state, got ", o.max_swap_rows);
  }
  const bool default_union = o.max_union_rows == 0;
  if (default_union) o.max_union_rows = default_max_union_rows(o.top_k, o.num_speculative_tokens);
  if (o.max_union_rows < 1 || o.max_union_rows > o.device_buffer_size) {
    invalid_argument("max_union_rows: expected 1 <= max_union_rows <= device_buffer_size (", o.device_buffer_size,
                     "), got ", o.max_union_rows,
                     default_union ? " (the default top_k x (1 + num_speculative_tokens))" : "");
  }
  return o;
}

IndexGroup::Memory::Memory(Backend& backend, int device, uint64_t device_bytes) : backend_(backend), device_(device) {
  device_base_ = static_cast<char*>(backend.allocate(device_bytes, device));
  host_stats_ = static_cast<int64_t*>(std::aligned_alloc(kHostMirrorBytes, kHostMirrorBytes));
  if (host_stats_ == nullptr) {
    backend.deallocate(device_base_, device);
    throw std::bad_alloc();
  }
  std::memset(host_stats_, 0, kHostMirrorBytes);
  // Page-locked, so that the counter copy is asynchronous and capturable.
  if (backend.can_register_host_memory()) {
    try {
      backend.register_host_memory(host_stats_, kHostMirrorBytes, device);
    } catch (...) {
      std::free(host_stats_);
      backend.deallocate(device_base_, device);
      throw;
    }
    host_registered_ = true;
  }
}

IndexGroup::Memory::~Memory() {
  if (host_registered_) {
    try {
      backend_.unregister_host_memory(host_stats_, device_);
    } catch (...) {
      // Freeing a page that stays registered is harmless for the allocator;
      // a destructor has no one to report the failure to.
    }
  }
  std::free(host_stats_);
  backend_.deallocate(device_base_, device_);
}

IndexGroup::IndexGroup(const IndexGroupOptions& options, Backend& backend)
    : options_(resolve_index_group_options(options)), backend_(backend) {
  const uint64_t state = static_cast<uint64_t>(options_.max_num_reqs) * options_.device_buffer_size;
  const uint64_t shared = static_cast<uint64_t>(options_.max_swap_rows) * options_.top_k;
  const uint64_t rows = static_cast<uint64_t>(options_.max_swap_rows);

  const uint64_t sizes[kNumTensors] = {
      state * 4,                  // device_global_indices
      state * 2,                  // lru_slots
      static_cast<uint64_t>(options_.device_buffer_size) * 2,  // lru_init
      shared * 4,
      shared * 4,
      shared * 4,
      shared * 4,          // attention, hot rows, resolved, miss mask
      rows * 4,                   // valid counts
      shared * 4,
      shared * 4,     // swap host rows, swap device rows
      rows * 4,                   // swap counts
      HS_NUM_STATS * 8,           // stats
      0,                          // stats host mirror (separate page)
  };
  // Each size is below 2^50 (S, R, K < 2^31, H < 2^15), so the sum of the
  // aligned sizes cannot overflow 64 bits.
  uint64_t offset = 0;
  for (int i = 0; i < kNumTensors; ++i) {
    offsets_[i] = offset;
    offset = align_up(offset + sizes[i], kTensorAlignment);
  }
  // Allocated here so that no resolve through the group needs anything of
  // its caller (hs_resolve_residency_args_t.workspace).
  const uint64_t workspace_offset = offset;
  const uint64_t workspace_bytes =
      options_.device.is_cuda()
          ? resolver_workspace_bytes_on_device(backend_, options_.device.index, options_.max_num_reqs,
                                               options_.device_buffer_size, options_.max_union_rows)
          : 0;
  offset = align_up(offset + workspace_bytes, kTensorAlignment);
  const uint64_t handoff_offset = offset;
  handoff_bytes_ = options_.device.is_cuda()
                       ? static_cast<uint64_t>(options_.max_num_reqs) * HS_RESOLVER_HANDOFF_WORDS * sizeof(int32_t)
                       : 0;
  offset = align_up(offset + handoff_bytes_, kTensorAlignment);
  device_bytes_ = offset;
  memory_ = std::make_unique<Memory>(backend_, options_.device.index, device_bytes_);

  const int32_t device_type = options_.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
  const int64_t S = options_.max_num_reqs, H = options_.device_buffer_size;
  const int64_t R = options_.max_swap_rows, K = options_.top_k;
  auto at = [&](hs_index_group_tensor_t which) { return memory_->device_base() + offsets_[which]; };
  describe(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES, at(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES), HS_DTYPE_INT32, device_type,
           S, H);
  describe(HS_INDEX_GROUP_LRU_SLOTS, at(HS_INDEX_GROUP_LRU_SLOTS), HS_DTYPE_INT16, device_type, S, H);
  describe(HS_INDEX_GROUP_LRU_INIT, at(HS_INDEX_GROUP_LRU_INIT), HS_DTYPE_INT16, device_type, H, 0);
  for (hs_index_group_tensor_t which :
       {HS_INDEX_GROUP_ATTENTION_INDICES, HS_INDEX_GROUP_HOT_ROWS, HS_INDEX_GROUP_RESOLVED_SLOTS,
        HS_INDEX_GROUP_MISS_MASK, HS_INDEX_GROUP_SWAP_HOST_ROWS, HS_INDEX_GROUP_SWAP_DEVICE_ROWS}) {
    describe(which, at(which), HS_DTYPE_INT32, device_type, R, K);
  }
  describe(HS_INDEX_GROUP_VALID_COUNTS, at(HS_INDEX_GROUP_VALID_COUNTS), HS_DTYPE_INT32, device_type, R, 0);
  describe(HS_INDEX_GROUP_SWAP_COUNTS, at(HS_INDEX_GROUP_SWAP_COUNTS), HS_DTYPE_INT32, device_type, R, 0);
  describe(HS_INDEX_GROUP_STATS, at(HS_INDEX_GROUP_STATS), HS_DTYPE_INT64, device_type, HS_NUM_STATS, 0);
  describe(HS_INDEX_GROUP_STATS_HOST, memory_->host_stats(), HS_DTYPE_INT64,
           memory_->host_registered() ? HS_DEVICE_CUDA_HOST : HS_DEVICE_CPU, HS_NUM_STATS, 0);
  if (workspace_bytes > 0) workspace_ = reinterpret_cast<uint8_t*>(memory_->device_base() + workspace_offset);
  if (handoff_bytes_ > 0) handoff_ = reinterpret_cast<int32_t*>(memory_->device_base() + handoff_offset);

  initialise();
}

IndexGroup::~IndexGroup() = default;

void IndexGroup::describe(hs_index_group_tensor_t which, void* data, hs_dtype_t dtype, int32_t device_type,
                          int64_t rows, int64_t columns) {
  shapes_[which] = {rows, columns};
  hs_tensor_t& t = tensors_[which];
  t.data = data;
  t.dtype = dtype;
  t.device_type = device_type;
  t.device_index = options_.device.is_cuda() ? options_.device.index : 0;
  t.ndim = is_matrix(which) ? 2 : 1;
  t.shape = shapes_[which].data();
  t.strides = nullptr;
}

ByteRange IndexGroup::memory() const {
  const auto begin = reinterpret_cast<uintptr_t>(memory_->device_base());
  return ByteRange{"the index group's state (device_global_indices, lru_slots, shared outputs, counters)", begin,
                   begin + device_bytes_};
}

const hs_tensor_t& IndexGroup::tensor(hs_index_group_tensor_t which) const {
  if (static_cast<int>(which) < 0 || static_cast<int>(which) >= kNumTensors) {
    invalid_argument("which: expected an hs_index_group_tensor_t in [0, ", static_cast<int>(kNumTensors), "), got ",
                     static_cast<int>(which));
  }
  return tensors_[which];
}

ResetHotStateParams IndexGroup::reset_params() const {
  ResetHotStateParams p;
  p.device_global_indices = data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.lru_slots = data<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  p.lru_init = data<int16_t>(HS_INDEX_GROUP_LRU_INIT);
  p.num_state_rows = options_.max_num_reqs;
  p.hot_size = options_.device_buffer_size;
  p.counters = data<int64_t>(HS_INDEX_GROUP_STATS);
  p.num_counters = HS_NUM_STATS;
  p.device = options_.device.index;
  return p;
}

void IndexGroup::initialise() {
  const int device = options_.device.index;
  const uint64_t shared_bytes = static_cast<uint64_t>(options_.max_swap_rows) * options_.top_k * 4;
  const uint64_t count_bytes = static_cast<uint64_t>(options_.max_swap_rows) * 4;
  std::vector<int16_t> lru_init(options_.device_buffer_size);
  std::iota(lru_init.begin(), lru_init.end(), int16_t{0});

  PrivateStream stream(backend_, device);
  // Everything -1 first (state, slots, rows, attention), then the masks and
  // counts 0; the reset kernel writes the hot-region state and counters.
  backend_.fill_async(memory_->device_base(), 0xFF, device_bytes_, stream.get());
  backend_.fill_async(data<void>(HS_INDEX_GROUP_MISS_MASK), 0, shared_bytes, stream.get());
  backend_.fill_async(data<void>(HS_INDEX_GROUP_VALID_COUNTS), 0, count_bytes, stream.get());
  backend_.fill_async(data<void>(HS_INDEX_GROUP_SWAP_COUNTS), 0, count_bytes, stream.get());
  // Every resolve leaves the records it used idle (zero) again.
  if (handoff_ != nullptr) backend_.fill_async(handoff_, 0, handoff_bytes_, stream.get());
  backend_.copy_async(data<void>(HS_INDEX_GROUP_LRU_INIT), lru_init.data(), lru_init.size() * sizeof(int16_t),
                      stream.get());
  backend_.reset_hot_state(reset_params(), stream.get());
  backend_.synchronize_stream(stream.get());
}

void IndexGroup::reset(hs_stream_t stream) { backend_.reset_hot_state(reset_params(), stream); }

void IndexGroup::invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices,
                                         hs_stream_t stream) {
  const TensorArg slots(sorted_slots, "sorted_slots");
  slots.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(options_.device, "the index group");
  const TensorArg states(state_indices, "state_indices");
  states.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(options_.device, "the index group");
  AliasCheck().reads(slots).reads(states).writes(memory()).check();
  if (slots.numel() == 0 || states.numel() == 0) return;
  InvalidateSortedSlotsParams p;
  p.device_global_indices = data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.num_state_rows = options_.max_num_reqs;
  p.hot_size = options_.device_buffer_size;
  p.sorted_slots = slots.data<int32_t>();
  p.num_slots = slots.numel();
  p.state_indices = states.data<int32_t>();
  p.num_state_indices = states.numel();
  p.device = options_.device.index;
  backend_.invalidate_sorted_slots(p, stream);
}

void IndexGroup::copy_stats_async(hs_stream_t stream) {
  backend_.copy_async(memory_->host_stats(), data<void>(HS_INDEX_GROUP_STATS), HS_NUM_STATS * sizeof(int64_t), stream);
}

std::array<int64_t, HS_NUM_STATS> IndexGroup::read_stats() const {
  std::array<int64_t, HS_NUM_STATS> values{};
  std::memcpy(values.data(), memory_->host_stats(), sizeof(values));
  return values;
}

Device IndexGroup::resolve_topk(const TensorArg& topk, ResolveResidencyParams* params) const {
  topk.on(options_.device, "the index group").ndim_is(2).size_is(1, options_.top_k, "the index group's top_k");
  return resolve_topk_params(topk, params);
}

void IndexGroup::fill_resolve_params(int64_t row_offset, ResolveResidencyParams* params) const {
  ResolveResidencyParams& p = *params;
  const int64_t T = p.num_tokens;
  const int64_t R = options_.max_swap_rows;
  if (row_offset < 0 || row_offset > R - T) {
    invalid_argument("row_offset: expected 0 <= row_offset <= max_swap_rows - T = ", R, " - ", T,
                     " (the shared top-k rows [row_offset, row_offset + T) must fit the group), got ", row_offset);
  }
  const int64_t K = options_.top_k;
  p.device_global_indices = data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.lru_slots = data<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  p.num_state_rows = options_.max_num_reqs;
  p.hot_size = options_.device_buffer_size;
  p.max_union_rows = options_.max_union_rows;
  p.stats = data<int64_t>(HS_INDEX_GROUP_STATS);
  p.workspace = workspace_;
  p.handoff = handoff_;
  // Rows [row_offset, row_offset + T) of the shared [R, K] and [R] outputs.
  auto rows_of = [&](hs_index_group_tensor_t which) { return data<int32_t>(which) + row_offset * K; };
  p.out_attention = rows_of(HS_INDEX_GROUP_ATTENTION_INDICES);
  p.out_hot_rows = rows_of(HS_INDEX_GROUP_HOT_ROWS);
  p.out_resolved = rows_of(HS_INDEX_GROUP_RESOLVED_SLOTS);
  p.out_miss_mask = rows_of(HS_INDEX_GROUP_MISS_MASK);
  p.out_swap_host_rows = rows_of(HS_INDEX_GROUP_SWAP_HOST_ROWS);
  p.out_swap_device_rows = rows_of(HS_INDEX_GROUP_SWAP_DEVICE_ROWS);
  p.out_attention_row_stride = p.out_hot_rows_row_stride = p.out_resolved_row_stride = p.out_miss_mask_row_stride =
      p.out_swap_host_rows_row_stride = p.out_swap_device_rows_row_stride = K;
  p.out_valid_counts = data<int32_t>(HS_INDEX_GROUP_VALID_COUNTS) + row_offset;
  p.out_swap_counts = data<int32_t>(HS_INDEX_GROUP_SWAP_COUNTS) + row_offset;
}

void IndexGroup::resolve(const ResolveResidencyParams& params, hs_stream_t stream) {
  backend_.resolve_residency(params, stream);
}

ResolveResidencyParams IndexGroup::resolve_params(const hs_index_group_resolve_args_t& a) const {
  ResolveResidencyParams p;
  const TensorArg topk(a.topk_indices, "topk_indices");
  const Device device = resolve_topk(topk, &p);
  fill_resolve_params(a.row_offset, &p);
  const TensorArg req_ids(a.req_id_per_token, "req_id_per_token");
  const TensorArg state_indices(a.request_state_indices, "request_state_indices");
  resolve_batch_params(req_ids, state_indices, device, &p);
  resolve_scalar_params(a.hot_block_size, a.attention_block_stride == 0 ? a.hot_block_size : a.attention_block_stride,
                        a.host_rows, options_.max_union_rows, &p);
  const TensorArg hot_table(a.hot_block_table, "hot_block_table");
  resolve_hot_table_params(hot_table, device, &p);
  const TensorArg out_attention(a.out_attention, "out_attention", true);
  if (out_attention.present()) {
    p.out_attention = resolve_output_matrix(out_attention, device, p, &p.out_attention_row_stride);
  }
  const TensorArg out_valid_counts(a.out_valid_counts, "out_valid_counts", true);
  if (out_valid_counts.present()) p.out_valid_counts = resolve_output_vector(out_valid_counts, device, p);
  const TensorArg source_table(a.source_block_table, "source_block_table", true);
  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  const TensorArg valid_rows(a.num_valid_rows, "num_valid_rows", true);
  resolve_optional_params(source_table, a.block_size, resident_table,
                          a.resident_block_size == 0 ? a.hot_block_size : a.resident_block_size, valid_rows, device,
                          &p);
  const TensorArg gather_host(a.gather_host_cache, "gather_host_cache", true);
  const TensorArg gather_hot(a.gather_hot_cache, "gather_hot_cache", true);
  resolve_fused_gather_params(gather_host, gather_hot, a.gather_hot_block_stride, device, &p);
  resolve_gather_schedule(a.gather_schedule, &p);
  AliasCheck()
      .writes(out_attention)
      .writes(out_valid_counts)
      .writes(gather_hot)
      .reads(topk)
      .reads(req_ids)
      .reads(state_indices)
      .reads(hot_table)
      .reads(source_table)
      .reads(resident_table)
      .reads(valid_rows)
      .reads(gather_host)
      .writes(memory())
      .check();
  return p;
}

}  // namespace hisparse
