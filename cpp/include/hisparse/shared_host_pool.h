/*
 * hisparse shared host pool and interprocess events: one host copy of the KV
 * for every tensor-parallel rank of a host (DESIGN.md "Host memory").
 *
 * The protocol is NCCL's unique-id pattern. One rank creates an id
 * (hs_shared_pool_id_create) and the caller broadcasts its bytes over its own
 * channel (torch.distributed, MPI, a socket); every rank then calls
 * hs_shared_host_pool_create with the id, its rank and the rank count. The
 * call is collective: it returns on every rank once every rank has attached,
 * populated its share of the pages and registered the whole region with its
 * own GPU, or fails on every rank.
 *
 *   - The region is one named POSIX shared-memory object (/dev/shm), created
 *     by rank 0 and mapped by every rank. Its name is unlinked as soon as
 *     every rank has attached, so from then on it exists only as long as a
 *     process maps it: a crash at any later moment leaves nothing behind.
 *     Before that, the ranks that notice a failure unlink it.
 *   - Every rank populates its contiguous share of the pages (1/nranks, on
 *     2 MiB boundaries) with populate_threads threads, then registers the
 *     whole region with its device in segments of at most max_segment_bytes
 *     (per `registration`, as hs_host_pool_create).
 *   - A rank that dies, fails or makes no progress makes the others fail
 *     with a message naming it instead of hanging: a death after the rank
 *     attached is seen at once (a robust lock each rank holds while it sets
 *     up); a rank that never arrives or stalls is given up on after
 *     timeout_seconds without progress.
 *   - An id makes one pool. A second pool from the same id in a process that
 *     already used it, a rank another process already holds, or a rank
 *     count, size or writer rank that differs from rank 0's is refused with
 *     HS_ERROR_INVALID_ARGUMENT naming the field; a mismatch also fails the
 *     pool on the other ranks.
 *   - One process takes one rank: a process that drives several GPUs needs
 *     no shared pool (a private pool is registered for every device).
 *
 * The result is an ordinary hs_host_pool_t: hs_host_pool_data, _get_info,
 * _segment, _release and _destroy work as for a private pool, and release
 * is per rank (unregister this rank's segments, then unmap). The memory is
 * returned to the system when the last rank unmaps it.
 *
 * One rank writes rows (writer_rank, 0 by default); the others only read.
 * The writer mirrors rows into the pool on its stream and records an
 * interprocess event; a reader makes its stream wait on the imported event
 * before it gathers (hs_ipc_event_*, below). hs_shared_host_pool_get_info
 * tells a rank whether it is the writer.
 *
 * Include this header directly or through hisparse/hisparse.h.
 */
#ifndef HISPARSE_SHARED_HOST_POOL_H_
#define HISPARSE_SHARED_HOST_POOL_H_

#include "hisparse/hisparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the backend of device_type (HS_DEVICE_CPU or HS_DEVICE_CUDA) can
 * serve a shared pool (the seed's supports_shared_host_pool): the CPU
 * backend always can; CUDA when it is compiled in and a device is usable. */
HS_API hs_status_t hs_supports_shared_host_pool(int32_t device_type, int32_t* supported);

/* ------------------------------------------------------------------ id */

#define HS_SHARED_POOL_ID_BYTES 128
/* Most ranks of one shared pool. */
#define HS_SHARED_POOL_MAX_RANKS 64
/* Default of hs_shared_host_pool_options_t.timeout_seconds. */
#define HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS 120.0

/* Opaque bytes; copy and send them as they are. */
typedef struct hs_shared_pool_id {
  char internal[HS_SHARED_POOL_ID_BYTES];
} hs_shared_pool_id_t;

/* A new id: a random name for the region, with this process's pid in it.
 * Touches nothing shared: an id that is never used leaves nothing behind. */
HS_API hs_status_t hs_shared_pool_id_create(hs_shared_pool_id_t* id);

/* ------------------------------------------------------------------ pool */

typedef struct hs_shared_host_pool_options {
  size_t struct_size;
  uint32_t struct_version;
  int32_t writer_rank;        /* the rank that writes rows; the others only read. Same on every rank */
  uint64_t size_bytes;        /* exact size of the pool, > 0. Same on every rank */
  int32_t populate_threads;   /* threads of this rank; 0 = the online cores divided among the ranks */
  int32_t registration;       /* hs_registration_t, per rank */
  int32_t device_index;       /* device this rank registers with; -1 = current */
  int32_t huge_pages;         /* 1 = advise transparent huge pages (in effect per /dev/shm's huge= option) */
  int32_t check_memory;       /* 1 = rank 0 refuses a pool above 95% of available RAM or above the free
                                 space of /dev/shm */
  int32_t reserved0;
  uint64_t max_segment_bytes; /* registration segment size; 0 = 64 GiB */
  double timeout_seconds;     /* longest wait for a rank that makes no progress; 0 = the default */
} hs_shared_host_pool_options_t;
#define HS_SHARED_HOST_POOL_OPTIONS_VERSION 1

/* Defaults: writer rank 0, populate with this rank's share of the cores,
 * register when possible, current device, huge pages, memory check on,
 * 64 GiB segments, HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS. Set size_bytes. */
static inline void hs_shared_host_pool_options_init(hs_shared_host_pool_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->struct_version = HS_SHARED_HOST_POOL_OPTIONS_VERSION;
  options->registration = HS_REGISTER_AUTO;
  options->device_index = -1;
  options->huge_pages = 1;
  options->check_memory = 1;
  options->timeout_seconds = HS_SHARED_POOL_DEFAULT_TIMEOUT_SECONDS;
}

/* Collective: rank `rank` of `nranks` (1 <= nranks <= HS_SHARED_POOL_MAX_RANKS)
 * attaches to the pool of `id`, populates its share and registers the whole
 * region; returns once every rank has done so. Blocking, seconds for large
 * pools. The memory is zero-filled. On failure *pool is NULL, nothing of
 * this rank stays mapped or registered, and the name is unlinked; the
 * message names the rank that failed, died or stalled and why. */
HS_API hs_status_t hs_shared_host_pool_create(const hs_shared_pool_id_t* id, int32_t rank, int32_t nranks,
                                              const hs_shared_host_pool_options_t* options, hs_host_pool_t* pool);

typedef struct hs_shared_host_pool_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t shared;           /* 1: made by hs_shared_host_pool_create; 0: a private pool (rank 0 of 1) */
  int32_t rank;
  int32_t nranks;
  int32_t writer_rank;
  int32_t is_writer;        /* rank == writer_rank: this rank may write rows into the pool */
  uint64_t share_offset;    /* this rank populated [share_offset, share_offset + share_bytes) */
  uint64_t share_bytes;
  double populate_seconds;  /* populating this rank's share */
  double register_seconds;  /* registering the whole region with this rank's device */
  double wait_seconds;      /* waiting for the other ranks */
  double ready_seconds;     /* the whole create call: every rank populated and registered */
} hs_shared_host_pool_info_t;
#define HS_SHARED_HOST_POOL_INFO_VERSION 1

/* Sharing facts of any host pool (a private pool answers shared = 0, rank 0
 * of 1, its own writer, its whole size as its share); valid after release. */
HS_API hs_status_t hs_shared_host_pool_get_info(hs_host_pool_t pool, hs_shared_host_pool_info_t* info);

/* ------------------------------------------------------------------ interprocess events */

/* An event that another process can wait on: the writer of a shared pool
 * records it after its mirror on its stream; a reader imports it once and,
 * every step, makes its stream wait on it before the gathers. No host
 * synchronisation anywhere.
 *
 * Ordering: a wait orders the stream after the work captured by the
 * event's most recent record that happened, in host time, before the wait
 * call (CUDA's rule for cudaStreamWaitEvent): the processes order their
 * record and wait calls among themselves (a barrier, a message, a step
 * counter).
 *
 * CUDA: cudaEventInterprocess | cudaEventDisableTiming events and
 * cudaIpcGetEventHandle / cudaIpcOpenEventHandle. The exporter keeps its
 * event alive while importers use it. A handle cannot be imported in the
 * process that exported it (CUDA refuses that; hisparse says so first).
 * CUDA graphs: record and wait are capturable; on a capturing stream they
 * become event record and wait nodes (cudaEventRecordExternal,
 * cudaEventWaitExternal) that act on every replay, and a driver that refuses
 * such a node reports HS_ERROR_CUDA with its message. Event nodes may not
 * sit in graph loops or conditionals. create, export, import, synchronize
 * and destroy are not stream work: call them outside capture.
 *
 * CPU backend: every call completes before it returns, so the work an event
 * would capture is already done when record is called; record and wait are
 * exact no-ops under the rule above, and synchronize returns at once. The
 * handle still carries its backend, device and exporting process, so a
 * handle of the wrong backend or kind, garbage bytes, or a handle imported
 * in its own process fail as they do on CUDA. */

#define HS_IPC_EVENT_HANDLE_BYTES 128

/* Opaque bytes; copy and send them as they are. */
typedef struct hs_ipc_event_handle {
  char internal[HS_IPC_EVENT_HANDLE_BYTES];
} hs_ipc_event_handle_t;

typedef struct hs_ipc_event* hs_ipc_event_t;

/* A new interprocess event on device_type (HS_DEVICE_CPU or HS_DEVICE_CUDA)
 * and device_index (CUDA; -1 = current device). */
HS_API hs_status_t hs_ipc_event_create(int32_t device_type, int32_t device_index, hs_ipc_event_t* event);

/* The bytes another process imports. HS_ERROR_INVALID_STATE for an
 * imported event (export the original). */
HS_API hs_status_t hs_ipc_event_export(hs_ipc_event_t event, hs_ipc_event_handle_t* handle);

/* Open an exported event in this process, on device_index (CUDA; -1 =
 * current device; may differ from the exporter's device). */
HS_API hs_status_t hs_ipc_event_import(const hs_ipc_event_handle_t* handle, int32_t device_index,
                                       hs_ipc_event_t* event);

/* Capture the work submitted to `stream` so far (stream-ordered, capturable). */
HS_API hs_status_t hs_ipc_event_record(hs_ipc_event_t event, hs_stream_t stream);

/* Make `stream` wait for the work of the most recent record (stream-ordered,
 * capturable; the host does not block). */
HS_API hs_status_t hs_ipc_event_wait(hs_ipc_event_t event, hs_stream_t stream);

/* Block the host until the most recent record's work is done. */
HS_API hs_status_t hs_ipc_event_synchronize(hs_ipc_event_t event);

typedef struct hs_ipc_event_info {
  size_t struct_size;
  uint32_t struct_version;
  int32_t device_type;    /* hs_device_type_t */
  int32_t device_index;   /* this process's device of the event */
  int32_t imported;       /* 1 when opened from a handle */
  int64_t exporter_pid;   /* process that created the event */
} hs_ipc_event_info_t;
#define HS_IPC_EVENT_INFO_VERSION 1

HS_API hs_status_t hs_ipc_event_get_info(hs_ipc_event_t event, hs_ipc_event_info_t* info);

/* Free the event (an imported one is closed; the exporter's stays). NULL is
 * accepted. HS_ERROR_INVALID_STATE, and nothing freed, while a runtime holds
 * it (hs_runtime_set_host_sharing, or a KV cache's host_event). */
HS_API hs_status_t hs_ipc_event_destroy(hs_ipc_event_t event);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HISPARSE_SHARED_HOST_POOL_H_ */
