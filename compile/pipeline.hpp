// The compile plan: which passes run, which patterns partition, in one place.
//
// Every tool that shows what a compile does (CompiledGraph::compile, `normgrad
// opt`, `dot --after-passes`, `partitions`) builds its pipeline with
// build_pipeline and its partitions with plan_graph, so they cannot disagree.
// The patterns come from the backend registry (backends/backend.hpp): every
// backend's in auto-selection order, or a forced backend's plus the
// collective patterns of the others.
#pragma once

#include <string>
#include <vector>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/graph.hpp>
#include <normgrad/passes/partitioner.hpp>
#include <normgrad/passes/pass.hpp>

namespace normgrad {

struct CompileOptions {
  // "auto" (every backend's patterns, in auto-selection order), or the name of
  // one backend (its patterns only; ops they do not take are an error).
  std::string backend = "auto";
  // Run the default pass pipeline and fuse (canonicalisation is still applied:
  // backends only see canonical ops). Off: every op as the user wrote it, unfused.
  bool optimize = true;
  // User pipelines, by pass name (built-in or registered with register_pass):
  // `pipeline`, when not empty, replaces the default one; `passes_before` and
  // `passes_after` run around it. canonicalize always runs first, since the
  // backends only see canonical ops.
  std::vector<std::string> pipeline{};
  std::vector<std::string> passes_before{};
  std::vector<std::string> passes_after{};
  // Keep going past partitions no backend of ours runs (opaque oneDNN Graph
  // ops) or that cannot compile yet (unknown shapes): they are listed in
  // CompiledGraph::pending() and execute() refuses to run. Off: compile fails
  // with kUnimplemented naming them.
  bool allow_unsupported = false;
  // Off: a partition that only the reference backend (float64, 10-100x slower
  // than a kernel) would run under "auto" is an error naming why the fast
  // backends declined, instead of a silent slow path.
  bool allow_reference = true;
  // A full check of the graph after every pass (PassPipeline::set_verify_each;
  // always on in debug builds).
  bool verify_each = false;
  // A named JIT kernel variant instead of the JIT's own choice, for comparing
  // variants interleaved in one run (`normgrad bench --jit-variant`): "" or
  // "default" (the JIT decides), a name from the JIT's one list of variants
  // (backends/jit/jit_variants.cpp; docs/cli.md describes each), or "A+B"
  // for both. Under an unknown name the JIT declines, listing the known ones.
  std::string jit_variant{};
  // The process group of each AllReduce `group` name (the synchronized
  // batch-norm backward's collective): see backends/communicator.hpp. Empty:
  // "world" is MPI_COMM_WORLD under mpirun, else this process alone.
  CommunicatorMap communicators{};
};

// canonicalize, then (when `options.optimize`) passes_before, the pipeline
// (the user's, or every built-in pass in passes.def's order), passes_after.
StatusOr<PassPipeline> build_pipeline(const CompileOptions& options);

// The patterns the partitioner may use under `options`, in priority order.
// `ctx` must outlive the returned options (their accept() asks the backends).
StatusOr<PartitionerOptions> partitioner_options(const CompileOptions& options,
                                                 const CompileContext& ctx);
// The context the backends compile in under `options`.
CompileContext compile_context(const CompileOptions& options);

// The partitions of a finalized `graph` as it is (no passes run), matched
// with the patterns of the backends `options` allows; `trials`, when given,
// receives every pattern's answer at every op.
StatusOr<std::vector<Partition>> partition_graph(const Graph& graph,
                                                 const CompileOptions& options = {},
                                                 std::vector<PatternTrial>* trials = nullptr);

// A graph as compile sees it: the user's graph after build_pipeline (the
// lowered graph), its partitions, and every pattern's answer at every op.
struct Plan {
  Graph lowered;
  std::vector<Partition> partitions;
  std::vector<PatternTrial> trials;
};
StatusOr<Plan> plan_graph(const Graph& graph, const CompileOptions& options = {});

}  // namespace normgrad
