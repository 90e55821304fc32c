/*
 * hisparse KV cache: the model-level object that owns everything one model's
 * sparse-attention KV needs, built in one call from a layer -> group map,
 * and the kernels it runs, also callable on their own.
 *
 * An hs_kv_cache_t holds, for L layers of rows of row_bytes (kv_dtype):
 *   - the host cache: one host pool (private, made by the cache, or a pool
 *     the caller passes, e.g. a shared one), laid out token-major as
 *     [host_rows, L, row_width]: host slot g holds the rows of every layer
 *     side by side; request state row s owns host blocks 1 + s * P .. (P =
 *     ceil(max_seq_len / block_size)), block 0 is the null block;
 *   - the device slab [L, num_blocks, hot_block_size, row_width]: per layer
 *     one paged cache whose block 0 is unused, then each state row's
 *     ceil(H / hot_block_size) hot blocks, then each state row's resident
 *     blocks (resident_pages pages of resident_page_size positions);
 *   - the tables, indexed by state row (batch row b of every call is state
 *     row b): request_state_indices (0 .. S-1), the source block table, the
 *     hot block table, the resident blocks of each state row, the resident
 *     block table (rewritten by begin_forward) and the request lengths;
 *   - one hs_runtime_t per layer: the first layer of each group leads its
 *     index group, the others follow it (followers reuse the leader's
 *     resolution and move only their own bytes).
 *
 * Empty entries: in every table of the cache, 0 means "none" (no host block,
 * not resident); block 0 of the host pool and of the slab never holds data,
 * so the three rules of the raw kernels agree here. The raw rules, for
 * callers with tables of their own: a source (host) block <= 0 is none (block
 * 0 is the host pool's null block); a resident block > 0 is resident, <= 0 is
 * not; a hot block >= 0 is usable and < 0 is not (hot block 0 is an ordinary
 * block of a slab). docs/kv_cache.md says the same with examples.
 *
 * Per forward: hs_kv_cache_begin_forward(lengths after this forward's
 * tokens), then per layer in order hs_kv_cache_write (the layer's new rows),
 * hs_kv_cache_swap_in (the leader with its top-k, a follower with the token
 * count) and hs_kv_cache_read (or an attention kernel reading the slab at the
 * attention indices). Everything on that path is stream-ordered, never
 * blocks the host, never allocates and is capturable in a CUDA graph.
 * Follower prefetch is always correct: a write rewrites every hot copy of its
 * host slot (write-through, after the layer's prefetched rows have landed),
 * so a row the forward writes after its leader resolved can never be served
 * stale. Admit and release reset one request's hot state in every group
 * and its ring pages (no page of it resident until a forward reaches it).
 *
 * Include this header directly or through hisparse/hisparse.h.
 */
#ifndef HISPARSE_KV_CACHE_H_
#define HISPARSE_KV_CACHE_H_

#include "hisparse/hisparse.h"
#include "hisparse/runtime.h"
#include "hisparse/shared_host_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ kernels */

/* The write of T new rows of one layer (docs/kv_cache.md, "write_rows"). For
 * token row t with batch row b = req_id_per_token[t] in [0, B) and state row
 * s = request_state_indices[b] >= 0 (else the token writes nothing), position
 * p = positions[t]:
 *   - host slot g = source_block_table[b, p / block_size] * block_size +
 *     p % block_size (none for p < 0, a block past the table, a block <= 0,
 *     or g >= host rows); without a source table g = p;
 *   - host_cache[g] = rows[t] when g exists and host_cache is given;
 *   - the resident copy: r = resident_block_table[b, p / rbs] > 0 (rbs =
 *     dim 1 of resident_cache) puts the row at resident_cache[r, p % rbs];
 *   - hot copies: every hot slot j of device_global_indices[s] holding g gets
 *     the row at hot_cache[hot_block_table[b, j / hbs], j % hbs] (hbs = dim 1
 *     of hot_cache; a negative hot block or one past the table is skipped).
 * Destinations outside their tensors are skipped. Two token rows of one call
 * that write one host slot leave one of their rows (which one is
 * unspecified). rows, tables and caches on one device; host_cache host memory
 * (registered on CUDA); resident_cache and hot_cache paged views [blocks,
 * block size, row width] of rows' dtype and width. The three caches share no
 * byte with each other or with any input, except that resident_cache and
 * hot_cache may be one paged view (one base address, block size and block
 * stride: resident pages among the hot blocks). Stream-ordered,
 * capturable. */
typedef struct hs_write_rows_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* rows;                  /* [T, W] */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= T] */
  const hs_tensor_t* positions;             /* int32 or int64 [>= T] */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* host_cache;            /* [..., W], optional: NULL = no host store */
  const hs_tensor_t* source_block_table;    /* int32 [B, Ws], optional: NULL = positions are host slots */
  int64_t block_size;                       /* tokens per source block (> 0 with a source table) */
  int64_t host_rows;                        /* host slots of the mapping when host_cache is NULL; 0 = no limit */
  const hs_tensor_t* resident_cache;        /* paged view, optional (with resident_block_table) */
  const hs_tensor_t* resident_block_table;  /* int32 [B, Wr], optional */
  const hs_tensor_t* hot_cache;             /* paged view, optional (with the two below) */
  const hs_tensor_t* hot_block_table;       /* int32 [B, Wh], optional */
  const hs_tensor_t* device_global_indices; /* int32 [S, H] of the index group, optional */
} hs_write_rows_args_t;
#define HS_WRITE_ROWS_ARGS_VERSION 1

static inline void hs_write_rows_args_init(hs_write_rows_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_WRITE_ROWS_ARGS_VERSION;
}

HS_API hs_status_t hs_write_rows(const hs_write_rows_args_t* args, hs_stream_t stream);

/* out[t, k] = the row of `cache` at row offset indices[t, k] (the attention
 * addressing of hisparse/runtime.h: block r / bs * block stride + r % bs),
 * zeros for an index < 0 or past the cache's rows. cache: a paged view
 * [blocks, bs, W] (rows contiguous within a block) or rows [N, W]; indices
 * int32 [T, k] (unit column stride); out [T, k, W] contiguous, cache's dtype
 * and width, on the cache's device, sharing no byte with cache or indices. The read an attention kernel (or a test)
 * makes of exactly the rows hisparse resolved. Stream-ordered, capturable. */
HS_API hs_status_t hs_read_rows(const hs_tensor_t* cache, const hs_tensor_t* indices, const hs_tensor_t* out,
                                hs_stream_t stream);

/* The newest pages of every request resident (the seed's
 * update_hisparse_residency for the newest-pages policy). For batch row b
 * with state row s = request_state_indices[b] in [0, S) and length L =
 * seq_lens[b] > 0: page g (page_size = blocks_per_page x table_block_size
 * positions) is in the window last - num_pages < g <= last, last = (L - 1) /
 * page_size, and lives in ring slot g % num_pages of the state row's blocks:
 * table[b, q] = resident_blocks[s, (g % num_pages) * blocks_per_page + q %
 * blocks_per_page] for every table column q of a resident page g = q /
 * blocks_per_page; every other entry (and every entry of a padding row or a
 * row of length <= 0) is 0. Pages are kept at any size that is a whole
 * number of table blocks; a table at the hot block size is what
 * hs_runtime_swap_in reads.
 *
 * A page's rows stay valid while every row of it is written while the page
 * is resident (begin each forward with the lengths after it). A length that
 * falls back across a page boundary (rejected draft tokens) would bring an
 * earlier page back into a ring slot a later page has written; ring_pages
 * keeps that from serving stale rows. With ring_pages (int32 [>= S, >=
 * num_pages], read and written): every page in a window of the call first
 * claims its slot, ring_pages[s, g % num_pages] = max(itself, g), and then a
 * page in a window is resident only when its slot holds it
 * (ring_pages[s, g % num_pages] == g after all claims); a page whose slot a
 * later page holds is served from the host and hot copies. -1 = a slot that
 * holds no page: fill a state row's entries with -1 when a new request
 * takes it. Without ring_pages (null), every page in a window is resident,
 * and lengths must never fall back across a page boundary.
 * Stream-ordered, capturable. */
typedef struct hs_update_residency_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* resident_block_table;  /* int32 [B, Wt], written (sharing no byte with the inputs) */
  int64_t table_block_size;                 /* positions per table entry, > 0 */
  int32_t blocks_per_page;                  /* table entries per page, > 0 */
  int32_t num_pages;                        /* newest pages kept resident, >= 0 */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* seq_lens;              /* int32 [>= B] */
  const hs_tensor_t* resident_blocks;       /* int32 [S, num_pages x blocks_per_page] */
  /* version 2 */
  const hs_tensor_t* ring_pages; /* int32 [>= S, >= num_pages], read and written; null = none (see above) */
} hs_update_residency_args_t;
#define HS_UPDATE_RESIDENCY_ARGS_VERSION 2

static inline void hs_update_residency_args_init(hs_update_residency_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_UPDATE_RESIDENCY_ARGS_VERSION;
  args->blocks_per_page = 1;
}

HS_API hs_status_t hs_update_residency(const hs_update_residency_args_t* args, hs_stream_t stream);

/* ------------------------------------------------------------------ the KV cache */

typedef struct hs_kv_cache* hs_kv_cache_t;

typedef struct hs_kv_cache_options {
  size_t struct_size;
  uint32_t struct_version;
  const hs_config_t* config;  /* required: top_k, H, max_union_rows, row_bytes, block sizes */
  int32_t num_layers;         /* 1 <= L <= 65536 */
  const int32_t* layer_groups; /* [L]: the index group of each layer, numbered 0, 1, ... in order of first
                                  appearance; NULL = every layer its own group. The first layer of a group
                                  leads it */
  int32_t max_requests;       /* S: request state rows (and batch rows), >= 1 */
  int32_t resident_pages;     /* newest pages per request kept resident on the device, >= 0 */
  int64_t max_seq_len;        /* positions per request, >= 1 */
  int64_t resident_page_size; /* positions per resident page: a multiple of hot_block_size; 0 = hot_block_size */
  int32_t device_type;        /* HS_DEVICE_CPU or HS_DEVICE_CUDA */
  int32_t device_index;       /* -1 = the calling thread's current CUDA device */
  int32_t kv_dtype;           /* hs_dtype_t of the rows; row width = row_bytes / its size */
  int32_t max_swap_rows;      /* token rows of the shared top-k state per forward; 0 = the runtime's default */
  hs_host_pool_t host_pool;   /* borrowed pool holding the host cache at offset 0 (at least
                                 hs_kv_cache_host_bytes), e.g. a shared one, and no other live cache's (a pool
                                 serves one cache at a time); NULL = the cache makes a private pool (registered
                                 with the device when it is CUDA) */
  hs_ipc_event_t host_event;  /* borrowed, optional (shared pools): the writer records it after each host write,
                                 readers wait on it before their gathers (hs_runtime_set_host_sharing) */
} hs_kv_cache_options_t;
#define HS_KV_CACHE_OPTIONS_VERSION 1

static inline void hs_kv_cache_options_init(hs_kv_cache_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_KV_CACHE_OPTIONS_VERSION;
  options->device_type = HS_DEVICE_CPU;
  options->device_index = -1;
  options->kv_dtype = HS_DTYPE_UINT8;
}

/* Bytes of host memory the cache of `options` needs (its host_pool must hold
 * at least this many). Host-only. */
HS_API hs_status_t hs_kv_cache_host_bytes(const hs_kv_cache_options_t* options, uint64_t* bytes);

/* Build the cache: the host pool (unless given), the slab and tables (one
 * device allocation), every runtime bound. Blocking (allocates,
 * initialises, registers a private pool); not for the decode path. On
 * failure *cache is NULL and nothing is leaked. Errors name the option. */
HS_API hs_status_t hs_kv_cache_create(const hs_kv_cache_options_t* options, hs_kv_cache_t* cache);

/* Free everything the cache made. NULL is accepted. The caller guarantees that
 * no device work still uses it (synchronise first). */
HS_API hs_status_t hs_kv_cache_destroy(hs_kv_cache_t cache);

typedef struct hs_kv_cache_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t num_layers;
  int32_t num_groups;
  int32_t max_requests;
  int32_t resident_pages;
  int64_t max_seq_len;
  int64_t resident_page_size;
  int64_t host_rows;        /* host slots, block 0 included */
  int64_t num_blocks;       /* slab blocks per layer, block 0 included */
  int32_t blocks_per_request; /* host blocks per state row (P) */
  int32_t active_requests;  /* admitted and not released */
  int32_t is_writer;        /* 1 when this process writes the host pool (always for a private pool) */
  int32_t reserved0;
  uint64_t host_bytes;
  uint64_t device_bytes;
} hs_kv_cache_info_t;
#define HS_KV_CACHE_INFO_VERSION 1

HS_API hs_status_t hs_kv_cache_get_info(hs_kv_cache_t cache, hs_kv_cache_info_t* info);

/* The group of `layer` and its leader layer. */
HS_API hs_status_t hs_kv_cache_layer_group(hs_kv_cache_t cache, int32_t layer, int32_t* group, int32_t* leader);

/* The runtime of `layer` (borrowed: valid while the cache lives). Its cache
 * binds it: hs_runtime_destroy, hs_runtime_bind_source_cache,
 * hs_runtime_bind_hot_cache and hs_runtime_unbind refuse it. */
HS_API hs_status_t hs_kv_cache_get_runtime(hs_kv_cache_t cache, int32_t layer, hs_runtime_t* runtime);

typedef enum hs_kv_cache_tensor {
  HS_KV_CACHE_HOST_CACHE = 0,            /* kv_dtype [host_rows, L, W], host memory */
  HS_KV_CACHE_SLAB = 1,                  /* kv_dtype [L, num_blocks, hot_block_size, W], on the device */
  HS_KV_CACHE_REQUEST_STATE_INDICES = 2, /* int32 [S]: 0 .. S-1 */
  HS_KV_CACHE_SOURCE_BLOCK_TABLE = 3,    /* int32 [S, P] */
  HS_KV_CACHE_HOT_BLOCK_TABLE = 4,       /* int32 [S, ceil(H / hot_block_size)] */
  HS_KV_CACHE_RESIDENT_BLOCKS = 5,       /* int32 [S, resident_pages x blocks per page] */
  HS_KV_CACHE_RESIDENT_BLOCK_TABLE = 6,  /* int32 [S, ceil(max_seq_len / hot_block_size)] */
  HS_KV_CACHE_SEQ_LENS = 7,              /* int32 [S]: the lengths of the current forward */
  HS_KV_CACHE_RING_PAGES = 8,            /* int32 [S, resident_pages]: the page each ring slot holds, -1 = none */
  HS_KV_CACHE_NUM_TENSORS = 9
} hs_kv_cache_tensor_t;

/* A borrowed descriptor (strides NULL: contiguous), valid while the cache
 * lives. The tables are the cache's own: read them, do not write them. */
HS_API hs_status_t hs_kv_cache_get_tensor(hs_kv_cache_t cache, hs_kv_cache_tensor_t which, hs_tensor_t* out);

/* Admit a request into state row `row` (-1 = the lowest free row; *admitted
 * receives it): its hot state is reset in every group and its ring slots
 * hold no page (stream-ordered on `stream`, capturable). HS_ERROR_INVALID_STATE for a row already admitted or
 * when no row is free. The request's host blocks are the row's own. */
HS_API hs_status_t hs_kv_cache_admit(hs_kv_cache_t cache, int32_t row, int32_t* admitted, hs_stream_t stream);

/* Release state row `row` (its hot state reset in every group and its ring
 * slots emptied, so nothing it held can be served to the next request of
 * the row). HS_ERROR_INVALID_STATE
 * for a row that is not admitted. */
HS_API hs_status_t hs_kv_cache_release(hs_kv_cache_t cache, int32_t row, hs_stream_t stream);

/* Start a forward: copy `seq_lens` (int32 [S] on the cache's device: each
 * request's length after this forward's tokens, 0 for rows without a
 * request) into the cache, rewrite the resident block table (the newest
 * resident_pages pages of each request) and begin the forward on every
 * runtime. Capturable, so the lengths are device data the host never reads:
 * positions at or past max_seq_len have no host block and are never
 * stored or served, and a length past it makes no page past it resident. */
HS_API hs_status_t hs_kv_cache_begin_forward(hs_kv_cache_t cache, const hs_tensor_t* seq_lens, hs_stream_t stream);

/* Store this forward's new rows of `layer` (hs_write_rows with the cache's
 * tables): host slot by position through the source table (skipped on a
 * reader of a shared pool), the resident copy, and every hot copy of the
 * slot in the layer's group. Waits first for the layer's rows its leader
 * prefetched in this forward, so the write lands after them. rows [T, W]
 * kv_dtype, req_id_per_token int32 [>= T] (state rows), positions int32 or
 * int64 [>= T]. Capturable. */
HS_API hs_status_t hs_kv_cache_write(hs_kv_cache_t cache, int32_t layer, const hs_tensor_t* rows,
                                     const hs_tensor_t* req_id_per_token, const hs_tensor_t* positions,
                                     hs_stream_t stream);

typedef struct hs_kv_cache_swap_in_args {
  size_t struct_size;
  uint32_t struct_version;
  const hs_tensor_t* topk_indices;     /* leader: int32 [T, k], k <= top_k, request-relative positions (-1 =
                                          none; positions at or past the request's length are dropped);
                                          followers: NULL (refused otherwise) */
  const hs_tensor_t* req_id_per_token; /* leader: int32 [>= T], state rows */
  const hs_tensor_t* num_valid_rows;   /* leader, optional: int32 [1] */
  int64_t num_tokens;                  /* T; 0 = rows of topk_indices (followers must give it) */
  int32_t prefetch;                    /* leader: 1 = stage every follower now (always correct, see above) */
  int32_t fused_gather;                /* leader: 1 (the default, HS_DEFAULT_FUSED_GATHER) = the resolve copies
                                          the leader's own rows; 0 = a separate gather */
} hs_kv_cache_swap_in_args_t;
#define HS_KV_CACHE_SWAP_IN_ARGS_VERSION 1

static inline void hs_kv_cache_swap_in_args_init(hs_kv_cache_swap_in_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_KV_CACHE_SWAP_IN_ARGS_VERSION;
  args->prefetch = 1;
  args->fused_gather = HS_DEFAULT_FUSED_GATHER;
}

/* hs_runtime_swap_in of `layer` with the cache's tables and lengths. The
 * attention indices of the call are rows [first_row, first_row + num_rows)
 * of the group's shared state (hs_runtime_get_index_group), columns [0, k):
 * row offsets into the layer's slab view (HS_KV_CACHE_SLAB[layer]), -1 =
 * masked. Capturable. */
HS_API hs_status_t hs_kv_cache_swap_in(hs_kv_cache_t cache, int32_t layer, const hs_kv_cache_swap_in_args_t* args,
                                       hs_runtime_swap_in_result_t* result, hs_stream_t stream);

/* hs_read_rows on the layer's slab view: out[t, k] = the row attention index
 * indices[t, k] names, zeros for -1. out shares no byte with indices or with
 * the cache's own memory (slab, tables, host cache, group state).
 * Capturable. */
HS_API hs_status_t hs_kv_cache_read(hs_kv_cache_t cache, int32_t layer, const hs_tensor_t* indices,
                                    const hs_tensor_t* out, hs_stream_t stream);

/* Counters: zero them in every group (stream-ordered, capturable), copy them
 * to their host mirrors (capturable), and read one group's (group >= 0) or
 * the sum over all groups (group = -1) as the last completed copy left them;
 * bytes_moved = misses x the row bytes of the group's layers, summed. */
HS_API hs_status_t hs_kv_cache_reset_stats(hs_kv_cache_t cache, hs_stream_t stream);
HS_API hs_status_t hs_kv_cache_copy_stats_async(hs_kv_cache_t cache, hs_stream_t stream);
HS_API hs_status_t hs_kv_cache_get_stats(hs_kv_cache_t cache, int32_t group, hs_runtime_stats_t* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_KV_CACHE_H_ */
