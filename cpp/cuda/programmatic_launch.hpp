// A cudaLaunchKernelEx configuration that allows programmatic stream
// serialization (programmatic dependent launch, Hopper and later): the
// launched kernel may start while the kernel ahead of it in the stream
// finishes, up to its own griddepcontrol.wait (hopper_sync.cuh,
// wait_for_prior_grid), which the kernel must call before it reads anything
// that kernel wrote.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace hisparse {
namespace cuda {

class ProgrammaticLaunch {
 public:
  // `programmatic` false: an ordinary launch (devices before sm_90).
  ProgrammaticLaunch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, bool programmatic) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = shared_bytes;
    config_.stream = stream;
    attribute_.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute_.val.programmaticStreamSerializationAllowed = 1;
    config_.attrs = &attribute_;
    config_.numAttrs = programmatic ? 1 : 0;
  }
  // The config points at the attribute it owns.
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;

  const cudaLaunchConfig_t* config() const { return &config_; }

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attribute_ = {};
};

}  // namespace cuda
}  // namespace hisparse
