// How long a block's other memory accesses take while its own reads of host
// memory are in flight, and while other SMs' are: the turn launches'
// question (docs/performance.md, "256 requests at 0.1%": a turn whose
// staged rows are in flight waits for them before its outputs and the next
// turn's phase A: could idle SMs read them instead, and is it the warps
// that issued them that wait?). One 1024-thread block
// per SM (120 KB of shared memory): 1 block (`alone`), one per SM all
// reading (`all`, as the first turns' walks), or one per SM of which the
// odd ones read (`half`: the even ones probe with nothing of their own in
// flight). In a block that reads, warp 0 starts `rows` host rows of 656
// bytes (lane i row i, at random 16-byte offsets of the block's own 4 MiB of
// a pinned pool, fresh every launch) by
//
//   bulk      one TMA bulk copy per row into shared memory, counted in by an
//             mbarrier (the resolver's miss stage)
//   load      one 16-byte load of each row into a register
//   prefetch  prefetch.global.L2 of each of the row's 128-byte lines
//
// and, after a block barrier (the rows are issued, not in), one probe runs,
// by warps 1-31 while warp 0 waits for its rows (prober `others`), or by
// warp 0 itself before it waits (prober `issuer`: do the issuing warp's own
// later accesses wait for its rows?):
//
//   l2_chain  16 dependent loads, each on another line, of a device buffer
//             that a kernel just before read into L2 (the prober's first
//             thread)
//   l1_chain  16 dependent loads of lines the block read just before the
//             issue (L1 hits, the prober's first thread)
//   stores    48 bytes of global stores per thread of the prober (the
//             outputs' amount), a barrier of its threads, then
//             __threadfence (its first thread)
//   shared    16 dependent shared-memory loads (the prober's first thread)
//
// Printed as JSON: per issue kind, prober, probe, readers and rows, medians
// over the reading blocks of five launches, in microseconds after the
// issue: the probe done (stores: issued, and fenced), the rows in (bulk:
// the mbarrier's phase complete; load: the value used; prefetch: not known,
// 0), and how long warp 0 took to issue its rows; for `half` also the probe
// of the blocks that read nothing.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o accesses_behind_host_reads bench/accesses_behind_host_reads.cu
//   ./accesses_behind_host_reads > accesses_behind_host_reads.json
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "../cpp/cuda/hopper_sync.cuh"
#include "standalone_cuda.cuh"

using hisparse::cuda::bulk_copy_to_shared;
using hisparse::cuda::mbarrier_arrive;
using hisparse::cuda::mbarrier_init_one_arrival;
using hisparse::cuda::mbarrier_wait_first_phase;

constexpr int kThreads = 1024;
constexpr int kRowBytes = 656;
constexpr int kMaxRows = 32;
constexpr int kChain = 16;
constexpr int kStoreVectors = 3;  // 48 bytes per thread
constexpr int64_t kRegionBytes = 4 << 20;
constexpr int kSharedBytes = 120 << 10;  // one block per SM
constexpr int kL1Words = 1024;           // per block: the L1 chain's 32 lines, read before the issue
constexpr int kChainWords = 8192;        // per block: the L1 chain's words, then the L2 chain's

enum Issue { kBulk = 0, kLoad = 1, kPrefetch = 2 };
const char* const kIssueNames[] = {"bulk", "load", "prefetch"};
enum Probe { kL2Chain = 0, kL1Chain = 1, kStores = 2, kShared = 3 };
const char* const kProbeNames[] = {"l2_chain", "l1_chain", "stores", "shared"};
enum Prober { kOthers = 0, kIssuer = 1 };
const char* const kProberNames[] = {"others", "issuer"};
const char* const kReaderNames[] = {"alone", "all", "half"};

struct BlockTimes {
  unsigned long long issue_began, issued, probe_done, probe_fenced, rows_in;
};

// One probe (module comment) by the `threads` threads from `first` (a whole
// number of warps), timed by thread `first`; returns {done, fenced}.
__device__ __forceinline__ void run_probe(int probe, int first, int threads, const int* block_chain,
                                          const int* shared_chain, uint4* stores, int touched, unsigned* sink,
                                          BlockTimes* times) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < first || t >= first + threads) return;
  unsigned long long done = 0, fenced = 0;
  if (probe == kL2Chain || probe == kL1Chain) {
    if (t == first) {
      // Each word holds the next word's index (set by the host): below
      // kL1Words for the L1 chain, above for the L2 chain.
      int i = probe == kL1Chain ? 0 : kL1Words;
      for (int k = 0; k < kChain; ++k) i = block_chain[i];
      done = now_after(static_cast<unsigned>(i));
      sink[gridDim.x + blockIdx.x] = static_cast<unsigned>(i);
    }
  } else if (probe == kStores) {
    uint4* mine = stores + (static_cast<int64_t>(blockIdx.x) * kThreads + t) * kStoreVectors;
    for (int v = 0; v < kStoreVectors; ++v) mine[v] = make_uint4(t, v, blockIdx.x, touched);
    if (threads == 32) {
      __syncwarp();
    } else {
      asm volatile("bar.sync 1, %0;" ::"r"(threads));
    }
    if (t == first) {
      done = now();
      __threadfence();
      fenced = now();
    }
  } else {
    if (t == first) {
      int i = 0;
      for (int k = 0; k < kChain; ++k) i = shared_chain[i];
      done = now_after(static_cast<unsigned>(i));
      sink[gridDim.x + blockIdx.x] = static_cast<unsigned>(i);
    }
  }
  if (t == first) {
    times[blockIdx.x].probe_done = done;
    times[blockIdx.x].probe_fenced = fenced;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    probe_kernel(const uint8_t* host, const int64_t* offsets, int rows_of_readers, int readers_every, int issue,
                 int probe, int prober, const int* chain, unsigned* sink, uint4* stores, BlockTimes* times) {
  extern __shared__ uint4 stage[];
  __shared__ __align__(8) unsigned long long barrier_word;
  __shared__ int shared_chain[kChain * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = static_cast<int>(blockIdx.x) % readers_every == readers_every - 1 ? rows_of_readers : 0;
  const unsigned barrier = static_cast<unsigned>(__cvta_generic_to_shared(&barrier_word));
  const int* const block_chain = chain + static_cast<int64_t>(blockIdx.x) * kChainWords;
  if (threadIdx.x == 0) {
    mbarrier_init_one_arrival(barrier);
  }
  if (threadIdx.x < kChain * 32) shared_chain[threadIdx.x] = (threadIdx.x + 32) % (kChain * 32);
  // The L1 chain's lines: the block reads them once now.
  const int touched = block_chain[threadIdx.x % kL1Words];
  sink[2 * gridDim.x + blockIdx.x * kThreads + threadIdx.x] = static_cast<unsigned>(touched);
  __syncthreads();
  uint4 value = make_uint4(0, 0, 0, 0);
  if (warp == 0) {
    const bool mine = lane < rows;
    const uint8_t* src = host + (mine ? offsets[static_cast<int64_t>(blockIdx.x) * kMaxRows + lane] : 0);
    // The issue is timed once every lane has its row's address.
    const unsigned addresses = __reduce_or_sync(0xffffffffu, static_cast<unsigned>(reinterpret_cast<uintptr_t>(src)));
    if (lane == 0) times[blockIdx.x].issue_began = now_after(addresses);
    if (mine && issue == kBulk) {
      bulk_copy_to_shared(barrier, static_cast<unsigned>(__cvta_generic_to_shared(stage + lane * (kRowBytes / 16))),
                          src, kRowBytes);
    } else if (mine && issue == kLoad) {
      value = *reinterpret_cast<const uint4*>(src);
    } else if (mine && issue == kPrefetch) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(src) & ~uintptr_t{127};
      for (uintptr_t line = begin; line < reinterpret_cast<uintptr_t>(src) + kRowBytes; line += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
      }
    }
    __syncwarp();  // every lane's bytes are announced before the one arrival
    if (lane == 0 && issue == kBulk) mbarrier_arrive(barrier);
  }
  __syncthreads();  // every row is issued
  if (threadIdx.x == 0) times[blockIdx.x].issued = now();
  if (prober == kIssuer) {
    run_probe(probe, 0, 32, block_chain, shared_chain, stores, touched, sink, times);
  } else {
    run_probe(probe, 32, kThreads - 32, block_chain, shared_chain, stores, touched, sink, times);
  }
  if (warp == 0) {
    unsigned long long rows_in = 0;
    if (issue == kBulk) {
      mbarrier_wait_first_phase(barrier);
      rows_in = now_after(static_cast<unsigned>(stage[0].x));
    } else if (issue == kLoad) {
      const unsigned folded = __reduce_xor_sync(0xffffffffu, value.x ^ value.y ^ value.z ^ value.w);
      rows_in = now_after(folded);
      if (lane == 0) sink[blockIdx.x] = folded;
    }
    if (lane == 0) times[blockIdx.x].rows_in = rows_in;
  }
}

__global__ void warm_kernel(const int* chain, unsigned* sink) {
  unsigned sum = 0;
  for (int j = threadIdx.x; j < kChainWords; j += kThreads)
    sum += chain[static_cast<int64_t>(blockIdx.x) * kChainWords + j];
  if (sum == 0xFFFFFFFFu) sink[blockIdx.x] = sum;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  int device = 0, sms = 0;
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  const int max_blocks = sms;
  uint8_t* host = nullptr;
  const int64_t pool_bytes = kRegionBytes * max_blocks;
  CK(cudaHostAlloc(&host, pool_bytes, cudaHostAllocMapped));
  for (int64_t i = 0; i < pool_bytes; i += 4096) host[i] = static_cast<uint8_t>(i >> 12);
  uint8_t* host_device = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_device), host, 0));
  int64_t* offsets = nullptr;
  int* chain = nullptr;
  unsigned* sink = nullptr;
  uint4* stores = nullptr;
  BlockTimes* times = nullptr;
  CK(cudaMalloc(&offsets, sizeof(int64_t) * max_blocks * kMaxRows));
  CK(cudaMalloc(&chain, sizeof(int) * static_cast<int64_t>(max_blocks) * kChainWords));
  {
    // Each hop moves to another 128-byte line: 7 lines on within the L1
    // chain's 32, 61 lines on within the L2 chain's 224.
    std::vector<int> links(static_cast<size_t>(max_blocks) * kChainWords);
    for (int b = 0; b < max_blocks; ++b) {
      for (int j = 0; j < kChainWords; ++j) {
        links[static_cast<size_t>(b) * kChainWords + j] =
            j < kL1Words ? (j + 7 * 32) % kL1Words : kL1Words + (j - kL1Words + 61 * 32) % (kChainWords - kL1Words);
      }
    }
    CK(cudaMemcpy(chain, links.data(), sizeof(int) * links.size(), cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&sink, sizeof(unsigned) * (2 + kThreads) * max_blocks));
  CK(cudaMalloc(&stores, sizeof(uint4) * static_cast<int64_t>(max_blocks) * kThreads * kStoreVectors));
  CK(cudaMalloc(&times, sizeof(BlockTimes) * max_blocks));
  CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  std::mt19937_64 rng(7);
  std::vector<int64_t> host_offsets(static_cast<size_t>(max_blocks) * kMaxRows);
  std::vector<BlockTimes> block_times(max_blocks);
  const int kRows[] = {0, 1, 2, 4, 8, 16, 32};
  printf("{\"gpu\": \"%s\", \"sms\": %d, \"row_bytes\": %d, \"points\": [\n", prop.name, sms, kRowBytes);
  bool first = true;
  for (int issue = 0; issue < 3; ++issue) {
    for (int prober = 0; prober < 2; ++prober) {
      for (int probe = 0; probe < 4; ++probe) {
        for (int readers = 0; readers < 3; ++readers) {
          const int blocks = readers == 0 ? 1 : max_blocks;
          const int every = readers == 2 ? 2 : 1;
          for (int rows : kRows) {
            std::vector<double> probe_done, probe_fenced, rows_in, issue_time, others_done, others_fenced;
            for (int launch = 0; launch < 6; ++launch) {
              for (int b = 0; b < blocks; ++b) {
                for (int r = 0; r < kMaxRows; ++r) {
                  host_offsets[static_cast<size_t>(b) * kMaxRows + r] =
                      b * kRegionBytes + static_cast<int64_t>(rng() % ((kRegionBytes - kRowBytes) / 16)) * 16;
                }
              }
              CK(cudaMemcpy(offsets, host_offsets.data(), sizeof(int64_t) * blocks * kMaxRows, cudaMemcpyHostToDevice));
              // The chains' words into L2 (the probe kernel's L1 starts cold).
              warm_kernel<<<blocks, kThreads>>>(chain, sink);
              probe_kernel<<<blocks, kThreads, kSharedBytes>>>(host_device, offsets, rows, every, issue, probe, prober,
                                                               chain, sink, stores, times);
              CK(cudaGetLastError());
              CK(cudaDeviceSynchronize());
              if (launch == 0) continue;  // warm-up
              CK(cudaMemcpy(block_times.data(), times, sizeof(BlockTimes) * blocks, cudaMemcpyDeviceToHost));
              for (int b = 0; b < blocks; ++b) {
                const BlockTimes& t = block_times[b];
                const double at = static_cast<double>(t.issued);
                const double done = (static_cast<double>(t.probe_done) - at) / 1000.0;
                const double fenced = t.probe_fenced != 0 ? (static_cast<double>(t.probe_fenced) - at) / 1000.0 : 0;
                if (b % every != every - 1) {
                  others_done.push_back(done);
                  others_fenced.push_back(fenced);
                  continue;
                }
                probe_done.push_back(done);
                probe_fenced.push_back(fenced);
                rows_in.push_back(t.rows_in != 0 ? (static_cast<double>(t.rows_in) - at) / 1000.0 : 0);
                issue_time.push_back((at - static_cast<double>(t.issue_began)) / 1000.0);
              }
            }
            printf(
                "%s  {\"issue\": \"%s\", \"prober\": \"%s\", \"probe\": \"%s\", \"readers\": \"%s\", \"blocks\": %d, "
                "\"rows\": %d, \"issue_us\": %.3f, \"probe_done_us\": %.3f, \"probe_fenced_us\": %.3f, "
                "\"rows_in_us\": %.3f",
                first ? "" : ",\n", kIssueNames[issue], kProberNames[prober], kProbeNames[probe], kReaderNames[readers],
                blocks, rows, median(issue_time), median(probe_done), median(probe_fenced), median(rows_in));
            if (every > 1) {
              printf(", \"others_probe_done_us\": %.3f, \"others_probe_fenced_us\": %.3f", median(others_done),
                     median(others_fenced));
            }
            printf("}");
            first = false;
          }
        }
      }
    }
  }
  printf("\n]}\n");
  return 0;
}
