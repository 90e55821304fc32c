/*
 * hisparse: the data plane for hierarchical sparse attention.
 *
 * The stable C ABI. Conventions (modelled on NCCL's nccl.h):
 *   - every function returns hs_status_t; HS_SUCCESS is 0;
 *   - on failure, hs_last_error() returns a message for the calling thread
 *     that names the argument, what was expected and what was given;
 *   - objects are opaque handles created by *_create and freed by *_destroy;
 *   - structs passed by pointer open with their own size and version, so
 *     they can grow without breaking old callers: a struct grows only by
 *     appending fields, with a bump of its HS_*_VERSION; the library reads
 *     the fields of an input struct's version and gives the later ones
 *     their *_init defaults, and writes an output struct as the newest
 *     version its struct_size holds (struct_version says which). The *_init
 *     helpers are inline, so they always fill the struct the caller was
 *     compiled with. A struct smaller than its version (or than the
 *     struct's first version), or an input struct of a version newer than
 *     the library's, is refused naming struct_size or struct_version;
 *   - a stream is an opaque pointer (a cudaStream_t for the CUDA backend,
 *     ignored by the CPU backend) and is always the last argument;
 *   - functions that take a stream never block the host and never allocate
 *     memory; they are safe to capture into a CUDA graph.
 *
 * Bad input: handles are followed only while they are live (a NULL,
 * destroyed or made-up handle fails with HS_ERROR_INVALID_ARGUMENT naming
 * it); a tensor descriptor is refused before its memory is touched when no
 * real tensor could have it (more than 2^56 bytes, addresses that wrap) or
 * when it lies in a released host pool (HS_ERROR_INVALID_STATE); an output
 * that shares memory with an input, the state a call updates or another
 * output is refused naming both. A failed call changes nothing.
 *
 * Thread safety: functions on different handles may be called concurrently.
 * A handle must not be used concurrently from two threads unless its
 * documentation says so. hs_last_error() is thread-local.
 */
#ifndef HISPARSE_HISPARSE_H_
#define HISPARSE_HISPARSE_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HISPARSE_VERSION_MAJOR 0
#define HISPARSE_VERSION_MINOR 1
#define HISPARSE_VERSION_PATCH 0
#define HISPARSE_VERSION_STRING "0.1.0"
#define HISPARSE_VERSION_CODE(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define HISPARSE_VERSION HISPARSE_VERSION_CODE(HISPARSE_VERSION_MAJOR, HISPARSE_VERSION_MINOR, HISPARSE_VERSION_PATCH)

#if defined(HISPARSE_BUILDING)
#define HS_API __attribute__((visibility("default")))
#else
#define HS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ status */

typedef enum hs_status {
  HS_SUCCESS = 0,
  HS_ERROR_INVALID_ARGUMENT = 1, /* a value, shape, device or stride is wrong */
  HS_ERROR_INVALID_DTYPE = 2,    /* a tensor has the wrong element type */
  HS_ERROR_INVALID_STATE = 3,    /* the object cannot do this now (released, unbound) */
  HS_ERROR_OUT_OF_MEMORY = 4,    /* an allocation failed */
  HS_ERROR_UNSUPPORTED = 5,      /* backend not compiled in, or no device present */
  HS_ERROR_CUDA = 6,             /* the CUDA runtime reported an error */
  HS_ERROR_SYSTEM = 7,           /* an operating-system call failed */
  HS_ERROR_INTERNAL = 8,         /* a bug in hisparse; please report it */
  HS_NUM_STATUS = 9
} hs_status_t;

/* Static name of a status ("HS_ERROR_INVALID_ARGUMENT", ...). Never NULL. */
HS_API const char* hs_status_string(hs_status_t status);

/* Message of the last failed call on this thread ("" if none). The pointer
 * stays valid until the next hisparse call on this thread. */
HS_API const char* hs_last_error(void);

/* Runtime version as HISPARSE_VERSION_CODE(major, minor, patch). */
HS_API hs_status_t hs_get_version(int* version);
/* Runtime version string, e.g. "0.1.0". Never NULL. */
HS_API const char* hs_version_string(void);

/* ------------------------------------------------------------------ tensors */

typedef enum hs_dtype {
  HS_DTYPE_UINT8 = 0,
  HS_DTYPE_INT8 = 1,
  HS_DTYPE_INT16 = 2,
  HS_DTYPE_INT32 = 3,
  HS_DTYPE_INT64 = 4,
  HS_DTYPE_FLOAT16 = 5,
  HS_DTYPE_BFLOAT16 = 6,
  HS_DTYPE_FLOAT32 = 7,
  HS_DTYPE_FLOAT64 = 8,
  HS_DTYPE_FLOAT8_E4M3 = 9,
  HS_DTYPE_FLOAT8_E5M2 = 10,
  HS_DTYPE_BOOL = 11,
  HS_NUM_DTYPES = 12
} hs_dtype_t;

/* Device types use DLPack's codes so bindings can pass them through. */
typedef enum hs_device_type {
  HS_DEVICE_CPU = 1,
  HS_DEVICE_CUDA = 2,
  HS_DEVICE_CUDA_HOST = 3 /* page-locked host memory, read on the CPU backend */
} hs_device_type_t;

#define HS_MAX_DIMS 8

/* A borrowed view of memory; hisparse never frees it. Shapes and strides are
 * in elements; strides == NULL means C-contiguous. */
typedef struct hs_tensor {
  void* data;
  hs_dtype_t dtype;
  int32_t device_type; /* hs_device_type_t */
  int32_t device_index;
  int32_t ndim;
  const int64_t* shape;
  const int64_t* strides;
} hs_tensor_t;

/* Bytes per element of a dtype (0 for an unknown value). */
HS_API size_t hs_dtype_size(hs_dtype_t dtype);
/* Static name of a dtype ("int32", ...). Never NULL. */
HS_API const char* hs_dtype_name(hs_dtype_t dtype);

/* A stream: cudaStream_t for the CUDA backend (NULL = legacy default stream),
 * ignored by the CPU backend. */
typedef struct CUstream_st* hs_stream_t;

/* ------------------------------------------------------------------ backends */

typedef struct hs_build_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t cuda_compiled;         /* 1 when the CUDA backend is built in */
  int32_t cuda_runtime_version;  /* CUDART_VERSION it was built with, 0 without CUDA */
  char cuda_architectures[64];   /* e.g. "80,90" */
  char build_type[32];           /* CMake build type */
  char compiler[64];
} hs_build_info_t;
#define HS_BUILD_INFO_VERSION 1

/* Fill *info (the caller sets info->struct_size = sizeof(hs_build_info_t)).
 * Never touches a GPU. */
HS_API hs_status_t hs_get_build_info(hs_build_info_t* info);

typedef struct hs_device_properties {
  size_t struct_size;
  uint32_t struct_version;
  char name[256];
  int32_t major;
  int32_t minor;
  int32_t multiprocessor_count;
  int32_t unified_addressing;
  int32_t can_map_host_memory;
  int32_t reserved0;
  uint64_t total_global_memory;
  uint64_t l2_cache_bytes;
  uint64_t max_shared_memory_per_block; /* opt-in maximum for one block */
} hs_device_properties_t;
#define HS_DEVICE_PROPERTIES_VERSION 1

/* Number of CUDA devices visible (0 when the backend is not compiled in or no
 * driver/device is present; never an error for that). Initialises CUDA. */
HS_API hs_status_t hs_cuda_device_count(int* count);

/* Properties of CUDA device `device`. HS_ERROR_UNSUPPORTED without CUDA. */
HS_API hs_status_t hs_cuda_device_properties(int device, hs_device_properties_t* props);

/* Why the CUDA backend cannot be used here ("" when it can). Thread-local
 * buffer, valid until the next call on this thread. */
HS_API const char* hs_cuda_unavailable_reason(void);

/* ------------------------------------------------------------------ host memory */

/* Bytes of RAM available for a new allocation (MemAvailable on Linux). */
HS_API hs_status_t hs_available_host_memory(uint64_t* bytes);

/* HS_ERROR_INVALID_ARGUMENT when `pool_bytes` exceeds 95% of available RAM,
 * with a message giving both figures in GiB and what to lower. */
HS_API hs_status_t hs_check_host_memory(uint64_t pool_bytes);

typedef enum hs_registration {
  HS_REGISTER_AUTO = 0, /* register when the CUDA backend and a device are present */
  HS_REGISTER_ALWAYS = 1, /* fail when registration is impossible */
  HS_REGISTER_NEVER = 2
} hs_registration_t;

typedef struct hs_host_pool_options {
  size_t struct_size;
  uint32_t struct_version;
  uint64_t size_bytes;          /* exact size of the pool, > 0 */
  int32_t populate_threads;     /* 0 = one per online core */
  int32_t registration;         /* hs_registration_t */
  int32_t device_index;         /* device to register with; -1 = current */
  int32_t huge_pages;           /* 1 = advise transparent huge pages */
  int32_t check_memory;         /* 1 = refuse pools above 95% of available RAM */
  int32_t reserved0;
  uint64_t max_segment_bytes;   /* registration segment size; 0 = 64 GiB */
} hs_host_pool_options_t;
#define HS_HOST_POOL_OPTIONS_VERSION 1

/* Defaults: populate with every core, register when possible, current
 * device, huge pages, memory check on, 64 GiB segments. Set size_bytes. */
static inline void hs_host_pool_options_init(hs_host_pool_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_HOST_POOL_OPTIONS_VERSION;
  options->registration = HS_REGISTER_AUTO;
  options->device_index = -1;
  options->huge_pages = 1;
  options->check_memory = 1;
}

typedef struct hs_host_pool* hs_host_pool_t;

/* Allocate an exact-size, page-aligned host region, populate its pages in
 * parallel, and register it with the GPU in segments (per `registration`).
 * Blocking; may take seconds for large pools. On failure nothing is leaked.
 * The memory is zero-filled. */
HS_API hs_status_t hs_host_pool_create(const hs_host_pool_options_t* options, hs_host_pool_t* pool);

/* Unregister every segment, then unmap. Idempotent: later calls succeed and
 * do nothing. Blocking. The caller guarantees no GPU work still reads the
 * pool (synchronise first). From the release on, hisparse refuses the pool's
 * memory wherever it was given before: a runtime whose source cache was
 * bound in it fails (HS_ERROR_INVALID_STATE naming host_cache), a staging
 * plan whose storage lies in it too (naming storage), instead of touching
 * it. The memory itself is gone: an address into it kept past the release
 * dangles like any freed memory (hs_host_pool_retire keeps the pages mapped
 * and refuses every call given them). */
HS_API hs_status_t hs_host_pool_release(hs_host_pool_t pool);

/* Release the pool for hisparse now, but keep its pages mapped and
 * registered until hs_host_pool_release or hs_host_pool_destroy: for a
 * caller that hands out views of the pool and unmaps it when the last one
 * is gone. From this call on, hs_host_pool_data fails, the info reports
 * released = 1, and every call given a tensor that lies in the pool's memory
 * (a kernel, a runtime bound in it) fails with HS_ERROR_INVALID_STATE naming
 * the argument. Idempotent. */
HS_API hs_status_t hs_host_pool_retire(hs_host_pool_t pool);

/* Release (if not yet) and free the handle. NULL is accepted. */
HS_API hs_status_t hs_host_pool_destroy(hs_host_pool_t pool);

/* Base address (page-aligned). HS_ERROR_INVALID_STATE after release. */
HS_API hs_status_t hs_host_pool_data(hs_host_pool_t pool, void** data);

typedef struct hs_host_pool_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t released;             /* 1 after hs_host_pool_release or hs_host_pool_retire */
  int32_t registered;           /* 1 when registered with a GPU */
  int32_t device_index;         /* device registered with, -1 if none */
  int32_t num_segments;         /* registration segments */
  int32_t populate_threads;     /* threads that populated the pages */
  int32_t huge_pages;
  uint64_t size_bytes;          /* exact size requested */
  uint64_t mapped_bytes;        /* size rounded up to the page size */
  double populate_seconds;
  double register_seconds;
} hs_host_pool_info_t;
#define HS_HOST_POOL_INFO_VERSION 1

/* Setup figures; valid after release too (released = 1). */
HS_API hs_status_t hs_host_pool_get_info(hs_host_pool_t pool, hs_host_pool_info_t* info);

/* Exact byte range of registration segment `index` (0 <= index < num_segments). */
HS_API hs_status_t hs_host_pool_segment(hs_host_pool_t pool, int32_t index, void** data, uint64_t* bytes);

/* ------------------------------------------------------------------ layout */

typedef struct hs_host_layout {
  size_t struct_size;
  uint32_t struct_version;
  int64_t host_num_blocks;   /* blocks in the pool, including the null block 0 */
  int64_t host_block_stride; /* bytes between consecutive host blocks */
  int64_t min_host_blocks;   /* ceil(max_model_len / block_size) + 2 */
} hs_host_layout_t;
#define HS_HOST_LAYOUT_VERSION 1

/* Size the host pool: a host block holds `block_size` tokens of every layer
 * (`page_size_bytes` in all, a multiple of 16). Fails with
 * HS_ERROR_INVALID_ARGUMENT when the budget holds no block, or too few blocks
 * for one request at `max_model_len` plus the null block and a copy-on-write
 * tail. */
HS_API hs_status_t hs_plan_host_layout(uint64_t page_size_bytes, int64_t block_size, int64_t max_model_len,
                                       uint64_t host_budget_bytes, hs_host_layout_t* layout);

/* ------------------------------------------------------------------ configuration */

typedef struct hs_config {
  size_t struct_size;
  uint32_t struct_version;
  int32_t top_k;                  /* positions the indexer selects per token row */
  int32_t device_buffer_size;     /* H: hot slots per request, <= 32767 */
  int32_t max_union_rows;         /* distinct rows per request and step, top_k <= . <= H;
                                     0 = top_k x (1 + num_speculative_tokens) (hs_default_max_union_rows) */
  int32_t num_speculative_tokens; /* draft tokens per request and step (token rows - 1), >= 0 */
  int32_t row_bytes;              /* bytes of one token's KV in one layer, multiple of 16 */
  int32_t block_size;             /* tokens per host (source) block */
  int32_t hot_block_size;         /* tokens per hot-cache block */
  int32_t eager_host_mirror;      /* 1 = mirror decode-time KV writes to the host eagerly */
} hs_config_t;
#define HS_CONFIG_VERSION 1

/* Defaults: DeepSeek-V3.2 FP8 MLA decode (top_k 2048, H 4096, no draft
 * tokens, so a union of 2048 rows, 656-byte rows, blocks of 64 tokens). */
static inline void hs_config_init(hs_config_t* config) {
  memset(config, 0, sizeof(*config));
  config->struct_size = sizeof(*config);
  config->struct_version = HS_CONFIG_VERSION;
  config->top_k = 2048;
  config->device_buffer_size = 4096;
  config->row_bytes = 656;
  config->block_size = 64;
  config->hot_block_size = 64;
}

/* Validate a configuration up front (its max_union_rows default filled in).
 * `device` >= 0 also checks that CUDA device `device` exists (every valid
 * shape runs there: one whose resolver arrays do not fit a block's shared
 * memory uses a workspace, see hs_resolver_workspace_bytes); -1 skips the
 * device check. */
HS_API hs_status_t hs_config_validate(const hs_config_t* config, int device);

/* The defaults of max_union_rows and max_swap_rows wherever they appear
 * (hs_config_t, hs_index_group_options_t, hs_runtime_options_t), one rule
 * each: the distinct rows one request can select in a step,
 * top_k x (1 + num_speculative_tokens), and the token rows of one forward's
 * shared top-k state, max_num_reqs x (1 + num_speculative_tokens).
 * HS_ERROR_INVALID_ARGUMENT for a negative count or a product past INT32_MAX. */
HS_API hs_status_t hs_default_max_union_rows(int32_t top_k, int32_t num_speculative_tokens, int32_t* max_union_rows);
HS_API hs_status_t hs_default_max_swap_rows(int32_t max_num_reqs, int32_t num_speculative_tokens,
                                            int32_t* max_swap_rows);

/* Dynamic shared memory, in bytes, that the CUDA residency resolver needs per
 * block to keep every array of a request of `device_buffer_size` hot slots
 * and `max_union_rows` union rows in shared memory. */
HS_API hs_status_t hs_resolver_shared_memory_bytes(int32_t device_buffer_size, int32_t max_union_rows, uint64_t* bytes);

/* Bytes of the global workspace (hs_resolve_residency_args_t.workspace) that
 * the CUDA residency resolver needs on CUDA device `device` for
 * `num_state_rows` state rows (rows of device_global_indices) of
 * `device_buffer_size` hot slots and `max_union_rows` union rows: 0 when a
 * request's arrays fit one block's shared memory there
 * (hs_resolver_shared_memory_bytes <= the device's opt-in shared memory per
 * block), else one slice per state row for the arrays that do not. */
HS_API hs_status_t hs_resolver_workspace_bytes(int64_t num_state_rows, int32_t device_buffer_size,
                                               int32_t max_union_rows, int device, uint64_t* bytes);

/* ------------------------------------------------------------------ kernels */

/* Copy `src` into `dst` byte for byte through a kernel (CUDA: device threads
 * read registered host memory directly, zero-copy). Both tensors contiguous
 * with the same byte size; `dst` on the device whose backend runs the copy.
 * Stream-ordered, capturable. */
HS_API hs_status_t hs_copy_bytes(const hs_tensor_t* dst, const hs_tensor_t* src, hs_stream_t stream);

/* How a fused gather's rows move on CUDA (hs_resolve_residency_args_t
 * gather_schedule); the bytes, outputs, state and counters are the
 * same for both, and the CPU backend copies every row itself.
 *   HS_RESOLVE_GATHER_AUTO   chosen per request on the device, without a host
 *                            sync: a request whose few misses the resolve
 *                            launch stages copies them itself; the rows of
 *                            the others are copied on every SM: with a
 *                            handoff array, by the same launch as soon as
 *                            each request's swap list is complete; without
 *                            one, right after it, in the same stream, by a
 *                            gather kernel spread over the GPU.
 *   HS_RESOLVE_GATHER_FUSED  every row copied by the resolve launch itself
 *                            (one launch; one SM per request). */
typedef enum hs_resolve_gather_schedule {
  HS_RESOLVE_GATHER_AUTO = 0,
  HS_RESOLVE_GATHER_FUSED = 1
} hs_resolve_gather_schedule_t;

/* Residency resolution: see docs/residency.md for the exact contract. The
 * backend is chosen by the device of `topk_indices` (every tensor must be on
 * it). Stream-ordered, no host sync, no allocation, capturable.
 *
 * Fused gather (optional): with gather_host_cache and gather_hot_cache
 * set, the call also copies the rows of the swap list it emits from the host
 * cache into the hot cache, with the bytes hs_gather_compact would write if
 * run right after it on out_swap_*. One launch and no dependent round trip
 * per layer instead of two. */
typedef struct hs_resolve_residency_args {
  size_t struct_size;
  uint32_t struct_version;
  /* inputs */
  const hs_tensor_t* topk_indices;          /* int32 [T, K] */
  const hs_tensor_t* req_id_per_token;      /* int32 [>= T] */
  const hs_tensor_t* request_state_indices; /* int32 [B] */
  const hs_tensor_t* device_global_indices; /* int32 [S, H], updated */
  const hs_tensor_t* lru_slots;             /* int16 [S, H], updated */
  const hs_tensor_t* hot_block_table;       /* int32 [>= B, >= ceil(H / hot_block_size)] */
  int64_t hot_block_size;                   /* rows per hot block */
  int64_t attention_block_stride;           /* rows between hot blocks, >= hot_block_size */
  int64_t host_rows;                        /* rows of the host cache (0 to INT32_MAX): host slots at or past it
                                               are invalid */
  int64_t max_union_rows;                   /* distinct rows per request, 1 <= . <= H */
  /* outputs */
  const hs_tensor_t* out_attention;         /* int32 [>= T, K] */
  const hs_tensor_t* out_hot_rows;          /* int32 [>= T, K] */
  const hs_tensor_t* out_resolved;          /* int32 [>= T, K] */
  const hs_tensor_t* out_miss_mask;         /* int32 [>= T, K] */
  const hs_tensor_t* out_valid_counts;      /* int32 [>= T] */
  const hs_tensor_t* out_swap_host_rows;    /* int32 [>= T, K] */
  const hs_tensor_t* out_swap_device_rows;  /* int32 [>= T, K] */
  const hs_tensor_t* out_swap_counts;       /* int32 [>= T] */
  /* optional (NULL = absent) */
  const hs_tensor_t* source_block_table;    /* int32 [>= B, W]; W = 0: every position lies past it */
  int64_t block_size;
  const hs_tensor_t* resident_block_table;  /* int32 [>= B, Wr] */
  int64_t resident_block_size;
  const hs_tensor_t* num_valid_rows;        /* int32, one element */
  const hs_tensor_t* stats;                 /* int64 [>= 5], accumulated */
  /* Fused gather (optional, both NULL = off, both or neither). The same
   * rules as hs_gather_compact's host_cache, hot_cache and hot_block_stride,
   * with the swap list being out_swap_host_rows, out_swap_device_rows and
   * out_swap_counts (the first T rows) and hot_block_size this call's
   * hot_block_size. gather_hot_cache must be on the device of topk_indices;
   * on CUDA gather_host_cache is registered or pinned host memory (or memory
   * of that device). */
  const hs_tensor_t* gather_host_cache;     /* [..., W] host cache */
  const hs_tensor_t* gather_hot_cache;      /* paged hot cache, same dtype and W */
  int64_t gather_hot_block_stride;          /* rows between hot blocks; 0 = hot_block_size
                                               (must be 0 without a fused gather) */
  /* Optional: the CUDA resolver's workspace, a contiguous 1-D uint8
   * tensor on the device of topk_indices, 16-byte aligned, of at least
   * hs_resolver_workspace_bytes(S, H, max_union_rows, device) bytes (S, H:
   * the shape of device_global_indices), sharing no byte with another
   * argument. Required when that size is not 0; a workspace given is
   * checked on every backend, and only its size is ignored where that size
   * is 0 (the CPU backend never reads it). Its contents need no
   * initialisation and are scratch of one launch at a time: launches that
   * share a workspace must be ordered (one stream, or events). */
  const hs_tensor_t* workspace;
  /* An hs_resolve_gather_schedule_t for a fused gather (0, AUTO, by
   * default); must be 0 without one. */
  int32_t gather_schedule;
  /* Optional: the automatic schedule's handoff array, int32
   * [S, HS_RESOLVER_HANDOFF_WORDS] contiguous on the device of topk_indices
   * (S: the rows of device_global_indices), sharing no byte with another
   * argument. Allocate it once with the state, filled with zeros, and
   * leave it to the resolves: each launch leaves every record it uses idle
   * again (its first word zero). Contents that no resolve wrote (memory
   * not zeroed) cannot be detected and can make a launch copy wrong rows.
   * With it, HS_RESOLVE_GATHER_AUTO on CUDA is one launch; it is checked
   * on every backend and read only there. Launches that share it must not
   * resolve one state row at once (which the state forbids anyway). */
  const hs_tensor_t* handoff;
  /* Optional: a residency hint, int32 [ceil(host_rows / 32)] contiguous
   * on the device of topk_indices: bit g set when some hot slot probably
   * holds host row g. Read and kept by the CUDA automatic schedule, whose
   * early reads predict from it instead of from device_global_indices (a
   * wrong bit costs a wasted or a late host read, never a wrong byte);
   * ignored elsewhere. */
  const hs_tensor_t* residency_hint;
} hs_resolve_residency_args_t;
#define HS_RESOLVER_HANDOFF_WORDS 4
#define HS_RESOLVE_RESIDENCY_ARGS_VERSION 1

static inline void hs_resolve_residency_args_init(hs_resolve_residency_args_t* args) {
  memset(args, 0, sizeof(*args));
  args->struct_size = sizeof(*args);
  args->struct_version = HS_RESOLVE_RESIDENCY_ARGS_VERSION;
}
HS_API hs_status_t hs_resolve_residency(const hs_resolve_residency_args_t* args, hs_stream_t stream);

/* Indices of the counters in a stats tensor. */
typedef enum hs_stat {
  HS_STAT_LOOKUPS = 0,
  HS_STAT_HITS = 1,
  HS_STAT_MISSES = 2,
  HS_STAT_RESIDENT = 3,
  HS_STAT_INVALID = 4,
  HS_NUM_STATS = 5
} hs_stat_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#include "hisparse/data_movement.h"
#include "hisparse/host_registration.h"
#include "hisparse/index_group.h"
#include "hisparse/kv_cache.h"
#include "hisparse/runtime.h"
#include "hisparse/shared_host_pool.h"
#include "hisparse/staging.h"

#endif /* HISPARSE_HISPARSE_H_ */
