// One collective call's data on every rank of a team, drawn from a seed (every
// thread of an NCCL team draws the same, so each can check its own ranks), with
// the driven ranks' device buffers and the CPU reference.
//
// Partials carry sentinel words (BF16 pair +0, -0: they must arrive as +0) and, on
// teams of 4 or more, the planted column {2^24, 1, -2^24, 1, 0 ...}, whose FP32 sum
// is 1 in rank order and 0 or 2 in others: a summation order that is not rank
// order fails bitwise.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "reference/ar_norm.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode::test {

// Partials [ranks][rows · width] with the planted values described above.
std::vector<std::vector<uint16_t>> make_partials(int ranks, int rows, int64_t width, uint64_t seed);

struct AllReduceCase {
  int rows = 0;
  int64_t width = 0;
  std::vector<std::vector<uint16_t>> partials;  // every rank's
  std::vector<uint16_t> reference;
  std::vector<DeviceBuffer> x, out;  // driven ranks'
  std::vector<AllReduceIo> io;
  AllReduceCase(const Team& team, int rows, int64_t width, uint64_t seed);
  // Fresh partials from `seed` into the same device buffers (graph replays).
  void refill(const Team& team, uint64_t seed);
  // Driven ranks whose output differs from the reference (0 when all match).
  int ranks_wrong(const Team& team) const;
};

struct ArNormCase {
  int rows = 0;
  int64_t hidden = 0;
  bool has_residual = true;
  std::vector<std::vector<uint16_t>> partials;
  std::vector<uint16_t> residual, weight;
  reference::ArNormResult reference;
  std::vector<DeviceBuffer> x, res, out, res_out;
  DeviceBuffer weight_dev;
  std::vector<ArNormIo> io;
  ArNormCase(const Team& team, int rows, int64_t hidden, bool residual, uint64_t seed);
  // Residual bitwise, output within 1 BF16 ulp, every driven rank identical:
  // the number of driven ranks that fail.
  int ranks_wrong(const Team& team) const;
};

struct GatherCase {
  int rows = 0;
  int64_t shard_cols = 0;
  DType dtype = DType::kBF16;
  std::vector<std::vector<uint32_t>> shards;  // every rank's [rows, shard words]
  std::vector<uint32_t> reference;            // [rows, TP · shard words], sentinel words cleaned when `cleaned`
  std::vector<DeviceBuffer> shard, out;
  std::vector<GatherIo> io;
  GatherCase(const Team& team, int rows, int64_t shard_cols, DType dtype, uint64_t seed);
  // Driven ranks whose output differs from the reference; `cleaned`: sentinel
  // words are expected as 0 (the mailbox path), else moved as they are.
  int ranks_wrong(const Team& team, bool cleaned) const;
};

// Every driven rank's stream.
std::vector<cudaStream_t> team_streams(const Team& team);

// Counts, on the device and on each driven rank's stream, the 16-bit words of the
// driven ranks' outputs that differ from an expected copy. Capturable: inside a
// graph it checks every replay.
class MismatchCount {
 public:
  explicit MismatchCount(const Team& team);
  // got[i] (driven rank i's output) against want, n 16-bit words.
  void check(const std::vector<DeviceBuffer>& got, const DeviceBuffer& want, std::size_t n);
  unsigned read() const;  // once the streams drained
  void reset();

 private:
  std::vector<cudaStream_t> streams_;
  DeviceBuffer counter_;
};

// True when every 16-bit word of the first n at `d` is a NaN (a poisoned output).
bool all_nan(const DeviceBuffer& d, std::size_t n);

}  // namespace tpdecode::test
