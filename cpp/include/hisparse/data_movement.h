/*
 * hisparse data movement: the kernels that move KV rows between the host
 * pool and the GPU (DESIGN.md "Data movement").
 *
 *   hs_gather_compact         swap list -> hot cache (zero-copy host reads)
 *   hs_gather_compact_group   the same for several layers whose host rows of
 *                             one token lie side by side: one contiguous read
 *                             per entry, one piece to each layer's hot cache
 *   hs_gather_plan            prefill staging: host rows -> staged rows
 *   hs_invalidate_written_slots  drop hot copies of rewritten host slots,
 *                             for many index-group tables in one launch
 *   hs_mirror_rows            device rows -> host slots (keeps the host pool
 *                             authoritative for KV written on the GPU)
 *   hs_swap_blocks_batch      a batch of (src, dst, bytes) copies
 *   hs_warm_host_pages        one word of every host page of some requests'
 *                             host blocks read ahead, so that the GPU's
 *                             translations of those pages are warm
 *
 * Every call validates shapes, dtypes, devices, strides and alignment on
 * the host and fails with a message naming the argument. Device *data*
 * (indices inside the tensors) is never read on the host: out-of-range
 * entries are skipped or zero-filled by the kernels as documented per call,
 * with offsets computed without overflow for any int32 index. A call whose
 * output shares memory with one of its inputs or with another output is
 * refused (HS_ERROR_INVALID_ARGUMENT naming both), before anything runs.
 * The backend is chosen by the device of the destination (CPU tensors run
 * the CPU reference). All calls are stream-ordered, never block the host,
 * never allocate, and can be captured into a CUDA graph.
 */
#ifndef HISPARSE_DATA_MOVEMENT_H_
#define HISPARSE_DATA_MOVEMENT_H_

#include "hisparse/hisparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ gather_compact */

/* How the CUDA gather is scheduled. Every variant writes the same bytes; the
 * CPU backend accepts every value and runs its one reference loop. */
typedef enum hs_gather_variant {
  HS_GATHER_AUTO = 0,           /* the library's choice (hs_gather_default_variant) */
  HS_GATHER_WARP_PER_ROW = 1,   /* one warp per swap entry on a grid of K x R warps */
  HS_GATHER_SORTED = 2,         /* per token row, entries sorted by host slot in shared memory, then
                                   copied in address order by whole blocks: runs of adjacent host rows
                                   become contiguous reads; max_blocks (else half the SMs) blocks in
                                   all. For rows scattered over the pool. A block's share of a token
                                   row of more than 2048 columns opts in to more than 48 KiB of shared
                                   memory; past the device's limit the call runs ROW_PERSISTENT. */
  HS_GATHER_ROW_PERSISTENT = 3, /* one warp per row, all of a row's loads before its stores, on a
                                   fixed grid (max_blocks, else one block per SM) that strides over
                                   the used rows. The default (HS_GATHER_AUTO): suited to misses
                                   local to each request, the decode case. */
  HS_NUM_GATHER_VARIANTS = 4
} hs_gather_variant_t;

/* Static name of a variant ("auto", "warp_per_row", ...); "unknown" otherwise. */
HS_API const char* hs_gather_variant_name(int32_t variant);
/* The variant HS_GATHER_AUTO runs. */
HS_API int32_t hs_gather_default_variant(void);

/* Copy each swap entry's host row into its hot row.
 *
 * host_cache: the host cache, [..., W] of any dtype whose leading dimensions
 *   flatten to rows at one uniform pitch (a multiple of 16 bytes); its base
 *   is 16-byte aligned; row_bytes = W * itemsize, a multiple of 16. On CUDA
 *   it must be registered or pinned host memory (or memory of the same
 *   device); kernels read it zero-copy.
 * hot_cache: the paged hot cache on the executing device, same dtype and W,
 *   rows contiguous within a block (stride of dimension -2 == W). Physical
 *   hot row r lives at row offset
 *       (r / hot_block_size) * hot_block_stride + r % hot_block_size
 *   from hot_cache's data pointer (the attention addressing). A 3-D
 *   [blocks, hot_block_size, W] view must agree with hot_block_size and
 *   hot_block_stride; any other view only bounds the rows that may be
 *   written: a destination whose whole row does not lie within the view's
 *   memory extent is skipped.
 * swap_host_rows, swap_device_rows: int32 [R, K], unit column stride.
 * swap_counts: int32 [>= R]; entry (t, k) is used for k < clamp(counts[t], 0, K).
 *
 * Per used entry (h, d): h < 0 or d < 0 -> skipped; d outside the hot
 * cache -> skipped; h >= host row count -> the hot row is zero-filled;
 * otherwise host row h is copied to hot row d. Destinations are expected to
 * be distinct (the resolver guarantees it); if two used entries share a
 * destination, which one lands is unspecified. */
typedef struct hs_gather_compact_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* host_cache;       /* [..., W] */
  const hs_tensor_t* hot_cache;
  const hs_tensor_t* swap_host_rows;   /* int32 [R, K] */
  const hs_tensor_t* swap_device_rows; /* int32 [R, K] */
  const hs_tensor_t* swap_counts;      /* int32 [>= R] */
  int64_t hot_block_size;              /* rows per hot block, 1 .. INT32_MAX */
  int64_t hot_block_stride;            /* rows between hot blocks, hot_block_size .. INT32_MAX (the range of
                                          an attention index); 0 = hot_block_size */
  int32_t variant;                     /* hs_gather_variant_t */
  int32_t max_blocks;                  /* CUDA: thread blocks of SORTED and ROW_PERSISTENT; 0 = half the SMs
                                          for SORTED (fewer concurrent rows translate fewer host pages at
                                          once, which suits scattered rows and leaves SMs to compute), one
                                          per SM for ROW_PERSISTENT */
} hs_gather_compact_args_t;
#define HS_GATHER_COMPACT_ARGS_VERSION 1

static inline void hs_gather_compact_args_init(hs_gather_compact_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_GATHER_COMPACT_ARGS_VERSION;
  args->variant = HS_GATHER_AUTO;
}
HS_API hs_status_t hs_gather_compact(const hs_gather_compact_args_t* args, hs_stream_t stream);

/* ------------------------------------------------------------------ gather_compact_group */

/* Most hot caches (pieces) one hs_gather_compact_group call fills. */
#define HS_MAX_GATHER_GROUP_PIECES 16

/* hs_gather_compact for P layers at once, for a host layout that keeps one
 * token's rows of those layers side by side (token-major: host slot h holds
 * P consecutive rows of W, one per layer). Each used swap entry (h, d) reads
 * the P * row_bytes contiguous bytes of host slot h in one piece and writes
 * its piece i to hot row d of hot_caches[i]. Why: an SM reads host memory
 * in 128-byte lines, so an isolated 656-byte row costs six lines for 5.1 of
 * data; P adjacent rows read together waste at most one line in total.
 *
 * host_cache: [..., P, W] of any dtype: the last two dimensions are P rows of
 *   W elements back to back (stride of dimension -2 == W, unit stride in the
 *   last), the leading dimensions flatten to host slots at one uniform pitch
 *   (a multiple of 16 bytes, at least P * row_bytes); e.g. host[:, l0:l0+P, :]
 *   of a token-major [slots, layers, W] cache. Memory rules as host_cache of
 *   hs_gather_compact.
 * hot_caches: num_hot_caches == P descriptors (1..HS_MAX_GATHER_GROUP_PIECES),
 *   each a hot cache as in hs_gather_compact (same dtype and W as host_cache);
 *   all P on one device with identical shapes and strides (the layers of one
 *   index group share their hot layout), at any base addresses.
 * swap_host_rows, swap_device_rows, swap_counts, hot_block_size,
 *   hot_block_stride: as in hs_gather_compact; one swap list serves all P.
 *
 * Per used entry: h < 0 or d < 0 or d outside the hot caches -> skipped;
 * h >= host slot count -> every piece's hot row is zero-filled; otherwise
 * piece i of slot h lands in hot row d of hot_caches[i]. The bytes equal P
 * calls of hs_gather_compact, one per piece. CUDA runs one warp per entry
 * on a persistent grid (max_blocks, else one block per SM). */
typedef struct hs_gather_compact_group_args {
  size_t struct_size;
  uint32_t struct_version;
  int32_t num_hot_caches;              /* P */
  const hs_tensor_t* host_cache;        /* [..., P, W] */
  const hs_tensor_t* const* hot_caches; /* P hot caches */
  const hs_tensor_t* swap_host_rows;   /* int32 [R, K] */
  const hs_tensor_t* swap_device_rows; /* int32 [R, K] */
  const hs_tensor_t* swap_counts;      /* int32 [>= R] */
  int64_t hot_block_size;              /* rows per hot block, 1 .. INT32_MAX */
  int64_t hot_block_stride;            /* as in hs_gather_compact: hot_block_size .. INT32_MAX; 0 = hot_block_size */
  int32_t max_blocks;                  /* CUDA thread blocks; 0 = one per SM */
  int32_t reserved0;
} hs_gather_compact_group_args_t;
#define HS_GATHER_COMPACT_GROUP_ARGS_VERSION 1

static inline void hs_gather_compact_group_args_init(hs_gather_compact_group_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_GATHER_COMPACT_GROUP_ARGS_VERSION;
}
HS_API hs_status_t hs_gather_compact_group(const hs_gather_compact_group_args_t* args, hs_stream_t stream);

/* ------------------------------------------------------------------ gather_plan */

/* Prefill staging (the seed's hisparse_gather_plan):
 *   staged[dst_rows[j]] = src_rows[row_ids[j]]  where miss_mask[j] != 0 and row_ids[j] >= 0
 * for j over the N elements of row_ids, dst_rows and miss_mask (int32, each
 * contiguous with N elements, e.g. the plan's [1, N]). Rows as in
 * hs_gather_compact: src_rows is [..., W] at a uniform pitch (host memory,
 * registered on CUDA, or memory of the executing device); staged is
 * [..., W] contiguous on the executing device, same dtype and W; staged rows
 * are numbered in order. Entries with row_ids[j] >= the source row count,
 * dst_rows[j] < 0 or dst_rows[j] >= the staged row count are skipped (the
 * staged row keeps its bytes). Distinct dst_rows are expected; with
 * duplicates, which source lands is unspecified. */
HS_API hs_status_t hs_gather_plan(const hs_tensor_t* src_rows, const hs_tensor_t* staged, const hs_tensor_t* row_ids,
                                  const hs_tensor_t* dst_rows, const hs_tensor_t* miss_mask, hs_stream_t stream);

/* ------------------------------------------------------------------ invalidation */

/* Upper bound on tables per call. */
#define HS_MAX_INVALIDATION_TABLES 4096

/* For every token t < n = min(numel(req_id_per_token), numel(written_slots)):
 * b = req_id_per_token[t] (skipped outside [0, B)), s = request_state_indices[b]
 * (skipped outside [0, S)), w = written_slots[t] (skipped when negative);
 * then every slot j of row s of every table with table[s, j] == w becomes -1
 * (all duplicates). Nothing else changes.
 *
 * tables: num_tables descriptors of int32 [S, H] contiguous tensors of one
 *   shape, on one device (the index groups' device_global_indices), each
 *   listed once (tables that share memory are refused, naming both).
 * table_pointers: optional int64 [num_tables] on the same device holding the
 *   tables' data pointers in order (the seed's cached group table). When
 *   absent the pointers travel as kernel arguments (64 tables per launch),
 *   which needs no device array at all. The CPU backend checks that a given
 *   array matches the descriptors; CUDA cannot read it on the host, so the
 *   caller guarantees it.
 * request_state_indices: int32 [B]; req_id_per_token, written_slots: int32 1-D.
 */
typedef struct hs_invalidate_written_slots_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* const* tables;
  int32_t num_tables;
  int32_t reserved0;
  const hs_tensor_t* table_pointers;        /* optional, int64 [num_tables] */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= n] */
  const hs_tensor_t* written_slots;         /* int32 [>= n] */
} hs_invalidate_written_slots_args_t;
#define HS_INVALIDATE_WRITTEN_SLOTS_ARGS_VERSION 1

static inline void hs_invalidate_written_slots_args_init(hs_invalidate_written_slots_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_INVALIDATE_WRITTEN_SLOTS_ARGS_VERSION;
}
HS_API hs_status_t hs_invalidate_written_slots(const hs_invalidate_written_slots_args_t* args, hs_stream_t stream);

/* ------------------------------------------------------------------ device -> host */

/* host_cache[slot_mapping[i]] = src_rows[i] for i < N, skipping negative
 * slots and slots >= the host row count. src_rows: [N, ..., W] at a uniform
 * row pitch on the executing device; host_cache: [..., W] as in
 * hs_gather_compact (registered host memory on CUDA, written zero-copy by a
 * kernel); same dtype and W. slot_mapping: int32 or int64 1-D with at least
 * N entries (only the first N are read). Duplicate slots: which row lands is
 * unspecified. The host sees the bytes once the stream has passed the call
 * (synchronise or wait on an event before reading them on the CPU). */
HS_API hs_status_t hs_mirror_rows(const hs_tensor_t* src_rows, const hs_tensor_t* host_cache,
                                  const hs_tensor_t* slot_mapping, hs_stream_t stream);

/* Copy sizes[i] bytes from address src[i] to address dst[i] for every i
 * (the seed's swap_blocks_batch: device-to-host block copies on the given
 * stream, by a kernel, so it is capturable). src, dst, sizes: int64 1-D of
 * equal length on the executing device (host tensors run the CPU backend,
 * which copies with memmove). Entries with a size <= 0 or a null address
 * are skipped. The CPU backend reads the addresses on the host, so it checks
 * every used entry before copying anything: each range must be host memory
 * mapped in this process with the access its copy needs (read for src,
 * write for dst; never CUDA device memory), and no destination may overlap
 * another range of the batch or the address arrays themselves; otherwise
 * HS_ERROR_INVALID_ARGUMENT naming the entry. On CUDA the addresses live in
 * device data the host cannot see: the caller guarantees that each range is
 * device memory of the executing device or registered host memory, and that
 * destinations overlap nothing else of the batch. */
HS_API hs_status_t hs_swap_blocks_batch(const hs_tensor_t* src, const hs_tensor_t* dst, const hs_tensor_t* sizes,
                                        hs_stream_t stream);

/* ------------------------------------------------------------------ page warm-up */

/* Reads one 32-bit word of every page_bytes page of host memory that the
 * used host blocks of the requests of block_table span, and nothing else
 * changes. A step's misses scatter over each request's whole context, and
 * where the host caches of a model's layers together outgrow what the GPU
 * keeps of its translations of host pages, each row read pays a cold
 * translation; run this for the next layer's cache while the current layer
 * computes, on a second stream, and that layer's reads find the
 * translations warm (docs/performance.md, "Host page warm-up").
 *
 * host_cache: [..., W] as in hs_gather_compact (host memory, registered on
 *   CUDA; or memory of the executing device); block h covers its bytes from
 *   row h * block_size up to row (h + 1) * block_size, row padding included,
 *   clamped to the end of the last row.
 * block_table: int32 [B, M] on the executing device (host tensors run the
 *   CPU backend): request b's host blocks in order. seq_lens: int32 [>= B] on
 *   that device, or null: request b uses its first
 *   ceil(seq_lens[b] / block_size) entries (at most M, none for a length
 *   <= 0); null uses all M. Used entries < 0 or naming a block past the cache
 *   are skipped.
 * block_size: rows per host block, 1 .. INT32_MAX. page_bytes: a power of
 *   two from 16 to 2^30 (65536: the page size of the GPU's mappings of host
 *   memory on Hopper).
 * The words read, for each used entry: the one at every address within the
 *   block's bytes that is a multiple of page_bytes, and the block's first one
 *   when that is not such an address and the request's previous entry is
 *   not used or not the block just below (so that consecutive blocks of a
 *   request read each page they span once).
 * out: int64 [2] on the executing device, or null: out[0] = the number of
 *   words read, out[1] = their XOR as an unsigned 32-bit value (what the CPU
 *   backend gives bit for bit). */
HS_API hs_status_t hs_warm_host_pages(const hs_tensor_t* host_cache, const hs_tensor_t* block_table,
                                      const hs_tensor_t* seq_lens, int64_t block_size, int64_t page_bytes,
                                      const hs_tensor_t* out, hs_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_DATA_MOVEMENT_H_ */
