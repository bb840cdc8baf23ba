// Partition: printing helpers.
#include <normgrad/graph/partition.hpp>

namespace normgrad {

std::string Partition::ops_string() const {
  std::string s;
  for (const Op& op : ops) s += (s.empty() ? "" : "+") + std::string(op.kind_spelling());
  return s;
}

}  // namespace normgrad
