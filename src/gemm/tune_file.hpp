// The tuning cache file (JSON): read and written by GemmTuner.
//   {"format": "tpdecode-gemm-tune/1",
//    "entries": [{"device": "NVIDIA H200", "sms": 132, "version": "...", "n": 2112, "k": 7168,
//                 "m_min": 5, "m_max": 8, "dtype": "bf16", "path": "warp", "split": 6,
//                 "lt_algo": "<128 hex digits>", "us": 9.7, "tune_ms": 21.5,
//                 "finalists": 3, "rounds": 2, "stable": true}, ...]}
// An entry whose path this library does not have (written by another version) is
// skipped, not an error.
#pragma once

#include <string>
#include <vector>

#include "tpdecode/gemm_tuner.hpp"

namespace tpdecode {

struct TuneEntry {
  GemmKey key;
  GemmDecision decision;
};

// The file's entries; none where the file does not exist. Throws Error (naming the
// problem) where it exists but cannot be read or is not a valid tuning cache.
std::vector<TuneEntry> read_tune_file(const std::string& path);
// Replaces the file atomically (a temporary file renamed over it); throws Error on
// failure.
void write_tune_file(const std::string& path, const std::vector<TuneEntry>& entries);

}  // namespace tpdecode
