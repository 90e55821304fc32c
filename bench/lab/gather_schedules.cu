// Gather schedule lab: which schedule of a zero-copy row gather gets closest
// to pinned memcpy for swap lists whose misses are local to each request's
// host window (bench_gather.py's "local" pattern). Not part of the library:
// a standalone program that times candidate schedules side by side in one
// run, each verified byte for byte, to decide what the library should adopt.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gather_schedules bench/lab/gather_schedules.cu
//   ./gather_schedules > bench/results/gather_schedules_h200.txt
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

struct List {
  const int32_t* host_row;  // [R, K]
  const int32_t* dev_row;   // [R, K]
  const int32_t* counts;    // [R]
  const int32_t* prefix;    // [R + 1] exclusive prefix of counts (lab only: built on the host)
  int R, K, total;
};

struct Rows {
  const uint8_t* host;
  uint8_t* hot;
  int64_t row_bytes;
};

__device__ __forceinline__ uint4 ld_plain(const void* p) { return *reinterpret_cast<const uint4*>(p); }
template <int kHint>
__device__ __forceinline__ uint4 ld_hint(const void* p) {
  uint4 v;
  if (kHint == 256) {
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if (kHint == 128) {
    asm volatile("ld.global.nc.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    v = ld_plain(p);
  }
  return v;
}

// Entry index f (over used entries) -> (t, k) by binary search in prefix.
__device__ __forceinline__ void locate(const List& l, int f, int* t, int* k) {
  int lo = 0, hi = l.R;  // prefix[lo] <= f < prefix[hi]
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (l.prefix[mid] <= f) lo = mid; else hi = mid;
  }
  *t = lo;
  *k = f - l.prefix[lo];
}

// 1. the product's warp_per_row: grid covers R x K.
template <int kHint>
__global__ void wpr_kernel(Rows r, List l) {
  const int lane = threadIdx.x & 31;
  const int k = blockIdx.x * 8 + threadIdx.x / 32;
  const int t = blockIdx.y;
  if (k >= l.counts[t]) return;
  const int64_t h = l.host_row[t * l.K + k], d = l.dev_row[t * l.K + k];
  const int chunks = r.row_bytes / 16;
  for (int c = lane; c < chunks; c += 32) {
    uint4 v = ld_hint<kHint>(r.host + h * r.row_bytes + c * 16);
    *reinterpret_cast<uint4*>(r.hot + d * r.row_bytes + c * 16) = v;
  }
}

// 2. persistent, `lanes` lanes per row (32 = one warp per row, 16 = half warp),
// all of a row's loads issued before its stores.
template <int kLanes, int kHint>
__global__ void persist_kernel(Rows r, List l) {
  constexpr int kGroups = 32 / kLanes;
  const int lane = threadIdx.x & 31;
  const int sub = lane / kLanes, sl = lane % kLanes;
  const int chunks = r.row_bytes / 16;
  constexpr int kMaxPer = (72 + kLanes - 1) / kLanes;  // rows up to 1152 B
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int base = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kGroups; base < l.total;
       base += warps * kGroups) {
    const int f = base + sub;
    const bool live = f < l.total;
    int t = 0, k = 0;
    if (live) locate(l, f, &t, &k);
    const uint8_t* src = live ? r.host + int64_t(l.host_row[t * l.K + k]) * r.row_bytes : nullptr;
    uint8_t* dst = live ? r.hot + int64_t(l.dev_row[t * l.K + k]) * r.row_bytes : nullptr;
    uint4 v[kMaxPer];
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) {
      const int c = sl + i * kLanes;
      if (live && c < chunks) v[i] = ld_hint<kHint>(src + c * 16);
    }
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) {
      const int c = sl + i * kLanes;
      if (live && c < chunks) *reinterpret_cast<uint4*>(dst + c * 16) = v[i];
    }
  }
}

// 3. TMA bulk copies host -> shared (one per row, one mbarrier per batch),
// then the block writes the staged rows out. kBatch rows per round.
template <int kBatch>
__global__ void bulk_kernel(Rows r, List l) {
  extern __shared__ __align__(128) uint8_t stage[];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  const uint32_t stage_addr = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const int chunks = r.row_bytes / 16;
  uint32_t phase = 0;
  __shared__ int64_t dst_row[kBatch];
  for (int base = blockIdx.x * kBatch; base < l.total; base += gridDim.x * kBatch) {
    const int n = min(kBatch, l.total - base);
    if (threadIdx.x == 0) {
      asm volatile("fence.proxy.async.shared::cta;");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_addr),
                   "r"(static_cast<uint32_t>(n * r.row_bytes)));
    }
    __syncthreads();
    if (threadIdx.x < n) {
      int t, k;
      locate(l, base + threadIdx.x, &t, &k);
      const uint8_t* src = r.host + int64_t(l.host_row[t * l.K + k]) * r.row_bytes;
      dst_row[threadIdx.x] = l.dev_row[t * l.K + k];
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              stage_addr + static_cast<uint32_t>(threadIdx.x * r.row_bytes)),
          "l"(src), "r"(static_cast<uint32_t>(r.row_bytes)), "r"(bar_addr)
          : "memory");
    }
    // Wait for the batch.
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done) : "r"(bar_addr), "r"(phase) : "memory");
    }
    phase ^= 1;
    __syncthreads();  // dst_row visible
    for (int c = threadIdx.x; c < n * chunks; c += blockDim.x) {
      const int e = c / chunks, ch = c - e * chunks;
      *reinterpret_cast<uint4*>(r.hot + dst_row[e] * r.row_bytes + ch * 16) =
          *reinterpret_cast<const uint4*>(stage + e * r.row_bytes + ch * 16);
    }
    __syncthreads();
  }
}

__global__ void verify_kernel(Rows r, List l, unsigned long long* bad) {
  const int chunks = r.row_bytes / 16;
  for (int f = blockIdx.x * blockDim.x + threadIdx.x; f < l.total * chunks; f += gridDim.x * blockDim.x) {
    const int e = f / chunks, ch = f - e * chunks;
    int t, k;
    locate(l, e, &t, &k);
    const uint4 a = *reinterpret_cast<const uint4*>(r.host + int64_t(l.host_row[t * l.K + k]) * r.row_bytes + ch * 16);
    const uint4 b = *reinterpret_cast<const uint4*>(r.hot + int64_t(l.dev_row[t * l.K + k]) * r.row_bytes + ch * 16);
    if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) atomicAdd(bad, 1ull);
  }
}

int main(int argc, char** argv) {
  const size_t pool_bytes = size_t(4) << 30;
  const int R = 64, K = 2048, H = 4096, context = 32768, block = 64, lists = 4, iters = 12;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  void* pool = mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(pool, pool_bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < pool_bytes; i += 8) *reinterpret_cast<uint64_t*>((char*)pool + i) = i * 0x9E3779B97F4A7C15ull;
  CK(cudaHostRegister(pool, pool_bytes, cudaHostRegisterMapped));
  uint8_t* hot = nullptr;
  unsigned long long* bad = nullptr;
  CK(cudaMalloc(&bad, 8));
  std::mt19937_64 rng(1);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  uint8_t* dev_dst = nullptr;
  CK(cudaMalloc(&dev_dst, size_t(R) * 410 * 1152));
  for (int row_bytes : {656, 1152}) {
    CK(cudaMalloc(&hot, size_t(R) * H * row_bytes));
    const int64_t host_rows = pool_bytes / row_bytes;
    const int64_t share = host_rows / R;
    for (int m : {102, 205, 410}) {
      for (int sorted = 0; sorted < 2; ++sorted) {
        std::vector<List> ls;
        for (int li = 0; li < lists; ++li) {
          std::vector<int32_t> hr(R * K, -1), dr(R * K, -1), cnt(R, m), pre(R + 1, 0);
          for (int t = 0; t < R; ++t) {
            const int64_t wstart = (int64_t(rng() % ((share - context) / block))) * block + t * share;
            std::vector<int32_t> pick(context);
            std::iota(pick.begin(), pick.end(), 0);
            std::shuffle(pick.begin(), pick.end(), rng);
            std::vector<int32_t> dst(H);
            std::iota(dst.begin(), dst.end(), 0);
            std::shuffle(dst.begin(), dst.end(), rng);
            if (sorted) std::sort(pick.begin(), pick.begin() + m);
            for (int k = 0; k < m; ++k) {
              hr[t * K + k] = int32_t(wstart + pick[k]);
              dr[t * K + k] = t * H + dst[k];
            }
            pre[t + 1] = pre[t] + m;
          }
          int32_t *dh, *dd, *dc, *dp;
          CK(cudaMalloc(&dh, 4 * R * K));
          CK(cudaMalloc(&dd, 4 * R * K));
          CK(cudaMalloc(&dc, 4 * R));
          CK(cudaMalloc(&dp, 4 * (R + 1)));
          CK(cudaMemcpy(dh, hr.data(), 4 * R * K, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(dd, dr.data(), 4 * R * K, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(dc, cnt.data(), 4 * R, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(dp, pre.data(), 4 * (R + 1), cudaMemcpyHostToDevice));
          ls.push_back(List{dh, dd, dc, dp, R, K, pre[R]});
        }
        const double bytes = double(R) * m * row_bytes;
        // memcpy of the same bytes from the pool.
        auto time_it = [&](auto launch) {
          for (int w = 0; w < 2; ++w) launch(ls[w % lists]);
          CK(cudaEventRecord(e0));
          for (int i = 0; i < iters; ++i) launch(ls[i % lists]);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          return bytes * iters / (ms * 1e-3) / 1e9;
        };
        const double memcpy_gbps = time_it([&](const List&) {
          CK(cudaMemcpyAsync(dev_dst, (char*)pool + (rng() % 1000) * 4096, size_t(bytes), cudaMemcpyHostToDevice));
        });
        printf("row %4d  m %3d  %s  memcpy %.1f GB/s |", row_bytes, m, sorted ? "sorted" : "random", memcpy_gbps);
        Rows rows{reinterpret_cast<const uint8_t*>(pool), hot, row_bytes};
        auto report = [&](const char* name, auto launch) {
          const double g = time_it(launch);
          CK(cudaMemset(hot, 0, size_t(R) * H * row_bytes));
          CK(cudaMemset(bad, 0, 8));
          launch(ls[0]);
          verify_kernel<<<264, 256>>>(rows, ls[0], bad);
          unsigned long long b = 0;
          CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
          CK(cudaGetLastError());
          printf(" %s %.2f%s", name, g / memcpy_gbps, b ? "!" : "");
        };
        report("wpr", [&](const List& l) { wpr_kernel<0><<<dim3(K / 8, R), 256>>>(rows, l); });
        report("wpr256", [&](const List& l) { wpr_kernel<256><<<dim3(K / 8, R), 256>>>(rows, l); });
        report("wpr128", [&](const List& l) { wpr_kernel<128><<<dim3(K / 8, R), 256>>>(rows, l); });
        for (int mult : {1, 2, 4}) {
          char name[32];
          snprintf(name, sizeof name, "p32x%d", mult);
          report(name, [&](const List& l) { persist_kernel<32, 0><<<sms * mult, 256>>>(rows, l); });
          snprintf(name, sizeof name, "p32h256x%d", mult);
          report(name, [&](const List& l) { persist_kernel<32, 256><<<sms * mult, 256>>>(rows, l); });
          snprintf(name, sizeof name, "p16x%d", mult);
          report(name, [&](const List& l) { persist_kernel<16, 0><<<sms * mult, 256>>>(rows, l); });
        }
        report("p32h256@66", [&](const List& l) { persist_kernel<32, 256><<<66, 256>>>(rows, l); });
        for (int mult : {1, 2}) {
          char name[32];
          snprintf(name, sizeof name, "bulk32x%d", mult);
          CK(cudaFuncSetAttribute(bulk_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, 32 * 1152));
          report(name, [&](const List& l) { bulk_kernel<32><<<sms * mult, 256, 32 * row_bytes>>>(rows, l); });
        }
        CK(cudaFuncSetAttribute(bulk_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1152));
        report("bulk64x2", [&](const List& l) { bulk_kernel<64><<<sms * 2, 256, 64 * row_bytes>>>(rows, l); });
        printf("\n");
        fflush(stdout);
      }
    }
    CK(cudaFree(hot));
  }
  return 0;
}
