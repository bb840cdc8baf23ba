// Communicator: the process group an AllReduce sums over.
//
// The synchronized batch-norm backward (docs/scale-out.md) splits into a
// per-process reduction, an AllReduce of the per-channel sums and an apply
// step. The AllReduce op names a group ("world" by default); compiling maps
// the name to a Communicator. The MPI backend implements Communicator on an
// MPI_Comm. With no communicator for a group, a process is alone in it, and
// the reference backend runs AllReduce as the identity.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <normgrad/graph/status.hpp>

namespace normgrad {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // For messages: "MPI_COMM_WORLD (2 processes)".
  virtual std::string name() const = 0;
  // Sums data[0:count] element-wise over every process, in place; every
  // process gets the same bits, and the same bits on every run for a fixed
  // process count. First agrees on `count` and `signature` (a hash of what
  // the processes must run alike: the synchronized op, its dtype, layout and
  // epsilon) with one small collective: a process whose count or signature
  // differs, or that passes `failed`, makes the call fail on every process,
  // and the error names the failing rank. Fails with kDeadlineExceeded when
  // some process does not join within the timeout, instead of hanging.
  virtual Status all_reduce_sum(double* data, int64_t count, bool failed = false,
                                uint64_t signature = 0) const = 0;
};

// Communicators by AllReduce group name, given by the user at compile time.
using CommunicatorMap = std::map<std::string, std::shared_ptr<const Communicator>>;

// The communicator of `group`: the map's entry, else, for "world" in a
// process that runs under MPI with more than one process, MPI_COMM_WORLD;
// nullptr when the process is alone in the group. A group that is not in the
// map while MPI runs more than one process is an error (summing over the
// wrong processes would be silent).
StatusOr<std::shared_ptr<const Communicator>> resolve_group(const CommunicatorMap& map,
                                                            const std::string& group);

// MPI in this build: false when CMake found no MPI.
bool built_with_mpi();
// Initializes MPI when this build has it and the process was started by an
// MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE or PMI_SIZE); a no-op
// otherwise. Safe to call more than once; MPI is finalized at exit.
Status mpi_init_if_launched(int* argc, char*** argv);
// MPI_COMM_WORLD as a Communicator when MPI is initialized; nullptr otherwise.
std::shared_ptr<const Communicator> mpi_world();
// MPI_COMM_SELF: a group of one, for checks that run the whole problem locally.
std::shared_ptr<const Communicator> mpi_self();
// Wraps an existing MPI communicator (pass a pointer to the MPI_Comm; it must
// outlive the compiled graphs). kUnimplemented in a build without MPI.
StatusOr<std::shared_ptr<const Communicator>> mpi_communicator(const void* mpi_comm);
// Seconds a collective waits for every process (NORMGRAD_COLLECTIVE_TIMEOUT,
// default 120).
double collective_timeout_seconds();

}  // namespace normgrad
