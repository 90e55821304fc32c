/*
 * hisparse runtime: the per-layer data plane an engine calls every decode
 * step (the seed's HiSparseRuntime and HiSparseSlotInvalidator).
 *
 * A runtime serves one attention layer. Layers that share one indexer output
 * form an index group: the first runtime created without a leader is the
 * group's leader and creates the group (an hs_index_group_t: hot-region
 * state, shared top-k outputs, counters) plus the group's copy stream and
 * events; runtimes created with that leader join the group as followers.
 *
 * Per decode step and layer (swap_in):
 *   - the leader makes the copy stream wait for the producer of the top-k
 *     (the top-k-ready event, or the compute stream), resolves residency once
 *     for the whole group into the shared top-k rows of this step, gathers
 *     its own missed rows (in the resolve launch itself with fused_gather)
 *     and, for a prefetch batch, every follower's missed rows on the copy
 *     stream (one gather per follower, or one for all with group_gather),
 *     recording one ready event per layer;
 *   - a layer that was not prefetched stages its own rows (the copy stream
 *     waits for the compute stream, gathers, records the layer's event);
 *   - every layer's compute stream then waits for its own ready event, so
 *     the attention kernel that follows on the compute stream reads rows that
 *     are in place.
 * A prefetch never serves a row the forward writes after it: a layer's
 * hs_runtime_write waits for the rows its leader prefetched for it and then
 * rewrites every hot copy of the slots it writes (docs/kv_cache.md, "The
 * prefetch invariant"). Host rows written any other way need their hot
 * copies dropped (the slot invalidator) before the next resolve.
 *
 * Token-major host layout: an SM reads host memory in 128-byte lines, so a
 * lone row of a few hundred bytes wastes part of a line at each end. When
 * the followers' host caches lie side by side within each host slot (one
 * token's rows of several layers adjacent, e.g. followers bound to
 * host[:, 1], host[:, 2], ... of a [slots, layers, W] pool), a prefetch
 * batch with group_gather = 1 stages all followers with one
 * hs_gather_compact_group (one contiguous read per missed slot) instead of
 * one gather per follower. It is opt-in per call because it trades latency
 * for bandwidth: the group gather moves the followers' bytes at a higher
 * rate, but every follower's ready event waits for all followers' bytes, so
 * the first followers' attention can no longer overlap the later followers'
 * copies. Use it only when a layer's attention is short next to a
 * follower's copy; with longer attention the per-follower gathers hide
 * behind it and finish the step sooner (docs/staging.md has the model,
 * docs/performance.md the measurements).
 * The leader gathers its own rows alone first either way. Precisely, the
 * followers (at least two) tile when all are bound with the same kv_dtype,
 * row width, host row count, host slot pitch (when there are two or more
 * slots) and hot view layout, and their host base addresses, sorted, are
 * exactly row_bytes apart within a pitch of at least followers x row_bytes.
 * hs_runtime_info_t.followers_staged_together tells whether the bindings of
 * the moment tile, i.e. allow group_gather = 1. Bytes, outputs and events
 * are those of per-follower gathers. More than
 * HS_MAX_GATHER_GROUP_PIECES followers take one launch per run of at most
 * that many adjacent pieces.
 *
 * Results are the attention indices (and valid counts) in the group's shared
 * top-k rows (hs_index_group_get_tensor on hs_runtime_get_index_group),
 * rows [first_row, first_row + num_rows) of the call.
 *
 * Step rows: hs_runtime_begin_forward resets a runtime's row cursor; each
 * swap_in takes the next num_tokens rows of the shared state (several
 * swap_in calls per forward, e.g. speculative drafts, take consecutive rows)
 * and fails when they pass max_swap_rows.
 *
 * Everything on the decode path (begin_forward, swap_in, reset_hot_state,
 * invalidate_sorted_slots, copy_stats_async, mirror_rows, and the slot
 * invalidator once warmed up) is stream-ordered, never blocks the host,
 * never allocates, and can be captured into a CUDA graph: streams only wait
 * on events recorded by the same call sequence. The CPU backend runs all of
 * it synchronously (its streams and events are no-ops).
 *
 * Binding: the runtime stores descriptors of the memory it is bound to, not
 * the memory. The caller keeps the host cache, the hot-cache slab and the
 * block table alive, at the same address, until hs_runtime_unbind or
 * hs_runtime_destroy; their *contents* may change between steps.
 *
 * Thread safety: the runtimes of one index group share host-side state (the
 * member list, the rows the leader resolved in this forward, the copy
 * stream), so calls on runtimes of one group must not run concurrently.
 * Runtimes of different groups are independent. hs_runtime_get_info and
 * hs_runtime_get_stats only read, but must not race a call that changes the
 * runtime or hs_runtime_destroy.
 *
 * Include this header directly or through hisparse/hisparse.h.
 */
#ifndef HISPARSE_RUNTIME_H_
#define HISPARSE_RUNTIME_H_

#include "hisparse/hisparse.h"
#include "hisparse/index_group.h"
#include "hisparse/shared_host_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_runtime* hs_runtime_t;

/* ------------------------------------------------------------------ creation */

/* Whether a group keeps a residency hint. AUTO, the default, keeps one where
 * its resolves can read from it: a CUDA group without speculative tokens
 * (config->num_speculative_tokens == 0) whose max_num_reqs is below half the
 * device's SMs and whose resolver arrays fit one block's shared memory, so
 * that every launch has helper blocks that read predicted misses early;
 * elsewhere nothing reads the hint, or (from half the SMs on) only the
 * helpers of a launch's first requests, and every request pays its upkeep. */
typedef enum hs_residency_hint_choice {
  HS_RESIDENCY_HINT_OFF = 0,
  HS_RESIDENCY_HINT_ON = 1,
  HS_RESIDENCY_HINT_AUTO = 2
} hs_residency_hint_choice_t;

/* What HS_RESIDENCY_HINT_AUTO decides for a leader of `config` and
 * `max_num_reqs` request state rows on the device (device_type, device_index
 * as in hs_runtime_options_t): *keeps = 1 keeps a hint, 0 none. Blocks
 * only to read the device's properties. */
HS_API hs_status_t hs_runtime_default_residency_hint(const hs_config_t* config, int32_t max_num_reqs,
                                                     int32_t device_type, int32_t device_index, int32_t* keeps);

typedef struct hs_runtime_options {
  size_t struct_size;
  uint32_t struct_version;
  const hs_config_t* config; /* required: sizes, row_bytes, block sizes, eager_host_mirror */
  int32_t device_type;       /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index;      /* CUDA device; -1 = the calling thread's current device */
  int32_t max_num_reqs;      /* S: request state rows, >= 1 */
  int32_t max_swap_rows;     /* R: token rows of the shared top-k state per forward; 0 = the leader's on a follower,
                                else max_num_reqs x (1 + config->num_speculative_tokens) (hs_default_max_swap_rows) */
  int32_t kv_dtype;          /* hs_dtype_t of the KV rows; row width = config->row_bytes / its size */
  int32_t residency_hint;    /* hs_residency_hint_choice_t: whether the group keeps a residency hint for its
                                CUDA resolves, from which the fused gather predicts the misses it reads early
                                instead of from the state (docs/residency.md, "Residency hint"). A leader's
                                choice: a follower gives HS_RESIDENCY_HINT_AUTO (default) or _OFF */
  hs_runtime_t leader;       /* NULL: become a group leader; else join this runtime's group */
  /* leader only (NULL for followers) */
  hs_stream_t copy_stream;   /* borrowed copy stream; NULL = the group creates and owns one */
  void* topk_ready_event;    /* borrowed cudaEvent_t that the top-k producer records; NULL = none */
} hs_runtime_options_t;
#define HS_RUNTIME_OPTIONS_VERSION 1

/* Defaults: CPU backend, uint8 rows, the default max_swap_rows, leader with
 * its own copy stream, residency hint where it pays (HS_RESIDENCY_HINT_AUTO).
 * Set config and max_num_reqs. */
static inline void hs_runtime_options_init(hs_runtime_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_RUNTIME_OPTIONS_VERSION;
  options->device_type = HS_DEVICE_CPU;
  options->device_index = -1;
  options->kv_dtype = HS_DTYPE_UINT8;
  options->residency_hint = HS_RESIDENCY_HINT_AUTO;
}

/* Create a runtime. Without a leader it creates the index group (sized by
 * config->top_k, device_buffer_size, max_union_rows, max_num_reqs and
 * max_swap_rows), the copy stream (unless one is given) and the group's
 * events; with a leader it joins the leader's group, and its device,
 * max_num_reqs and max_swap_rows (0 = the leader's) and config's top_k,
 * device_buffer_size, max_union_rows and hot_block_size must equal the
 * leader's (row_bytes, kv_dtype, block_size and eager_host_mirror may
 * differ). A borrowed copy stream or event must outlive the group.
 * Blocking (allocates and initialises the group); not for the decode path.
 * On failure *runtime is NULL and nothing is leaked. The caller owns the
 * runtime and frees it with hs_runtime_destroy. Errors name the option. */
HS_API hs_status_t hs_runtime_create(const hs_runtime_options_t* options, hs_runtime_t* runtime);

/* Leave the group and free the runtime. NULL is accepted. The group's memory,
 * copy stream and events live until its last runtime is destroyed, so
 * followers may outlive their leader (their swap_in then fails with
 * HS_ERROR_INVALID_STATE: nobody resolves for them). The caller guarantees
 * that no device work still uses what is freed (synchronise first). Does not
 * synchronise. */
HS_API hs_status_t hs_runtime_destroy(hs_runtime_t runtime);

/* The runtime's index group: a borrowed handle, valid while any runtime of
 * the group lives. Use it to read the shared top-k rows and the hot-region
 * state (hs_index_group_get_tensor); do not destroy it. Non-blocking. */
HS_API hs_status_t hs_runtime_get_index_group(hs_runtime_t runtime, hs_index_group_t* group);

typedef struct hs_runtime_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t is_leader;
  int32_t group_size;             /* live runtimes in the group (leader included while it lives) */
  int32_t device_type;
  int32_t device_index;
  int32_t max_num_reqs;
  int32_t max_swap_rows;
  int32_t top_k;
  int32_t device_buffer_size;
  int32_t max_union_rows;
  int32_t num_speculative_tokens;
  int32_t row_bytes;
  int32_t kv_dtype;
  int32_t row_width;              /* elements of kv_dtype per row */
  int32_t block_size;             /* config: tokens per source block */
  int32_t hot_block_size;         /* config: tokens per hot block */
  int32_t eager_host_mirror;
  int32_t source_bound;           /* 1 after bind_source_cache */
  int32_t hot_bound;              /* 1 after bind_hot_cache */
  int32_t staged;                 /* 1 while this layer's rows are staged and not yet waited for */
  int32_t followers_staged_together; /* 1 on a leader whose followers' layout allows group_gather: their
                                        host caches tile one token-major span as the bindings stand now
                                        (see "Token-major host layout" above); 0 otherwise and on
                                        followers. It reports the layout, not what a call did. */
  int64_t host_rows;              /* rows of the bound host cache (0 unbound) */
  int64_t hot_num_blocks;         /* blocks of the bound hot view (0 unbound) */
  int64_t attention_block_stride; /* rows between hot blocks (block_stride / row_bytes; 0 unbound) */
  int64_t next_row;               /* first shared row the next swap_in takes */
  uint64_t group_row_bytes;       /* row_bytes summed over the group's live runtimes */
  int32_t is_writer;              /* 1 when this runtime writes its host cache (see hs_runtime_set_host_sharing) */
  int32_t host_role;              /* hs_host_role_t as set (HS_HOST_ROLE_AUTO unless set) */
  int32_t residency_hint;         /* 1 when the group keeps a residency hint (the leader's choice, with
                                     HS_RESIDENCY_HINT_AUTO decided at its creation; on the CPU backend
                                     only ON reports 1, and nothing is allocated); version 2 */
} hs_runtime_info_t;
#define HS_RUNTIME_INFO_VERSION 2

/* Non-blocking. Set info->struct_size (sizeof(hs_runtime_info_t)). */
HS_API hs_status_t hs_runtime_get_info(hs_runtime_t runtime, hs_runtime_info_t* info);

/* ------------------------------------------------------------------ binding */

/* Bind the host (source) cache: `host_cache` is [rows, ..., row_width] of
 * the runtime's kv_dtype whose leading dimensions flatten to rows at one
 * uniform pitch (16-byte aligned rows); its rows are the host slots. It must
 * be host memory: on CUDA registered or pinned (kernels read it zero-copy),
 * else HS_ERROR_INVALID_ARGUMENT naming host_cache. `registered_host_pool`
 * (optional) is the registered range the cache lies in (the seed's
 * registered_host_pool); the cache must lie within it. Replaces an earlier
 * binding. The cache must not share memory with the group's state or with
 * a hot view or block table bound in the group (two runtimes may read one
 * host cache). When it lies in a hisparse host pool, every later call that
 * reads or writes it (swap_in, mirror_rows, a leader staging this follower)
 * fails with HS_ERROR_INVALID_STATE naming host_cache once that pool is
 * released, instead of touching the memory. Non-blocking (host checks only);
 * not for the decode path. */
HS_API hs_status_t hs_runtime_bind_source_cache(hs_runtime_t runtime, const hs_tensor_t* host_cache,
                                                const hs_tensor_t* registered_host_pool);

/* The hot cache: a strided view into a shared device slab (the seed's
 * PagedCacheView.bind). Block b of the view starts byte_offset + b *
 * block_stride bytes into the slab and holds block_size rows of row_bytes.
 * Physical hot row r is row r % block_size of block r / block_size; the
 * attention kernel addresses it as (r / block_size) * attention_block_stride
 * + r % block_size rows from the view's start, attention_block_stride =
 * block_stride / row_bytes. The view (written by the gathers) must not share
 * a byte with its block table, the group's state, or another binding of the
 * group; views of layers interleaved block by block in one slab do not. */
typedef struct hs_hot_cache_binding {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* raw_tensor;  /* the slab: contiguous, any dtype, on the runtime's device */
  int64_t byte_offset;            /* >= 0, a multiple of 16 */
  int64_t block_stride;           /* bytes between blocks: a multiple of row_bytes, >= block_size * row_bytes */
  int64_t num_blocks;             /* >= 1; the view must end within the slab */
  int64_t block_size;             /* rows per block: the config's hot_block_size */
  const hs_tensor_t* block_table; /* int32 [B, >= ceil(H / block_size)] on the runtime's device */
} hs_hot_cache_binding_t;
#define HS_HOT_CACHE_BINDING_VERSION 1

static inline void hs_hot_cache_binding_init(hs_hot_cache_binding_t* binding) {
  memset(binding, 0, sizeof(*binding));
  binding->struct_size = sizeof(*binding);
  binding->struct_version = HS_HOT_CACHE_BINDING_VERSION;
}

/* The view hs_runtime_bind_hot_cache would bind, of any slab: the data
 * pointer of block 0's first row and the shape [num_blocks, block_size,
 * row_width] with element strides of `dtype` (an hs_dtype_t) for a
 * contiguous raw_tensor, byte_offset, block_stride (bytes), num_blocks and
 * block_size, checked by the same rules (errors name the argument); e.g. the
 * paged view of a layer's resident cache. Host-only. */
typedef struct hs_paged_view {
  size_t struct_size;
  uint32_t struct_version;
  void* data;
  int64_t shape[3];
  int64_t strides[3];
} hs_paged_view_t;
#define HS_PAGED_VIEW_VERSION 1

HS_API hs_status_t hs_paged_cache_view(const hs_tensor_t* raw_tensor, int32_t dtype, int64_t row_width,
                                       int64_t byte_offset, int64_t block_stride, int64_t num_blocks,
                                       int64_t block_size, hs_paged_view_t* view);

/* Bind the hot cache. Every number is checked against the slab's extent; a
 * follower must have its leader's block size and attention_block_stride
 * (checked here when the other is bound, and at every swap_in). Replaces an
 * earlier binding. Non-blocking (host checks only); not for the decode path. */
HS_API hs_status_t hs_runtime_bind_hot_cache(hs_runtime_t runtime, const hs_hot_cache_binding_t* binding);

/* Restore the unbound state (no source, no hot cache, no staged rows). Host
 * memory registrations are not touched. Non-blocking. */
HS_API hs_status_t hs_runtime_unbind(hs_runtime_t runtime);

/* Borrowed descriptors of the bound host cache (as given) and of the hot
 * view ([num_blocks, block_size, row_width] of kv_dtype, block stride
 * block_stride bytes). Valid until the next bind/unbind/destroy.
 * HS_ERROR_INVALID_STATE when unbound. Non-blocking. */
HS_API hs_status_t hs_runtime_get_host_cache(hs_runtime_t runtime, hs_tensor_t* out);
HS_API hs_status_t hs_runtime_get_hot_cache(hs_runtime_t runtime, hs_tensor_t* out);

/* ------------------------------------------------------------------ decode step */

/* Start a forward: reset this runtime's row cursor to 0 and drop staged
 * rows that were never waited for; on the leader also forget the rows it
 * resolved (so a follower called before its leader in the new forward
 * fails). Call it on every runtime of the group before the forward's first
 * swap_in. Host-only; capturable (it enqueues nothing). */
HS_API hs_status_t hs_runtime_begin_forward(hs_runtime_t runtime);

typedef struct hs_runtime_swap_in_args {
  size_t struct_size;
  uint32_t struct_version;
  /* read by the leader (followers may leave them NULL) */
  const hs_tensor_t* topk_indices;          /* int32 [T, k], k <= K: request-relative positions, -1 = none;
                                               a follower refuses one (it reuses its leader's resolution) */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= T] */
  const hs_tensor_t* request_state_indices; /* int32 [B], -1 = padding */
  const hs_tensor_t* source_block_table;    /* int32 [B, W], optional: NULL = positions are host slots */
  int64_t block_size;                       /* tokens per source block; 0 = config block_size */
  const hs_tensor_t* resident_block_table;  /* int32 [B, Wr], optional: > 0 = page resident on the GPU */
  int64_t resident_block_size;              /* 0 = the hot block size */
  const hs_tensor_t* num_valid_rows;        /* int32 [1], optional: rows at or past it are padding */
  const hs_tensor_t* out_attention;         /* int32 [>= T, K], optional: attention indices here */
  const hs_tensor_t* out_valid_counts;      /* int32 [>= T], optional: valid counts here */
  int32_t prefetch;                         /* 1 = stage every follower's rows now (a prefetch batch) */
  int32_t ignore_topk_ready;                /* 1 = wait for the compute stream even with a top-k-ready event */
  int32_t fused_gather;                     /* 0 or 1 on every runtime, acted on by the leader only: 1 (the
                                               default, HS_DEFAULT_FUSED_GATHER) = the resolve launch also copies
                                               the leader's own rows, in its automatic schedule; 0 = a separate
                                               gather after the resolve */
  int32_t group_gather;                     /* 0 or 1 on every runtime, acted on by the leader only: 1 = stage
                                               the followers of this prefetch batch with one group gather */
  /* read by every runtime */
  int64_t num_tokens;                       /* T; 0 = rows of topk_indices (required then) */
  /* read by the leader */
  const hs_tensor_t* seq_lens;              /* int32 [>= B], optional: positions at or past seq_lens[b] of batch
                                               row b are dropped (-1) before the resolve; ready when the top-k is
                                               (it is read on the copy stream after the top-k-ready wait) */
} hs_runtime_swap_in_args_t;
#define HS_RUNTIME_SWAP_IN_ARGS_VERSION 1

/* The leader's path when the caller does not choose: the fused gather's
 * automatic schedule, which decides per request on the device whether the
 * resolve launch or a gather right after it copies the rows (never the
 * separate path's extra launch for a request of few misses, never one SM
 * for a request of many). */
#define HS_DEFAULT_FUSED_GATHER 1

static inline void hs_runtime_swap_in_args_init(hs_runtime_swap_in_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_RUNTIME_SWAP_IN_ARGS_VERSION;
  args->fused_gather = HS_DEFAULT_FUSED_GATHER;
}

typedef struct hs_runtime_swap_in_result {
  size_t struct_size;
  uint32_t struct_version;
  int64_t first_row;  /* this call's shared top-k rows are [first_row, first_row + num_rows) */
  int64_t num_rows;
  int32_t prefetched; /* 1 when the leader had staged this layer's rows */
  int32_t reserved0;
} hs_runtime_swap_in_result_t;
#define HS_RUNTIME_SWAP_IN_RESULT_VERSION 1

/* Resolve once per group and make this layer's rows available before the
 * next work on `stream` (the compute stream), as described at the top of
 * this file. A top-k narrower than the config's top_k (k < K columns) and
 * per-request lengths (seq_lens) are applied before the resolve: the
 * positions, padded with -1 to K columns and with those at or past their
 * request's length set to -1, are copied into a buffer the group owns and
 * resolved from there; the attention indices of the call are then columns
 * [0, k) of the shared rows (columns k .. K-1 are -1), and the padded and
 * dropped entries count as lookups and invalid entries. The leader resolves with its bound hot block table, its host
 * cache's row count and attention_block_stride; followers move their own
 * bytes with the leader's swap list. `result` may be NULL.
 * Errors: HS_ERROR_INVALID_STATE ("layer swap was not prefetched") for an
 * unbound runtime or follower, a follower called before its leader resolved
 * its rows in this forward, a follower whose leader was destroyed, or a
 * follower whose staged rows differ from the rows it asks for;
 * HS_ERROR_INVALID_ARGUMENT for rows past max_swap_rows, a follower whose
 * block size or attention_block_stride differs from its leader's, bad
 * tensors, and tensors that share memory with what the call writes (its
 * outputs, the group's state, the bound hot views) or an output over what
 * it reads (named); HS_ERROR_INVALID_STATE for a source cache whose host
 * pool was released. A failed call takes no rows.
 *
 * fused_gather = 1 on the leader (the default): the resolve launch itself
 * copies the leader's own missed rows into its hot cache (hs_resolve_residency's fused
 * gather with the bound host cache, hot view and attention_block_stride, in
 * its automatic schedule: a request with many misses publishes its swap
 * list to the same launch's helper blocks, through the index group's
 * handoff array; past the SM count, up to twice it, one block per SM
 * resolves two requests in turn and then copies both swap lists, where two
 * requests' arrays would fit one SM's shared memory, and otherwise the same
 * call enqueues a tail gather right after the resolve), so
 * the leader enqueues no gather of its own; its ready event is recorded on
 * the copy stream right after the resolve (and its tail gather, if any). Bytes, outputs, state and
 * counters are those of fused_gather = 0; followers (prefetched or not) still
 * gather on the leader's swap list. It pays off when few rows miss
 * (steady-state decode: one launch and one dependent wait fewer per step):
 * see docs/residency.md, "Fused gather". Followers ignore the flag (they never
 * resolve), but it must still be 0 or 1.
 *
 * group_gather = 1 on the leader: the prefetch batch stages all followers
 * with one hs_gather_compact_group from their token-major host span instead
 * of one gather per follower (see "Token-major host layout" above for when
 * that pays). It needs prefetch = 1 (HS_ERROR_INVALID_ARGUMENT naming both
 * otherwise) and followers whose host caches tile; when they do not, the call
 * fails with HS_ERROR_INVALID_ARGUMENT naming group_gather and the condition
 * that failed, before anything is enqueued (no rows taken, nothing staged).
 * Bytes, outputs, state, counters and events are those of group_gather = 0.
 * Followers ignore the flag (they never stage others), but it must still be
 * 0 or 1.
 * Stream-ordered, no host sync, no allocation, capturable. */
HS_API hs_status_t hs_runtime_swap_in(hs_runtime_t runtime, const hs_runtime_swap_in_args_t* args,
                                      hs_runtime_swap_in_result_t* result, hs_stream_t stream);

/* Drop all hot-buffer bookkeeping of the group (hits become misses): the
 * reset runs on the copy stream after everything enqueued so far on `stream`
 * and on the copy stream, and `stream` waits for it. Capturable. */
HS_API hs_status_t hs_runtime_reset_hot_state(hs_runtime_t runtime, hs_stream_t stream);

/* Rebuild the group's residency hint (docs/residency.md, "Residency hint")
 * from its state: call it after writing device_global_indices directly (a
 * restored snapshot), whose rows the hint would otherwise mispredict. Runs
 * on the copy stream like hs_runtime_reset_hot_state; a no-op without a
 * hint (a leader created without residency_hint, the CPU, or before the
 * leader binds a source cache). Capturable. */
HS_API hs_status_t hs_runtime_rebuild_residency_hint(hs_runtime_t runtime, hs_stream_t stream);

/* Drop hot copies of the group using shared, preprocessed inputs
 * (hs_index_group_invalidate_sorted_slots on `stream`). Capturable. */
HS_API hs_status_t hs_runtime_invalidate_sorted_slots(hs_runtime_t runtime, const hs_tensor_t* sorted_slots,
                                                      const hs_tensor_t* state_indices, hs_stream_t stream);

/* Keep the host pool authoritative for KV written on the GPU:
 * host_cache[slot_mapping[i]] = src_rows[i] (hs_mirror_rows into the bound
 * host cache; src_rows on the runtime's device, same dtype and row width).
 * It leaves hot copies of the slots as they are: use hs_runtime_write, which
 * also rewrites them, for rows a hot buffer may hold. A writer records its
 * host event after the mirror. HS_ERROR_INVALID_STATE without a bound source
 * cache, and on a reader of a shared pool (readers never write the pool).
 * Capturable. */
HS_API hs_status_t hs_runtime_mirror_rows(hs_runtime_t runtime, const hs_tensor_t* src_rows,
                                          const hs_tensor_t* slot_mapping, hs_stream_t stream);

/* Drop the hot-region state of one request (state row `state_row`, 0 <=
 * state_row < max_num_reqs) in the runtime's group: nothing held, LRU order
 * 0 .. H-1; other rows and the counters are untouched. Ordered like
 * hs_runtime_reset_hot_state (on the copy stream, between earlier and later
 * work of `stream`). Call it when a state row changes hands (admit or
 * release), so that a new request is never served the previous one's rows.
 * Capturable. */
HS_API hs_status_t hs_runtime_reset_request(hs_runtime_t runtime, int32_t state_row, hs_stream_t stream);

/* The write op: store this forward's new rows of the layer so that no stale
 * copy of them can be served (hs_write_rows on the runtime's bindings):
 * rows[t] goes to its host slot in the bound host cache (positions through
 * source_block_table, or positions are host slots without one), to its
 * resident copy when resident_cache and resident_block_table are given, and
 * over every hot copy of that slot that the group's device_global_indices
 * holds for its state row, in the bound hot view (write-through). The call
 * first makes `stream` wait for this layer's rows its leader prefetched in
 * this forward, so a prefetched copy never lands after the write: follower
 * prefetch is correct whatever the group's order of writes and resolves.
 * The host store is skipped when skip_host_store = 1 and on a reader of a
 * shared pool (the writer stores the rows; the reader, which computed the
 * same rows, updates only its own device copies); a writer records its host
 * event (hs_runtime_set_host_sharing) after the store. HS_ERROR_INVALID_STATE
 * for an unbound runtime. Stream-ordered, capturable. */
typedef struct hs_runtime_write_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* rows;                  /* [T, row_width] of kv_dtype on the runtime's device */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= T]: batch row of each row */
  const hs_tensor_t* positions;             /* int32 or int64 [>= T]: request-relative positions (host slots
                                               without a source table) */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* source_block_table;    /* int32 [B, W], optional */
  int64_t block_size;                       /* tokens per source block; 0 = config block_size */
  const hs_tensor_t* resident_cache;        /* paged view [blocks, block size, row_width], optional */
  const hs_tensor_t* resident_block_table;  /* int32 [B, Wr], optional (with resident_cache) */
  int32_t skip_host_store;                  /* 1 = leave the host cache alone (rows reach it otherwise) */
  int32_t reserved0;
} hs_runtime_write_args_t;
#define HS_RUNTIME_WRITE_ARGS_VERSION 1

static inline void hs_runtime_write_args_init(hs_runtime_write_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_RUNTIME_WRITE_ARGS_VERSION;
}

HS_API hs_status_t hs_runtime_write(hs_runtime_t runtime, const hs_runtime_write_args_t* args, hs_stream_t stream);

/* Which process writes the host cache. One rank of a shared pool writes rows
 * (the pool's writer_rank); the others only read it. HS_HOST_ROLE_AUTO (the
 * default) learns the role from the pool at bind_source_cache: a host cache
 * inside a live shared pool of this process takes that pool's role, any
 * other memory is written by its owner. A reader refuses hs_runtime_mirror_rows
 * and skips the host store of hs_runtime_write. */
typedef enum hs_host_role { HS_HOST_ROLE_AUTO = 0, HS_HOST_ROLE_WRITER = 1, HS_HOST_ROLE_READER = 2 } hs_host_role_t;

typedef struct hs_runtime_host_sharing {
  size_t struct_size;
  uint32_t struct_version;
  int32_t role;         /* hs_host_role_t */
  hs_ipc_event_t event; /* borrowed, optional (NULL = none): the writer records it on its stream after each host
                           write (mirror_rows, write); a reader makes the copy stream wait on it before every gather
                           from the host cache (a resolve with fused gather, a stage, a prefetch). It must live on
                           the runtime's device and outlive the runtime's use of it */
} hs_runtime_host_sharing_t;
#define HS_RUNTIME_HOST_SHARING_VERSION 1

static inline void hs_runtime_host_sharing_init(hs_runtime_host_sharing_t* sharing) {
  memset(sharing, 0, sizeof(*sharing));
  sharing->struct_size = sizeof(*sharing);
  sharing->struct_version = HS_RUNTIME_HOST_SHARING_VERSION;
}

/* Set the runtime's host role and event (replacing earlier ones). Host-only. */
HS_API hs_status_t hs_runtime_set_host_sharing(hs_runtime_t runtime, const hs_runtime_host_sharing_t* sharing);

/* ------------------------------------------------------------------ counters */

/* Enqueue a copy of the group's device counters into their host mirror on
 * `stream`. Capturable. */
HS_API hs_status_t hs_runtime_copy_stats_async(hs_runtime_t runtime, hs_stream_t stream);

/* Zero the group's device counters without touching the hot state: ordered
 * like hs_runtime_reset_hot_state (on the copy stream, between earlier and
 * later work of `stream`). Capturable. */
HS_API hs_status_t hs_runtime_reset_stats(hs_runtime_t runtime, hs_stream_t stream);

typedef struct hs_runtime_stats {
  size_t struct_size;
  uint32_t struct_version;
  int32_t num_layers;       /* live runtimes of the group */
  int64_t lookups;
  int64_t hits;
  int64_t misses;
  int64_t resident;
  int64_t invalid;
  double hit_rate;          /* hits / (hits + misses); 0 before any lookup */
  uint64_t group_row_bytes; /* row_bytes summed over the group's live runtimes */
  uint64_t bytes_moved;     /* misses x group_row_bytes: bytes every layer of the group loaded */
} hs_runtime_stats_t;
#define HS_RUNTIME_STATS_VERSION 1

/* The group's counters as the last completed hs_runtime_copy_stats_async
 * left them (synchronise its stream first). Non-blocking. */
HS_API hs_status_t hs_runtime_get_stats(hs_runtime_t runtime, hs_runtime_stats_t* stats);

/* ------------------------------------------------------------------ slot invalidator */

/* Drop hot copies of rewritten host slots for many index groups in one
 * launch (the seed's HiSparseSlotInvalidator): hs_invalidate_written_slots
 * over the device_global_indices of the groups of the given runtimes, with a
 * device array of their table pointers that is built once per set of groups
 * and cached. */
typedef struct hs_slot_invalidator* hs_slot_invalidator_t;

/* Create an empty cache for device (device_type, device_index; -1 = the
 * current CUDA device). Non-blocking. Not thread-safe: one thread at a time
 * per invalidator. */
HS_API hs_status_t hs_slot_invalidator_create(int32_t device_type, int32_t device_index,
                                              hs_slot_invalidator_t* invalidator);

/* Free the cached device arrays. NULL is accepted. The caller guarantees no
 * device work still reads them (synchronise first). */
HS_API hs_status_t hs_slot_invalidator_destroy(hs_slot_invalidator_t invalidator);

/* Invalidate written_slots[:n] (n = min(numel(written_slots),
 * numel(req_id_per_token))) in the groups of runtimes[0 .. num_runtimes-1]
 * (typically the leaders; all groups must share one [S, H] layout and the
 * invalidator's device). Does nothing when n == 0 or num_runtimes == 0.
 * The first call with a new set of groups allocates and fills the pointer
 * array and waits for it (blocking: make it once outside CUDA-graph capture);
 * later calls with the same set are stream-ordered, allocation-free and
 * capturable. */
HS_API hs_status_t hs_slot_invalidator_run(hs_slot_invalidator_t invalidator, const hs_runtime_t* runtimes,
                                           int32_t num_runtimes, const hs_tensor_t* request_state_indices,
                                           const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots,
                                           hs_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_RUNTIME_H_ */
