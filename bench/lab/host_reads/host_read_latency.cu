// Lab: how fast the GPU reads scattered 656-byte rows of pinned host memory,
// for three ways of allocating the memory (bench/lab/host_reads/README.md).
//
//   nvcc -O3 -arch=sm_90 -o host_read_latency host_read_latency.cu -lcuda
//   ./host_read_latency 0   # mmap + transparent huge pages + cudaHostRegister
//   ./host_read_latency 1   # cudaHostAlloc
//   ./host_read_latency 2   # cuMemCreate on host NUMA node 0 (2 MiB granularity)
//
// chain: one thread, one dependent 4-byte read after another (random rows,
// then one row again and again). bulk: per block, `rows/block` random rows of
// the block's own 21 MB region (one request's context in bench_resolver) by
// one TMA bulk copy each into shared memory, counted in by an mbarrier, as
// the resolver's miss stage does. warpload: the same rows by one warp with
// 16-byte loads, as the resolver's phase E does.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cstdint>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t mix(uint32_t x) { x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16; return x; }
constexpr int ROW = 656;
constexpr int kMaxRowsPerBlock = 8;  // the bulk kernel's shared buffer
__global__ void chain(const uint8_t* host, long long rows, int n, uint32_t seed, long long* out, int repeat_same) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) {
    long long r = repeat_same ? (mix(seed) % rows) : (mix(seed + i * 7919u) % rows);
    const uint32_t* p = reinterpret_cast<const uint32_t*>(host + r * ROW + (v & 0));
    long long c0 = clock64(); unsigned long long t0 = gtime();
    uint32_t x; asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(x) : "l"(p));
    v += x; __threadfence_block();
    long long c1 = clock64(); unsigned long long t1 = gtime();
    out[2 * i] = c1 - c0; out[2 * i + 1] = (long long)(t1 - t0) + (v == 12345 ? 1 : 0);
  }
}
__global__ void bulk(const uint8_t* host, long long rows_per_block, int per_block, uint32_t seed, long long* out) {
  __shared__ __align__(128) uint8_t buf[kMaxRowsPerBlock * ROW];
  __shared__ __align__(8) unsigned long long bar;
  if (threadIdx.x != 0) return;
  uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n fence.mbarrier_init.release.cluster;" ::"r"(b) : "memory");
  unsigned long long t0 = gtime(); long long c0 = clock64();
  for (int i = 0; i < per_block; ++i) {
    long long r = blockIdx.x * rows_per_block + mix(seed + blockIdx.x * 131u + i) % rows_per_block;
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(buf + i * ROW));
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(ROW) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(host + r * ROW), "r"(ROW), "r"(b) : "memory");
  }
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(b) : "memory");
  uint32_t done = 0;
  while (!done) asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0,1,0,p;\n}\n" : "=r"(done) : "r"(b) : "memory");
  unsigned long long t1 = gtime(); long long c1 = clock64();
  out[4 * blockIdx.x] = t0; out[4 * blockIdx.x + 1] = t1; out[4 * blockIdx.x + 2] = c1 - c0; out[4 * blockIdx.x + 3] = buf[5];
}
__global__ void warpload(const uint8_t* host, long long rows_per_block, int per_block, uint32_t seed, long long* out) {
  if (threadIdx.x >= 32) return;
  unsigned long long t0 = gtime(); long long c0 = clock64();
  uint4 acc = {0, 0, 0, 0};
  for (int i = 0; i < per_block; ++i) {
    long long r = blockIdx.x * rows_per_block + mix(seed + blockIdx.x * 131u + i) % rows_per_block;
    const uint4* src = reinterpret_cast<const uint4*>(host + r * ROW);
    for (int c = threadIdx.x; c < ROW / 16; c += 32) { uint4 x = src[c]; acc.x ^= x.x; acc.y ^= x.y; }
  }
  acc.x = __reduce_xor_sync(~0u, acc.x);
  unsigned long long t1 = gtime(); long long c1 = clock64();
  if (threadIdx.x == 0) { out[4 * blockIdx.x] = t0; out[4 * blockIdx.x + 1] = t1; out[4 * blockIdx.x + 2] = c1 - c0; out[4 * blockIdx.x + 3] = acc.x; }
}
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main(int argc, char** argv) {
  const size_t bytes = size_t(5) << 30;
  const int alloc_kind = argc > 1 ? atoi(argv[1]) : 0;
  uint8_t* h;
  if (alloc_kind == 0) {
    h = (uint8_t*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(h, bytes, MADV_HUGEPAGE);
    memset(h, 0x5a, bytes);
    CK(cudaHostRegister(h, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    printf("mmap + THP + cudaHostRegister\n");
  } else if (alloc_kind == 1) {
    CK(cudaHostAlloc((void**)&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(h, 0x5a, bytes);
    printf("cudaHostAlloc\n");
  } else {
    CK(cudaFree(0));
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = 0;
    size_t gmin = 0, grec = 0;
    CUresult r1 = cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUresult r2 = cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    printf("cuMemCreate(HOST_NUMA 0): granularity min %zu (rc %d) recommended %zu (rc %d)\n", gmin, r1, grec, r2);
    size_t gran = alloc_kind == 3 && grec ? grec : (gmin ? gmin : (2u << 20));
    size_t size = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle handle;
    CUresult rc = cuMemCreate(&handle, size, &prop, 0);
    if (rc != CUDA_SUCCESS) { printf("cuMemCreate failed %d\n", rc); return 1; }
    CUdeviceptr va;
    rc = cuMemAddressReserve(&va, size, gran, 0, 0); if (rc) { printf("reserve %d\n", rc); return 1; }
    rc = cuMemMap(va, size, 0, handle, 0); if (rc) { printf("map %d\n", rc); return 1; }
    CUmemAccessDesc access[2] = {};
    access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE; access[0].location.id = 0; access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; access[1].location.id = 0; access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = cuMemSetAccess(va, size, access, 2);
    if (rc) {
      printf("setaccess with host location %d; device only\n", rc);
      rc = cuMemSetAccess(va, size, access, 1); if (rc) { printf("setaccess %d\n", rc); return 1; }
    }
    h = reinterpret_cast<uint8_t*>(va);
    CK(cudaMemset(h, 0x5a, bytes));
    CK(cudaDeviceSynchronize());
    printf("cuMemCreate host mapping, granularity %zu\n", gran);
  }
  long long rows = bytes / ROW;
  long long* d; CK(cudaMalloc(&d, 1 << 20));
  std::vector<long long> o(1 << 17);
  int clk; CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  printf("sm clock attr %d kHz\n", clk);
  for (int same = 0; same < 2; ++same) {
    chain<<<1, 1>>>(h, rows, 64, 1234 + same, d, same); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o.data(), d, 64 * 16, cudaMemcpyDeviceToHost));
    std::vector<double> cy, ns; for (int i = 1; i < 64; ++i) { cy.push_back(o[2*i]); ns.push_back(o[2*i+1]); }
    printf("chain %s: median %.0f cycles, %.0f ns (globaltimer); min %.0f max %.0f cycles\n", same ? "same row" : "random rows", med(cy), med(ns),
           *std::min_element(cy.begin(), cy.end()), *std::max_element(cy.begin(), cy.end()));
  }
  long long rows_per_block = (32768LL * 656) / ROW;  // one request's context, like the bench
  for (int kind = 0; kind < 2; ++kind)
  for (int per : {2, kMaxRowsPerBlock})
  for (int nb : {1, 16, 64, 100, 132}) {
    std::vector<double> lat_all, span_all;
    for (int rep = 0; rep < 5; ++rep) {
      if (kind == 0) bulk<<<nb, 32>>>(h, rows_per_block, per, 777u * rep + nb + per, d);
      else warpload<<<nb, 32>>>(h, rows_per_block, per, 999u * rep + nb + per, d);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(o.data(), d, nb * 32, cudaMemcpyDeviceToHost));
      unsigned long long t0min = ~0ull, t1max = 0; std::vector<double> lat;
      for (int b = 0; b < nb; ++b) { t0min = std::min<unsigned long long>(t0min, o[4*b]); t1max = std::max<unsigned long long>(t1max, o[4*b+1]); lat.push_back(o[4*b+2] / (clk / 1e6)); }
      lat_all.push_back(med(lat)); span_all.push_back((t1max - t0min));
    }
    printf("%s rows/block=%d blocks=%3d: median block latency %.0f ns (clock), grid span %.0f ns (globaltimer), bytes %d -> %.1f GB/s\n",
           kind == 0 ? "bulk    " : "warpload", per, nb, med(lat_all), med(span_all), nb * per * ROW, nb * per * ROW / med(span_all));
  }
  return 0;
}
