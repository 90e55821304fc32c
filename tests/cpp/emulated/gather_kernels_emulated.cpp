// gather_compact's kernel source (cpp/cuda/gather_compact.cu, and the
// resolver's tail gather that launches it), compiled for the CPU emulation
// of the CUDA execution model: launch_gather_compact and
// launch_resolver_tail_gather run the kernels' code on the host. Its own
// translation unit, as each .cu is one in the CUDA build (their file-local
// names would clash with the resolver's).
#include "emulated/cuda_emulation.hpp"  // first: before any CUDA header

// The sorted schedule's `extern __shared__` array, as large as the emulated
// blocks' shared memory.
namespace hisparse {
namespace cuda {
namespace {
thread_local uint64_t shared[emu::kSharedBytes / sizeof(uint64_t)];
}  // namespace
}  // namespace cuda
}  // namespace hisparse

#include "cuda/gather_compact.cu"         // the kernel source itself
#include "cuda/resolver_tail_gather.cu"  // its launch by the resolver's automatic schedule
