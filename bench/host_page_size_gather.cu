// Whether the page size of the GPU's mapping of pinned host memory limits
// scattered zero-copy reads (the resolver's host reads of missed rows):
// random 656-byte rows, fresh ones for every repetition, gathered by one
// warp per row with 16-byte loads from a 4 GiB pool allocated four ways:
//
//   malloc+THP+register    2 MiB-aligned malloc, MADV_HUGEPAGE, cudaHostRegister
//   malloc+4K+register     the same with MADV_NOHUGEPAGE
//   cudaHostAlloc          the runtime's own pinned allocation
//   cuMemCreate host NUMA  pinned host memory through the virtual memory
//                          API, mapped at its 2 MiB granularity
//
//   nvcc -O3 -arch=sm_90 -o host_page_size_gather bench/host_page_size_gather.cu -lcuda
//   ./host_page_size_gather
//
// Results on an H200: bench/results/host_page_size_gather_h200.json.
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                      \
    }                                                \
  } while (0)
#define CKD(x)                   \
  do {                           \
    CUresult e = (x);            \
    if (e != CUDA_SUCCESS) {     \
      const char* s;             \
      cuGetErrorString(e, &s);   \
      printf("%s: %s\n", #x, s); \
      return 1;                  \
    }                            \
  } while (0)

constexpr int kRowBytes = 656;

__global__ void gather_rows(const uint8_t* __restrict__ host, uint8_t* __restrict__ dst,
                            const int64_t* __restrict__ rows, int n) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < n; r += warps) {
    const uint4* src = reinterpret_cast<const uint4*>(host + rows[r] * kRowBytes);
    uint4* out = reinterpret_cast<uint4*>(dst + (int64_t)r * kRowBytes);
    uint4 a = lane < 41 ? src[lane] : make_uint4(0, 0, 0, 0);
    uint4 b = lane + 32 < 41 ? src[lane + 32] : make_uint4(0, 0, 0, 0);
    if (lane < 41) out[lane] = a;
    if (lane + 32 < 41) out[lane + 32] = b;
  }
}

int run(const char* name, uint8_t* dev_host, size_t pool_bytes, int64_t* d_rows, uint8_t* d_dst, int blocks) {
  const int64_t pool_rows = pool_bytes / kRowBytes;
  std::mt19937_64 rng(1234);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int n : {200, 8192, 65536, 262144}) {
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<int64_t> rows(n);
      for (auto& r : rows) r = rng() % pool_rows;  // fresh rows each time: cold translations
      CK(cudaMemcpy(d_rows, rows.data(), n * 8, cudaMemcpyHostToDevice));
      cudaEventRecord(e0);
      gather_rows<<<blocks, 512>>>(dev_host, d_dst, d_rows, n);
      CK(cudaGetLastError());  // a refused launch would otherwise time an empty interval
      cudaEventRecord(e1);
      CK(cudaEventSynchronize(e1));
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      printf("%-22s rows %7d rep %d: %9.1f us  %6.2f GB/s payload\n", name, n, rep, ms * 1e3,
             (double)n * kRowBytes / (ms * 1e-3) / 1e9);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}

int main() {
  const size_t pool = size_t{4} << 30;
  CK(cudaSetDevice(0));
  CKD(cuInit(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = 4 * sms;  // 16 warps each, four blocks per SM
  int64_t* d_rows;
  uint8_t* d_dst;
  CK(cudaMalloc(&d_rows, 262144 * 8));
  CK(cudaMalloc(&d_dst, (size_t)262144 * kRowBytes));
  for (int mode = 0; mode < 4; ++mode) {
    if (mode <= 1) {
      void* p = aligned_alloc(2 << 20, pool);
      if (p == nullptr) {
        printf("aligned_alloc of %zu bytes failed\n", pool);
        return 1;
      }
      // Huge pages are advised (or refused), not checked: with THP set to
      // "madvise" the kernel backs the advised region where it can.
      madvise(p, pool, mode == 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
      memset(p, 0x5A, pool);
      CK(cudaHostRegister(p, pool, cudaHostRegisterMapped));
      uint8_t* dp;
      CK(cudaHostGetDevicePointer((void**)&dp, p, 0));
      if (run(mode == 0 ? "malloc+THP+register" : "malloc+4K+register", dp, pool, d_rows, d_dst, blocks)) return 1;
      CK(cudaHostUnregister(p));
      free(p);
    } else if (mode == 2) {
      void* p;
      CK(cudaHostAlloc(&p, pool, cudaHostAllocMapped));
      memset(p, 0x5A, pool);
      uint8_t* dp;
      CK(cudaHostGetDevicePointer((void**)&dp, p, 0));
      if (run("cudaHostAlloc", dp, pool, d_rows, d_dst, blocks)) return 1;
      CK(cudaFreeHost(p));
    } else {
      CUmemAllocationProp prop = {};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      prop.location.id = 0;
      size_t gran = 0;
      CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
      printf("host NUMA granularity %zu\n", gran);
      CUmemGenericAllocationHandle h;
      CKD(cuMemCreate(&h, pool, &prop, 0));
      CUdeviceptr va;
      CKD(cuMemAddressReserve(&va, pool, gran, 0, 0));
      CKD(cuMemMap(va, pool, 0, h, 0));
      CUmemAccessDesc acc[2] = {};
      acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      acc[0].location.id = 0;
      acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      acc[1].location.id = 0;
      acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CUresult both = cuMemSetAccess(va, pool, acc, 2);
      if (both != CUDA_SUCCESS) {
        printf("host access not granted (%d); device only\n", (int)both);
        CKD(cuMemSetAccess(va, pool, acc, 1));
      } else {
        memset((void*)va, 0x5A, pool);
        printf("host wrote the pool through the same address\n");
      }
      CK(cudaMemset((void*)va, 0x5A, pool));
      CK(cudaDeviceSynchronize());
      if (run("cuMemCreate host NUMA", (uint8_t*)va, pool, d_rows, d_dst, blocks)) return 1;
      cuMemUnmap(va, pool);
      cuMemAddressFree(va, pool);
      cuMemRelease(h);
    }
  }
  printf("done\n");
  return 0;
}
