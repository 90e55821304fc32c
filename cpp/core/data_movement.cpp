#include "core/data_movement.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/process_memory.hpp"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr size_t kRowAlignment = 16;

// Bytes of one row of `t` (its last dimension: unit stride, a positive
// multiple of 16 bytes, at least 2 dimensions).
int64_t row_bytes_of(const TensorArg& t) {
  if (t.ndim() < 2) {
    invalid_argument(t.name(), ": expected a tensor of rows [..., row width] with at least 2 dimensions, got shape ",
                     t.shape_string());
  }
  const int last = t.ndim() - 1;
  const int64_t row_bytes = t.size(last) * static_cast<int64_t>(dtype_size(t.dtype()));
  if (row_bytes == 0 || row_bytes % static_cast<int64_t>(kRowAlignment) != 0) {
    invalid_argument(t.name(), ": expected rows of a positive multiple of 16 bytes, got ", t.size(last), " x ",
                     dtype_name(t.dtype()), " = ", row_bytes, " bytes (shape ", t.shape_string(), ")");
  }
  if (t.size(last) > 1 && t.stride(last) != 1) {
    invalid_argument(t.name(), ": expected a unit stride in the last (row) dimension, got ", t.stride(last));
  }
  return row_bytes;
}

void same_rows(const TensorArg& t, const TensorArg& reference, int64_t row_bytes, int64_t reference_row_bytes) {
  if (t.dtype() != reference.dtype()) {
    fail(HS_ERROR_INVALID_DTYPE, t.name(), ": expected dtype ", dtype_name(reference.dtype()), " (the dtype of ",
         reference.name(), "), got ", dtype_name(t.dtype()));
  }
  if (row_bytes != reference_row_bytes) {
    invalid_argument(t.name(), ": expected rows of ", reference_row_bytes, " bytes (the row width of ",
                     reference.name(), ", shape ", reference.shape_string(), "), got ", row_bytes, " bytes (shape ",
                     t.shape_string(), ")");
  }
}

// A source of rows read by the kernel on `device`: host memory (registered
// on CUDA) or memory of that very device.
void check_source_device(const TensorArg& t, const Device& device, const char* reference) {
  if (t.device().is_cuda() || !device.is_cuda()) t.on(device, reference);
}

int32_t checked_int32(int64_t value, const char* name) {
  if (value > kInt32Max) invalid_argument(name, ": expected at most ", kInt32Max, ", got ", value);
  return static_cast<int32_t>(value);
}

const TensorArg& int_vector(const TensorArg& t, const Device& device, const char* reference) {
  t.dtype_is(HS_DTYPE_INT32).ndim_is(1).unit_stride(0).on(device, reference);
  return t;
}

int32_t resolve_variant(int32_t variant) {
  if (variant < 0 || variant >= HS_NUM_GATHER_VARIANTS) {
    std::string names;
    for (int32_t v = 0; v < HS_NUM_GATHER_VARIANTS; ++v) names += str(v == 0 ? "" : ", ", gather_variant_name(v));
    invalid_argument("variant: expected 0 to ", HS_NUM_GATHER_VARIANTS - 1, " (", names, "), got ", variant);
  }
  return variant == HS_GATHER_AUTO ? gather_default_variant() : variant;
}

// The swap list of a gather (shared by gather_compact and its group form).
void swap_list_params(const hs_tensor_t* swap_host_rows, const hs_tensor_t* swap_device_rows,
                      const hs_tensor_t* swap_counts, const Device& device, const char* reference,
                      GatherCompactParams* params, AliasCheck* aliases) {
  GatherCompactParams& p = *params;
  const TensorArg swap_host(swap_host_rows, "swap_host_rows");
  swap_host.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, reference);
  const TensorArg swap_device(swap_device_rows, "swap_device_rows");
  swap_device.dtype_is(HS_DTYPE_INT32).row_major_2d().on(device, reference);
  swap_device.size_is(0, swap_host.size(0), "the token rows of swap_host_rows");
  swap_device.size_is(1, swap_host.size(1), "the columns of swap_host_rows");
  const TensorArg counts(swap_counts, "swap_counts");
  int_vector(counts, device, reference).size_at_least(0, swap_host.size(0), "one count per row of swap_host_rows");
  aliases->reads(swap_host).reads(swap_device).reads(counts);
  p.swap_host_rows = swap_host.data<int32_t>();
  p.swap_device_rows = swap_device.data<int32_t>();
  p.swap_host_row_stride = swap_host.stride(0);
  p.swap_device_row_stride = swap_device.stride(0);
  p.swap_counts = counts.data<int32_t>();
  p.num_token_rows = checked_int32(swap_host.size(0), "swap_host_rows rows");
  p.top_k = checked_int32(swap_host.size(1), "swap_host_rows columns");
}

int32_t checked_max_blocks(int32_t max_blocks) {
  if (max_blocks < 0) invalid_argument("max_blocks: expected 0 (automatic) or a positive count, got ", max_blocks);
  return max_blocks;
}

// host_cache [..., P, W] seen as its piece 0: [..., W] at the slot pitch.
struct FirstPieceView {
  std::array<int64_t, HS_MAX_DIMS> shape{};
  std::array<int64_t, HS_MAX_DIMS> strides{};
  hs_tensor_t tensor{};
};

// An int32 index tensor of exactly `count` elements, contiguous, on `device`.
const int32_t* index_list(const TensorArg& t, int64_t count, const Device& device, const char* reference) {
  t.dtype_is(HS_DTYPE_INT32).contiguous().on(device, reference);
  if (t.numel() != count) {
    invalid_argument(t.name(), ": expected ", count, " elements (as row_ids), got shape ", t.shape_string());
  }
  return t.data<int32_t>();
}

// The CPU backend dereferences the addresses of swap_blocks_batch on the
// host, so every used entry is checked first: host memory mapped with the
// access its copy needs (never CUDA device memory), destinations apart from
// each other, from every source and from the address arrays themselves.
// No process maps memory at or past this address (57-bit virtual addresses,
// the most x86-64 and AArch64 give user space).
constexpr uint64_t kUserAddressEnd = uint64_t{1} << 57;

void check_host_copies(const SwapBlocksParams& p, const TensorArg& src, const TensorArg& dst, const TensorArg& sizes) {
  struct Piece {
    uintptr_t begin;
    uintptr_t end;
    int64_t entry;
    bool written;
  };
  std::vector<Piece> pieces;
  pieces.reserve(static_cast<size_t>(2 * p.count + 3));
  for (const TensorArg* array : {&src, &dst, &sizes}) {
    const ByteRange range = array->bytes();
    if (!range.empty()) pieces.push_back(Piece{range.begin, range.end, -1, false});
  }
  Backend* cuda = cuda_backend();
  const ProcessMemoryMap memory;
  for (int64_t i = 0; i < p.count; ++i) {
    if (p.sizes[i] <= 0 || p.src[i] == 0 || p.dst[i] == 0) continue;
    for (const auto& [name, address, written] :
         {std::tuple<const char*, int64_t, bool>{"src", p.src[i], false}, {"dst", p.dst[i], true}}) {
      const auto begin = static_cast<uintptr_t>(address);
      const auto bytes = static_cast<uint64_t>(p.sizes[i]);
      // The size's fault when the range starts in the address space (an
      // address past it is the address's fault, below).
      if (bytes > kUserAddressEnd || (begin < kUserAddressEnd && begin > kUserAddressEnd - bytes)) {
        invalid_argument("sizes: entry ", i, " (", bytes, " bytes from ", name, " address ", address,
                         ") runs past the end of a process's address space");
      }
      const auto* first = reinterpret_cast<const uint8_t*>(begin);
      if (cuda != nullptr && (cuda->is_device_memory(first) || cuda->is_device_memory(first + bytes - 1))) {
        invalid_argument(name, ": entry ", i,
                         " points to CUDA device memory, but the address arrays are host "
                         "tensors, which run the CPU backend; put src, dst and sizes on the CUDA device");
      }
      if (!memory.covers(begin, bytes, written)) {
        invalid_argument(name, ": entry ", i, " (address ", address, ", ", bytes, " bytes) is not host memory mapped ",
                         written ? "writable" : "readable", " in this process");
      }
      pieces.push_back(Piece{begin, begin + bytes, i, written});
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  // In address order, a range overlaps an earlier one exactly when it starts
  // before the furthest end so far: compare with the furthest reaching range
  // of all (for a destination) and of the destinations (for a source).
  const auto describe = [](const Piece& piece) {
    return piece.entry < 0 ? std::string("the address arrays")
                           : str(piece.written ? "dst" : "src", " entry ", piece.entry);
  };
  const Piece* furthest = nullptr;
  const Piece* furthest_written = nullptr;
  for (const Piece& piece : pieces) {
    const Piece* earlier = piece.written ? furthest : furthest_written;
    if (earlier != nullptr && piece.begin < earlier->end) {
      invalid_argument(piece.written ? "dst" : "src", ": ", describe(piece), " overlaps ", describe(*earlier),
                       " (a copy must not write bytes another copy of the batch reads or writes)");
    }
    if (furthest == nullptr || piece.end > furthest->end) furthest = &piece;
    if (piece.written && (furthest_written == nullptr || piece.end > furthest_written->end)) {
      furthest_written = &piece;
    }
  }
}

}  // namespace

Rows rows_of(const TensorArg& t) {
  const int last = t.ndim() - 1;
  const int64_t itemsize = static_cast<int64_t>(dtype_size(t.dtype()));
  Rows rows;
  rows.row_bytes = row_bytes_of(t);
  rows.count = 1;
  int64_t pitch = -1;     // elements
  int64_t expected = -1;  // stride the next outer dimension must have
  for (int d = last - 1; d >= 0; --d) {
    rows.count *= t.size(d);
    if (t.size(d) == 1) continue;
    if (expected < 0) {
      pitch = t.stride(d);
      if (pitch < t.size(last)) {
        invalid_argument(t.name(), ": expected a row stride of at least the row width ", t.size(last),
                         " elements, got ", pitch, " (shape ", t.shape_string(), ")");
      }
      expected = pitch * t.size(d);
    } else {
      if (t.stride(d) != expected) {
        invalid_argument(t.name(), ": expected rows at one uniform pitch (stride ", expected, " in dimension ", d,
                         "), got stride ", t.stride(d), " (shape ", t.shape_string(),
                         "); pass a view whose leading dimensions flatten");
      }
      expected *= t.size(d);
    }
  }
  rows.pitch = (pitch < 0 ? t.size(last) : pitch) * itemsize;
  if (rows.pitch % static_cast<int64_t>(kRowAlignment) != 0) {
    invalid_argument(t.name(), ": expected a row pitch that is a multiple of 16 bytes, got ", rows.pitch, " bytes");
  }
  if (rows.count > 0) {
    t.aligned(kRowAlignment);
    rows.extent = (rows.count - 1) * rows.pitch + rows.row_bytes;
  }
  rows.base = t.data<uint8_t>();
  return rows;
}

Device gather_cache_params(const TensorArg& host, const TensorArg& hot, int64_t hot_block_size,
                           int64_t hot_block_stride, const char* stride_name, GatherCompactParams* params) {
  GatherCompactParams& p = *params;
  const Device device = hot.device();
  const Rows host_rows = rows_of(host);
  same_rows(hot, host, row_bytes_of(hot), host_rows.row_bytes);
  check_source_device(host, device, hot.name());

  p.device = device.index;
  p.row_bytes = host_rows.row_bytes;
  p.host = host_rows.base;
  p.host_rows = host_rows.count;
  p.host_pitch = host_rows.pitch;

  if (hot_block_size < 1 || hot_block_size > kInt32Max) {
    invalid_argument("hot_block_size: expected a positive number of rows per hot block, at most ", kInt32Max, ", got ",
                     hot_block_size);
  }
  const int64_t stride = hot_block_stride == 0 ? hot_block_size : hot_block_stride;
  // Hot rows are int32 and addressed as attention indices are: a stride
  // past INT32_MAX reaches no row an int32 attention index can name, and
  // below it no row's offset, block x stride + row % block, leaves int64.
  if (stride < hot_block_size || stride > kInt32Max) {
    invalid_argument(stride_name, ": expected 0 (= hot_block_size) or at least hot_block_size (", hot_block_size,
                     ") and at most ", kInt32Max, " rows, got ", hot_block_stride);
  }
  p.hot_block_size = hot_block_size;
  p.hot_block_stride = stride;
  // Hot rows are contiguous within a block: the attention kernel addresses
  // them as block base + offset rows of exactly row_bytes.
  const int row_dim = hot.ndim() - 2;
  const int64_t width = hot.size(hot.ndim() - 1);
  if (hot.size(row_dim) > 1 && hot.stride(row_dim) != width) {
    invalid_argument(hot.name(), ": expected rows contiguous within a block (stride ", width, " in dimension ", row_dim,
                     "), got stride ", hot.stride(row_dim), " (shape ", hot.shape_string(), ")");
  }
  int64_t span_elements = 0;
  if (hot.numel() > 0) {
    span_elements = width;
    for (int d = 0; d < hot.ndim() - 1; ++d) {
      if (hot.size(d) > 1 && hot.stride(d) <= 0) {
        invalid_argument(hot.name(), ": expected positive strides, got stride ", hot.stride(d), " in dimension ", d);
      }
      span_elements += (hot.size(d) - 1) * hot.stride(d);
    }
  }
  if (hot.ndim() == 3) {
    hot.size_is(1, hot_block_size, "hot_block_size rows per block");
    if (hot.size(0) > 1 && hot.stride(0) != stride * width) {
      invalid_argument(hot.name(), ": expected a block stride of ", stride_name, " x row width = ", stride * width,
                       " elements, got ", hot.stride(0), " (shape ", hot.shape_string(), ")");
    }
  }
  const int64_t span_bytes = span_elements * static_cast<int64_t>(dtype_size(hot.dtype()));
  p.hot = hot.data<uint8_t>();
  p.hot_span_rows = span_bytes / p.row_bytes;
  if (span_bytes > 0) hot.aligned(kRowAlignment);

  Backend& backend = backend_for(device, hot.name());
  backend.check_accessible(host_rows.base, static_cast<size_t>(host_rows.extent), device.index, host.name());
  backend.check_accessible(p.hot, static_cast<size_t>(span_bytes), device.index, hot.name());
  return device;
}

const char* gather_variant_name(int32_t variant) {
  switch (variant) {
    case HS_GATHER_AUTO: return "auto";
    case HS_GATHER_WARP_PER_ROW: return "warp_per_row";
    case HS_GATHER_SORTED: return "sorted";
    case HS_GATHER_ROW_PERSISTENT: return "row_persistent";
    default: return "unknown";
  }
}

// One warp per row on one block per SM: it holds up for rows local to each
// request (the decode case) without a sorting pass or shared memory (see
// hs_gather_variant_t; docs/performance.md has the measurements).
int32_t gather_default_variant() { return HS_GATHER_ROW_PERSISTENT; }

GatherCompactParams gather_compact_params(const hs_gather_compact_args_t& a, Device* device_out) {
  GatherCompactParams p;
  const TensorArg host(a.host_cache, "host_cache");
  const TensorArg hot(a.hot_cache, "hot_cache");
  const Device device = gather_cache_params(host, hot, a.hot_block_size, a.hot_block_stride, "hot_block_stride", &p);
  *device_out = device;
  AliasCheck aliases;
  aliases.writes(hot).reads(host);
  swap_list_params(a.swap_host_rows, a.swap_device_rows, a.swap_counts, device, "hot_cache", &p, &aliases);
  p.variant = resolve_variant(a.variant);
  p.max_blocks = checked_max_blocks(a.max_blocks);
  aliases.check();
  return p;
}

GatherCompactParams gather_compact_group_params(const hs_gather_compact_group_args_t& a, Device* device_out) {
  const int32_t pieces = a.num_hot_caches;
  if (pieces < 1 || pieces > HS_MAX_GATHER_GROUP_PIECES) {
    invalid_argument("num_hot_caches: expected 1 to ", HS_MAX_GATHER_GROUP_PIECES, " hot caches (one per piece), got ",
                     pieces);
  }
  if (a.hot_caches == nullptr) invalid_argument("hot_caches: expected a non-NULL pointer");
  const TensorArg host(a.host_cache, "host_cache");
  if (host.ndim() < 3) {
    invalid_argument("host_cache: expected [..., P, W] (slots of P = num_hot_caches rows side by side) with at least "
                     "3 dimensions, got shape ",
                     host.shape_string());
  }
  const int piece_dim = host.ndim() - 2;
  host.size_is(piece_dim, pieces, "num_hot_caches pieces per slot");
  const int64_t width = host.size(host.ndim() - 1);
  if (pieces > 1 && host.stride(piece_dim) != width) {
    invalid_argument("host_cache: expected the ", pieces, " pieces of a slot back to back (stride ", width,
                     " in dimension ", piece_dim, "), got stride ", host.stride(piece_dim), " (shape ",
                     host.shape_string(), ")");
  }
  FirstPieceView first;
  for (int d = 0; d < piece_dim; ++d) {
    first.shape[d] = host.size(d);
    first.strides[d] = host.stride(d);
  }
  first.shape[piece_dim] = width;
  first.strides[piece_dim] = 1;
  first.tensor = host.raw();
  first.tensor.ndim = host.ndim() - 1;
  first.tensor.shape = first.shape.data();
  first.tensor.strides = first.strides.data();

  GatherCompactParams p;
  // Argument names as literals: validation on the decode path allocates nothing.
  static constexpr const char* kNames[HS_MAX_GATHER_GROUP_PIECES] = {
      "hot_caches[0]",  "hot_caches[1]",  "hot_caches[2]",  "hot_caches[3]", "hot_caches[4]",  "hot_caches[5]",
      "hot_caches[6]",  "hot_caches[7]",  "hot_caches[8]",  "hot_caches[9]", "hot_caches[10]", "hot_caches[11]",
      "hot_caches[12]", "hot_caches[13]", "hot_caches[14]", "hot_caches[15]"};
  static_assert(HS_MAX_GATHER_GROUP_PIECES == 16, "one name per piece");
  const TensorArg first_hot(a.hot_caches[0], kNames[0]);
  const Device device = gather_cache_params(TensorArg(&first.tensor, "host_cache"), first_hot, a.hot_block_size,
                                            a.hot_block_stride, "hot_block_stride", &p);
  *device_out = device;
  AliasCheck aliases;
  aliases.reads(host).writes(first_hot);
  p.pieces = pieces;
  p.piece_hot[0] = p.hot;
  for (int32_t i = 1; i < pieces; ++i) {
    const TensorArg hot(a.hot_caches[i], kNames[i]);
    aliases.writes(hot);
    hot.on(device, kNames[0]);
    // dtype and row width first, with gather_compact's errors; then the layout.
    GatherCompactParams piece;
    gather_cache_params(TensorArg(&first.tensor, "host_cache"), hot, a.hot_block_size, a.hot_block_stride,
                        "hot_block_stride", &piece);
    bool same_layout = hot.ndim() == first_hot.ndim();
    for (int d = 0; same_layout && d < hot.ndim(); ++d) {
      same_layout = hot.size(d) == first_hot.size(d) && (hot.size(d) <= 1 || hot.stride(d) == first_hot.stride(d));
    }
    if (!same_layout) {
      invalid_argument(hot.name(), ": expected the shape and strides of hot_caches[0] (", first_hot.shape_string(),
                       "; the layers of one group share a hot layout), got ", hot.shape_string());
    }
    p.piece_hot[i] = piece.hot;
  }
  // The whole span of P pieces must lie inside each slot's pitch and be
  // reachable, not only piece 0.
  const int64_t span = pieces * p.row_bytes;
  if (p.host_rows > 1 && p.host_pitch < span) {
    invalid_argument("host_cache: expected a slot pitch of at least P x row bytes = ", span, " bytes, got ",
                     p.host_pitch, " bytes (shape ", host.shape_string(), ")");
  }
  if (p.host_rows > 0) {
    const int64_t extent = (p.host_rows - 1) * p.host_pitch + span;
    backend_for(device, "hot_caches[0]")
        .check_accessible(p.host, static_cast<size_t>(extent), device.index, "host_cache");
  }
  swap_list_params(a.swap_host_rows, a.swap_device_rows, a.swap_counts, device, "hot_caches[0]", &p, &aliases);
  p.max_blocks = checked_max_blocks(a.max_blocks);
  p.variant = HS_GATHER_ROW_PERSISTENT;
  aliases.check();
  return p;
}

GatherPlanParams gather_plan_params(const hs_tensor_t* src_rows, const hs_tensor_t* staged_rows,
                                    const hs_tensor_t* row_ids_t, const hs_tensor_t* dst_rows_t,
                                    const hs_tensor_t* miss_mask_t, Device* device_out) {
  const TensorArg staged(staged_rows, "staged");
  const TensorArg src(src_rows, "src_rows");
  const Device device = staged.device();
  *device_out = device;
  const Rows source = rows_of(src);
  const Rows destination = rows_of(staged);
  same_rows(staged, src, destination.row_bytes, source.row_bytes);
  if (destination.count > 1 && destination.pitch != destination.row_bytes) {
    invalid_argument("staged: expected contiguous rows (pitch ", destination.row_bytes, " bytes), got a pitch of ",
                     destination.pitch, " bytes (shape ", staged.shape_string(), ")");
  }
  check_source_device(src, device, "staged");

  const TensorArg row_ids(row_ids_t, "row_ids");
  row_ids.dtype_is(HS_DTYPE_INT32).contiguous().on(device, "staged");
  GatherPlanParams p;
  p.device = device.index;
  p.src = source.base;
  p.src_rows = source.count;
  p.src_pitch = source.pitch;
  p.staged = destination.base;
  p.staged_rows = destination.count;
  p.row_bytes = source.row_bytes;
  p.count = row_ids.numel();
  p.row_ids = row_ids.data<int32_t>();
  const TensorArg dst_rows(dst_rows_t, "dst_rows");
  const TensorArg miss_mask(miss_mask_t, "miss_mask");
  p.dst_rows = index_list(dst_rows, p.count, device, "staged");
  p.miss_mask = index_list(miss_mask, p.count, device, "staged");
  AliasCheck().writes(staged).reads(src).reads(row_ids).reads(dst_rows).reads(miss_mask).check();

  Backend& backend = backend_for(device, "staged");
  backend.check_accessible(source.base, static_cast<size_t>(source.extent), device.index, "src_rows");
  backend.check_accessible(destination.base, static_cast<size_t>(destination.extent), device.index, "staged");
  return p;
}

void mirror_source_params(const TensorArg& src, const TensorArg& slots, const TensorArg& host, int64_t host_row_bytes,
                          const Device& device, MirrorRowsParams* params) {
  const Rows source = rows_of(src);
  same_rows(src, host, source.row_bytes, host_row_bytes);
  if (slots.dtype() != HS_DTYPE_INT32 && slots.dtype() != HS_DTYPE_INT64) {
    fail(HS_ERROR_INVALID_DTYPE, "slot_mapping: expected dtype int32 or int64, got ", dtype_name(slots.dtype()));
  }
  slots.ndim_is(1).unit_stride(0).on(device, src.name());
  slots.size_at_least(0, source.count, "one host slot per row of src_rows");
  MirrorRowsParams& p = *params;
  p.device = device.index;
  p.src = source.base;
  p.src_pitch = source.pitch;
  p.count = source.count;
  p.row_bytes = source.row_bytes;
  p.slot_mapping = slots.data<void>();
  p.slot_mapping_int64 = slots.dtype() == HS_DTYPE_INT64;
  backend_for(device, src.name())
      .check_accessible(source.base, static_cast<size_t>(source.extent), device.index, src.name());
}

MirrorRowsParams mirror_rows_params(const hs_tensor_t* src_rows, const hs_tensor_t* host_cache_t,
                                    const hs_tensor_t* slot_mapping_t, Device* device_out) {
  const TensorArg src(src_rows, "src_rows");
  const TensorArg host(host_cache_t, "host_cache");
  const Device device = src.device();
  *device_out = device;
  const Rows source = rows_of(src);
  const Rows destination = rows_of(host);
  same_rows(host, src, destination.row_bytes, source.row_bytes);
  check_source_device(host, device, "src_rows");
  MirrorRowsParams p;
  const TensorArg slot_mapping(slot_mapping_t, "slot_mapping");
  mirror_source_params(src, slot_mapping, host, destination.row_bytes, device, &p);
  AliasCheck().writes(host).reads(src).reads(slot_mapping).check();
  p.host = destination.base;
  p.host_rows = destination.count;
  p.host_pitch = destination.pitch;
  backend_for(device, "src_rows")
      .check_accessible(destination.base, static_cast<size_t>(destination.extent), device.index, "host_cache");
  return p;
}

void invalidation_inputs(const TensorArg& state_indices, const TensorArg& req_ids, const TensorArg& written,
                         const Device& device, const char* reference, InvalidateSlotsParams* params) {
  int_vector(state_indices, device, reference);
  int_vector(req_ids, device, reference);
  int_vector(written, device, reference);
  InvalidateSlotsParams& p = *params;
  p.device = device.index;
  p.request_state_indices = state_indices.data<int32_t>();
  p.num_batch_rows = checked_int32(state_indices.size(0), "request_state_indices length");
  p.req_id_per_token = req_ids.data<int32_t>();
  p.written_slots = written.data<int32_t>();
  p.num_tokens = checked_int32(std::min(req_ids.size(0), written.size(0)), "token count");
}

InvalidateSlotsParams invalidate_written_slots_params(const hs_invalidate_written_slots_args_t& a,
                                                      std::vector<int32_t*>* tables, Device* device_out) {
  if (a.num_tables < 0 || a.num_tables > HS_MAX_INVALIDATION_TABLES) {
    invalid_argument("num_tables: expected 0 to ", HS_MAX_INVALIDATION_TABLES, ", got ", a.num_tables);
  }
  if (a.num_tables > 0 && a.tables == nullptr) invalid_argument("tables: expected a non-NULL pointer");
  const TensorArg state_indices(a.request_state_indices, "request_state_indices");
  const Device device = state_indices.device();
  *device_out = device;
  InvalidateSlotsParams p;
  const TensorArg req_ids(a.req_id_per_token, "req_id_per_token");
  const TensorArg written(a.written_slots, "written_slots");
  invalidation_inputs(state_indices, req_ids, written, device, "request_state_indices", &p);
  const ByteRange inputs[] = {state_indices.bytes(), req_ids.bytes(), written.bytes()};
  std::vector<ByteRange> table_ranges;
  table_ranges.reserve(static_cast<size_t>(a.num_tables));

  // Names must outlive the TensorArgs that point at them.
  std::vector<std::string> names;
  names.reserve(static_cast<size_t>(a.num_tables));
  tables->clear();
  tables->reserve(static_cast<size_t>(a.num_tables));
  int64_t rows = 0;
  int64_t hot_size = 0;
  for (int32_t i = 0; i < a.num_tables; ++i) {
    names.push_back(str("tables[", i, "]"));
    const TensorArg table(a.tables[i], names.back().c_str());
    table.dtype_is(HS_DTYPE_INT32).ndim_is(2).contiguous().on(device, "request_state_indices");
    if (i == 0) {
      rows = table.size(0);
      hot_size = table.size(1);
    } else if (table.size(0) != rows || table.size(1) != hot_size) {
      invalid_argument(table.name(), ": expected shape [", rows, ", ", hot_size,
                       "] (the shape of tables[0]; index groups must share one hot layout), got ",
                       table.shape_string());
    }
    tables->push_back(table.data<int32_t>());
    // Every table is written: apart from every input and from each other
    // (contiguous, so neighbours in address order are enough to compare).
    const ByteRange range = table.bytes();
    for (const ByteRange& input : inputs) check_apart(range, true, input, false);
    table_ranges.push_back(range);
  }
  std::sort(table_ranges.begin(), table_ranges.end(),
            [](const ByteRange& x, const ByteRange& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < table_ranges.size(); ++i) check_apart(table_ranges[i], true, table_ranges[i - 1], true);
  p.tables = tables->data();
  p.num_tables = a.num_tables;
  p.num_state_rows = checked_int32(rows, "tables rows");
  p.hot_size = checked_int32(hot_size, "tables columns");

  const TensorArg pointers(a.table_pointers, "table_pointers", true);
  if (pointers.present()) {
    pointers.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0).on(device, "request_state_indices");
    pointers.size_is(0, a.num_tables, "one pointer per table");
    if (!device.is_cuda()) {
      for (int32_t i = 0; i < a.num_tables; ++i) {
        if (pointers.data<int64_t>()[i] != static_cast<int64_t>(reinterpret_cast<uintptr_t>((*tables)[i]))) {
          invalid_argument("table_pointers: entry ", i, " does not hold the data pointer of tables[", i, "]");
        }
      }
    }
    for (const ByteRange& table : table_ranges) check_apart(table, true, pointers.bytes(), false);
    p.table_pointers = pointers.data<int64_t>();
  }
  return p;
}

SwapBlocksParams swap_blocks_params(const hs_tensor_t* src_t, const hs_tensor_t* dst_t, const hs_tensor_t* sizes_t,
                                    Device* device_out) {
  const TensorArg src(src_t, "src");
  const TensorArg dst(dst_t, "dst");
  const TensorArg sizes(sizes_t, "sizes");
  const Device device = src.device();
  *device_out = device;
  src.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0);
  dst.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0).on(device, "src");
  sizes.dtype_is(HS_DTYPE_INT64).ndim_is(1).unit_stride(0).on(device, "src");
  dst.size_is(0, src.size(0), "one destination per entry of src");
  sizes.size_is(0, src.size(0), "one size per entry of src");
  SwapBlocksParams p;
  p.device = device.index;
  p.src = src.data<int64_t>();
  p.dst = dst.data<int64_t>();
  p.sizes = sizes.data<int64_t>();
  p.count = src.size(0);
  if (!device.is_cuda()) check_host_copies(p, src, dst, sizes);
  return p;
}

WarmHostPagesParams warm_host_pages_params(const hs_tensor_t* host_cache, const hs_tensor_t* block_table,
                                           const hs_tensor_t* seq_lens, int64_t block_size, int64_t page_bytes,
                                           const hs_tensor_t* out, Device* device_out) {
  const TensorArg host(host_cache, "host_cache");
  const TensorArg table(block_table, "block_table");
  const TensorArg lengths(seq_lens, "seq_lens", /*optional=*/true);
  const TensorArg totals(out, "out", /*optional=*/true);
  const Device device = table.device();
  *device_out = device;
  table.dtype_is(HS_DTYPE_INT32).ndim_is(2).row_major_2d();
  const Rows rows = rows_of(host);
  check_source_device(host, device, "block_table");
  if (block_size < 1 || block_size > kInt32Max) {
    invalid_argument("block_size: expected a positive number of rows per host block, at most ", kInt32Max, ", got ",
                     block_size);
  }
  constexpr int64_t kMaxPageBytes = int64_t{1} << 30;
  if (page_bytes < 16 || page_bytes > kMaxPageBytes || (page_bytes & (page_bytes - 1)) != 0) {
    invalid_argument("page_bytes: expected a power of two from 16 to ", kMaxPageBytes, ", got ", page_bytes);
  }
  AliasCheck aliases;
  aliases.reads(host).reads(table);
  WarmHostPagesParams p;
  if (lengths.present()) {
    int_vector(lengths, device, "block_table").size_at_least(0, table.size(0), "one length per row of block_table");
    aliases.reads(lengths);
    p.seq_lens = lengths.data<int32_t>();
  }
  if (totals.present()) {
    totals.dtype_is(HS_DTYPE_INT64)
        .ndim_is(1)
        .unit_stride(0)
        .size_is(0, 2, "[words read, their XOR]")
        .on(device, "block_table");
    aliases.writes(totals);
    p.out = totals.data<int64_t>();
  }
  aliases.check();
  p.device = device.index;
  p.host = rows.base;
  p.extent = rows.extent;
  // One block covers every row when it holds them all (so no product of
  // block_size and a pitch can overflow).
  p.block_bytes = block_size >= rows.count ? rows.extent : block_size * rows.pitch;
  p.host_blocks = rows.count == 0 ? 0 : (rows.count + block_size - 1) / block_size;
  p.block_table = table.table_data();
  p.block_table_row_stride = table.numel() > 0 ? table.stride(0) : 0;
  p.num_requests = checked_int32(table.size(0), "block_table rows");
  p.table_width = checked_int32(table.size(1), "block_table columns");
  p.block_size = block_size;
  p.page_bytes = page_bytes;
  if (rows.extent > 0) {
    backend_for(device, "block_table")
        .check_accessible(rows.base, static_cast<size_t>(rows.extent), device.index, host.name());
  }
  return p;
}

}  // namespace hisparse
