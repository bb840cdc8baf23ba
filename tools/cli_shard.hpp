// `--shard-batch`: one graph's batch split over the processes of MPI_COMM_WORLD.
//
// Every process loads the same full-batch graph and makes the same inputs
// (same seed), keeps its slice of dim 0 of every batched tensor (rank r gets
// rows [N r / P, N (r + 1) / P), so slices may be uneven or empty), and runs
// the slice's graph, whose synchronized batch norms sum their per-channel
// reductions across processes (split-sync-batch-norm + AllReduce). --check
// compares each process's slice of the outputs with ref on the full batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {
namespace cli {

struct RunOptions;  // tools/cli_driver.hpp

struct ShardOptions {
  std::string backend = "auto";
  bool check = false;
  int64_t iters = 1;  // > 1: time the steps (median)
  int64_t seed = 1;
  double data_offset = 0.0;  // RunOptions::data_offset
  bool quiet = false;        // bench: no per-tensor lines
};

struct ShardResult {
  bool passed = true;  // every process's check (when checking)
  int processes = 1;
  double step_ms = 0.0;        // median over iters, the slowest process's
  double collective_ms = 0.0;  // of which AllReduce partitions (median)
  std::string kernels;         // "partition: backend kernel" lines of this process
};

// Runs `full` (finalized) sharded over MPI_COMM_WORLD (or alone without MPI).
StatusOr<ShardResult> run_sharded(const Graph& full, const ShardOptions& opt);

// `normgrad run GRAPH --shard-batch [--check]`: exit 0 when every process passed.
int shard_run_command(const std::string& path, const RunOptions& opt);

// `normgrad bench --shard-batch` (under mpirun): each of `shapes` in each
// dtype and layout, its synchronized backward with the batch split over the
// processes, timed over `iters` steps; rank 0 prints the step and the
// collective's share. Exit 0 when every process passed.
int bench_sharded(const std::vector<std::pair<std::string, Dims>>& shapes,
                  const std::vector<std::string>& dts, const std::vector<std::string>& layouts,
                  const std::string& backend, int64_t iters, int64_t threads);

}  // namespace cli
}  // namespace normgrad
