// Group resolution for AllReduce, and the MPI entry points of a build without MPI.
#include <normgrad/backends/communicator.hpp>

#include <cstdlib>

namespace normgrad {

StatusOr<std::shared_ptr<const Communicator>> resolve_group(const CommunicatorMap& map,
                                                            const std::string& group) {
  if (auto it = map.find(group); it != map.end()) {
    if (!it->second) return invalid_argument("communicator of group '" + group + "' is null");
    return it->second;
  }
  std::shared_ptr<const Communicator> world = mpi_world();
  if (!world || world->size() == 1) return std::shared_ptr<const Communicator>();
  if (group == "world") return world;
  return invalid_argument(
      "AllReduce group '" + group + "' has no communicator: this process runs under MPI with " +
      std::to_string(world->size()) + " processes, so pass one in CompileOptions::communicators");
}

double collective_timeout_seconds() {
  const char* v = std::getenv("NORMGRAD_COLLECTIVE_TIMEOUT");
  if (v == nullptr) return 120.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  return end != v && s > 0 ? s : 120.0;
}

#ifndef NORMGRAD_WITH_MPI
bool built_with_mpi() {
  return false;
}
Status mpi_init_if_launched(int*, char***) {
  return ok_status();
}
std::shared_ptr<const Communicator> mpi_world() {
  return nullptr;
}
std::shared_ptr<const Communicator> mpi_self() {
  return nullptr;
}
StatusOr<std::shared_ptr<const Communicator>> mpi_communicator(const void*) {
  return unimplemented("normgrad was built without MPI (CMake found none)");
}
#endif

}  // namespace normgrad
