# The installed headers: the library's public API. The layer check
# (CheckLayers.cmake) holds testing, tools, python and bench to them.
set(ng_public_headers
  graph/status.hpp graph/data_type.hpp graph/logical_tensor.hpp graph/op.hpp graph/op_checks.hpp
  graph/graph.hpp graph/op_list.hpp graph/op_kinds.def graph/partition.hpp graph/indexing.hpp graph/json_io.hpp graph/text_io.hpp graph/npy.hpp
  ops/op_schema.hpp ops/op_registry.hpp ops/op_ports.hpp ops/op_ports.def ops/batch_norm_desc.hpp ops/tf_batch_norm.hpp
  passes/pass.hpp passes/passes.def passes/partitioner.hpp passes/canonicalize.hpp
  passes/cse.hpp passes/dead_code.hpp passes/fold_layout.hpp passes/split_sync_batch_norm.hpp passes/pattern.hpp
  passes/rewrite_util.hpp passes/rewrite_driver.hpp
  backends/backend.hpp backends/communicator.hpp compile/compiler.hpp compile/pipeline.hpp
  backends/caching_allocator.hpp backends/tune_cache.hpp graph/limits.hpp)
