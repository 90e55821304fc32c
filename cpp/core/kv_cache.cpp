#include "core/kv_cache.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/aliasing.hpp"
#include "core/checked_math.hpp"
#include "core/config.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/host_memory.hpp"
#include "core/kv_ops.hpp"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr uint64_t kTensorAlignment = 256;

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// For a >= 0 and b > 0, without the overflow of (a + b - 1) / b near INT64_MAX.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

int32_t checked_int32(int64_t value, const char* name, const char* why) {
  if (value > kInt32Max) invalid_argument(name, ": ", why, " must fit in int32, got ", value);
  return static_cast<int32_t>(value);
}

}  // namespace

KvCacheLayout kv_cache_layout(const KvCacheOptions& o) {
  KvCacheLayout l;
  const hs_config_t config = resolve_config(o.config);
  const size_t itemsize = dtype_size(o.kv_dtype);
  if (itemsize == 0) {
    fail(HS_ERROR_INVALID_DTYPE, "kv_dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES), "), got ",
         static_cast<int>(o.kv_dtype));
  }
  if (config.row_bytes % static_cast<int32_t>(itemsize) != 0) {
    invalid_argument("kv_dtype: row_bytes ", config.row_bytes, " is not a whole number of ", dtype_name(o.kv_dtype),
                     " elements (", itemsize, " bytes each)");
  }
  // A runtime per layer, and per-layer tables sized before any memory check:
  // a bound well past any model keeps a wild value from allocating first.
  constexpr int32_t kMaxLayers = 1 << 16;
  if (o.num_layers < 1 || o.num_layers > kMaxLayers) {
    invalid_argument("num_layers: expected 1 to ", kMaxLayers, " layers, got ", o.num_layers);
  }
  if (o.max_requests < 1) invalid_argument("max_requests: expected at least one request row, got ", o.max_requests);
  if (o.max_seq_len < 1) invalid_argument("max_seq_len: expected at least one position, got ", o.max_seq_len);
  if (o.resident_pages < 0) {
    invalid_argument("resident_pages: expected 0 or more pages per request, got ", o.resident_pages);
  }
  l.num_layers = o.num_layers;
  l.max_requests = o.max_requests;
  l.row_bytes = config.row_bytes;
  l.row_width = config.row_bytes / static_cast<int32_t>(itemsize);
  l.block_size = config.block_size;
  l.hot_block_size = config.hot_block_size;
  l.max_seq_len = o.max_seq_len;
  l.resident_pages = o.resident_pages;
  const int64_t page_size = o.resident_page_size == 0 ? config.hot_block_size : o.resident_page_size;
  if (page_size < 1 || page_size % config.hot_block_size != 0) {
    invalid_argument("resident_page_size: expected 0 (the hot block size) or a positive multiple of hot_block_size (",
                     config.hot_block_size, "), got ", o.resident_page_size);
  }
  l.blocks_per_page = checked_int32(page_size / config.hot_block_size, "resident_page_size", "hot blocks per page");

  // Groups numbered in order of first appearance, so the first layer of
  // each group is its leader and group g's leader comes before group g+1's.
  l.group_of.resize(o.num_layers);
  if (o.layer_groups.empty()) {
    std::iota(l.group_of.begin(), l.group_of.end(), 0);
  } else {
    if (static_cast<int32_t>(o.layer_groups.size()) != o.num_layers) {
      invalid_argument("layer_groups: expected one group per layer (", o.num_layers, "), got ", o.layer_groups.size());
    }
    int32_t next = 0;
    for (int32_t layer = 0; layer < o.num_layers; ++layer) {
      const int32_t g = o.layer_groups[layer];
      if (g < 0 || g > next) {
        invalid_argument("layer_groups[", layer, "]: expected an existing group (0 to ", next - 1,
                         ") or the next new one (", next, "), got ", g,
                         "; groups are numbered in order of first appearance");
      }
      if (g == next) ++next;
      l.group_of[layer] = g;
    }
  }
  l.num_groups = *std::max_element(l.group_of.begin(), l.group_of.end()) + 1;
  l.leader_of.assign(l.num_groups, -1);
  for (int32_t layer = o.num_layers - 1; layer >= 0; --layer) l.leader_of[l.group_of[layer]] = layer;

  const int64_t S = o.max_requests;
  l.hot_blocks = checked_int32(ceil_div(config.device_buffer_size, config.hot_block_size), "device_buffer_size",
                               "hot blocks per request");
  l.host_blocks = checked_int32(ceil_div(o.max_seq_len, config.block_size), "max_seq_len", "host blocks per request");
  l.resident_table_width =
      checked_int32(ceil_div(o.max_seq_len, config.hot_block_size), "max_seq_len", "resident table columns");
  // Host slots and attention indices are int32.
  const int64_t host_blocks = checked_add(1, checked_mul(S, l.host_blocks, "max_requests"), "max_requests");
  l.host_rows = checked_mul(host_blocks, config.block_size, "max_requests");
  checked_int32(l.host_rows, "max_requests", "host slots (max_requests x blocks per request x block_size)");
  const int64_t ring = checked_mul(static_cast<int64_t>(o.resident_pages), l.blocks_per_page, "resident_pages");
  l.num_blocks =
      checked_add(1, checked_mul(S, checked_add(l.hot_blocks, ring, "resident_pages"), "max_requests"), "max_requests");
  // Attention indices are int32 rows of a layer's slab.
  const int64_t slab_rows = checked_mul(l.num_blocks, config.hot_block_size, "max_requests");
  if (slab_rows > kInt32Max) {
    invalid_argument("max_requests, resident_pages: a layer's slab of (1 + max_requests x (", l.hot_blocks,
                     " hot blocks + resident_pages x ", l.blocks_per_page,
                     " blocks per page)) x hot_block_size = ", slab_rows, " rows exceeds the int32 attention indices");
  }
  l.host_bytes = static_cast<uint64_t>(
      checked_mul(checked_mul(l.host_rows, o.num_layers, "num_layers"), l.row_bytes, "num_layers"));
  l.layer_bytes = static_cast<uint64_t>(
      checked_mul(checked_mul(l.num_blocks, config.hot_block_size, "max_requests"), l.row_bytes, "max_requests"));
  checked_mul(static_cast<int64_t>(l.layer_bytes), o.num_layers, "num_layers");
  return l;
}

// ------------------------------------------------------------------ creation

KvCache::KvCache(const KvCacheOptions& options)
    : options_(options), layout_(kv_cache_layout(options)), backend_(backend_for(options.device, "device")) {
  options_.config = resolve_config(options.config);
  const KvCacheLayout& l = layout_;
  if (options_.host_event != nullptr && options_.host_event->device() != options_.device) {
    invalid_argument("host_event: expected an interprocess event on the cache's device ", options_.device.describe(),
                     ", got one on ", options_.host_event->device().describe());
  }
  if (options_.host_pool != nullptr) {
    if (options_.host_pool->released()) invalid_argument("host_pool: the pool was released");
    if (options_.host_pool->size_bytes() < l.host_bytes) {
      invalid_argument("host_pool: expected at least ", l.host_bytes, " bytes (hs_kv_cache_host_bytes), got a pool of ",
                       options_.host_pool->size_bytes());
    }
    if (!options_.host_pool->claim_for_host_cache()) {
      invalid_argument("host_pool: the pool already holds the host cache of another KV cache (each cache keeps its "
                       "host cache at offset 0 of its pool, so a pool serves one cache at a time)");
    }
    pool_claim_.pool = options_.host_pool;
    pool_ = options_.host_pool;
  } else {
    check_host_memory(l.host_bytes);
    HostPoolOptions pool;
    pool.size_bytes = l.host_bytes;
    if (options_.device.is_cuda() && backend_.can_register_host_memory()) {
      pool.registrar = &backend_;
      pool.device = options_.device.index;
    }
    owned_pool_ = std::make_unique<HostPool>(pool);
    pool_ = owned_pool_.get();
  }

  // One device allocation: the slab, then the tables.
  const int64_t S = l.max_requests;
  const uint64_t sizes[HS_KV_CACHE_NUM_TENSORS] = {
      0,                                               // host cache (in the pool)
      l.layer_bytes * static_cast<uint64_t>(l.num_layers),  // slab
      static_cast<uint64_t>(S) * 4,                    // request_state_indices
      static_cast<uint64_t>(S) * l.host_blocks * 4,    // source block table
      static_cast<uint64_t>(S) * l.hot_blocks * 4,     // hot block table
      static_cast<uint64_t>(S) * l.resident_pages * l.blocks_per_page * 4,  // resident blocks
      static_cast<uint64_t>(S) * l.resident_table_width * 4,              // resident block table
      static_cast<uint64_t>(S) * 4,                    // seq_lens
      static_cast<uint64_t>(S) * l.resident_pages * 4,  // ring pages
  };
  uint64_t offset = 0;
  for (int i = 0; i < HS_KV_CACHE_NUM_TENSORS; ++i) {
    offsets_[i] = offset;
    offset = align_up(offset + sizes[i], kTensorAlignment);
  }
  device_bytes_ = offset;
  memory_ = std::make_unique<DeviceBuffer>(backend_, options_.device.index, device_bytes_);

  const int32_t device_type = options_.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
  auto at = [&](hs_kv_cache_tensor_t which) { return memory_->data() + offsets_[which]; };
  describe(HS_KV_CACHE_HOST_CACHE, pool_->data(), options_.kv_dtype, HS_DEVICE_CPU,
           {l.host_rows, l.num_layers, l.row_width});
  describe(HS_KV_CACHE_SLAB, at(HS_KV_CACHE_SLAB), options_.kv_dtype, device_type,
           {l.num_layers, l.num_blocks, l.hot_block_size, l.row_width});
  describe(HS_KV_CACHE_REQUEST_STATE_INDICES, at(HS_KV_CACHE_REQUEST_STATE_INDICES), HS_DTYPE_INT32, device_type, {S});
  describe(HS_KV_CACHE_SOURCE_BLOCK_TABLE, at(HS_KV_CACHE_SOURCE_BLOCK_TABLE), HS_DTYPE_INT32, device_type,
           {S, l.host_blocks});
  describe(HS_KV_CACHE_HOT_BLOCK_TABLE, at(HS_KV_CACHE_HOT_BLOCK_TABLE), HS_DTYPE_INT32, device_type,
           {S, l.hot_blocks});
  describe(HS_KV_CACHE_RESIDENT_BLOCKS, at(HS_KV_CACHE_RESIDENT_BLOCKS), HS_DTYPE_INT32, device_type,
           {S, static_cast<int64_t>(l.resident_pages) * l.blocks_per_page});
  describe(HS_KV_CACHE_RESIDENT_BLOCK_TABLE, at(HS_KV_CACHE_RESIDENT_BLOCK_TABLE), HS_DTYPE_INT32, device_type,
           {S, l.resident_table_width});
  describe(HS_KV_CACHE_SEQ_LENS, at(HS_KV_CACHE_SEQ_LENS), HS_DTYPE_INT32, device_type, {S});
  describe(HS_KV_CACHE_RING_PAGES, at(HS_KV_CACHE_RING_PAGES), HS_DTYPE_INT32, device_type,
           {S, static_cast<int64_t>(l.resident_pages)});
  initialise_tables();
  active_.assign(static_cast<size_t>(S), false);

  // One runtime per layer: the first layer of each group leads it.
  RuntimeOptions r;
  r.config = options_.config;
  r.device = options_.device;
  r.max_num_reqs = l.max_requests;
  r.max_swap_rows = options_.max_swap_rows;
  r.kv_dtype = options_.kv_dtype;
  runtimes_.resize(static_cast<size_t>(l.num_layers));
  for (int32_t layer = 0; layer < l.num_layers; ++layer) {
    const int32_t leader = l.leader_of[l.group_of[layer]];
    runtimes_[layer] =
        leader == layer ? std::make_unique<Runtime>(r) : std::make_unique<Runtime>(r, *runtimes_[leader]);
  }
  bind_runtimes();
}

KvCache::~KvCache() = default;

void KvCache::describe(hs_kv_cache_tensor_t which, void* data, hs_dtype_t dtype, int32_t device_type,
                       std::initializer_list<int64_t> shape) {
  std::copy(shape.begin(), shape.end(), shapes_[which].begin());
  hs_tensor_t& t = tensors_[which];
  t.data = data;
  t.dtype = dtype;
  t.device_type = device_type;
  t.device_index = options_.device.is_cuda() ? options_.device.index : 0;
  t.ndim = static_cast<int32_t>(shape.size());
  t.shape = shapes_[which].data();
  t.strides = nullptr;
}

void KvCache::initialise_tables() {
  const KvCacheLayout& l = layout_;
  const int64_t S = l.max_requests;
  std::vector<int32_t> states(static_cast<size_t>(S));
  std::iota(states.begin(), states.end(), 0);
  // Host block 0 and slab block 0 hold nothing: every table's 0 is "none".
  std::vector<int32_t> source(static_cast<size_t>(S) * l.host_blocks);
  std::vector<int32_t> hot(static_cast<size_t>(S) * l.hot_blocks);
  const int64_t ring = static_cast<int64_t>(l.resident_pages) * l.blocks_per_page;
  std::vector<int32_t> resident(static_cast<size_t>(S * ring));
  for (int64_t s = 0; s < S; ++s) {
    for (int32_t i = 0; i < l.host_blocks; ++i)
      source[s * l.host_blocks + i] = static_cast<int32_t>(1 + s * l.host_blocks + i);
    for (int32_t i = 0; i < l.hot_blocks; ++i)
      hot[s * l.hot_blocks + i] = static_cast<int32_t>(1 + s * l.hot_blocks + i);
    for (int64_t i = 0; i < ring; ++i) {
      resident[s * ring + i] = static_cast<int32_t>(1 + S * l.hot_blocks + s * ring + i);
    }
  }
  PrivateStream stream(backend_, options_.device.index);
  auto upload = [&](hs_kv_cache_tensor_t which, const std::vector<int32_t>& values) {
    backend_.copy_async(tensors_[which].data, values.data(), values.size() * sizeof(int32_t), stream.get());
  };
  backend_.fill_async(memory_->data(), 0, device_bytes_, stream.get());
  // Ring slots start holding no page (-1 in every byte).
  backend_.fill_async(tensors_[HS_KV_CACHE_RING_PAGES].data, 0xFF, static_cast<size_t>(S) * l.resident_pages * 4,
                      stream.get());
  upload(HS_KV_CACHE_REQUEST_STATE_INDICES, states);
  upload(HS_KV_CACHE_SOURCE_BLOCK_TABLE, source);
  upload(HS_KV_CACHE_HOT_BLOCK_TABLE, hot);
  upload(HS_KV_CACHE_RESIDENT_BLOCKS, resident);
  backend_.synchronize_stream(stream.get());
}

hs_tensor_t KvCache::layer_view(int32_t layer, std::array<int64_t, 3>* shape) const {
  const KvCacheLayout& l = layout_;
  *shape = {l.num_blocks, l.hot_block_size, l.row_width};
  hs_tensor_t view = tensors_[HS_KV_CACHE_SLAB];
  view.data = memory_->data() + offsets_[HS_KV_CACHE_SLAB] + static_cast<uint64_t>(layer) * l.layer_bytes;
  view.ndim = 3;
  view.shape = shape->data();
  view.strides = nullptr;
  return view;
}

void KvCache::bind_runtimes() {
  const KvCacheLayout& l = layout_;
  const hs_tensor_t& slab_tensor = tensors_[HS_KV_CACHE_SLAB];
  std::array<int64_t, 1> slab_shape{static_cast<int64_t>(l.layer_bytes * static_cast<uint64_t>(l.num_layers))};
  const hs_tensor_t slab{slab_tensor.data,  HS_DTYPE_UINT8, slab_tensor.device_type, slab_tensor.device_index, 1,
                         slab_shape.data(), nullptr};
  for (int32_t layer = 0; layer < l.num_layers; ++layer) {
    // Layer l's rows of the token-major host cache: [host_rows, W] at a
    // pitch of L rows.
    std::array<int64_t, 2> host_shape{l.host_rows, l.row_width};
    std::array<int64_t, 2> host_strides{static_cast<int64_t>(l.num_layers) * l.row_width, 1};
    const hs_tensor_t host{static_cast<char*>(pool_->data()) + layer * l.row_bytes,
                           options_.kv_dtype,
                           HS_DEVICE_CPU,
                           0,
                           2,
                           host_shape.data(),
                           host_strides.data()};
    Runtime& r = *runtimes_[layer];
    r.bind_source_cache(&host, nullptr);
    hs_hot_cache_binding_t binding;
    hs_hot_cache_binding_init(&binding);
    binding.raw_tensor = &slab;
    binding.byte_offset = static_cast<int64_t>(static_cast<uint64_t>(layer) * l.layer_bytes);
    binding.block_stride = l.hot_block_size * l.row_bytes;
    binding.num_blocks = l.num_blocks;
    binding.block_size = l.hot_block_size;
    binding.block_table = &tensors_[HS_KV_CACHE_HOT_BLOCK_TABLE];
    r.bind_hot_cache(binding);
    r.set_host_sharing(HS_HOST_ROLE_AUTO, options_.host_event);
  }
}

// ------------------------------------------------------------------ queries

int32_t KvCache::checked_layer(int32_t layer) const {
  if (layer < 0 || layer >= layout_.num_layers) {
    invalid_argument("layer: expected 0 <= layer < num_layers = ", layout_.num_layers, ", got ", layer);
  }
  return layer;
}

void KvCache::checked_row(int32_t row) const {
  if (row < 0 || row >= layout_.max_requests) {
    invalid_argument("row: expected 0 <= row < max_requests = ", layout_.max_requests, ", got ", row);
  }
}

Runtime& KvCache::runtime(int32_t layer) const { return *runtimes_[checked_layer(layer)]; }

int32_t KvCache::group_of(int32_t layer) const { return layout_.group_of[checked_layer(layer)]; }

const hs_tensor_t& KvCache::tensor(hs_kv_cache_tensor_t which) const {
  if (static_cast<int>(which) < 0 || static_cast<int>(which) >= HS_KV_CACHE_NUM_TENSORS) {
    invalid_argument("which: expected an hs_kv_cache_tensor_t in [0, ", static_cast<int>(HS_KV_CACHE_NUM_TENSORS),
                     "), got ", static_cast<int>(which));
  }
  return tensors_[which];
}

int32_t KvCache::active_requests() const {
  return static_cast<int32_t>(std::count(active_.begin(), active_.end(), true));
}

// ------------------------------------------------------------------ requests

void KvCache::clear_ring_pages(int32_t row, hs_stream_t stream) {
  const size_t bytes = static_cast<size_t>(layout_.resident_pages) * sizeof(int32_t);
  backend_.fill_async(static_cast<uint8_t*>(tensors_[HS_KV_CACHE_RING_PAGES].data) + row * bytes, 0xFF, bytes, stream);
}

void KvCache::reset_row(int32_t row, hs_stream_t stream) {
  for (int32_t leader : layout_.leader_of) runtimes_[leader]->reset_request(row, stream);
  clear_ring_pages(row, stream);
}

int32_t KvCache::admit(int32_t row, hs_stream_t stream) {
  if (row == -1) {
    const auto free = std::find(active_.begin(), active_.end(), false);
    if (free == active_.end()) {
      fail(HS_ERROR_INVALID_STATE, "admit: every one of the ", layout_.max_requests,
           " request rows is admitted; release one first");
    }
    row = static_cast<int32_t>(free - active_.begin());
  }
  checked_row(row);
  if (active_[row]) fail(HS_ERROR_INVALID_STATE, "row: request row ", row, " is admitted already; release it first");
  reset_row(row, stream);
  active_[row] = true;
  return row;
}

void KvCache::release(int32_t row, hs_stream_t stream) {
  checked_row(row);
  if (!active_[row]) fail(HS_ERROR_INVALID_STATE, "row: request row ", row, " is not admitted");
  reset_row(row, stream);
  active_[row] = false;
}

// ------------------------------------------------------------------ a forward

void KvCache::begin_forward(const hs_tensor_t* seq_lens_t, hs_stream_t stream) {
  const TensorArg lengths(seq_lens_t, "seq_lens");
  lengths.dtype_is(HS_DTYPE_INT32).ndim_is(1).contiguous().on(options_.device, "the cache");
  lengths.size_is(0, layout_.max_requests, "one length per request row");
  const hs_tensor_t& own = tensors_[HS_KV_CACHE_SEQ_LENS];
  // The cache's own lengths given back are already in place; lengths that
  // overlap them otherwise would be copied over themselves.
  if (lengths.data<void>() != own.data) {
    const TensorArg own_lengths(&own, "the cache's seq_lens table");
    check_apart(lengths.bytes(), false, own_lengths.bytes(), true);
    backend_.copy_async(own.data, lengths.data<void>(), static_cast<size_t>(layout_.max_requests) * sizeof(int32_t),
                        stream);
  }
  if (layout_.resident_pages > 0) {
    ResidencyParams p;
    p.device = options_.device.index;
    p.table = static_cast<int32_t*>(tensors_[HS_KV_CACHE_RESIDENT_BLOCK_TABLE].data);
    p.table_row_stride = layout_.resident_table_width;
    p.table_width = layout_.resident_table_width;
    p.table_block_size = layout_.hot_block_size;
    p.blocks_per_page = layout_.blocks_per_page;
    p.num_pages = layout_.resident_pages;
    p.num_batch_rows = layout_.max_requests;
    p.request_state_indices = static_cast<const int32_t*>(tensors_[HS_KV_CACHE_REQUEST_STATE_INDICES].data);
    p.seq_lens = static_cast<const int32_t*>(own.data);
    p.resident_blocks = static_cast<const int32_t*>(tensors_[HS_KV_CACHE_RESIDENT_BLOCKS].data);
    p.resident_blocks_row_stride = static_cast<int64_t>(layout_.resident_pages) * layout_.blocks_per_page;
    p.num_state_rows = layout_.max_requests;
    p.ring_pages = static_cast<int32_t*>(tensors_[HS_KV_CACHE_RING_PAGES].data);
    p.ring_pages_row_stride = layout_.resident_pages;
    backend_.update_residency(p, stream);
  }
  for (const auto& r : runtimes_) r->begin_forward();
}

void KvCache::write(int32_t layer, const hs_tensor_t* rows, const hs_tensor_t* req_id_per_token,
                    const hs_tensor_t* positions, hs_stream_t stream) {
  Runtime& r = runtime(layer);
  std::array<int64_t, 3> shape{};
  const hs_tensor_t view = layer_view(layer, &shape);
  hs_runtime_write_args_t a;
  hs_runtime_write_args_init(&a);
  a.rows = rows;
  a.req_id_per_token = req_id_per_token;
  a.positions = positions;
  a.request_state_indices = &tensors_[HS_KV_CACHE_REQUEST_STATE_INDICES];
  a.source_block_table = &tensors_[HS_KV_CACHE_SOURCE_BLOCK_TABLE];
  a.block_size = layout_.block_size;
  if (layout_.resident_pages > 0) {
    a.resident_cache = &view;
    a.resident_block_table = &tensors_[HS_KV_CACHE_RESIDENT_BLOCK_TABLE];
  }
  r.write(a, stream);
}

SwapInResult KvCache::swap_in(int32_t layer, const hs_kv_cache_swap_in_args_t& in, hs_stream_t stream) {
  Runtime& r = runtime(layer);
  hs_runtime_swap_in_args_t a;
  hs_runtime_swap_in_args_init(&a);
  a.topk_indices = in.topk_indices;
  a.num_tokens = in.num_tokens;
  a.prefetch = in.prefetch;
  a.fused_gather = in.fused_gather;
  if (r.is_leader()) {
    a.req_id_per_token = in.req_id_per_token;
    a.num_valid_rows = in.num_valid_rows;
    a.request_state_indices = &tensors_[HS_KV_CACHE_REQUEST_STATE_INDICES];
    a.source_block_table = &tensors_[HS_KV_CACHE_SOURCE_BLOCK_TABLE];
    a.block_size = layout_.block_size;
    if (layout_.resident_pages > 0) {
      a.resident_block_table = &tensors_[HS_KV_CACHE_RESIDENT_BLOCK_TABLE];
      a.resident_block_size = layout_.hot_block_size;
    }
    // Positions a request has not written yet are never loaded.
    a.seq_lens = &tensors_[HS_KV_CACHE_SEQ_LENS];
  }
  return r.swap_in(a, stream);
}

void KvCache::read(int32_t layer, const hs_tensor_t* indices, const hs_tensor_t* out, hs_stream_t stream) {
  checked_layer(layer);
  std::array<int64_t, 3> shape{};
  const hs_tensor_t view = layer_view(layer, &shape);
  ReadRowsParams p;
  const TensorArg indices_arg(indices, "indices");
  const TensorArg out_arg(out, "out");
  read_rows_args(paged_rows(TensorArg(&view, "slab"), options_.device, "the cache", false), options_.kv_dtype,
                 indices_arg, out_arg, options_.device, &p);
  // `out` is written: apart from the indices and from everything the cache
  // owns (its slab, which the call reads, and the state it keeps).
  AliasCheck().writes(out_arg).reads(indices_arg).check();
  check_apart_from_own_memory(out_arg.bytes(), true);
  if (p.num_rows == 0 || p.width == 0) return;
  backend_.read_rows(p, stream);
}

void KvCache::check_apart_from_own_memory(const ByteRange& range, bool written) const {
  const uintptr_t device_begin = reinterpret_cast<uintptr_t>(memory_->data());
  const uintptr_t host_begin = reinterpret_cast<uintptr_t>(tensors_[HS_KV_CACHE_HOST_CACHE].data);
  check_apart(range, written, ByteRange{"the cache's slab and tables", device_begin, device_begin + device_bytes_},
              false);
  check_apart(range, written, ByteRange{"the cache's host cache", host_begin, host_begin + layout_.host_bytes}, false);
  for (int32_t leader : layout_.leader_of) {
    ByteRange state = runtimes_[leader]->group().index_group().memory();
    state.name = "the state of an index group of the cache";
    check_apart(range, written, state, false);
  }
}

// ------------------------------------------------------------------ counters

void KvCache::reset_stats(hs_stream_t stream) {
  for (int32_t leader : layout_.leader_of) runtimes_[leader]->reset_stats(stream);
}

void KvCache::copy_stats_async(hs_stream_t stream) {
  for (int32_t leader : layout_.leader_of) runtimes_[leader]->copy_stats_async(stream);
}

RuntimeStats KvCache::stats(int32_t group) const {
  if (group < -1 || group >= layout_.num_groups) {
    invalid_argument("group: expected -1 (all groups) or 0 <= group < ", layout_.num_groups, ", got ", group);
  }
  if (group >= 0) return runtimes_[layout_.leader_of[group]]->stats();
  RuntimeStats total;
  for (int32_t leader : layout_.leader_of) {
    const RuntimeStats s = runtimes_[leader]->stats();
    total.num_layers += s.num_layers;
    for (int i = 0; i < HS_NUM_STATS; ++i) total.counters[i] += s.counters[i];
    total.group_row_bytes += s.group_row_bytes;
    total.bytes_moved += s.bytes_moved;
  }
  const int64_t hits = total.counters[HS_STAT_HITS];
  const int64_t misses = total.counters[HS_STAT_MISSES];
  total.hit_rate = hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0;
  return total;
}

}  // namespace hisparse
