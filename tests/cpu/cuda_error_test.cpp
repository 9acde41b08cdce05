// A CUDA error names the call and where; one that a stream capture in progress
// caused says so (an object built or prepared inside a capture).
#include <gtest/gtest.h>

#include <string>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

std::string message_of(cudaError_t code) {
  try {
    TPD_CUDA(code);
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), code);
    return e.what();
  }
  return "";
}

TEST(CudaError, NamesTheCallAndHintsAtACapture) {
  EXPECT_EQ(message_of(cudaSuccess), "");
  const std::string capture = message_of(cudaErrorStreamCaptureUnsupported);
  EXPECT_NE(capture.find("cudaErrorStreamCaptureUnsupported"), std::string::npos) << capture;
  EXPECT_NE(capture.find("in code at "), std::string::npos) << capture;
  EXPECT_NE(capture.find("before capturing"), std::string::npos) << capture;
  EXPECT_NE(message_of(cudaErrorStreamCaptureImplicit).find("before capturing"), std::string::npos);
  const std::string oom = message_of(cudaErrorMemoryAllocation);
  EXPECT_NE(oom.find("cudaErrorMemoryAllocation"), std::string::npos) << oom;
  EXPECT_EQ(oom.find("capture"), std::string::npos) << oom;
}

}  // namespace
}  // namespace tpdecode
