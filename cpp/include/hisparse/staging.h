/*
 * hisparse prefill staging (DESIGN.md "Data movement", docs/staging.md):
 * stage the host KV blocks a prefill batch reads into one compact device
 * buffer that every layer shares.
 *
 *   hs_staging_plan_*         the plan of a batch: its distinct host blocks
 *                             renumbered 0, 1, 2, ... (0 = the null block),
 *                             the renumbered block table, and which staged
 *                             rows come from the host and which from
 *                             GPU-resident pages
 *   hs_gather_prefill_cache   one layer's staged cache for a plan
 *   hs_gather_resident_rows   device rows by flat row id (the resident copy)
 *   hs_staging_remap          the block renumbering on its own
 *
 * Output shapes depend only on input shapes and the plan's sizes, never on
 * tensor contents, and every function that takes a stream validates on the
 * host, then only enqueues kernels: no host sync, no allocation, capturable
 * into a CUDA graph. Block ids, lengths and state rows inside tensors are
 * device data the host never reads: an id outside the documented range is
 * an invalid entry (treated as stated per call), never an out-of-bounds
 * access. The backend is the plan's device (CPU tensors run the CPU
 * reference). Include this header directly or through hisparse/hisparse.h.
 *
 * Thread safety: a plan must not be used from two threads at once (building
 * and ensure_gpu_sources change its host-side state); different plans may.
 */
#ifndef HISPARSE_STAGING_H_
#define HISPARSE_STAGING_H_

#include "hisparse/hisparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows a staged cache is best allocated with at least (the gather itself
 * writes exactly num_blocks * block_size rows): prefills of different sizes
 * then draw same-sized buffers from a caching allocator, and attention
 * kernels that read whole tiles past the last staged row stay inside it. */
#define HS_MIN_STAGED_PREFILL_ROWS 1024

/* ------------------------------------------------------------------ the plan */

typedef struct hs_staging_plan* hs_staging_plan_t;

/* Sizes of a plan. B x C is the shape of the request block tables it is
 * built from; the staged cache has num_blocks = staging_block_capacity + 1
 * blocks (block 0 is the null block) of block_size rows, N = num_blocks x
 * block_size rows in all, and N must fit in int32.
 *
 * storage (optional): memory the plan borrows instead of allocating its
 * own, uint8 1-D contiguous on the plan's device, 16-byte aligned, with at
 * least hs_staging_plan_storage_bytes bytes; it must outlive the plan. A
 * caller with a caching allocator (PyTorch) passes it so that plans cost no
 * device allocation and can be created inside a CUDA-graph capture. NULL:
 * the plan allocates through its backend at create and frees at destroy. */
typedef struct hs_staging_plan_options {
  size_t struct_size;
  uint32_t struct_version;
  int32_t device_type;            /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index;           /* CUDA device; -1 = the calling thread's current device */
  int64_t num_rows;               /* B >= 0 */
  int64_t num_cols;               /* C >= 0 */
  int64_t block_size;             /* tokens per host block, >= 1 */
  int64_t staging_block_capacity; /* blocks staged besides the null block, >= 0 */
  const hs_tensor_t* storage;     /* optional borrowed memory, see above */
} hs_staging_plan_options_t;
#define HS_STAGING_PLAN_OPTIONS_VERSION 1

/* Defaults: CPU, current device. Set the sizes. */
static inline void hs_staging_plan_options_init(hs_staging_plan_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_STAGING_PLAN_OPTIONS_VERSION;
  options->device_type = HS_DEVICE_CPU;
  options->device_index = -1;
}

/* Bytes of storage a plan of these options needs (the storage field is
 * ignored). Validates the sizes with the messages of hs_staging_plan_create.
 * On CUDA it asks the device for its sort's scratch size (initialises CUDA). */
HS_API hs_status_t hs_staging_plan_storage_bytes(const hs_staging_plan_options_t* options, uint64_t* bytes);

/* Create a plan (not yet built). Blocking when it allocates; with caller
 * storage it touches no device memory and calls no stream. On failure
 * *plan is NULL and nothing is leaked. Free with hs_staging_plan_destroy. */
HS_API hs_status_t hs_staging_plan_create(const hs_staging_plan_options_t* options, hs_staging_plan_t* plan);

/* Free the plan (and its memory when it owns it). NULL is accepted. The
 * caller guarantees that no device work still uses the plan's tensors. */
HS_API hs_status_t hs_staging_plan_destroy(hs_staging_plan_t plan);

/* The tensors of a plan, all int32 and contiguous on the plan's device. */
typedef enum hs_staging_plan_tensor {
  HS_STAGING_PLAN_BLOCK_TABLE = 0, /* [B, C]: the renumbered block table (0 = null block or not staged) */
  HS_STAGING_PLAN_ROW_IDS = 1,     /* [1, N]: host slot staged into row j, -1 = unused row */
  HS_STAGING_PLAN_DST_ROWS = 2,    /* [1, N]: 0 .. N-1 */
  HS_STAGING_PLAN_MISS_MASK = 3,   /* [1, N]: 1 where row j is loaded from the host cache */
  HS_STAGING_PLAN_GPU_ROW_IDS = 4, /* [1, N]: flat resident-cache row of row j, -1 = none; meaningful
                                      only while hs_staging_plan_info_t.has_gpu_sources is 1 */
  HS_STAGING_PLAN_NUM_TENSORS = 5
} hs_staging_plan_tensor_t;

/* A borrowed descriptor of tensor `which`, valid (and constant) until the
 * plan is destroyed; the contents change with build and ensure_gpu_sources. */
HS_API hs_status_t hs_staging_plan_get_tensor(hs_staging_plan_t plan, hs_staging_plan_tensor_t which, hs_tensor_t* out);

typedef struct hs_staging_plan_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t device_type;             /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index;            /* resolved device (0 on the CPU) */
  int32_t built;                   /* 1 once hs_staging_plan_build succeeded */
  int32_t has_gpu_sources;         /* 1 while rows are served from a resident cache */
  int32_t owns_storage;            /* 1 when the plan allocated its memory */
  int64_t num_rows;                /* B */
  int64_t num_cols;                /* C */
  int64_t block_size;
  int64_t staging_block_capacity;
  int64_t num_blocks;              /* staging_block_capacity + 1 */
  int64_t num_staged_rows;         /* N = num_blocks * block_size */
  uint64_t storage_bytes;          /* bytes of storage the plan uses */
  uint64_t gpu_source_table;       /* data address of the resident_state_rows of the sources, 0 = none */
  int64_t gpu_source_block_size;   /* their resident_block_size, 0 = none */
} hs_staging_plan_info_t;
#define HS_STAGING_PLAN_INFO_VERSION 1

HS_API hs_status_t hs_staging_plan_get_info(hs_staging_plan_t plan, hs_staging_plan_info_t* info);

/* Build the plan of a batch (the seed's build_hisparse_prefill_staging_plan).
 *
 * block_table: int32 or int64 [B, C] (unit column stride), host block ids
 *   per request. seq_lens: int32 or int64 [>= B] (unit stride; only the
 *   first B are read). Both on the plan's device.
 *
 * Request b uses u_b = ceil(max(seq_lens[b], 0) / block_size) blocks. The
 * capacity's slots are dealt out request after request (u_0 to request 0,
 * then u_1, ...); slot k of request b is column k - (u_0 + ... + u_{b-1}),
 * which holds nothing when it is >= C but still uses the slot. The block ids
 * of the filled slots (0 for empty ones) are renumbered as hs_staging_remap
 * does; then
 *   block_table[b, c] = the new id at every staged entry, 0 elsewhere,
 *   row_ids as hs_staging_remap's, dst_rows = 0 .. N-1,
 *   miss_mask[j] = row_ids[j] >= 0,
 * and the plan has no GPU sources. A block id that is negative or whose
 * rows do not fit in int32 (id * block_size + block_size - 1 > 2^31 - 1)
 * counts as the null block 0. On error the plan is unchanged. */
HS_API hs_status_t hs_staging_plan_build(hs_staging_plan_t plan, const hs_tensor_t* block_table,
                                         const hs_tensor_t* seq_lens, hs_stream_t stream);

/* Serve staged rows that have a copy in a resident group's GPU cache from
 * that copy (the seed's HiSparsePrefillStagingPlan.ensure_gpu_sources).
 *
 * resident_state_rows: int32 or int64 [S, R] (unit column stride): page p of
 *   state row s is resident block resident_state_rows[s, p] (> 0 when
 *   resident). state_indices: int32 or int64 1-D (unit stride): the state row
 *   of each batch row. Both on the plan's device.
 *
 * Cached: when the plan's sources were computed for the same table (same
 * data address) and resident_block_size, the call does nothing (a change of
 * the table in place is not seen). Otherwise, when resident_block_size <= 0,
 * block_size is not a multiple of it, B == 0, or state_indices has fewer
 * than B entries, the plan has no GPU sources afterwards (sources computed
 * for another table are dropped: miss_mask back to row_ids >= 0). Otherwise,
 * with P = block_size / resident_block_size: staged block k's representative
 * is the first entry of block_table (row-major) whose value is k; with
 * representative (b, c) and s = state_indices[b], its pages are
 * resident_state_rows[s, c * P + i] for i < P (0 past column R, and 0 for
 * every page when s is outside [0, S) or k has no representative). Row o of
 * block k is resident when its page q = page[o / resident_block_size] is
 * > 0, q * resident_block_size + resident_block_size - 1 fits in int32, the
 * host block of k is > 0 and row_ids of the row is >= 0. Then
 *   gpu_row_ids[j] = q * resident_block_size + o % resident_block_size for
 *   resident rows, -1 otherwise; miss_mask[j] = row_ids[j] >= 0 and not
 *   resident. HS_ERROR_INVALID_STATE before the plan is built. */
HS_API hs_status_t hs_staging_plan_ensure_gpu_sources(hs_staging_plan_t plan, const hs_tensor_t* resident_state_rows,
                                                      const hs_tensor_t* state_indices, int64_t resident_block_size,
                                                      hs_stream_t stream);

/* ------------------------------------------------------------------ gathers */

/* One layer's staged cache for `plan` (the seed's gather_prefill_cache):
 *   1. rows with a resident copy (gpu_row_ids[j] >= 0, while the plan has GPU
 *      sources): staged[j] = row gpu_row_ids[j] of resident_cache, with the
 *      rules of hs_gather_resident_rows (an id past the cache reads row 0);
 *   2. then hs_gather_plan: staged[dst_rows[j]] = host_cache[row_ids[j]]
 *      where miss_mask[j] != 0 and 0 <= row_ids[j] < host rows.
 * Other rows of staged keep their bytes (row_ids < 0, or past the host
 * cache).
 *
 * host_cache: the layer's host cache, rows [..., W] at one uniform pitch as
 *   hs_gather_plan's src_rows (registered or pinned host memory, or memory of
 *   the plan's device, on CUDA); with 3 or more dimensions, dimension 1 must
 *   be the plan's block_size.
 * resident_cache: the resident group's paged GPU cache [blocks,
 *   resident_block_size, W'] (any strides of 16-byte multiples, unit stride
 *   in the last) with rows of W * itemsize bytes, on the plan's device;
 *   required while the plan has GPU sources, with the resident_block_size
 *   given to ensure_gpu_sources; NULL otherwise accepted.
 * staged: contiguous rows [..., W] of host_cache's dtype on the plan's device
 *   with at least N rows; rows past N are never written.
 * HS_ERROR_INVALID_STATE before the plan is built. */
HS_API hs_status_t hs_gather_prefill_cache(hs_staging_plan_t plan, const hs_tensor_t* host_cache,
                                           const hs_tensor_t* resident_cache, const hs_tensor_t* staged,
                                           hs_stream_t stream);

/* destination[j] = flat row row_ids[j] of source, bytes unchanged (the
 * seed backend's gather_resident_rows). source: [blocks, block_size, W] of
 * any dtype, any strides that are 16-byte multiples, unit stride in the
 * last; flat row r is source[r / block_size, r % block_size]; at least one
 * row. destination: [N, W'] rows of the same byte size (a multiple of 16; a
 * different dtype is reinterpreted, not converted) at a 16-byte pitch.
 * row_ids: int32 or int64 [N] (unit stride). All three on one device; the
 * backend is that device's (device-to-device on CUDA). An id outside
 * [0, blocks * block_size) copies row 0. */
HS_API hs_status_t hs_gather_resident_rows(const hs_tensor_t* source, const hs_tensor_t* destination,
                                           const hs_tensor_t* row_ids, hs_stream_t stream);

/* ------------------------------------------------------------------ remap */

/* The block renumbering of a plan on its own (the seed's
 * hisparse_prefill_staging_remap), without data-dependent output sizes.
 * Let n = numel(block_table) and D the distinct values of {0} and every
 * entry's block id, ascending, where an entry's block id is its value, or
 * 0 when it is negative or its rows do not fit in int32 (value * block_size
 * + block_size - 1 > 2^31 - 1). Then
 *   out_block_table[i] = the rank of entry i's block id in D,
 *   out_row_ids[k * block_size + o] = D[k] * block_size + o for k < |D|,
 *   and -1 for the n + 1 - |D| blocks after.
 * block_table: int32 or int64, any shape, contiguous. out_block_table:
 * int32 with n elements, contiguous. out_row_ids: int32 with
 * (n + 1) * block_size elements (e.g. [1, (n + 1) * block_size]), contiguous;
 * that count must fit in int32. workspace: uint8 1-D contiguous with at
 * least hs_staging_remap_workspace_bytes(n) bytes, 16-byte aligned. All on
 * one device. */
typedef struct hs_staging_remap_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* block_table;
  int64_t block_size;
  const hs_tensor_t* out_block_table;
  const hs_tensor_t* out_row_ids;
  const hs_tensor_t* workspace;
} hs_staging_remap_args_t;
#define HS_STAGING_REMAP_ARGS_VERSION 1

static inline void hs_staging_remap_args_init(hs_staging_remap_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_STAGING_REMAP_ARGS_VERSION;
}

/* Workspace bytes of hs_staging_remap over `num_entries` entries with
 * `block_size` on a device (device_type HS_DEVICE_CPU or HS_DEVICE_CUDA,
 * device_index -1 = current); validates both counts. */
HS_API hs_status_t hs_staging_remap_workspace_bytes(int32_t device_type, int32_t device_index, int64_t num_entries,
                                                    int64_t block_size, uint64_t* bytes);

HS_API hs_status_t hs_staging_remap(const hs_staging_remap_args_t* args, hs_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_STAGING_H_ */
