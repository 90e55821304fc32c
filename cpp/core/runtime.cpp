#include "core/runtime.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "core/aliasing.hpp"
#include "core/checked_math.hpp"
#include "core/config.hpp"
#include "core/data_movement.hpp"
#include "core/error.hpp"
#include "core/kv_ops.hpp"
#include "core/paged_view.hpp"
#include "core/resolve_residency_args.hpp"
#include "core/shared_host_pool.hpp"

namespace hisparse {
namespace {

constexpr int64_t kRowAlignment = 16;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Bytes from a tensor's data pointer to the end of its last element (0 when
// empty): the range a kernel may touch.
int64_t span_bytes(const TensorArg& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.stride(d) < 0) invalid_argument(t.name(), ": expected non-negative strides, got ", t.stride(d));
    last = checked_add(last, checked_mul(t.size(d) - 1, t.stride(d), t.name()), t.name());
  }
  return checked_mul(last + 1, static_cast<int64_t>(dtype_size(t.dtype())), t.name());
}

// `o` with its config resolved and the defaults filled in (a follower takes
// its leader's max_num_reqs and max_swap_rows), validated.
RuntimeOptions resolve_options(const RuntimeOptions& options, const RuntimeOptions* leader) {
  RuntimeOptions o = options;
  o.config = resolve_config(o.config);
  if (leader != nullptr && o.max_num_reqs == 0) o.max_num_reqs = leader->max_num_reqs;
  if (o.max_num_reqs < 1) {
    invalid_argument("max_num_reqs: expected at least one request state row, got ", o.max_num_reqs);
  }
  if (o.max_swap_rows < 0) {
    invalid_argument("max_swap_rows: expected 0 (default) or a positive number of token rows, got ", o.max_swap_rows);
  }
  if (o.max_swap_rows == 0) {
    o.max_swap_rows = leader != nullptr ? leader->max_swap_rows
                                        : default_max_swap_rows(o.max_num_reqs, o.config.num_speculative_tokens);
  }
  const size_t itemsize = dtype_size(o.kv_dtype);
  if (itemsize == 0) {
    fail(HS_ERROR_INVALID_DTYPE, "kv_dtype: expected an hs_dtype_t in [0, ", static_cast<int>(HS_NUM_DTYPES), "), got ",
         static_cast<int>(o.kv_dtype));
  }
  if (o.config.row_bytes % static_cast<int32_t>(itemsize) != 0) {
    invalid_argument("kv_dtype: row_bytes ", o.config.row_bytes, " is not a whole number of ", dtype_name(o.kv_dtype),
                     " elements (", itemsize, " bytes each)");
  }
  return o;
}

// The leader's residency hint choice, decided for its device: AUTO keeps
// none on the CPU backend, which never reads one (ON is reported as asked,
// but the CPU backend allocates nothing for it either).
bool keeps_residency_hint(const RuntimeOptions& o, const Backend& backend) {
  switch (o.residency_hint) {
    case HS_RESIDENCY_HINT_ON: return true;
    case HS_RESIDENCY_HINT_AUTO:
      return o.device.is_cuda() && residency_hint_pays(backend, o.device.index, o.config, o.max_num_reqs);
    default: return false;
  }
}

}  // namespace

// ------------------------------------------------------------------ StoredTensor

void StoredTensor::assign(const hs_tensor_t& tensor) {
  if (tensor.ndim < 0 || tensor.ndim > HS_MAX_DIMS) {
    invalid_argument("tensor: expected 0 to ", HS_MAX_DIMS, " dimensions, got ", tensor.ndim);
  }
  tensor_ = tensor;
  for (int d = 0; d < tensor.ndim; ++d) {
    shape_[d] = tensor.shape[d];
    if (tensor.strides != nullptr) strides_[d] = tensor.strides[d];
  }
  tensor_.shape = shape_.data();
  tensor_.strides = tensor.strides != nullptr ? strides_.data() : nullptr;
}

// ------------------------------------------------------------------ creation

Runtime::Runtime(const RuntimeOptions& options) : options_(resolve_options(options, nullptr)) {
  Backend& backend = backend_for(options_.device, "device_index");
  GroupOptions g;
  g.index_group.device = options_.device;
  g.index_group.max_num_reqs = options_.max_num_reqs;
  g.index_group.device_buffer_size = options_.config.device_buffer_size;
  g.index_group.max_swap_rows = options_.max_swap_rows;
  g.index_group.top_k = options_.config.top_k;
  g.index_group.max_union_rows = options_.config.max_union_rows;
  g.copy_stream = options_.copy_stream;
  g.topk_ready = options_.topk_ready;
  g.residency_hint = keeps_residency_hint(options_, backend);
  group_ = std::make_shared<RuntimeGroup>(g, backend);
  init_common();
  group_->set_leader(this);
}

Runtime::Runtime(const RuntimeOptions& options, Runtime& leader) {
  if (!leader.is_leader()) {
    invalid_argument("leader: expected a group leader (a runtime created without a leader), got a follower");
  }
  options_ = resolve_options(options, &leader.options_);
  const RuntimeOptions& l = leader.options_;
  auto same = [](const char* name, int64_t mine, int64_t theirs) {
    if (mine != theirs) {
      invalid_argument(name, ": a follower must have its group leader's ", name, " (", theirs, "), got ", mine);
    }
  };
  if (options_.device != l.device) {
    invalid_argument("device: a follower must live on its group leader's device (", l.device.describe(), "), got ",
                     options_.device.describe());
  }
  same("top_k", options_.config.top_k, l.config.top_k);
  same("device_buffer_size", options_.config.device_buffer_size, l.config.device_buffer_size);
  same("max_union_rows", options_.config.max_union_rows, l.config.max_union_rows);
  same("max_num_reqs", options_.max_num_reqs, l.max_num_reqs);
  same("max_swap_rows", options_.max_swap_rows, l.max_swap_rows);
  if (options_.copy_stream != nullptr) {
    invalid_argument("copy_stream: only a group leader takes a copy stream; followers use their leader's");
  }
  if (options_.residency_hint == HS_RESIDENCY_HINT_ON) {
    invalid_argument("residency_hint: only a group leader keeps a residency hint; followers use their leader's");
  }
  if (options_.topk_ready != nullptr) {
    invalid_argument("topk_ready_event: only a group leader takes a top-k-ready event; followers use their leader's");
  }
  group_ = leader.group_;
  init_common();
  try {
    group_->add_follower(this);
  } catch (...) {
    backend_->destroy_event(ready_event_, options_.device.index);
    throw;
  }
}

void Runtime::init_common() {
  backend_ = &group_->backend();
  row_width_ = options_.config.row_bytes / static_cast<int32_t>(dtype_size(options_.kv_dtype));
  ready_event_ = backend_->create_event(options_.device.index);
}

Runtime::~Runtime() {
  if (host_event_ != nullptr) host_event_->give_back();
  group_->remove(this);
  backend_->destroy_event(ready_event_, options_.device.index);
}

// ------------------------------------------------------------------ binding

const hs_tensor_t& Runtime::host_cache() const {
  if (!source_bound_) fail(HS_ERROR_INVALID_STATE, "host_cache: the runtime has no bound source cache");
  return source_.cache.raw();
}

const hs_tensor_t& Runtime::hot_cache() const {
  if (!hot_bound_) fail(HS_ERROR_INVALID_STATE, "hot_cache: the runtime has no bound hot cache");
  return hot_.view.raw();
}

GatherCompactParams Runtime::gather_template(const SourceBinding& source, const HotBinding& hot) const {
  GatherCompactParams g;
  try {
    gather_cache_params(TensorArg(source.cache.get(), "host_cache"), TensorArg(hot.view.get(), "hot_cache"),
                        hot.block_size, hot.attention_block_stride, "block_stride", &g);
  } catch (const Error& error) {
    throw Error(error.status(), str("the bound caches fail the gather's checks: ", error.what()));
  }
  g.variant = gather_default_variant();
  return g;
}

void Runtime::bind_source_cache(const hs_tensor_t* host_cache, const hs_tensor_t* registered_host_pool) {
  const TensorArg cache(host_cache, "host_cache");
  if (cache.device().is_cuda()) {
    invalid_argument("host_cache: hisparse requires a host-resident KV pool; got a tensor on ",
                     cache.device().describe());
  }
  if (cache.dtype() != options_.kv_dtype || cache.ndim() < 2 || cache.size(cache.ndim() - 1) != row_width_) {
    const bool dtype_wrong = cache.dtype() != options_.kv_dtype;
    fail(dtype_wrong ? HS_ERROR_INVALID_DTYPE : HS_ERROR_INVALID_ARGUMENT,
         "host_cache: hisparse runtime bound to a KV cache with mismatched layout: expected rows of (", row_width_,
         ", ", dtype_name(options_.kv_dtype), ") = ", row_bytes(), " bytes, got shape ", cache.shape_string(), " of ",
         dtype_name(cache.dtype()));
  }
  // Rows at one pitch: the kernels address host slot g at base + g * pitch.
  const int last = cache.ndim() - 1;
  if (row_width_ > 1 && cache.stride(last) != 1) {
    invalid_argument("host_cache: expected a unit stride in the last (row) dimension, got ", cache.stride(last));
  }
  int64_t rows = 1;
  int64_t pitch = -1;
  int64_t expected = -1;
  for (int d = last - 1; d >= 0; --d) {
    rows *= cache.size(d);
    if (cache.size(d) == 1) continue;
    if (expected < 0) {
      pitch = cache.stride(d);
      if (pitch < row_width_) {
        invalid_argument("host_cache: expected a row stride of at least the row width ", row_width_, ", got ", pitch);
      }
      expected = pitch * cache.size(d);
    } else if (cache.stride(d) != expected) {
      invalid_argument("host_cache: expected rows at one uniform pitch (stride ", expected, " in dimension ", d,
                       "), got stride ", cache.stride(d), " (shape ", cache.shape_string(),
                       "); host slot g must be row g of the view");
    } else {
      expected *= cache.size(d);
    }
  }
  // Host slots are int32 in the resolver's outputs and swap lists.
  if (rows > kInt32Max) {
    invalid_argument("host_cache: expected at most ", kInt32Max, " rows (host slots are int32), got ", rows);
  }
  const int64_t itemsize = static_cast<int64_t>(dtype_size(cache.dtype()));
  const int64_t pitch_bytes = (pitch < 0 ? row_width_ : pitch) * itemsize;
  if (pitch_bytes % kRowAlignment != 0) {
    invalid_argument("host_cache: expected a row pitch that is a multiple of 16 bytes, got ", pitch_bytes, " bytes");
  }
  if (rows > 0) cache.aligned(kRowAlignment);
  const int64_t extent =
      rows > 0 ? checked_add(checked_mul(rows - 1, pitch_bytes, "host_cache"), row_bytes(), "host_cache") : 0;
  const TensorArg pool(registered_host_pool, "registered_host_pool", true);
  if (pool.present()) {
    if (pool.device().is_cuda()) {
      invalid_argument("registered_host_pool: expected host memory, got a tensor on ", pool.device().describe());
    }
    const auto begin = reinterpret_cast<uintptr_t>(pool.data<void>());
    const auto end = begin + static_cast<uintptr_t>(span_bytes(pool));
    const auto first = reinterpret_cast<uintptr_t>(cache.data<void>());
    if (first < begin || first + static_cast<uintptr_t>(extent) > end) {
      invalid_argument("registered_host_pool: expected the registered range that holds host_cache, but host_cache's ",
                       extent, " bytes at offset ", static_cast<int64_t>(first - begin),
                       " do not lie within the pool's ", static_cast<int64_t>(end - begin), " bytes");
    }
  }
  // A kernel reading unregistered pageable memory would kill the context.
  backend_->check_accessible(cache.data<void>(), static_cast<size_t>(extent), options_.device.index, "host_cache");
  // A cache inside a shared pool takes this process's role in that pool.
  const std::optional<SharedPoolRole> role = shared_host_pool_role(cache.data<void>(), static_cast<uint64_t>(extent));

  SourceBinding source;
  source.cache.assign(*host_cache);
  source.rows = rows;
  source.pitch = pitch < 0 ? row_width_ : pitch;
  source.bytes = cache.bytes();
  source.pool = host_region_holding(cache.data<void>(), static_cast<uint64_t>(extent));
  check_binding_apart(source.bytes, hot_bound_ ? hot_.view_bytes : ByteRange{},
                      hot_bound_ ? hot_.table_bytes : ByteRange{});
  // Everything is checked before anything changes: a refused binding leaves
  // the previous one in place.
  if (hot_bound_) gather_ = gather_template(source, hot_);
  source_ = source;
  source_bound_ = true;
  pool_reader_ = role.has_value() && !role->is_writer();
  // The leader's source rows are the host rows its resolves name.
  if (is_leader() && group_->keeps_residency_hint()) group_->rebuild_residency_hint(rows);
}

void Runtime::bind_hot_cache(const hs_hot_cache_binding_t& b) {
  const TensorArg raw(b.raw_tensor, "raw_tensor");
  raw.on(options_.device, "the runtime");
  const int64_t hot_block_size = options_.config.hot_block_size;
  if (b.block_size != hot_block_size) {
    invalid_argument("block_size: expected the config's hot_block_size (", hot_block_size, " rows per hot block), got ",
                     b.block_size);
  }
  const PagedView view =
      paged_view(raw, options_.kv_dtype, row_width_, b.byte_offset, b.block_stride, b.num_blocks, b.block_size);
  const TensorArg table(b.block_table, "block_table");
  table.dtype_is(HS_DTYPE_INT32).ndim_is(2).row_major_2d().on(options_.device, "the runtime");
  const int64_t H = options_.config.device_buffer_size;
  table.size_at_least(1, (H + b.block_size - 1) / b.block_size, "ceil(device_buffer_size / block_size) hot blocks");
  if (table.size(1) > kInt32Max) {
    invalid_argument("block_table: expected at most ", kInt32Max, " columns, got shape ", table.shape_string());
  }
  backend_->check_accessible(view.data, static_cast<size_t>(view.bytes), options_.device.index, "raw_tensor");
  check_hot_layout_in_group(b.block_size, view.attention_block_stride);

  HotBinding hot;
  hot.view.assign(hs_tensor_t{view.data, options_.kv_dtype, raw.raw().device_type, raw.raw().device_index, 3,
                              view.shape.data(), view.strides.data()});
  hot.block_table.assign(*b.block_table);
  hot.num_blocks = b.num_blocks;
  hot.block_size = b.block_size;
  hot.attention_block_stride = view.attention_block_stride;
  hot.view_bytes = TensorArg(hot.view.get(), "raw_tensor").bytes();
  hot.table_bytes = table.bytes();
  check_binding_apart(source_bound_ ? source_.bytes : ByteRange{}, hot.view_bytes, hot.table_bytes);
  // Everything is checked before anything changes: a refused binding leaves
  // the previous one in place.
  if (source_bound_) gather_ = gather_template(source_, hot);
  hot_ = hot;
  hot_bound_ = true;
}

void Runtime::unbind() {
  source_bound_ = false;
  source_ = SourceBinding{};
  hot_bound_ = false;
  hot_ = HotBinding{};
  gather_ = GatherCompactParams{};
  staged_ = Staged{};
  next_row_ = 0;
}

void Runtime::check_hot_layout_in_group(int64_t block_size, int64_t attention_block_stride) const {
  auto check = [](int64_t leader_block_size, int64_t leader_stride, int64_t member_block_size, int64_t member_stride) {
    if (member_block_size != leader_block_size) {
      invalid_argument("block_size: every runtime of an index group must use its leader's hot block size (the "
                       "leader's attention indices assume it): leader ",
                       leader_block_size, ", follower ", member_block_size);
    }
    if (member_stride != leader_stride) {
      invalid_argument("block_stride: every runtime of an index group must have its leader's attention_block_stride "
                       "(block_stride / row_bytes; the leader's attention indices assume it): leader ",
                       leader_stride, " rows, follower ", member_stride, " rows");
    }
  };
  if (is_leader()) {
    for (const Runtime* f : group_->followers()) {
      if (f->hot_bound_) check(block_size, attention_block_stride, f->hot_.block_size, f->hot_.attention_block_stride);
    }
  } else if (const Runtime* leader = group_->leader(); leader != nullptr && leader->hot_bound_) {
    check(leader->hot_.block_size, leader->hot_.attention_block_stride, block_size, attention_block_stride);
  }
}

// ------------------------------------------------------------------ decode step

void Runtime::begin_forward() {
  next_row_ = 0;
  staged_ = Staged{};
  if (is_leader()) group_->set_resolved_rows(0);
}

void Runtime::require_bound(const char* operation) const {
  if (!source_bound_ || !hot_bound_) {
    fail(HS_ERROR_INVALID_STATE, "hisparse layer swap was not prefetched: the runtime is not bound (", operation,
         " needs bind_source_cache and bind_hot_cache first; source cache ", source_bound_ ? "bound" : "unbound",
         ", hot cache ", hot_bound_ ? "bound" : "unbound", ")");
  }
  require_live_source();
}

void Runtime::require_live_source() const {
  if (source_bound_ && source_.pool != nullptr && source_.pool->released()) {
    fail(HS_ERROR_INVALID_STATE, is_leader() ? "host_cache" : "host_cache (of a follower)",
         ": the host pool the bound source cache lies in was released, so hisparse no longer reads or writes it; "
         "bind a cache in live memory (bind_source_cache) or unbind the runtime");
  }
}

void Runtime::check_binding_apart(const ByteRange& source, const ByteRange& view, const ByteRange& table) const {
  // Host caches are written by mirror_rows and read by the gathers, hot
  // views written by the gathers, block tables only read. Two runtimes may
  // read one host cache; nothing may write what another binding uses.
  const ByteRange state = group_->index_group().memory();
  for (const ByteRange* mine : {&source, &view, &table}) check_apart(*mine, false, state, true);
  check_apart(view, true, source, true);
  check_apart(table, false, source, true);
  check_apart(table, false, view, true);
  std::vector<const Runtime*> members(group_->followers().begin(), group_->followers().end());
  if (group_->leader() != nullptr) members.push_back(group_->leader());
  for (const Runtime* other : members) {
    if (other == this) continue;
    ByteRange other_source = other->source_bound_ ? other->source_.bytes : ByteRange{};
    ByteRange other_view = other->hot_bound_ ? other->hot_.view_bytes : ByteRange{};
    ByteRange other_table = other->hot_bound_ ? other->hot_.table_bytes : ByteRange{};
    other_source.name = "the source cache bound to another runtime of this index group";
    other_view.name = "the hot view bound to another runtime of this index group";
    other_table.name = "the hot block table bound to another runtime of this index group";
    check_apart(source, false, other_view, true);
    check_apart(view, true, other_source, false);
    check_apart(view, true, other_view, true);
    check_apart(view, true, other_table, false);
    check_apart(table, false, other_view, true);
  }
}

void Runtime::check_call_apart(const ByteRange* reads, size_t num_reads, const ByteRange* writes, size_t num_writes,
                               bool stages_followers) const {
  for (size_t i = 0; i < num_writes; ++i) {
    for (size_t j = i + 1; j < num_writes; ++j) check_apart(writes[i], true, writes[j], true);
    for (size_t j = 0; j < num_reads; ++j) check_apart(writes[i], true, reads[j], false);
  }
  // Memory the call's kernels write, and the caches they read.
  const ByteRange state = group_->index_group().memory();
  auto apart_from = [&](const ByteRange& bound, bool written) {
    for (size_t i = 0; i < num_writes; ++i) check_apart(writes[i], true, bound, written);
    for (size_t j = 0; j < num_reads; ++j) check_apart(reads[j], false, bound, written);
  };
  apart_from(state, true);
  ByteRange view = hot_.view_bytes;
  view.name = "the hot view bound to this runtime (raw_tensor)";
  apart_from(view, true);
  ByteRange source = source_.bytes;
  source.name = "the source cache bound to this runtime (host_cache)";
  apart_from(source, false);
  ByteRange table = hot_.table_bytes;
  table.name = "the hot block table bound to this runtime";
  apart_from(table, false);
  if (!stages_followers) return;
  for (const Runtime* f : group_->followers()) {
    ByteRange follower_view = f->hot_.view_bytes;
    follower_view.name = "the hot view bound to a follower of this runtime";
    apart_from(follower_view, true);
    ByteRange follower_source = f->source_.bytes;
    follower_source.name = "the source cache bound to a follower of this runtime";
    apart_from(follower_source, false);
  }
}

int64_t Runtime::token_rows(const hs_runtime_swap_in_args_t& a) const {
  if (a.num_tokens < 0) {
    invalid_argument("num_tokens: expected 0 (the rows of topk_indices) or more, got ", a.num_tokens);
  }
  if (a.topk_indices != nullptr && !is_leader()) {
    invalid_argument("topk_indices: a follower reuses its group leader's resolution of the step and reads no top-k; "
                     "pass num_tokens (the step's token rows) and no topk_indices");
  }
  if (a.topk_indices != nullptr) {
    const TensorArg topk(a.topk_indices, "topk_indices");
    topk.ndim_is(2);
    if (a.num_tokens != 0 && a.num_tokens != topk.size(0)) {
      invalid_argument("num_tokens: expected 0 or the rows of topk_indices (", topk.size(0), "), got ", a.num_tokens);
    }
    return topk.size(0);
  }
  if (is_leader()) invalid_argument("topk_indices: expected a tensor (the group leader resolves it), got NULL");
  if (a.num_tokens == 0) {
    invalid_argument("num_tokens: a follower called without topk_indices must give the token rows of the step, got 0");
  }
  return a.num_tokens;
}

ResolveResidencyParams Runtime::resolve_params(const hs_runtime_swap_in_args_t& a, int64_t first_row,
                                               PrepareTopkParams* prepare, bool* padded) const {
  IndexGroup& group = group_->index_group();
  const int64_t K = group.options().top_k;
  ResolveResidencyParams p;
  const TensorArg topk(a.topk_indices, "topk_indices");
  const TensorArg lengths(a.seq_lens, "seq_lens", true);
  topk.on(options_.device, "the index group").dtype_is(HS_DTYPE_INT32).row_major_2d();
  *padded = topk.size(1) != K || lengths.present();
  Device device;
  // The group's padded copy of rows [first_row, first_row + T): K columns.
  std::array<int64_t, 2> padded_shape{topk.size(0), K};
  const hs_tensor_t padded_topk{group_->padded_topk() + first_row * K,
                                HS_DTYPE_INT32,
                                options_.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU,
                                options_.device.index,
                                2,
                                padded_shape.data(),
                                nullptr};
  if (*padded) {
    if (topk.size(1) < 1 || topk.size(1) > K) {
      invalid_argument("topk_indices: expected 1 to top_k = ", K, " columns (narrower ones are padded), got shape ",
                       topk.shape_string());
    }
    device = group.resolve_topk(TensorArg(&padded_topk, "topk_indices"), &p);
  } else {
    device = group.resolve_topk(topk, &p);
  }
  group.fill_resolve_params(first_row, &p);
  const TensorArg req_ids(a.req_id_per_token, "req_id_per_token");
  const TensorArg state_indices(a.request_state_indices, "request_state_indices");
  resolve_batch_params(req_ids, state_indices, device, &p);
  if (*padded) {
    PrepareTopkParams& q = *prepare;
    q.device = device.index;
    q.topk = topk.data<int32_t>();
    q.topk_row_stride = topk.stride(0);
    q.width = static_cast<int32_t>(topk.size(1));
    q.out = const_cast<int32_t*>(p.topk_indices);
    q.out_row_stride = K;
    q.top_k = static_cast<int32_t>(K);
    q.num_tokens = p.num_tokens;
    q.req_id_per_token = p.req_id_per_token;
    q.num_batch_rows = p.num_batch_rows;
    if (lengths.present()) {
      lengths.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, "topk_indices");
      lengths.size_at_least(0, p.num_batch_rows, "one length per batch row of request_state_indices");
      q.seq_lens = lengths.data<int32_t>();
    }
  }
  // The bound hot view and host cache, checked at bind.
  p.hot_block_size = static_cast<int32_t>(hot_.block_size);
  p.attention_block_stride = hot_.attention_block_stride;
  p.host_rows = source_.rows;
  // The hint sized for the leader's rows (this runtime's, when it resolves).
  if (group_->residency_hint_rows() == source_.rows) p.residency_hint = group_->residency_hint();
  // The bound hot block table, checked at bind but for its rows: one per
  // batch row of this step.
  const TensorArg table(hot_.block_table.get(), "hot_block_table");
  table.size_at_least(0, p.num_batch_rows, "one row per batch row of request_state_indices");
  p.hot_block_table = table.data<int32_t>();
  p.hot_table_row_stride = table.stride(0);
  p.hot_table_width = static_cast<int32_t>(table.size(1));
  const TensorArg out_attention(a.out_attention, "out_attention", true);
  if (out_attention.present()) {
    p.out_attention = resolve_output_matrix(out_attention, device, p, &p.out_attention_row_stride);
  }
  const TensorArg out_valid_counts(a.out_valid_counts, "out_valid_counts", true);
  if (out_valid_counts.present()) p.out_valid_counts = resolve_output_vector(out_valid_counts, device, p);
  if (a.block_size < 0) {
    invalid_argument("block_size: expected 0 (the config's) or a positive count, got ", a.block_size);
  }
  if (a.resident_block_size < 0) {
    invalid_argument("resident_block_size: expected 0 (the hot block size) or a positive count, got ",
                     a.resident_block_size);
  }
  const TensorArg source_table(a.source_block_table, "source_block_table", true);
  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  const TensorArg valid_rows(a.num_valid_rows, "num_valid_rows", true);
  resolve_optional_params(source_table, a.block_size == 0 ? options_.config.block_size : a.block_size, resident_table,
                          a.resident_block_size == 0 ? hot_.block_size : a.resident_block_size, valid_rows, device, &p);
  const ByteRange reads[] = {topk.bytes(),           req_ids.bytes(),    state_indices.bytes(), source_table.bytes(),
                             resident_table.bytes(), valid_rows.bytes(), lengths.bytes()};
  const ByteRange writes[] = {out_attention.bytes(), out_valid_counts.bytes()};
  check_call_apart(reads, std::size(reads), writes, std::size(writes), a.prefetch != 0);
  // The resolve launch copies this layer's rows itself, with the gather
  // stage() would run.
  if (a.fused_gather != 0) resolve_fused_gather_params(gather_, &p);
  return p;
}

GatherCompactParams Runtime::gather_params(int64_t first_row, int64_t num_rows) const {
  const IndexGroup& group = group_->index_group();
  const int64_t K = group.options().top_k;
  GatherCompactParams g = gather_;
  g.swap_host_rows = group.data<int32_t>(HS_INDEX_GROUP_SWAP_HOST_ROWS) + first_row * K;
  g.swap_device_rows = group.data<int32_t>(HS_INDEX_GROUP_SWAP_DEVICE_ROWS) + first_row * K;
  g.swap_host_row_stride = K;
  g.swap_device_row_stride = K;
  g.swap_counts = group.data<int32_t>(HS_INDEX_GROUP_SWAP_COUNTS) + first_row;
  g.num_token_rows = static_cast<int32_t>(num_rows);
  g.top_k = static_cast<int32_t>(K);
  return g;
}

void Runtime::stage(int64_t first_row, int64_t num_rows) {
  if (num_rows > 0) backend_->gather_compact(gather_params(first_row, num_rows), group_->copy_stream());
  mark_staged(first_row, num_rows);
}

void Runtime::mark_staged(int64_t first_row, int64_t num_rows) {
  backend_->record_event(ready_event_, group_->copy_stream());
  staged_ = Staged{true, first_row, num_rows};
}

SwapInResult Runtime::swap_in(const hs_runtime_swap_in_args_t& a, hs_stream_t stream) {
  require_bound("swap_in");
  const int64_t num_rows = token_rows(a);
  const int64_t first_row = next_row_;
  const int64_t stop = first_row + num_rows;
  const int64_t capacity = options_.max_swap_rows;
  if (stop > capacity) {
    invalid_argument("hisparse swap rows exceed the configured speculative decode capacity: stop=", stop,
                     ", capacity=", capacity,
                     " (max_swap_rows bounds the token rows of all swap_in calls of one "
                     "forward; call begin_forward at the start of each forward)");
  }
  require_flag(a.prefetch, "prefetch");
  require_flag(a.fused_gather, "fused_gather");
  require_flag(a.group_gather, "group_gather");
  require_flag(a.ignore_topk_ready, "ignore_topk_ready");
  check_hot_layout_in_group(hot_.block_size, hot_.attention_block_stride);

  if (is_leader()) {
    // Everything that can be refused is refused before anything is enqueued.
    const std::vector<Runtime*>& followers = group_->followers();
    const bool prefetch = a.prefetch != 0;
    if (a.group_gather != 0 && !prefetch) {
      invalid_argument("group_gather: stages the followers of a prefetch batch, so it needs prefetch = 1; got "
                       "group_gather = 1 with prefetch = 0");
    }
    for (size_t i = 0; prefetch && i < followers.size(); ++i) {
      if (!followers[i]->source_bound_ || !followers[i]->hot_bound_) {
        fail(HS_ERROR_INVALID_STATE, "hisparse layer swap was not prefetched: follower ", i,
             " of the group is not bound (bind_source_cache and bind_hot_cache), so a prefetch batch cannot stage it");
      }
      followers[i]->require_live_source();
    }
    FollowerSpan span;
    if (a.group_gather != 0) {
      std::string why;
      if (!followers_span(&span, &why)) {
        invalid_argument("group_gather: the followers' host caches do not tile one token-major span (", why,
                         "); bind follower l to host[:, l] of one [slots, layers, W] view, or pass group_gather = 0");
      }
    }
    PrepareTopkParams prepare;
    bool padded = false;
    const ResolveResidencyParams resolution = resolve_params(a, first_row, &prepare, &padded);
    group_->copy_waits_for_topk(stream, a.ignore_topk_ready != 0);
    // A reader gathers rows the writer stores: the gathers below (the fused
    // one in the resolve, the leader's, the prefetched followers') wait for
    // the writer's most recent host write.
    copy_waits_for_host_writes();
    for (size_t i = 0; prefetch && i < followers.size(); ++i) followers[i]->copy_waits_for_host_writes();
    if (padded && resolution.num_tokens > 0) backend_->prepare_topk(prepare, group_->copy_stream());
    group_->index_group().resolve(resolution, group_->copy_stream());
    group_->set_resolved_rows(stop);
    if (a.fused_gather != 0) {
      mark_staged(first_row, num_rows);  // the resolve launch already copied this layer's rows
    } else {
      stage(first_row, num_rows);
    }
    // The leader staged alone first: its attention waits for its own rows
    // only. Then the followers: one gather each by default, so that each
    // follower's attention waits for its own bytes only; one group gather
    // when asked (more bytes per second, but every follower waits for all).
    if (a.group_gather != 0) {
      stage_followers_together(span, first_row, num_rows);
    } else if (prefetch) {
      for (Runtime* follower : followers) follower->stage(first_row, num_rows);
    }
  } else if (group_->leader() == nullptr) {
    fail(HS_ERROR_INVALID_STATE, "hisparse layer swap was not prefetched: the group leader was destroyed, so nothing "
                                 "resolves this follower's rows");
  } else if (stop > group_->resolved_rows()) {
    fail(HS_ERROR_INVALID_STATE, "hisparse layer swap was not prefetched: the group leader resolved ",
         group_->resolved_rows(), " token rows in this forward, this follower asks for rows [", first_row, ", ", stop,
         "); call swap_in on the leader first (and begin_forward on every runtime at the start of each forward)");
  }

  bool prefetched = false;
  if (staged_.active) {
    if (staged_.first_row != first_row || staged_.num_rows != num_rows) {
      fail(HS_ERROR_INVALID_STATE, "hisparse layer swap was not prefetched for these rows: the leader staged rows [",
           staged_.first_row, ", ", staged_.first_row + staged_.num_rows, ") of this layer, this call asks for [",
           first_row, ", ", stop, "); every runtime of a group must swap in the same token rows in the same order");
    }
    prefetched = !is_leader();
  } else {
    group_->copy_waits_for(stream);
    copy_waits_for_host_writes();
    stage(first_row, num_rows);
  }
  backend_->stream_wait_event(stream, ready_event_);
  staged_ = Staged{};
  next_row_ = stop;
  return SwapInResult{first_row, num_rows, prefetched};
}

void Runtime::reset_hot_state(hs_stream_t stream) {
  // The reset runs on the copy stream between both streams' earlier and later
  // work. Recording on the caller's stream first keeps it capturable: the
  // copy stream joins the capture before the caller's stream waits on it.
  group_->copy_waits_for(stream);
  group_->index_group().reset(group_->copy_stream());
  group_->rebuild_residency_hint(group_->residency_hint_rows());
  group_->stream_waits_for_copy(stream);
}

void Runtime::rebuild_residency_hint(hs_stream_t stream) {
  group_->copy_waits_for(stream);
  group_->rebuild_residency_hint(group_->residency_hint_rows());
  group_->stream_waits_for_copy(stream);
}

void Runtime::invalidate_sorted_slots(const hs_tensor_t* sorted_slots, const hs_tensor_t* state_indices,
                                      hs_stream_t stream) {
  group_->index_group().invalidate_sorted_slots(sorted_slots, state_indices, stream);
}

void Runtime::mirror_rows(const hs_tensor_t* src_rows, const hs_tensor_t* slot_mapping, hs_stream_t stream) {
  if (!source_bound_) {
    fail(HS_ERROR_INVALID_STATE, "mirror_rows: the runtime has no bound source cache to mirror into "
                                 "(call bind_source_cache first)");
  }
  require_live_source();
  if (!is_writer()) {
    fail(HS_ERROR_INVALID_STATE, "mirror_rows: this process reads the shared host pool and never writes it (its "
                                 "writer rank stores the rows); use write, which updates only this rank's device "
                                 "copies on a reader");
  }
  const TensorArg src(src_rows, "src_rows");
  src.on(options_.device, "the runtime");
  MirrorRowsParams p;
  const TensorArg slots(slot_mapping, "slot_mapping");
  mirror_source_params(src, slots, TensorArg(source_.cache.get(), "host_cache"), row_bytes(), options_.device, &p);
  ByteRange host = source_.bytes;
  host.name = "the source cache bound to this runtime (host_cache)";
  check_apart(src.bytes(), false, host, true);
  check_apart(slots.bytes(), false, host, true);
  // The destination is the bound host cache, checked at bind.
  const int64_t itemsize = static_cast<int64_t>(dtype_size(options_.kv_dtype));
  p.host = static_cast<uint8_t*>(source_.cache.raw().data);
  p.host_rows = source_.rows;
  p.host_pitch = source_.pitch * itemsize;
  if (p.count == 0) return;
  backend_->mirror_rows(p, stream);
  record_host_write(stream);
}

void Runtime::copy_stats_async(hs_stream_t stream) { group_->index_group().copy_stats_async(stream); }

RuntimeStats Runtime::stats() const {
  RuntimeStats s;
  s.counters = group_->index_group().read_stats();
  s.num_layers = group_->size();
  const int64_t hits = s.counters[HS_STAT_HITS];
  const int64_t misses = s.counters[HS_STAT_MISSES];
  s.hit_rate = hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0;
  s.group_row_bytes = group_->row_bytes();
  s.bytes_moved = static_cast<uint64_t>(std::max<int64_t>(misses, 0)) * s.group_row_bytes;
  return s;
}

void Runtime::reset_stats(hs_stream_t stream) {
  // On the copy stream, where resolves count, between both streams' earlier
  // and later work (as reset_hot_state).
  const hs_tensor_t& stats = group_->index_group().tensor(HS_INDEX_GROUP_STATS);
  group_->copy_waits_for(stream);
  backend_->fill_async(stats.data, 0, HS_NUM_STATS * sizeof(int64_t), group_->copy_stream());
  group_->stream_waits_for_copy(stream);
}

void Runtime::reset_request(int32_t state_row, hs_stream_t stream) {
  const IndexGroup& group = group_->index_group();
  const int32_t rows = group.options().max_num_reqs;
  if (state_row < 0 || state_row >= rows) {
    invalid_argument("state_row: expected 0 <= state_row < max_num_reqs = ", rows, ", got ", state_row);
  }
  ResetRequestParams p;
  p.device = options_.device.index;
  p.device_global_indices = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.lru_slots = group.data<int16_t>(HS_INDEX_GROUP_LRU_SLOTS);
  p.num_state_rows = rows;
  p.hot_size = group.options().device_buffer_size;
  p.state_row = state_row;
  p.residency_hint = group_->residency_hint();
  p.host_rows = group_->residency_hint_rows();
  group_->copy_waits_for(stream);
  backend_->reset_request(p, group_->copy_stream());
  group_->stream_waits_for_copy(stream);
}

void Runtime::write(const hs_runtime_write_args_t& a, hs_stream_t stream) {
  if (!source_bound_ || !hot_bound_) {
    fail(HS_ERROR_INVALID_STATE,
         "write: the runtime is not bound (write needs bind_source_cache and bind_hot_cache "
         "first; source cache ",
         source_bound_ ? "bound" : "unbound", ", hot cache ", hot_bound_ ? "bound" : "unbound", ")");
  }
  require_live_source();
  require_flag(a.skip_host_store, "skip_host_store");
  if (a.block_size < 0)
    invalid_argument("block_size: expected 0 (the config's) or a positive count, got ", a.block_size);
  WriteRowsParams p;
  const TensorArg rows(a.rows, "rows");
  const TensorArg req(a.req_id_per_token, "req_id_per_token");
  const TensorArg positions(a.positions, "positions");
  const TensorArg states(a.request_state_indices, "request_state_indices");
  write_rows_tokens(rows, req, positions, states, options_.kv_dtype, row_bytes(), options_.device, &p);
  const TensorArg source(a.source_block_table, "source_block_table", true);
  write_rows_source(source, a.block_size == 0 ? options_.config.block_size : a.block_size, source_.rows,
                    options_.device, &p);
  if (source_.rows == 0) p.host_rows = 0;
  const TensorArg resident(a.resident_cache, "resident_cache", true);
  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  write_rows_resident(resident, resident_table, options_.kv_dtype, options_.device, &p);
  // The bound caches and the group's state, checked at bind and creation.
  const bool store_host = a.skip_host_store == 0 && is_writer();
  const int64_t itemsize = static_cast<int64_t>(dtype_size(options_.kv_dtype));
  if (store_host) {
    p.host = static_cast<uint8_t*>(source_.cache.raw().data);
    p.host_pitch = source_.pitch * itemsize;
  }
  const IndexGroup& group = group_->index_group();
  p.device_global_indices = group.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.num_state_rows = group.options().max_num_reqs;
  p.hot_size = group.options().device_buffer_size;
  const TensorArg table(hot_.block_table.get(), "hot_block_table");
  table.size_at_least(0, p.num_batch_rows, "one row per batch row of request_state_indices");
  p.hot_block_table = table.data<int32_t>();
  p.hot_row_stride = table.stride(0);
  p.hot_width = static_cast<int32_t>(table.size(1));
  p.hot = static_cast<uint8_t*>(hot_.view.raw().data);
  p.hot_block_size = hot_.block_size;
  p.hot_block_stride = hot_.attention_block_stride;
  p.hot_span_rows = (hot_.num_blocks - 1) * hot_.attention_block_stride + hot_.block_size;
  // Written: the resident copy (the caller's), the bound host cache (when
  // stored) and hot view; read: the caller's other tensors, the hot block
  // table and the group's state (which hot slots hold which host slot).
  ByteRange host = source_.bytes, view = hot_.view_bytes, hot_table = hot_.table_bytes;
  host.name = "the source cache bound to this runtime (host_cache)";
  view.name = "the hot view bound to this runtime (raw_tensor)";
  hot_table.name = "the hot block table bound to this runtime";
  const bool one_view = destinations_in_one_view(p);
  AliasCheck aliases;
  if (!one_view) aliases.writes(resident);
  aliases.reads(rows).reads(req).reads(positions).reads(states).reads(source).reads(resident_table);
  aliases.writes(one_view ? wider(resident.bytes(), view) : view);
  if (store_host) aliases.writes(host);
  aliases.reads(hot_table).reads(group.memory()).check();
  if (p.num_tokens == 0) return;
  // The rows the leader prefetched for this layer in this forward land
  // before the write, which then rewrites any stale copy among them.
  if (staged_.active) backend_->stream_wait_event(stream, ready_event_);
  backend_->write_rows(p, stream);
  if (store_host) record_host_write(stream);
}

void Runtime::set_host_sharing(int32_t role, IpcEvent* event) {
  if (role != HS_HOST_ROLE_AUTO && role != HS_HOST_ROLE_WRITER && role != HS_HOST_ROLE_READER) {
    invalid_argument("role: expected HS_HOST_ROLE_AUTO (0), HS_HOST_ROLE_WRITER (1) or HS_HOST_ROLE_READER (2), got ",
                     role);
  }
  if (event != nullptr && event->device() != options_.device) {
    invalid_argument("event: expected an interprocess event on the runtime's device ", options_.device.describe(),
                     ", got one on ", event->device().describe());
  }
  host_role_ = role;
  if (event != host_event_) {
    if (event != nullptr) event->borrow();
    if (host_event_ != nullptr) host_event_->give_back();
    host_event_ = event;
  }
}

bool Runtime::is_writer() const {
  if (host_role_ == HS_HOST_ROLE_WRITER) return true;
  if (host_role_ == HS_HOST_ROLE_READER) return false;
  return !pool_reader_;
}

void Runtime::copy_waits_for_host_writes() const {
  if (host_event_ != nullptr && !is_writer()) host_event_->wait(group_->copy_stream());
}

void Runtime::record_host_write(hs_stream_t stream) const {
  if (host_event_ != nullptr && is_writer()) host_event_->record(stream);
}

}  // namespace hisparse
