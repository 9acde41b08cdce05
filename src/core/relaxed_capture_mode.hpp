// Host work outside any capture (tuning, preparing, a workspace's allocation) runs
// in relaxed capture mode. Why: another thread, or this one, may be capturing in
// global mode (a rank of a team, an engine's graph); our allocations and
// synchronisations must neither fail nor break its capture.
#pragma once

#include <cuda_runtime_api.h>

#include "tpdecode/error.hpp"

namespace tpdecode {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { TPD_CUDA(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace tpdecode
