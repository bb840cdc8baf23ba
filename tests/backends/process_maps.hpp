// The kernel mapping (a line of /proc/self/maps) that holds an address: what
// the caching allocator's tests ask of the blocks it maps, moves and unmaps.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

namespace normgrad {
namespace testing_util {

// [begin, end) of the mapping holding `p`; {0, 0} when none does.
inline std::pair<uintptr_t, uintptr_t> mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    const uintptr_t lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    const uintptr_t hi = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    if (a >= lo && a < hi) return {lo, hi};
  }
  return {0, 0};
}

}  // namespace testing_util
}  // namespace normgrad
