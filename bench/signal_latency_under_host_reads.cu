// How long one block's published signal takes to reach another block while
// zero-copy host reads are in flight: the early-read handoff's question
// (docs/performance.md, "Physical bounds": host reads hold up other memory
// traffic). Clusters of two 1024-thread blocks, one block per SM. In each
// cluster the producer (a request's owner) writes a 2 KB list 11 us into
// the launch, fences and signals; the consumer (an early-read helper) has
// `rows` host rows of 656 bytes in flight from its start, 31 warps reading
// them into shared memory (a warp's rows all at once, as the helpers
// read), while its last warp polls for the signal and then reads the
// list's first word. Publications:
//
//   global          the list in global memory, __threadfence, a release
//                   store of a global flag; the poll an acquire load and
//                   __nanosleep(128), as the handoff publishes and polls
//   global_cluster  the list in global memory, __threadfence, a release
//                   store into the consumer's shared memory (distributed
//                   shared memory); the poll an acquire load of its own
//                   shared word
//   cluster_fence   the same with a cluster-scope fence instead of
//                   __threadfence (the two blocks are the cluster)
//   cluster_list    the list itself written into the consumer's shared
//                   memory, a cluster-scope fence, the shared flag
//   tagged          no fence and no flag: each list word is written with
//                   the launch's tag in its upper half (one relaxed 64-bit
//                   store), and the consumer's last warp reads the words
//                   until every one carries the tag
//
// Each cluster's rows lie at random 16-byte offsets of its own 4 MiB of a
// pinned pool (a request's host blocks), fresh for every launch. Printed
// as JSON, per signal and rows per consumer: microseconds after the
// producer began to publish, medians and 90th percentiles over the
// clusters of five launches, of the producer's fence and store completing,
// the consumer seeing the signal and having the list's first word, the
// consumer's last row arriving, and the consumer done: once its rows and
// the list are in, it copies its rows from shared to device memory (as a
// helper copies its buffered rows to their hot rows) and fences; that
// copy's time to issue and to fence is also given from its start.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o signal_latency bench/signal_latency_under_host_reads.cu
//   ./signal_latency > signal_latency.json
//
// Results on an H200: bench/results/signal_latency_under_host_reads_h200.json.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "standalone_cuda.cuh"

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kReadingWarps = 31;
constexpr int kRowBytes = 656;
constexpr int kChunks = kRowBytes / 16;
constexpr int kMaxRowsPerWarp = 2;
constexpr int kMaxRows = kReadingWarps * kMaxRowsPerWarp;
constexpr int kListWords = 512;
constexpr int64_t kRegionBytes = 4 << 20;
// Forces one block per SM, as the resolver's shared memory does.
constexpr int kSharedBytes = 120 << 10;

enum Signal { kGlobal = 0, kGlobalCluster = 1, kClusterFence = 2, kClusterList = 3, kTagged = 4 };
const char* const kSignalNames[] = {"global", "global_cluster", "cluster_fence", "cluster_list", "tagged"};

struct ClusterTimes {
  unsigned long long publish, fence_done, store_done, seen, list_read, reads_in, copy_start, copy_issued, copy_fenced;
};

// Shared address `local` of this block in cluster block `rank`.
__device__ __forceinline__ unsigned remote_shared(const void* local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

__device__ __forceinline__ unsigned load_acquire_global(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The consumer's reading warps: warp w reads rows w and w + 31 (all loads
// issued before any store, as the helpers' one pass does) into the buffer.
__device__ void read_rows(const uint8_t* host, const int64_t* offsets, int rows, uint4* buffer) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4 value[kMaxRowsPerWarp][2];
  for (int j = 0; j < kMaxRowsPerWarp; ++j) {
    const int i = warp + kReadingWarps * j;
    const uint4* src = i < rows ? reinterpret_cast<const uint4*>(host + offsets[i]) : nullptr;
    value[j][0] = src != nullptr ? src[lane] : make_uint4(0, 0, 0, 0);
    value[j][1] = src != nullptr && lane + 32 < kChunks ? src[lane + 32] : make_uint4(0, 0, 0, 0);
  }
  for (int j = 0; j < kMaxRowsPerWarp; ++j) {
    const int i = warp + kReadingWarps * j;
    if (i >= rows) continue;
    buffer[i * kChunks + lane] = value[j][0];
    if (lane + 32 < kChunks) buffer[i * kChunks + lane + 32] = value[j][1];
  }
}

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    signal_kernel(const uint8_t* host, const int64_t* offsets, int rows, int signal, unsigned publish_ns,
                  unsigned* flags, int* lists, unsigned long long* tagged, unsigned tag, uint4* hot,
                  ClusterTimes* times) {
  extern __shared__ uint4 buffer[];
  __shared__ unsigned flag;
  __shared__ unsigned shared_list[kListWords];
  __shared__ unsigned long long reads_in;
  cg::cluster_group cluster = cg::this_cluster();
  const int id = blockIdx.x / 2;
  if (threadIdx.x == 0) {
    flag = 0;
    reads_in = 0;
  }
  cluster.sync();  // the consumer's flag is clear before the producer may set it
  const unsigned long long start = now();
  if (cluster.block_rank() == 0) {
    if (threadIdx.x < kListWords) {
      while (now() - start < publish_ns) {
      }
      const unsigned word = threadIdx.x + 1;
      if (signal == kClusterList) {
        asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote_shared(&shared_list[threadIdx.x], 1)), "r"(word)
                     : "memory");
      } else if (signal == kTagged) {
        const unsigned long long value = (static_cast<unsigned long long>(tag) << 32) | word;
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(tagged + id * kListWords + threadIdx.x), "l"(value)
                     : "memory");
      } else {
        lists[id * kListWords + threadIdx.x] = static_cast<int>(word);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && signal == kTagged) {
      const unsigned long long publish = now();
      times[id].publish = publish;
      times[id].fence_done = publish;
      times[id].store_done = publish;
    } else if (threadIdx.x == 0) {
      // The times stay in registers until the signal is out: a global store
      // before the fence would be one more write for it to wait for.
      const unsigned long long publish = now();
      if (signal == kClusterFence || signal == kClusterList) {
        asm volatile("fence.acq_rel.cluster;" ::: "memory");
      } else {
        __threadfence();
      }
      const unsigned long long fence_done = now();
      if (signal == kGlobal) {
        asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(flags + id) : "memory");
      } else {
        asm volatile("st.release.cluster.shared::cluster.u32 [%0], 1;" ::"r"(remote_shared(&flag, 1)) : "memory");
      }
      const unsigned long long store_done = now();
      times[id].publish = publish;
      times[id].fence_done = fence_done;
      times[id].store_done = store_done;
    }
  } else if (threadIdx.x / 32 < kReadingWarps) {
    read_rows(host, offsets + static_cast<int64_t>(id) * kMaxRows, rows, buffer);
    if (threadIdx.x % 32 == 0) atomicMax(&reads_in, now());
  } else if (signal == kTagged) {
    const int lane = threadIdx.x % 32;
    const unsigned long long* words = tagged + id * kListWords;
    bool complete = false;
    while (!complete) {
      bool mine = true;
      for (int i = lane; i < kListWords; i += 32) {
        unsigned long long v;
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(words + i) : "memory");
        mine &= (v >> 32) == tag && static_cast<unsigned>(v) == static_cast<unsigned>(i + 1);
      }
      complete = __all_sync(0xffffffffu, mine);
    }
    if (lane == 0) {
      times[id].seen = now();
      times[id].list_read = times[id].seen;
    }
  } else if (threadIdx.x % 32 == 0) {
    if (signal == kGlobal) {
      while (load_acquire_global(flags + id) == 0) __nanosleep(128);
    } else {
      const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(&flag));
      unsigned v = 0;
      while (v == 0) asm volatile("ld.acquire.cluster.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(local) : "memory");
    }
    ClusterTimes& t = times[id];
    t.seen = now();
    const unsigned first =
        signal == kClusterList ? shared_list[0] : __ldcg(reinterpret_cast<const unsigned*>(lists) + id * kListWords);
    t.list_read = now_after(first);
    if (first != 1) t.list_read = 0;  // a list not yet visible: reported as a failure
  }
  __syncthreads();
  if (cluster.block_rank() == 1 && rows > 0) {
    // The rows out to device memory once they and the list are in, as a
    // helper copies its buffered rows to their hot rows.
    const unsigned long long copy_start = now();
    uint4* const out = hot + static_cast<int64_t>(id) * kMaxRows * kChunks;
    for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) out[c] = buffer[c];
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned long long issued = now();
      __threadfence();
      const unsigned long long fenced = now();
      times[id].copy_start = copy_start;
      times[id].copy_issued = issued;
      times[id].copy_fenced = fenced;
    }
  }
  if (cluster.block_rank() == 1 && threadIdx.x == 0) times[id].reads_in = reads_in;
  cluster.sync();  // no block leaves while the other may still write its shared memory
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * (v.size() - 1))];
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(signal_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  cudaLaunchAttribute cluster_attr = {};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = 2;
  cluster_attr.val.clusterDim.y = 1;
  cluster_attr.val.clusterDim.z = 1;
  config.gridDim = dim3(sms);
  config.attrs = &cluster_attr;
  config.numAttrs = 1;
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, signal_kernel, &config));
  const int blocks = 2 * clusters;

  const size_t pool_bytes = static_cast<size_t>(clusters) * kRegionBytes;
  uint8_t* host = nullptr;
  CK(cudaHostAlloc(&host, pool_bytes, cudaHostAllocMapped));
  for (size_t i = 0; i < pool_bytes; i += 4096) host[i] = static_cast<uint8_t>(i >> 12);
  int64_t* offsets = nullptr;
  unsigned* flags = nullptr;
  int* lists = nullptr;
  ClusterTimes* times = nullptr;
  unsigned long long* tagged = nullptr;
  uint4* hot = nullptr;
  CK(cudaMalloc(&hot, sizeof(uint4) * clusters * kMaxRows * kChunks));
  CK(cudaMalloc(&tagged, sizeof(unsigned long long) * clusters * kListWords));
  CK(cudaMemset(tagged, 0, sizeof(unsigned long long) * clusters * kListWords));
  unsigned tag = 0;
  CK(cudaMalloc(&offsets, sizeof(int64_t) * clusters * kMaxRows));
  CK(cudaMalloc(&flags, sizeof(unsigned) * clusters));
  CK(cudaMalloc(&lists, sizeof(int) * clusters * kListWords));
  CK(cudaMalloc(&times, sizeof(ClusterTimes) * clusters));

  std::mt19937_64 rng(91);
  const unsigned publish_ns = 11000;
  printf("{\"benchmark\": \"signal_latency_under_host_reads\", \"sms\": %d, \"clusters\": %d, \"publish_us\": %.1f, "
         "\"points\": [",
         sms, clusters, publish_ns / 1e3);
  bool first = true;
  int stale_lists = 0;
  for (int signal : {kGlobal, kGlobalCluster, kClusterFence, kClusterList, kTagged}) {
    for (int rows : {0, 16, 32, 48, 62}) {
      std::vector<double> fence, store, seen, list_read, reads, copy_issued, copy_fenced, done;
      for (int launch = 0; launch < 6; ++launch) {
        std::vector<int64_t> h(static_cast<size_t>(clusters) * kMaxRows);
        for (int c = 0; c < clusters; ++c) {
          for (int i = 0; i < kMaxRows; ++i) {
            h[c * kMaxRows + i] =
                c * kRegionBytes + static_cast<int64_t>(rng() % ((kRegionBytes - kRowBytes) / 16)) * 16;
          }
        }
        CK(cudaMemcpy(offsets, h.data(), h.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
        CK(cudaMemset(flags, 0, sizeof(unsigned) * clusters));
        CK(cudaMemset(lists, 0, sizeof(int) * clusters * kListWords));
        config.gridDim = dim3(blocks);
        CK(cudaLaunchKernelEx(&config, signal_kernel, static_cast<const uint8_t*>(host),
                              static_cast<const int64_t*>(offsets), rows, signal, publish_ns, flags, lists, tagged,
                              ++tag, hot, times));
        CK(cudaDeviceSynchronize());
        if (launch == 0) continue;  // warms the pool's translations and the code
        std::vector<ClusterTimes> t(clusters);
        CK(cudaMemcpy(t.data(), times, sizeof(ClusterTimes) * clusters, cudaMemcpyDeviceToHost));
        for (const ClusterTimes& x : t) {
          const double p = static_cast<double>(x.publish);
          fence.push_back((x.fence_done - p) / 1e3);
          store.push_back((x.store_done - p) / 1e3);
          seen.push_back((x.seen - p) / 1e3);
          if (x.list_read == 0)
            ++stale_lists;
          else
            list_read.push_back((x.list_read - p) / 1e3);
          if (rows > 0) {
            reads.push_back((x.reads_in - p) / 1e3);
            copy_issued.push_back((x.copy_issued - static_cast<double>(x.copy_start)) / 1e3);
            copy_fenced.push_back((x.copy_fenced - static_cast<double>(x.copy_start)) / 1e3);
            done.push_back((x.copy_fenced - p) / 1e3);
          }
        }
      }
      printf("%s\n  {\"signal\": \"%s\", \"rows_per_consumer\": %d, \"rows\": %d", first ? "" : ",",
             kSignalNames[signal], rows, rows * clusters);
      first = false;
      const char* names[] = {"fence_done_us",
                             "store_done_us",
                             "seen_us",
                             "list_read_us",
                             "reads_in_us",
                             "copy_issued_after_start_us",
                             "copy_fenced_after_start_us",
                             "done_us"};
      const std::vector<double>* series[] = {&fence, &store,       &seen,        &list_read,
                                             &reads, &copy_issued, &copy_fenced, &done};
      for (int s = 0; s < 8; ++s) {
        if (series[s]->empty()) continue;
        printf(", \"%s\": {\"median\": %.2f, \"p90\": %.2f}", names[s], percentile(*series[s], 0.5),
               percentile(*series[s], 0.9));
      }
      printf("}");
    }
  }
  printf("\n], \"stale_lists\": %d}\n", stale_lists);
  return stale_lists == 0 ? 0 : 1;
}
