// How the tuner turns timing samples into a decision (pure: no GPU, no clock).
//
// Phase 1 times every candidate with a few replays (GemmTiming::replays() each,
// interleaved). The finalists are the candidates whose fastest phase-1 sample is
// within `window` of the fastest median, at most `max_finalists`, by fastest sample
// first. Why the fastest sample and not the median: a run of slow replays of one
// candidate (seen on the H200: >= 10 % on one candidate of many, interleaved)
// moves its median out of the window, but the replays it ran undisturbed still show
// what it can do, and phase 2 re-times it. Where there is more
// than one, phase 2 re-times the finalists in rounds, each round `replays` replays
// of each finalist interleaved (A B C A B C ...). A round's winner is the finalist
// with the lowest median of that round's samples. Phase 2 ends when the last
// `stable_rounds` rounds had the same winner and that winner also has the lowest
// median over all its phase-2 samples (the order is stable), after `max_rounds`
// rounds, or when the caller's budget says no more rounds. The decision is the
// finalist with the lowest median over all its phase-2 samples.
//
// Ties: equal medians go to the lower candidate index, everywhere (finalists' order,
// a round's winner, the pooled leader): the same samples always give the same
// decision.
//
// Samples: per-call microseconds of single replays. A value that is not finite and
// positive is dropped; a candidate with no sample left failed and is never chosen.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

namespace tpdecode {

// Per candidate (or finalist), per-call microseconds of each timed replay.
using GemmSamples = std::vector<std::vector<double>>;

inline constexpr std::size_t kNoCandidate = std::numeric_limits<std::size_t>::max();

struct GemmTuneRule {
  double window = 0.05;   // finalists: phase-1 medians at most (1 + window) x the fastest
  int max_finalists = 4;
  int stable_rounds = 2;  // consecutive rounds with the same winner that end phase 2
  int max_rounds = 6;     // phase-2 rounds at most
};

// The median of the sample's finite, positive values; NaN where there is none.
double valid_median(const std::vector<double>& sample);

// The fastest of the sample's finite, positive values; NaN where there is none.
double valid_min(const std::vector<double>& sample);

// The finalists of phase 1: candidate indices, fastest sample first (ties: lower
// index); empty where no candidate has a valid sample.
std::vector<std::size_t> gemm_finalists(const GemmSamples& phase1, const GemmTuneRule& rule);

// Where phase 2 stands after some rounds. rounds[r][f]: round r's samples of
// finalists[f].
struct GemmRoundVerdict {
  std::size_t winner = kNoCandidate;  // candidate index: the lowest median over all phase-2 samples
  double us = 0;                      // that median
  double lead = 0;                    // the runner-up's median / the winner's - 1 (0: no runner-up)
  bool stable = false;                // the last stable_rounds rounds' winners are `winner`
};
GemmRoundVerdict judge_rounds(const std::vector<std::size_t>& finalists, const std::vector<GemmSamples>& rounds,
                              const GemmTuneRule& rule);
// The winner of one round (lowest median; ties: lower candidate index); kNoCandidate
// where no finalist has a valid sample in it.
std::size_t round_winner(const std::vector<std::size_t>& finalists, const GemmSamples& round);

// The decision of both phases.
struct GemmChoice {
  std::size_t winner = kNoCandidate;  // candidate index; kNoCandidate: no candidate ran
  double us = 0;                      // its median (phase 2's samples where phase 2 ran)
  double lead = 0;                    // over the runner-up, in the samples that decided
  int finalists = 0;
  int rounds = 0;                     // phase-2 rounds run
  bool stable = false;                // one finalist, or phase 2 ended on a stable order
};
// Decides from phase 1's samples, running phase 2 through `retime` (the finalists'
// indices in, one round's samples of each out, in that order). `more` is asked
// before each round after the first stable_rounds ones (none: always yes); false
// ends phase 2. A `retime` that throws propagates (the caller decides what then).
using GemmRetime = std::function<GemmSamples(const std::vector<std::size_t>& finalists)>;
GemmChoice choose_gemm(const GemmSamples& phase1, const GemmRetime& retime, const GemmTuneRule& rule,
                       const std::function<bool()>& more = {});
// Phase 1 alone: the lowest median (ties: lower index).
GemmChoice choose_fastest(const GemmSamples& phase1);

}  // namespace tpdecode
