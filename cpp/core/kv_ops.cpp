#include "core/kv_ops.hpp"

#include <algorithm>
#include <limits>

#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/checked_math.hpp"
#include "core/data_movement.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr size_t kRowAlignment = 16;

int32_t checked_int32(int64_t value, const char* name) {
  if (value > kInt32Max) invalid_argument(name, ": expected at most ", kInt32Max, ", got ", value);
  return static_cast<int32_t>(value);
}

const TensorArg& int_vector(const TensorArg& t, const Device& device, const char* reference) {
  t.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, reference);
  return t;
}

// An int32 table [>= rows, W] with unit column stride on `device`.
const int32_t* block_table(const TensorArg& t, int64_t rows, const Device& device, const char* reference,
                           int64_t* row_stride, int32_t* width) {
  t.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, reference);
  t.size_at_least(0, rows, "one row per batch row of request_state_indices");
  *width = checked_int32(t.size(1), t.name());
  *row_stride = *width > 0 ? t.stride(0) : 0;  // every row of an empty table is table_data()
  return t.table_data();
}

void same_dtype(const TensorArg& t, hs_dtype_t dtype, const char* reference) {
  if (dtype != HS_NUM_DTYPES && t.dtype() != dtype) {
    fail(HS_ERROR_INVALID_DTYPE, t.name(), ": expected dtype ", dtype_name(dtype), " (the dtype of ", reference,
         "), got ", dtype_name(t.dtype()));
  }
}

}  // namespace

PagedRows paged_rows(const TensorArg& t, const Device& device, const char* reference, bool allow_flat) {
  t.on(device, reference);
  if (t.ndim() != 3 && !(allow_flat && t.ndim() == 2)) {
    invalid_argument(t.name(), ": expected a paged view [blocks, block_size, row width]",
                     allow_flat ? " or rows [N, row width]" : "", ", got shape ", t.shape_string());
  }
  const int last = t.ndim() - 1;
  const int64_t width = t.size(last);
  PagedRows rows;
  rows.row_bytes = width * static_cast<int64_t>(dtype_size(t.dtype()));
  if (rows.row_bytes == 0 || rows.row_bytes % static_cast<int64_t>(kRowAlignment) != 0) {
    invalid_argument(t.name(), ": expected rows of a positive multiple of 16 bytes, got ", width, " x ",
                     dtype_name(t.dtype()), " = ", rows.row_bytes, " bytes (shape ", t.shape_string(), ")");
  }
  if (width > 1 && t.stride(last) != 1) {
    invalid_argument(t.name(), ": expected a unit stride in the last (row) dimension, got ", t.stride(last));
  }
  const int row_dim = last - 1;
  if (t.size(row_dim) > 1 && t.stride(row_dim) != width) {
    invalid_argument(t.name(), ": expected rows contiguous within a block (stride ", width, " in dimension ", row_dim,
                     "), got stride ", t.stride(row_dim), " (shape ", t.shape_string(), ")");
  }
  rows.block_size = t.ndim() == 3 ? t.size(1) : std::max<int64_t>(t.size(0), 1);
  rows.block_stride = rows.block_size;
  if (t.ndim() == 3 && t.size(0) > 1) {
    if (t.stride(0) % width != 0 || t.stride(0) < t.size(1) * width) {
      invalid_argument(t.name(),
                       ": expected a block stride of whole rows, at least block_size x row width = ", t.size(1) * width,
                       " elements, got ", t.stride(0), " (shape ", t.shape_string(), ")");
    }
    rows.block_stride = t.stride(0) / width;
  }
  if (t.numel() > 0) {
    const int64_t blocks = t.ndim() == 3 ? t.size(0) : 1;
    rows.span_rows = checked_add(checked_mul(blocks - 1, rows.block_stride, t.name()), rows.block_size, t.name());
    t.aligned(kRowAlignment);
  }
  rows.base = t.data<uint8_t>();
  backend_for(device, t.name())
      .check_accessible(rows.base, static_cast<size_t>(checked_mul(rows.span_rows, rows.row_bytes, t.name())),
                        device.index, t.name());
  return rows;
}

void write_rows_tokens(const TensorArg& rows, const TensorArg& req, const TensorArg& positions, const TensorArg& states,
                       hs_dtype_t dtype, int64_t row_bytes, const Device& device, WriteRowsParams* params) {
  WriteRowsParams& p = *params;
  rows.on(device, "the writer").ndim_is(2);
  same_dtype(rows, dtype, "the cache");
  const Rows src = rows_of(rows);
  if (row_bytes > 0 && src.row_bytes != row_bytes) {
    invalid_argument("rows: expected rows of ", row_bytes, " bytes (the cache's row width), got ", src.row_bytes,
                     " bytes (shape ", rows.shape_string(), ")");
  }
  p.device = device.index;
  p.src = src.base;
  p.src_pitch = src.pitch;
  p.row_bytes = src.row_bytes;
  p.num_tokens = checked_int32(src.count, "rows");
  int_vector(req, device, "rows").size_at_least(0, p.num_tokens, "one batch row per row of rows");
  p.req_id_per_token = req.data<int32_t>();
  positions.ndim_is(1).unit_stride(0).on(device, "rows");
  if (positions.dtype() != HS_DTYPE_INT32 && positions.dtype() != HS_DTYPE_INT64) {
    fail(HS_ERROR_INVALID_DTYPE, "positions: expected dtype int32 or int64, got ", dtype_name(positions.dtype()));
  }
  positions.size_at_least(0, p.num_tokens, "one position per row of rows");
  p.positions = positions.data<void>();
  p.positions_int64 = positions.dtype() == HS_DTYPE_INT64;
  int_vector(states, device, "rows");
  p.request_state_indices = states.data<int32_t>();
  p.num_batch_rows = checked_int32(states.size(0), "request_state_indices");
}

void write_rows_source(const TensorArg& table, int64_t block_size, int64_t host_rows, const Device& device,
                       WriteRowsParams* params) {
  WriteRowsParams& p = *params;
  if (host_rows < 0) invalid_argument("host_rows: expected 0 (no limit) or a positive slot count, got ", host_rows);
  p.host_rows = host_rows == 0 ? std::numeric_limits<int64_t>::max() : host_rows;
  if (!table.present()) return;
  if (block_size < 1) {
    invalid_argument("block_size: expected a positive number of tokens per source block, got ", block_size);
  }
  p.source_block_table = block_table(table, p.num_batch_rows, device, "rows", &p.source_row_stride, &p.source_width);
  p.block_size = block_size;
}

void write_rows_resident(const TensorArg& cache, const TensorArg& table, hs_dtype_t dtype, const Device& device,
                         WriteRowsParams* params) {
  WriteRowsParams& p = *params;
  if (cache.present() != table.present()) {
    invalid_argument(cache.present() ? table.name() : cache.name(), ": expected a tensor with ",
                     cache.present() ? cache.name() : table.name(), " (the resident copy needs both), got NULL");
  }
  if (!cache.present()) return;
  same_dtype(cache, dtype, "rows");
  const PagedRows resident = paged_rows(cache, device, "rows", false);
  if (resident.row_bytes != p.row_bytes) {
    invalid_argument(cache.name(), ": expected rows of ", p.row_bytes, " bytes (the rows written), got ",
                     resident.row_bytes, " bytes (shape ", cache.shape_string(), ")");
  }
  p.resident = resident.base;
  p.resident_block_size = resident.block_size;
  p.resident_block_stride = resident.block_stride;
  p.resident_span_rows = resident.span_rows;
  p.resident_block_table =
      block_table(table, p.num_batch_rows, device, "rows", &p.resident_row_stride, &p.resident_width);
}

bool destinations_in_one_view(const WriteRowsParams& p) {
  return p.resident != nullptr && p.resident == p.hot && p.resident_block_size == p.hot_block_size &&
         p.resident_block_stride == p.hot_block_stride;
}

const ByteRange& wider(const ByteRange& a, const ByteRange& b) { return a.end - a.begin >= b.end - b.begin ? a : b; }

WriteRowsParams write_rows_params(const hs_write_rows_args_t& a, Device* device_out) {
  WriteRowsParams p;
  const TensorArg rows(a.rows, "rows");
  const Device device = rows.device();
  *device_out = device;
  const TensorArg req(a.req_id_per_token, "req_id_per_token");
  const TensorArg positions(a.positions, "positions");
  const TensorArg states(a.request_state_indices, "request_state_indices");
  write_rows_tokens(rows, req, positions, states, HS_NUM_DTYPES, 0, device, &p);
  const TensorArg host(a.host_cache, "host_cache", true);
  int64_t host_rows = a.host_rows;
  if (host.present()) {
    if (host.device().is_cuda() && host.device() != device) host.on(device, "rows");
    same_dtype(host, rows.dtype(), "rows");
    const Rows slots = rows_of(host);
    if (slots.row_bytes != p.row_bytes) {
      invalid_argument("host_cache: expected rows of ", p.row_bytes, " bytes (the rows written), got ", slots.row_bytes,
                       " bytes (shape ", host.shape_string(), ")");
    }
    if (host_rows != 0 && host_rows != slots.count) {
      invalid_argument("host_rows: expected 0 or the rows of host_cache (", slots.count, "), got ", host_rows);
    }
    host_rows = slots.count;
    backend_for(device, "host_cache")
        .check_accessible(slots.base, static_cast<size_t>(slots.extent), device.index, "host_cache");
    p.host = slots.base;
    p.host_pitch = slots.pitch;
  }
  const TensorArg source(a.source_block_table, "source_block_table", true);
  write_rows_source(source, a.block_size, host_rows, device, &p);
  if (host.present() && host_rows == 0) p.host_rows = 0;  // an empty host cache holds no slot
  const TensorArg resident(a.resident_cache, "resident_cache", true);
  const TensorArg resident_table(a.resident_block_table, "resident_block_table", true);
  write_rows_resident(resident, resident_table, rows.dtype(), device, &p);

  const TensorArg hot(a.hot_cache, "hot_cache", true);
  const TensorArg hot_table(a.hot_block_table, "hot_block_table", true);
  const TensorArg dgi(a.device_global_indices, "device_global_indices", true);
  if (hot.present() || hot_table.present() || dgi.present()) {
    for (const TensorArg* t : {&hot, &hot_table, &dgi}) {
      if (!t->present()) {
        invalid_argument(t->name(), ": expected a tensor (hot copies need hot_cache, hot_block_table and "
                                    "device_global_indices), got NULL");
      }
    }
    same_dtype(hot, rows.dtype(), "rows");
    const PagedRows view = paged_rows(hot, device, "rows", false);
    if (view.row_bytes != p.row_bytes) {
      invalid_argument("hot_cache: expected rows of ", p.row_bytes, " bytes (the rows written), got ", view.row_bytes,
                       " bytes (shape ", hot.shape_string(), ")");
    }
    dgi.dtype_is(HS_DTYPE_INT32).ndim_is(2).contiguous().on(device, "rows");
    p.device_global_indices = dgi.data<int32_t>();
    p.num_state_rows = checked_int32(dgi.size(0), "device_global_indices rows");
    p.hot_size = checked_int32(dgi.size(1), "device_global_indices columns");
    p.hot = view.base;
    p.hot_block_size = view.block_size;
    p.hot_block_stride = view.block_stride;
    p.hot_span_rows = view.span_rows;
    p.hot_block_table = block_table(hot_table, p.num_batch_rows, device, "rows", &p.hot_row_stride, &p.hot_width);
  }
  // The three caches are written, everything else is read.
  AliasCheck aliases;
  if (destinations_in_one_view(p)) {
    aliases.writes(wider(resident.bytes(), hot.bytes()));
  } else {
    aliases.writes(resident).writes(hot);
  }
  aliases.writes(host)
      .reads(rows)
      .reads(req)
      .reads(positions)
      .reads(states)
      .reads(source)
      .reads(resident_table)
      .reads(hot_table)
      .reads(dgi)
      .check();
  return p;
}

void read_rows_args(const PagedRows& cache, hs_dtype_t dtype, const TensorArg& indices, const TensorArg& out,
                    const Device& device, ReadRowsParams* params) {
  ReadRowsParams& p = *params;
  indices.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "cache");
  out.on(device, "cache").ndim_is(3).contiguous();
  same_dtype(out, dtype, "cache");
  out.size_is(0, indices.size(0), "the rows of indices");
  out.size_is(1, indices.size(1), "the columns of indices");
  const int64_t out_row_bytes = out.size(2) * static_cast<int64_t>(dtype_size(out.dtype()));
  if (out_row_bytes != cache.row_bytes) {
    invalid_argument("out: expected rows of ", cache.row_bytes, " bytes (the rows of cache), got ", out_row_bytes,
                     " bytes (shape ", out.shape_string(), ")");
  }
  if (out.numel() > 0) out.aligned(kRowAlignment);
  p.device = device.index;
  p.cache = cache.base;
  p.span_rows = cache.span_rows;
  p.row_bytes = cache.row_bytes;
  p.indices = indices.data<int32_t>();
  p.index_row_stride = indices.stride(0);
  p.num_rows = checked_int32(indices.size(0), "indices rows");
  p.width = checked_int32(indices.size(1), "indices columns");
  p.out = out.data<uint8_t>();
}

ReadRowsParams read_rows_params(const hs_tensor_t* cache_t, const hs_tensor_t* indices_t, const hs_tensor_t* out_t,
                                Device* device_out) {
  const TensorArg cache(cache_t, "cache");
  const Device device = cache.device();
  *device_out = device;
  ReadRowsParams p;
  const TensorArg indices(indices_t, "indices");
  const TensorArg out(out_t, "out");
  read_rows_args(paged_rows(cache, device, "cache", true), cache.dtype(), indices, out, device, &p);
  AliasCheck().writes(out).reads(cache).reads(indices).check();
  return p;
}

ResidencyParams residency_params(const hs_update_residency_args_t& a, Device* device_out) {
  ResidencyParams p;
  const TensorArg table(a.resident_block_table, "resident_block_table");
  const Device device = table.device();
  *device_out = device;
  table.dtype_is(HS_DTYPE_INT32).row_major_2d();
  if (a.table_block_size < 1) {
    invalid_argument("table_block_size: expected a positive number of positions per table entry, got ",
                     a.table_block_size);
  }
  if (a.blocks_per_page < 1) {
    invalid_argument("blocks_per_page: expected a positive number of table entries per page, got ", a.blocks_per_page);
  }
  if (a.num_pages < 0) invalid_argument("num_pages: expected a non-negative page count, got ", a.num_pages);
  checked_mul(a.table_block_size, a.blocks_per_page, "page size (table_block_size x blocks_per_page)");
  const TensorArg states(a.request_state_indices, "request_state_indices");
  int_vector(states, device, "resident_block_table");
  table.size_at_least(0, states.size(0), "one row per batch row of request_state_indices");
  const TensorArg lengths(a.seq_lens, "seq_lens");
  int_vector(lengths, device, "resident_block_table").size_at_least(0, states.size(0), "one length per batch row");
  const TensorArg blocks(a.resident_blocks, "resident_blocks");
  blocks.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "resident_block_table");
  const int64_t ring = static_cast<int64_t>(a.num_pages) * a.blocks_per_page;
  blocks.size_at_least(1, ring, "num_pages x blocks_per_page resident blocks per state row");
  p.device = device.index;
  p.table = table.data<int32_t>();
  p.table_row_stride = table.stride(0);
  p.table_width = checked_int32(table.size(1), "resident_block_table columns");
  p.table_block_size = a.table_block_size;
  p.blocks_per_page = a.blocks_per_page;
  p.num_pages = a.num_pages;
  p.num_batch_rows = checked_int32(states.size(0), "request_state_indices");
  p.request_state_indices = states.data<int32_t>();
  p.seq_lens = lengths.data<int32_t>();
  p.resident_blocks = blocks.data<int32_t>();
  p.resident_blocks_row_stride = blocks.stride(0);
  p.num_state_rows = checked_int32(blocks.size(0), "resident_blocks rows");
  const TensorArg ring_pages(a.ring_pages, "ring_pages", true);
  if (ring_pages.present()) {
    ring_pages.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, "resident_block_table");
    ring_pages.size_at_least(0, blocks.size(0), "one row per state row of resident_blocks");
    ring_pages.size_at_least(1, a.num_pages, "num_pages ring slots per state row");
    p.ring_pages = ring_pages.data<int32_t>();
    p.ring_pages_row_stride = ring_pages.stride(0);
  }
  AliasCheck().writes(table).writes(ring_pages).reads(states).reads(lengths).reads(blocks).check();
  return p;
}

}  // namespace hisparse
