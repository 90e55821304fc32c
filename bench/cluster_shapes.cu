// Which thread-block clusters of resolver-shaped blocks a GPU runs at once,
// and what a cluster launch costs: the facts a handoff between a request's
// owner and its helper blocks through distributed shared memory would be
// laid out by (docs/performance.md, "Physical bounds": publications behind
// host reads). Blocks of 1024 threads with 120 KiB of dynamic shared
// memory (one block per SM, as the resolver's 64 registers per thread and
// 111.2 KiB at H = 4096 allow) or 48 KiB (two per SM):
//
//   max_active_clusters   cudaOccupancyMaxActiveClusters for clusters of k
//                         blocks (k > 8 with the non-portable size allowed)
//   span_us               over max_active_clusters * k blocks that only
//                         stamp the timer, the median (of 20 launches) of
//                         the time from the first block's start to the
//                         last block's end: how far apart the clusters
//                         start, against the same blocks launched without
//                         clusters (k = 1)
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o cluster_shapes bench/cluster_shapes.cu
//   ./cluster_shapes > cluster_shapes.json
//
// Results on an H200: bench/results/cluster_shapes_h200.json.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "standalone_cuda.cuh"

constexpr int kThreads = 1024;

// Each block's start and end times.
__global__ void __launch_bounds__(kThreads, 1) stamp_kernel(unsigned long long* times) {
  if (threadIdx.x == 0) times[2 * blockIdx.x] = now();
  __syncthreads();
  if (threadIdx.x == 0) times[2 * blockIdx.x + 1] = now();
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(stamp_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  unsigned long long* times = nullptr;
  CK(cudaMalloc(&times, sizeof(unsigned long long) * 2 * 2 * sms));
  std::vector<unsigned long long> host(2 * 2 * sms);
  printf("{\"benchmark\": \"cluster_shapes\", \"sms\": %d, \"points\": [", sms);
  bool first = true;
  for (int shared_kib : {120, 48}) {
    CK(cudaFuncSetAttribute(stamp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_kib * 1024));
    for (int k : {1, 2, 3, 4, 6, 8, 12, 16}) {
      cudaLaunchConfig_t config = {};
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = static_cast<size_t>(shared_kib) * 1024;
      cudaLaunchAttribute attribute = {};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = k;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = k > 1 ? 1 : 0;
      config.gridDim = dim3(k);
      int clusters = 0;
      if (k == 1) {
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stamp_kernel, kThreads, config.dynamicSmemBytes));
        clusters = per_sm * sms;
      } else if (cudaOccupancyMaxActiveClusters(&clusters, stamp_kernel, &config) != cudaSuccess) {
        cudaGetLastError();
        clusters = 0;
      }
      std::vector<double> spans;
      if (clusters > 0) {
        config.gridDim = dim3(clusters * k);
        for (int launch = 0; launch < 21; ++launch) {
          CK(cudaLaunchKernelEx(&config, stamp_kernel, times));
          CK(cudaDeviceSynchronize());
          if (launch == 0) continue;
          CK(cudaMemcpy(host.data(), times, sizeof(unsigned long long) * 2 * clusters * k, cudaMemcpyDeviceToHost));
          unsigned long long start = ~0ull, end = 0;
          for (int b = 0; b < clusters * k; ++b) {
            start = std::min(start, host[2 * b]);
            end = std::max(end, host[2 * b + 1]);
          }
          spans.push_back((end - start) / 1e3);
        }
        std::sort(spans.begin(), spans.end());
      }
      printf("%s\n  {\"shared_kib\": %d, \"cluster_blocks\": %d, \"max_active_clusters\": %d, \"blocks\": %d, "
             "\"span_us\": %.2f}",
             first ? "" : ",", shared_kib, k, clusters, clusters * k, spans.empty() ? 0.0 : spans[spans.size() / 2]);
      first = false;
    }
  }
  printf("\n]}\n");
  return 0;
}
