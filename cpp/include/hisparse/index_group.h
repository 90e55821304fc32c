/*
 * hisparse index groups: the GPU state shared by the layers that reuse one
 * indexer output (the seed's HiSparseIndexGroup and _SharedTopKState).
 *
 * A group owns, on one device:
 *   - the hot-region state of every request state row: device_global_indices
 *     int32 [S, H] (host slot held by each hot slot, -1 = empty) and
 *     lru_slots int16 [S, H] (hot slots from least to most recently used),
 *     plus the initial LRU order lru_init int16 [H] = 0 .. H-1;
 *   - the shared top-k outputs for up to R = max_swap_rows token rows, which
 *     the leader layer writes once per step and the followers read: attention
 *     indices, hot rows, resolved host slots and miss mask [R, K], valid
 *     counts [R], the compact swap list (host rows, device rows) [R, K] and
 *     swap counts [R] (all int32; see docs/residency.md for their meaning);
 *   - residency counters int64 [HS_NUM_STATS] on the device (lookups, hits,
 *     misses, resident, invalid; see hs_stat_t), accumulated by every
 *     resolution through the group, and a page-locked host mirror of them.
 *
 * Include this header directly or through hisparse/hisparse.h.
 *
 * Thread safety: hs_index_group_get_tensor, hs_index_group_get_info and
 * hs_index_group_read_stats only read immutable or host-side data and may be
 * called from any thread at any time while the group lives. The stream
 * functions (reset, invalidate_sorted_slots, copy_stats_async, resolve)
 * touch no mutable host state, so concurrent calls are safe on the host; the
 * order of their device work is the order of the streams they are given, so
 * callers that use several streams order them with events. Destroy must not
 * race with any other call on the same group.
 */
#ifndef HISPARSE_INDEX_GROUP_H_
#define HISPARSE_INDEX_GROUP_H_

#include "hisparse/hisparse.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_index_group* hs_index_group_t;

typedef struct hs_index_group_options {
  size_t struct_size;
  uint32_t struct_version;
  int32_t device_type;            /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index;           /* CUDA device; -1 = the calling thread's current device */
  int32_t max_num_reqs;           /* S: request state rows, >= 1 */
  int32_t device_buffer_size;     /* H: hot slots per state row, 1 <= H <= 32767 */
  int32_t max_swap_rows;          /* R: token rows of the shared top-k state;
                                     0 = max_num_reqs x (1 + num_speculative_tokens) (hs_default_max_swap_rows) */
  int32_t top_k;                  /* K: top-k width of the shared outputs, >= 1 */
  int32_t max_union_rows;         /* distinct rows per request and step, 1 <= . <= H;
                                     0 = top_k x (1 + num_speculative_tokens) (hs_default_max_union_rows) */
  int32_t num_speculative_tokens; /* draft tokens per request and step, >= 0; read by the defaults only */
} hs_index_group_options_t;
#define HS_INDEX_GROUP_OPTIONS_VERSION 1

/* Defaults: CPU backend, top_k 2048, H 4096, no draft tokens (so
 * max_union_rows = top_k and max_swap_rows = max_num_reqs). Set
 * max_num_reqs (and the device). */
static inline void hs_index_group_options_init(hs_index_group_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_INDEX_GROUP_OPTIONS_VERSION;
  options->device_type = HS_DEVICE_CPU;
  options->device_index = -1;
  options->device_buffer_size = 4096;
  options->top_k = 2048;
}

/* The tensors a group owns (see the file comment for shapes). */
typedef enum hs_index_group_tensor {
  HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES = 0, /* int32 [S, H] */
  HS_INDEX_GROUP_LRU_SLOTS = 1,             /* int16 [S, H] */
  HS_INDEX_GROUP_LRU_INIT = 2,              /* int16 [H], 0 .. H-1, never written after creation */
  HS_INDEX_GROUP_ATTENTION_INDICES = 3,     /* int32 [R, K] */
  HS_INDEX_GROUP_HOT_ROWS = 4,              /* int32 [R, K] */
  HS_INDEX_GROUP_RESOLVED_SLOTS = 5,        /* int32 [R, K] */
  HS_INDEX_GROUP_MISS_MASK = 6,             /* int32 [R, K] */
  HS_INDEX_GROUP_VALID_COUNTS = 7,          /* int32 [R] */
  HS_INDEX_GROUP_SWAP_HOST_ROWS = 8,        /* int32 [R, K] */
  HS_INDEX_GROUP_SWAP_DEVICE_ROWS = 9,      /* int32 [R, K] */
  HS_INDEX_GROUP_SWAP_COUNTS = 10,          /* int32 [R] */
  HS_INDEX_GROUP_STATS = 11,                /* int64 [HS_NUM_STATS], device counters */
  HS_INDEX_GROUP_STATS_HOST = 12,           /* int64 [HS_NUM_STATS], host mirror (pinned for CUDA) */
  HS_INDEX_GROUP_NUM_TENSORS = 13
} hs_index_group_tensor_t;

/* Allocate a group on the options' device and initialise it: the state as
 * after hs_index_group_reset, shared outputs -1 (rows, slots, attention) or
 * 0 (miss mask, counts), counters and their host mirror 0.
 * Synchronous: allocates, initialises on a private stream of the group's
 * device and waits for it, so the group's memory is ready for use on any
 * stream when the call returns. Blocking; not for the decode path or a CUDA
 * graph capture. On failure *group is set to NULL and nothing is leaked. The
 * caller owns the group and frees it with hs_index_group_destroy. Errors
 * name the offending option. */
HS_API hs_status_t hs_index_group_create(const hs_index_group_options_t* options, hs_index_group_t* group);

/* Free the group and all its memory. NULL is accepted. The caller guarantees
 * that no device work still uses the group's tensors (synchronise first) and
 * that no borrowed descriptor is used afterwards. Does not synchronise. */
HS_API hs_status_t hs_index_group_destroy(hs_index_group_t group);

typedef struct hs_index_group_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t device_type;  /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index; /* resolved device (0 on the CPU) */
  int32_t max_num_reqs;
  int32_t device_buffer_size;
  int32_t max_swap_rows;
  int32_t top_k;
  int32_t max_union_rows;
  uint64_t device_bytes; /* bytes of device memory the group holds */
} hs_index_group_info_t;
#define HS_INDEX_GROUP_INFO_VERSION 1

/* The group's resolved sizes (defaults filled in). Non-blocking. */
HS_API hs_status_t hs_index_group_get_info(hs_index_group_t group, hs_index_group_info_t* info);

/* A borrowed descriptor of tensor `which`: data, dtype, device and the shape
 * (strides NULL: contiguous) are owned by the group and stay valid, and
 * constant, until hs_index_group_destroy. Non-blocking. */
HS_API hs_status_t hs_index_group_get_tensor(hs_index_group_t group, hs_index_group_tensor_t which, hs_tensor_t* out);

/* Drop all hot-region state (every hit becomes a miss): device_global_indices
 * = -1, lru_slots = lru_init in every row, device counters = 0. One kernel
 * on `stream`; no host sync, no allocation, capturable. The shared top-k
 * outputs and the host mirror are left as they are. */
HS_API hs_status_t hs_index_group_reset(hs_index_group_t group, hs_stream_t stream);

/* For each state row s in `state_indices` (int32 [N], contiguous, on the
 * group's device), every hot slot j whose host slot device_global_indices[s, j]
 * occurs in `sorted_slots` (int32 [M], contiguous, on the group's device)
 * becomes -1. The result does not depend on the order of `sorted_slots`:
 * ascending (non-decreasing) lists take a binary search per hot slot, any
 * other order (device data the host cannot see) a scan of the list, so an
 * unsorted list is slower, never wrong. Duplicates in either tensor are
 * harmless. State rows outside [0, S) (padding -1) are skipped: device data
 * the host cannot check. Neither tensor may share memory with the group's
 * state (HS_ERROR_INVALID_ARGUMENT naming it). M == 0 or N == 0 is a no-op.
 * Stream-ordered, no host sync, no allocation, capturable. */
HS_API hs_status_t hs_index_group_invalidate_sorted_slots(hs_index_group_t group, const hs_tensor_t* sorted_slots,
                                                          const hs_tensor_t* state_indices, hs_stream_t stream);

/* Enqueue a copy of the device counters into the host mirror on `stream`.
 * No host sync, no allocation, capturable (the mirror is page-locked). */
HS_API hs_status_t hs_index_group_copy_stats_async(hs_index_group_t group, hs_stream_t stream);

/* Read the host mirror into values[0 .. count-1] (count <= HS_NUM_STATS,
 * indexed by hs_stat_t). Reads what the last hs_index_group_copy_stats_async
 * wrote once the caller has synchronised its stream; does not synchronise. */
HS_API hs_status_t hs_index_group_read_stats(hs_index_group_t group, int64_t* values, int32_t count);

/* Residency resolution through the group: hs_resolve_residency with the
 * group's device_global_indices, lru_slots, max_union_rows and counters, and
 * the outputs written to the shared top-k rows [row_offset, row_offset + T)
 * (T = rows of topk_indices). Leave a field 0/NULL for its default.
 *
 * Fused gather (optional): gather_host_cache, gather_hot_cache and
 * gather_hot_block_stride follow hs_resolve_residency's rules (same
 * messages; see its "Fused gather" and docs/residency.md), so the resolve
 * also copies the rows of the swap list it writes into the shared rows into
 * that hot cache. */
typedef struct hs_index_group_resolve_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* topk_indices;          /* int32 [T, K], K = the group's top_k */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= T] */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* hot_block_table;       /* int32 [B, >= ceil(H / hot_block_size)] */
  int64_t hot_block_size;                   /* > 0 */
  int64_t attention_block_stride;           /* >= hot_block_size; 0 = hot_block_size */
  int64_t host_rows;                        /* rows of the host cache */
  int64_t row_offset;                       /* first shared row; row_offset + T <= max_swap_rows */
  /* optional (NULL = absent) */
  const hs_tensor_t* source_block_table;    /* int32 [B, W] */
  int64_t block_size;                       /* tokens per source block (with a source table) */
  const hs_tensor_t* resident_block_table;  /* int32 [B, Wr] */
  int64_t resident_block_size;              /* 0 = hot_block_size */
  const hs_tensor_t* num_valid_rows;        /* int32 [1] */
  const hs_tensor_t* out_attention;         /* int32 [>= T, K]: write here instead of the shared rows */
  const hs_tensor_t* out_valid_counts;      /* int32 [>= T]: write here instead of the shared rows */
  /* fused gather (optional; both NULL = off, both or neither) */
  const hs_tensor_t* gather_host_cache;     /* [..., W] host cache */
  const hs_tensor_t* gather_hot_cache;      /* paged hot cache, same dtype and W, on the group's device */
  int64_t gather_hot_block_stride;          /* rows between hot blocks; 0 = hot_block_size
                                               (must be 0 without a fused gather) */
  /* an hs_resolve_gather_schedule_t (0, AUTO, by default); the
   * resolver's workspace, where the group's shape needs one, and the
   * automatic schedule's handoff array (one launch) are the group's own */
  int32_t gather_schedule;
} hs_index_group_resolve_args_t;
#define HS_INDEX_GROUP_RESOLVE_ARGS_VERSION 1

static inline void hs_index_group_resolve_args_init(hs_index_group_resolve_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_INDEX_GROUP_RESOLVE_ARGS_VERSION;
}

/* Stream-ordered, no host sync, no allocation, capturable. Every tensor must
 * be on the group's device. */
HS_API hs_status_t hs_index_group_resolve(hs_index_group_t group, const hs_index_group_resolve_args_t* args,
                                          hs_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_INDEX_GROUP_H_ */
