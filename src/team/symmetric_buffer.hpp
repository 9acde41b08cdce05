// One symmetric allocation of a team, seen from every rank the Team object drives:
// each rank's own copy and every rank's copy as that rank addresses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tpdecode/team.hpp"

namespace tpdecode {

class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  std::size_t bytes() const { return bytes_; }
  // Own copy of driven rank i.
  void* local(int i) const { return local_.at(static_cast<std::size_t>(i)); }
  // Every rank's copy, as seen by driven rank i.
  const PeerPointers& peers(int i) const { return peers_.at(static_cast<std::size_t>(i)); }
  explicit operator bool() const { return bytes_ != 0; }

 private:
  friend class Team;
  friend struct detail::TeamInternals;
  std::size_t bytes_ = 0;
  uint32_t fill_word_ = 0;
  std::vector<void*> local_;
  std::vector<PeerPointers> peers_;
};

}  // namespace tpdecode
