// The compile plan: build_pipeline, backend selection and plan_graph.
#include <normgrad/compile/pipeline.hpp>

#include <algorithm>

namespace normgrad {

StatusOr<PassPipeline> build_pipeline(const CompileOptions& options) {
  // canonicalize always runs, first and once: the backends only see canonical ops.
  std::vector<std::string> names = {"canonicalize"};
  auto append = [&](const std::vector<std::string>& more) {
    for (const std::string& n : more) {
      if (n != "canonicalize") names.push_back(n);
    }
  };
  append(options.passes_before);
  if (options.optimize && !options.pipeline.empty()) {
    append(options.pipeline);
  } else if (options.optimize) {
    for (const PassInfo& p : registered_passes()) {
      if (p.builtin) append({p.name});
    }
  }
  append(options.passes_after);
  NG_ASSIGN_OR_RETURN(PassPipeline pipeline, make_pipeline(names));
  if (options.verify_each) pipeline.set_verify_each(true);
  return pipeline;
}

CompileContext compile_context(const CompileOptions& options) {
  CompileContext ctx;
  ctx.communicators = options.communicators;
  ctx.jit_variant = options.jit_variant;
  return ctx;
}

StatusOr<PartitionerOptions> partitioner_options(const CompileOptions& options,
                                                 const CompileContext& ctx) {
  PartitionerOptions po;
  po.fuse = options.optimize;
  const std::string& wanted = options.backend;
  const Backend* forced = nullptr;
  if (wanted != "auto") {
    const BackendEntry* entry = find_backend_entry(wanted);
    if (entry == nullptr) {
      std::string names;
      for (const std::string& n : known_backend_names()) names += (names.empty() ? "" : ", ") + n;
      return invalid_argument("unknown backend '" + wanted + "' (expected one of " + names + ")");
    }
    if (entry->backend == nullptr)
      return unimplemented("backend '" + wanted + "' is not built into this version of normgrad");
    forced = entry->backend;
    NG_RETURN_IF_ERROR(forced->configuration());
    po.patterns = forced->patterns();
    po.scope = "backend '" + wanted + "'";
  }
  // A collective runs where its communicator is (MPI, or ref for a process
  // alone), so forcing a compute backend leaves the other backends'
  // collective patterns in, after its own; a forced backend of collectives
  // only (MPI) stays alone.
  const bool forced_computes =
      forced != nullptr && std::any_of(po.patterns.begin(), po.patterns.end(),
                                       [](const Pattern& p) { return !p.collective; });
  for (const Backend* b : available_backends()) {
    if (b == forced) continue;
    if (forced == nullptr) NG_RETURN_IF_ERROR(b->configuration());
    for (Pattern& p : b->patterns()) {
      if (forced == nullptr || (forced_computes && p.collective))
        po.patterns.push_back(std::move(p));
    }
  }
  // `ctx` outlives the partitioner's use of the options (both live in the caller).
  po.accept = [&ctx](const Pattern& pattern, const Partition& p) {
    const Backend* b = find_backend(pattern.backend);
    if (b == nullptr) return internal_error("pattern " + pattern.full_name() + " has no backend");
    return b->supports(p, ctx);
  };
  return po;
}

StatusOr<std::vector<Partition>> partition_graph(const Graph& graph, const CompileOptions& options,
                                                 std::vector<PatternTrial>* trials) {
  const CompileContext ctx = compile_context(options);
  NG_ASSIGN_OR_RETURN(PartitionerOptions po, partitioner_options(options, ctx));
  return match_partitions(graph, po, trials);
}

StatusOr<Plan> plan_graph(const Graph& graph, const CompileOptions& options) {
  Plan plan;
  plan.lowered = graph;
  if (!plan.lowered.finalized()) NG_RETURN_IF_ERROR(plan.lowered.finalize());
  NG_ASSIGN_OR_RETURN(PassPipeline pipeline, build_pipeline(options));
  NG_ASSIGN_OR_RETURN(bool changed, pipeline.run(plan.lowered));
  (void)changed;
  NG_ASSIGN_OR_RETURN(plan.partitions, partition_graph(plan.lowered, options, &plan.trials));
  // The partitioner keeps partitions convex; a plan that could not run is its bug.
  NG_RETURN_IF_ERROR(check_partition_order(plan.lowered, plan.partitions));
  return plan;
}

}  // namespace normgrad
