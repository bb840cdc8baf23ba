// Failure modes of the synchronized backward across processes, run by
// tests/mpi/run_mpi.sh under `mpirun -np 2` and `-np 3`. Each mode prints one
// line per rank that the script checks, and exits 0 when this rank saw what
// it should. "The last rank" is rank size - 1.
//   mismatch        rank r has C = 8 (r + 1): a clean error on every rank
//   fail-early      the last rank fails before the collective: every other
//                   is told which rank failed
//   eps-mismatch    the last rank's graph has epsilon 1e-3, the others' 1e-5
//   dtype-mismatch  the last rank's graph is bf16, the others' f32
//   exit-before     the last rank exits before its first collective
//   exit-between    the last rank exits after one graph, before the next
//   timeout         rank 1 never joins: rank 0 gives up after the timeout, and its
//                   abort at exit ends rank 1
//   bits            prints a hash of the outputs (the script runs it twice)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/testing/oracle.hpp>

using namespace normgrad;

namespace {

Graph sync_graph(int64_t c, double eps = 1e-5, DataType dt = DataType::kF32) {
  const Dims shape = {3, c, 5, 5};
  Op bn(0, OpKind::kBatchNormTrainingBackward, "bn");
  bn.set_attr("epsilon", eps).set_attr("data_format", "NCX").set_attr("sync_group", "world");
  bn.add_input(LogicalTensor(0, dt, shape)).add_input(LogicalTensor(1, dt, shape));
  for (int64_t id : {2, 3, 4}) bn.add_input(LogicalTensor(id, DataType::kF32, {c}));
  bn.add_output(LogicalTensor(5, dt, shape))
      .add_output(LogicalTensor(6, DataType::kF32, {c}))
      .add_output(LogicalTensor(7, DataType::kF32, {c}));
  Graph g;
  (void)g.add_op(bn);
  (void)g.finalize();
  return g;
}

// Compiles and runs `g` with oracle inputs; the outputs' FNV-1a hash on success.
StatusOr<uint64_t> run(const Graph& g, uint64_t seed) {
  NG_ASSIGN_OR_RETURN(CompiledGraph cg, CompiledGraph::compile(g, CompileOptions{}));
  std::map<int64_t, std::string> sources;
  NG_ASSIGN_OR_RETURN(auto inputs,
                      oracle::make_inputs(cg.graph(), cg.lowered_graph(), "", seed, &sources));
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : inputs) in[id] = b.data();
  std::map<int64_t, oracle::Buffer> outs;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& t : cg.outputs()) {
    NG_ASSIGN_OR_RETURN(oracle::Buffer b, oracle::allocate(t));
    out[t.id] = outs.emplace(t.id, std::move(b)).first->second.data();
  }
  NG_RETURN_IF_ERROR(cg.execute(in, out));
  uint64_t h = 1469598103934665603ull;
  for (auto& [id, b] : outs) {
    for (char ch : b.bytes) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (Status s = mpi_init_if_launched(&argc, &argv); !s.ok() || argc != 2) {
    std::cerr << "usage: mpirun -np 2 mpi_sync_check mismatch|fail-early|eps-mismatch|"
                 "dtype-mismatch|exit-before|exit-between|timeout|bits\n";
    return 2;
  }
  const auto world = mpi_world();
  if (!world || world->size() < 2) {
    std::cerr << "mpi_sync_check: run it under mpirun with 2 or more processes\n";
    return 2;
  }
  const int rank = world->rank();
  const std::string mode = argv[1];
  auto report = [&](const Status& s, const char* want) {
    const bool ok = !s.ok() && s.to_string().find(want) != std::string::npos;
    std::cout << "rank " << rank << ": " << (ok ? "expected" : "UNEXPECTED") << ": "
              << s.to_string() << std::endl;
    return ok ? 0 : 1;
  };
  if (mode == "mismatch") {
    auto r = run(sync_graph(8 * (rank + 1)), 3);
    return report(r.status(), "counts range from");
  }
  const bool last = rank == world->size() - 1;
  if (mode == "fail-early") {
    if (last) {
      double unused = 0.0;
      return report(world->all_reduce_sum(&unused, 1, true), "this process failed");
    }
    const std::string want = "rank " + std::to_string(world->size() - 1) + " of the group failed";
    return report(run(sync_graph(8), 3).status(), want.c_str());
  }
  if (mode == "eps-mismatch" || mode == "dtype-mismatch") {
    const bool eps = mode == "eps-mismatch";
    const Graph g =
        sync_graph(8, eps && last ? 1e-3 : 1e-5, !eps && last ? DataType::kBF16 : DataType::kF32);
    return report(run(g, 3).status(), "signatures differ");
  }
  if (mode == "exit-before" || mode == "exit-between") {
    // The last rank leaves without MPI_Finalize; mpirun then ends the job.
    // The others must not hang: the script bounds the job's wall time.
    if (mode == "exit-between" && !run(sync_graph(8), 3).ok()) return 1;
    if (last) std::_Exit(3);
    auto r = run(sync_graph(8), 4);
    std::cout << "rank " << rank << ": ended: " << r.status().to_string() << std::endl;
    return r.ok() ? 1 : 0;
  }
  if (mode == "timeout") {
    if (rank == 1) {
      // A straggler stuck in its own work, alive until rank 0's abort ends the
      // job. (Exiting at once instead, through MPI_Finalize, races the abort
      // inside mpirun: Open MPI 4.1 then at times crashes or hangs in its own
      // teardown, an mpirun fault the library cannot affect.)
      std::cout << "rank 1: expected: stays out of the collective" << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(40));
      return 0;
    }
    return report(run(sync_graph(8), 3).status(), "deadline_exceeded");
  }
  if (mode == "bits") {
    auto first = run(sync_graph(16), 5);
    auto second = run(sync_graph(16), 5);
    if (!first.ok() || !second.ok()) {
      std::cout << "rank " << rank
                << ": UNEXPECTED: " << (first.ok() ? second.status() : first.status()).to_string()
                << std::endl;
      return 1;
    }
    std::cout << "rank " << rank << ": hash " << *first
              << (*first == *second ? " same" : " DIFFERENT") << std::endl;
    return *first == *second ? 0 : 1;
  }
  std::cerr << "mpi_sync_check: unknown mode " << mode << "\n";
  return 2;
}
