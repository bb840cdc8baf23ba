// Communicator on MPI: agreement and sums with MPI_Iallreduce under a deadline.
//
// Each all_reduce_sum is two collectives on the same communicator: a small
// one (MPI_MAX over {count, -count, signature halves and their negations,
// failed rank + 1}) so that every process learns whether all agree, and
// which rank failed, before any data moves (the rule normgrad.torch's
// synchronized layers follow too), then the sum itself, in place, on
// doubles. Both are non-blocking and polled against collective_timeout_seconds(),
// so a process that never arrives turns into an error on the others rather
// than a hang. A request given up on that way cannot be cancelled (MPI has no
// cancel for collectives): the process is then ended with MPI_Abort at exit,
// not MPI_Finalize, which would wait for it.
//
// Bits: MPI_SUM on doubles in Open MPI follows an algorithm chosen from the
// process count and message size only, so a fixed process count gives the
// same bits on every run.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <normgrad/backends/communicator.hpp>

namespace normgrad {
namespace {

std::atomic<bool> g_abandoned{false};  // a timed-out request is still pending

void finish_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_abandoned.load()) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string label) : comm_(comm), label_(std::move(label)) {
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  std::string name() const override {
    return label_ + " (" + std::to_string(size_) + (size_ == 1 ? " process)" : " processes)");
  }

  Status all_reduce_sum(double* data, int64_t count, bool failed,
                        uint64_t signature) const override {
    // Collectives must be issued in one order on every process; serialize this
    // process's callers so two threads never interleave theirs.
    std::lock_guard<std::mutex> lock(mu_);
    if (!mpi_running()) return internal_error("AllReduce: MPI is not running");
    const std::string who = "AllReduce on " + name() + ", rank " + std::to_string(rank_);
    const bool too_big = count > INT_MAX;  // MPI counts are int
    failed = failed || too_big;
    // The signature in two 32-bit halves, so each and its negation fit a long long.
    const long long hi = static_cast<long long>(signature >> 32);
    const long long lo = static_cast<long long>(signature & 0xffffffffull);
    long long mine[7] = {count, -count, hi, -hi, lo, -lo, failed ? rank_ + 1 : 0};
    long long all[7] = {0, 0, 0, 0, 0, 0, 0};
    MPI_Request req;
    int rc = MPI_Iallreduce(mine, all, 7, MPI_LONG_LONG, MPI_MAX, comm_, &req);
    if (rc != MPI_SUCCESS) return internal_error(who + ": " + mpi_error(rc));
    NG_RETURN_IF_ERROR(wait(&req, who + ", agreeing on the sizes"));
    if (failed) {
      if (too_big)
        return out_of_range(who + ": " + std::to_string(count) + " values exceed MPI's int count");
      return aborted(who + ": this process failed before the collective");
    }
    if (all[6] != 0) {
      return aborted(who + ": rank " + std::to_string(all[6] - 1) +
                     " of the group failed before the collective, so no rank ran it");
    }
    if (all[0] != count || -all[1] != count) {
      return invalid_argument(who + ": this process sums " + std::to_string(count) +
                              " values, but the group's counts range from " +
                              std::to_string(-all[1]) + " to " + std::to_string(all[0]) +
                              " (every process must hold the same per-channel shapes)");
    }
    if (all[2] != -all[3] || all[4] != -all[5]) {
      return invalid_argument(
          who +
          ": the processes run different synchronized ops (their "
          "signatures differ: op, dtype, layout, channels or epsilon) (rule: every "
          "process of the group runs the same graph on its slice)");
    }
    if (count == 0) return ok_status();
    rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE, MPI_SUM, comm_,
                        &req);
    if (rc != MPI_SUCCESS) return internal_error(who + ": " + mpi_error(rc));
    return wait(&req, who + ", summing");
  }

 private:
  Status wait(MPI_Request* req, const std::string& what) const {
    const double limit = collective_timeout_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(1);
    while (true) {
      int done = 0;
      const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return internal_error(what + ": " + mpi_error(rc));
      if (done) return ok_status();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > limit) {
        g_abandoned.store(true);
        return deadline_exceeded(what + ": not every process joined within " +
                                 std::to_string(static_cast<int>(limit)) +
                                 " s (NORMGRAD_COLLECTIVE_TIMEOUT); a process failed or "
                                 "runs a different graph");
      }
      // Spin (MPI_Test drives Open MPI's progress) for the first millisecond,
      // where a loopback sum completes; then back off so a process waiting
      // for a slow peer stops burning the core that peer may need.
      if (s > 1e-3) {
        std::this_thread::sleep_for(pause);
        if (pause < std::chrono::microseconds(1000)) pause *= 2;
      }
    }
  }

  MPI_Comm comm_;
  std::string label_;
  int size_ = 1, rank_ = 0;
  mutable std::mutex mu_;
};

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

}  // namespace

bool built_with_mpi() {
  return true;
}

Status mpi_init_if_launched(int* argc, char*** argv) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (mpi_running() || !launched_by_mpirun()) return ok_status();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return internal_error("MPI was already finalized");
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) return internal_error("MPI_Init_thread: " + mpi_error(rc));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(finish_mpi);
  return ok_status();
}

std::shared_ptr<const Communicator> mpi_world() {
  if (!mpi_running() && !mpi_init_if_launched(nullptr, nullptr).ok()) return nullptr;
  if (!mpi_running()) return nullptr;
  static std::shared_ptr<const Communicator> world =
      std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, "MPI_COMM_WORLD");
  return world;
}

std::shared_ptr<const Communicator> mpi_self() {
  if (!mpi_running()) return nullptr;
  static std::shared_ptr<const Communicator> self =
      std::make_shared<MpiCommunicator>(MPI_COMM_SELF, "MPI_COMM_SELF");
  return self;
}

StatusOr<std::shared_ptr<const Communicator>> mpi_communicator(const void* mpi_comm) {
  if (mpi_comm == nullptr) return invalid_argument("mpi_communicator: null MPI_Comm pointer");
  if (!mpi_running()) return invalid_argument("mpi_communicator: MPI is not initialized");
  MPI_Comm comm = *static_cast<const MPI_Comm*>(mpi_comm);
  if (comm == MPI_COMM_NULL) return invalid_argument("mpi_communicator: MPI_COMM_NULL");
  return std::shared_ptr<const Communicator>(
      std::make_shared<MpiCommunicator>(comm, "MPI communicator"));
}

}  // namespace normgrad
