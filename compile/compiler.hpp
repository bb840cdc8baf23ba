// Compiling partitions and whole graphs, and executing them on user buffers.
//
// compile_partition compiles a partition on the backend its pattern names (a
// partition built by hand is matched first) and returns an immutable
// CompiledPartition. CompiledGraph is the convenience that finalizes a graph,
// plans it (pipeline.hpp: the passes on a copy, the lowered graph, and its
// partitions), compiles each partition and runs them in order with owned
// intermediates. Its inputs
// and outputs are the user's graph's: inputs a pass made unused are accepted
// and ignored, and empty outputs no kernel writes (TensorFlow's reserve
// spaces) need no work.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <normgrad/backends/backend.hpp>
#include <normgrad/compile/pipeline.hpp>
#include <normgrad/graph/graph.hpp>

namespace normgrad {

class CompiledPartition {
 public:
  CompiledPartition(Partition partition, const Backend* backend,
                    std::shared_ptr<const Kernel> kernel, double compile_ms)
      : partition_(std::move(partition)),
        backend_(backend),
        kernel_(std::move(kernel)),
        compile_ms_(compile_ms) {}

  const Partition& partition() const { return partition_; }
  const char* backend_name() const { return backend_->name(); }
  std::string kernel_name() const { return kernel_->name(); }
  std::string kernel_config() const { return kernel_->config(); }  // Kernel::config
  double compile_ms() const { return compile_ms_; }

  // Tensors in the partition's port order; each must match its port's id,
  // dtype and dims, and point at a buffer large enough for its strides.
  Status execute(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                 const Allocator* allocator = nullptr) const;

 private:
  Partition partition_;
  const Backend* backend_;
  std::shared_ptr<const Kernel> kernel_;
  double compile_ms_;
};

StatusOr<std::shared_ptr<const CompiledPartition>> compile_partition(const Partition& partition,
                                                                     const CompileOptions& options);

class CompiledGraph {
 public:
  // Finalizes a copy of `graph` if needed, lowers, partitions and compiles it.
  static StatusOr<CompiledGraph> compile(const Graph& graph, const CompileOptions& options);
  // The same, taking the graph over: a large graph is not copied.
  static StatusOr<CompiledGraph> compile(Graph&& graph, const CompileOptions& options);

  // The user's graph, finalized, and the graph after the pass pipeline.
  const Graph& graph() const { return graph_; }
  const Graph& lowered_graph() const { return lowered_; }
  const std::vector<std::shared_ptr<const CompiledPartition>>& partitions() const {
    return partitions_;
  }
  // Partitions that were not compiled (allow_unsupported): unsupported ones
  // (is_supported() false, `reason` says why) and supported ones whose shapes
  // are not known (`reason` names the tensor). Ids continue the compiled ones'
  // numbering in graph order.
  const std::vector<Partition>& pending() const { return pending_; }
  // Every pattern tried at every op of the lowered graph, and its answer.
  const std::vector<PatternTrial>& pattern_trials() const { return trials_; }
  const std::vector<LogicalTensor>& inputs() const { return inputs_; }
  const std::vector<LogicalTensor>& outputs() const { return outputs_; }

  // Buffers by tensor id: every graph input and every graph output must be given.
  // Intermediates are allocated per call, so concurrent calls are safe.
  // `partition_ms`, when given, receives each partition's wall time.
  // A buffer for an id that is neither a graph input nor a graph output is an
  // error. `allocator` (oneDNN Graph's allocator) serves the intermediates and
  // the kernels' scratch when given.
  Status execute(const std::map<int64_t, const void*>& inputs,
                 const std::map<int64_t, void*>& outputs,
                 std::vector<double>* partition_ms = nullptr,
                 const Allocator* allocator = nullptr) const;
  // oneDNN Graph's query_logical_tensor: a graph input or output as the
  // compiled graph reads or writes it, with concrete strides (layout `any`
  // resolved to the dense row-major layout the kernels write).
  StatusOr<LogicalTensor> query_logical_tensor(int64_t id) const;
  // oneDNN Graph's get_inplace_ports: (input id, output id) pairs whose
  // buffers may be the same (diff_src over diff_dst, an elementwise op's
  // output over its input); every backend honours them.
  std::vector<std::pair<int64_t, int64_t>> inplace_pairs() const;

 private:
  // execute()'s check that outputs overlap no input outside inplace_pairs().
  Status check_aliasing(const std::map<int64_t, const void*>& inputs,
                        const std::map<int64_t, void*>& outputs) const;
  Graph graph_;
  Graph lowered_;
  std::vector<std::shared_ptr<const CompiledPartition>> partitions_;
  std::vector<Partition> pending_;
  std::vector<PatternTrial> trials_;
  std::vector<LogicalTensor> inputs_;
  std::vector<LogicalTensor> outputs_;
};

}  // namespace normgrad
