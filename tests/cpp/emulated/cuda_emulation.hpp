// A CPU emulation of the CUDA execution model, enough to run the CUDA
// resolver's and gather_compact's kernel source unchanged on the host: a
// block's threads are cooperative fibers (ucontext) that switch only at
// __syncthreads and at warp collectives (shuffles, ballots, __syncwarp),
// blocks run one after another, and device memory is host memory. Shared
// memory is thread_local storage: the fibers of the one OS thread that runs
// them all see one copy, as a block's threads do (and, as on the device,
// nothing initialises it).
//
// It checks a kernel's logic against the CPU reference where no GPU is at
// hand; it is no evidence for the CUDA build. Not emulated: concurrency
// (no two blocks overlap, so no race can show; a kernel that waits on
// another block must find it finished, i.e. helpers after owners), memory
// ordering, timing, and anything under __CUDA_ARCH__: the device code
// compiles as host code, so it takes its pre-sm_80 paths (synchronous
// copies for cp.async, no bulk copies or mbarriers, no programmatic
// launch). Warp collectives assume every lane of the warp that has not
// exited takes part (as the kernels' full-mask collectives do).
//
// Include it first, before any CUDA header: it defines the execution-space
// keywords away, the built-in variables, the intrinsics, and the runtime
// calls the launchers make (cudaLaunchKernelEx runs the grid here; kernels
// launched with <<<...>>> cannot be emulated, hence launch_kernel in
// cpp/cuda/kernel_launch.hpp). A kernel's `extern __shared__` array is the
// test's to define, in the kernel's namespace, as `thread_local`.
#pragma once

#define __host__
#define __device__
#define __global__
#define __shared__ thread_local
#define __launch_bounds__(...)
#define __grid_constant__

#include <sys/mman.h>
#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

// Built-in variables: the scheduler sets threadIdx before resuming a fiber.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

namespace emu {

constexpr int kMaxThreads = 1024;
// Each fiber's stack, with an inaccessible page below it, so that a stack
// that overflows faults at once instead of writing over its neighbour's.
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kSharedBytes = 240 * 1024;

struct Fiber {
  ucontext_t context;
  uint3 thread_idx;
  bool done = false;
};

struct WarpState {
  int arrived = 0;
  int generation = 0;
  int exited = 0;
  uint64_t in[32];
  uint64_t in2[32];
  uint64_t out[32];
};

struct BlockState {
  int threads = 0;
  int arrived = 0;
  int generation = 0;
  int exited = 0;
  int predicate_or[2] = {0, 0};  // __syncthreads_or of generations of each parity
  WarpState warps[kMaxThreads / 32];
};

inline Fiber* g_fibers = nullptr;
inline int g_current = -1;
inline ucontext_t g_scheduler;
inline BlockState g_block;
inline std::function<void()> g_body;
inline char* g_stacks = nullptr;
// The kernel source's own `extern __shared__` array (the test defines it).
inline unsigned char* g_shared = nullptr;

inline Fiber& current() { return g_fibers[g_current]; }
inline void yield() { swapcontext(&current().context, &g_scheduler); }

inline void fiber_entry() {
  g_body();
  Fiber& f = current();
  f.done = true;
  ++g_block.exited;
  WarpState& w = g_block.warps[f.thread_idx.x / 32];
  ++w.exited;
  // A barrier or collective that waited only for this thread completes.
  if (g_block.arrived > 0 && g_block.arrived + g_block.exited == g_block.threads) {
    g_block.arrived = 0;
    ++g_block.generation;
  }
  swapcontext(&f.context, &g_scheduler);
}

inline void syncthreads() {
  const int generation = g_block.generation;
  if (++g_block.arrived + g_block.exited == g_block.threads) {
    g_block.arrived = 0;
    ++g_block.generation;
    return;
  }
  while (g_block.generation == generation) yield();
}

// The barrier that also ORs the threads' predicates. A generation's result
// lives until the generation after next starts, when every thread has
// long read it.
inline int syncthreads_or(int predicate) {
  const int generation = g_block.generation;
  int& result = g_block.predicate_or[generation & 1];
  if (g_block.arrived == 0) result = 0;
  result |= predicate != 0;
  syncthreads();
  return g_block.predicate_or[generation & 1];
}

// A collective of the 32 lanes of the caller's warp (lanes that exited
// count as absent): every lane posts (a, b); the last to arrive computes
// out[] from in[] and in2[]; each lane gets out[lane].
template <class Compute>
inline uint64_t warp_collective(uint64_t a, uint64_t b, Compute compute) {
  const int lane = current().thread_idx.x & 31;
  WarpState& w = g_block.warps[current().thread_idx.x / 32];
  w.in[lane] = a;
  w.in2[lane] = b;
  const int generation = w.generation;
  if (++w.arrived + w.exited == 32) {
    compute(w);
    w.arrived = 0;
    ++w.generation;
  } else {
    while (w.generation == generation) yield();
  }
  return w.out[lane];
}

inline char* allocate_stacks() {
  const size_t bytes = (kGuardBytes + kStackBytes) * kMaxThreads;
  void* stacks = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (stacks == MAP_FAILED) {
    std::fprintf(stderr, "emu: no memory for the fibers' stacks\n");
    std::abort();
  }
  char* base = static_cast<char*>(stacks);
  for (int i = 0; i < kMaxThreads; ++i) mprotect(base + (kGuardBytes + kStackBytes) * i, kGuardBytes, PROT_NONE);
  return base;
}

// Runs `kernel_body` for every block of the grid, one block at a time.
inline void run_grid(dim3 grid, dim3 block, const std::function<void()>& kernel_body) {
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (block.y != 1 || block.z != 1 || threads > kMaxThreads || threads % 32 != 0) {
    std::fprintf(stderr, "emu: unsupported block shape\n");
    std::abort();
  }
  if (g_stacks == nullptr) g_stacks = allocate_stacks();
  std::vector<Fiber> fibers(threads);
  g_fibers = fibers.data();
  ::blockDim = block;
  ::gridDim = grid;
  g_body = kernel_body;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        ::blockIdx = make_uint3(bx, by, bz);
        g_block = BlockState{};
        g_block.threads = threads;
        // Uninitialised shared memory, as on the device: garbage, not zeros.
        if (g_shared != nullptr) std::memset(g_shared, 0xA5, kSharedBytes);
        for (int i = 0; i < threads; ++i) {
          Fiber& f = fibers[i];
          f.done = false;
          f.thread_idx = make_uint3(i, 0, 0);
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = g_stacks + (kGuardBytes + kStackBytes) * i + kGuardBytes;
          f.context.uc_stack.ss_size = kStackBytes;
          f.context.uc_link = nullptr;
          makecontext(&f.context, fiber_entry, 0);
        }
        // Round robin until every fiber has returned; a waiting fiber
        // yields back here at once.
        int left = threads;
        while (left > 0) {
          for (int i = 0; i < threads; ++i) {
            if (fibers[i].done) continue;
            g_current = i;
            ::threadIdx = fibers[i].thread_idx;
            swapcontext(&g_scheduler, &fibers[i].context);
            if (fibers[i].done) --left;
          }
        }
        g_current = -1;
      }
}

}  // namespace emu

// ---- Intrinsics.

inline void __syncthreads() { emu::syncthreads(); }
inline int __syncthreads_or(int predicate) { return emu::syncthreads_or(predicate); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) {
  emu::warp_collective(0, 0, [](emu::WarpState&) {});
}
inline void __threadfence() {}

namespace emu {
// The lane each lane reads from, as the CUDA shuffles define it.
enum class Shuffle { kIndex, kUp, kXor };

template <class T>
inline T shuffle(T value, int argument, Shuffle kind, int width = 32) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const uint64_t out =
      warp_collective(bits, static_cast<uint64_t>(static_cast<int64_t>(argument)), [kind, width](WarpState& w) {
        for (int lane = 0; lane < 32; ++lane) {
          const int arg = static_cast<int>(static_cast<int64_t>(w.in2[lane]));
          const int base = lane & ~(width - 1);
          int src = base + (arg & (width - 1));
          if (kind == Shuffle::kUp) src = lane - base >= arg ? lane - arg : lane;
          if (kind == Shuffle::kXor) src = base + (((lane - base) ^ arg) & (width - 1));
          w.out[lane] = w.in[src];
        }
      });
  T result;
  std::memcpy(&result, &out, sizeof(T));
  return result;
}
}  // namespace emu

template <class T>
inline T __shfl_sync(unsigned, T value, int source, int width = 32) {
  return emu::shuffle(value, source, emu::Shuffle::kIndex, width);
}
template <class T>
inline T __shfl_up_sync(unsigned, T value, unsigned delta, int width = 32) {
  return emu::shuffle(value, static_cast<int>(delta), emu::Shuffle::kUp, width);
}
template <class T>
inline T __shfl_xor_sync(unsigned, T value, int mask, int width = 32) {
  return emu::shuffle(value, mask, emu::Shuffle::kXor, width);
}

inline unsigned __ballot_sync(unsigned, int predicate) {
  return static_cast<unsigned>(emu::warp_collective(predicate != 0, 0, [](emu::WarpState& w) {
    uint64_t bits = 0;
    for (int lane = 0; lane < 32; ++lane) bits |= (w.in[lane] & 1u) << lane;
    for (int lane = 0; lane < 32; ++lane) w.out[lane] = bits;
  }));
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32); }
// n-th set bit (0-based n, from bit `base` upwards) as in the CUDA docs, for offset > 0.
inline unsigned __fns(unsigned mask, unsigned base, int offset) {
  if (offset <= 0) {
    std::fprintf(stderr, "emu: __fns with offset <= 0 not emulated\n");
    std::abort();
  }
  for (unsigned bit = base; bit < 32; ++bit) {
    if ((mask >> bit) & 1u) {
      if (--offset == 0) return bit;
    }
  }
  return 0xFFFFFFFFu;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
inline void __nanosleep(unsigned) { emu::yield(); }

inline unsigned __cvta_generic_to_shared(const void* p) {
  return static_cast<unsigned>(static_cast<const unsigned char*>(p) - emu::g_shared);
}

// The device's min and max: integer overloads of mixed types take the
// common type (the kernels mix int32_t and int64_t arguments).
#undef min
#undef max
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
  return a < b ? a : b;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
  return a > b ? a : b;
}

// Atomics: fibers switch only at collectives, so a plain read-modify-write
// is atomic. Each returns the old value, as on the device.
template <class T, class Update>
inline T read_modify_write(T* p, Update update) {
  const T old = *p;
  *p = update(old);
  return old;
}
template <class T>
inline T atomicAdd(T* p, T v) {
  return read_modify_write(p, [v](T old) { return static_cast<T>(old + v); });
}
template <class T>
inline T atomicMin(T* p, T v) {
  return read_modify_write(p, [v](T old) { return v < old ? v : old; });
}
template <class T>
inline T atomicMax(T* p, T v) {
  return read_modify_write(p, [v](T old) { return v > old ? v : old; });
}
template <class T>
inline T atomicCAS(T* p, T compare, T value) {
  return read_modify_write(p, [compare, value](T old) { return old == compare ? value : old; });
}
template <class T>
inline T atomicExch(T* p, T v) {
  return read_modify_write(p, [v](T) { return v; });
}
template <class T>
inline T atomicAnd(T* p, T v) {
  return read_modify_write(p, [v](T old) { return static_cast<T>(old & v); });
}
template <class T>
inline T atomicOr(T* p, T v) {
  return read_modify_write(p, [v](T old) { return static_cast<T>(old | v); });
}
template <class T>
inline T atomicXor(T* p, T v) {
  return read_modify_write(p, [v](T old) { return static_cast<T>(old ^ v); });
}

// ---- The runtime calls the launchers make.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
// A kernel's static shared memory is not known here: reported as none.
template <class T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, T*) {
  *attributes = cudaFuncAttributes{};
  return cudaSuccess;
}

namespace emu {
// What cudaDeviceGetAttribute reports (the test defines the runtime calls):
// an sm_80-class device, few SMs so that small batches reach the launches
// past the SM count, an H200's shared memory.
struct Device {
  int major = 8;
  int multiprocessors = 8;
  int block_shared_optin = 232448;
  int sm_shared = 233472;
  int block_reserved = 1024;
};
inline Device g_device;
}  // namespace emu

template <class... KernelArgs, class... Args>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(KernelArgs...), Args&&... args) {
  if (config->dynamicSmemBytes > emu::kSharedBytes) {
    std::fprintf(stderr, "emu: %zu B of dynamic shared memory, more than emulated\n", config->dynamicSmemBytes);
    std::abort();
  }
  std::function<void()> body = [&]() { kernel(args...); };
  emu::run_grid(config->gridDim, config->blockDim, body);
  return cudaSuccess;
}
