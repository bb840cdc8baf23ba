// CompiledPartition (execute checks), compile_partition, and CompiledGraph.
#include <normgrad/compile/compiler.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>
#include <normgrad/passes/rewrite_util.hpp>

namespace normgrad {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int verbose_level() {
  const char* v = std::getenv("NORMGRAD_VERBOSE");
  return v ? std::atoi(v) : 0;
}

std::string shapes_of(const Partition& p) {
  std::string s;
  for (const LogicalTensor& lt : p.inputs) {
    s += (s.empty() ? "" : " ") + std::string(dtype_name(lt.dtype)) + ":" + dims_to_string(lt.dims);
  }
  return s;
}

// `where()` names the port; it is called only when a check fails, so the
// per-call path builds no strings.
template <typename Where>
Status check_tensor(const Where& where, const LogicalTensor& port, const Tensor& t) {
  if (t.desc.id != port.id) {
    return invalid_argument(where() + ": tensor id " + std::to_string(t.desc.id) + ", expected " +
                            std::to_string(port.id));
  }
  if (t.desc.dtype != port.dtype) {
    return invalid_argument(where() + " (tensor " + std::to_string(port.id) + "): dtype " +
                            dtype_name(t.desc.dtype) + ", expected " + dtype_name(port.dtype));
  }
  if (t.desc.dims != port.dims) {
    return invalid_argument(where() + " (tensor " + std::to_string(port.id) + "): shape " +
                            dims_to_string(t.desc.dims) + ", expected " +
                            dims_to_string(port.dims));
  }
  if (t.desc.strides != port.strides && port.effective_strides() != t.desc.effective_strides()) {
    return invalid_argument(where() + " (tensor " + std::to_string(port.id) + "): strides " +
                            dims_to_string(t.desc.effective_strides()) + ", expected " +
                            dims_to_string(port.effective_strides()));
  }
  if (t.data == nullptr) {
    NG_ASSIGN_OR_RETURN(int64_t bytes, port.buffer_bytes());
    if (bytes > 0) {
      return invalid_argument(where() + " (tensor " + std::to_string(port.id) +
                              "): null buffer for " + std::to_string(bytes) + " bytes");
    }
  }
  return ok_status();
}

}  // namespace

Status CompiledPartition::execute(const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& outputs,
                                  const Allocator* allocator) const {
  AllocatorScope scope(allocator);
  auto who = [&] {
    return "partition " + std::to_string(partition_.id) + " (" + partition_.ops_string() + ")";
  };
  if (inputs.size() != partition_.inputs.size() || outputs.size() != partition_.outputs.size()) {
    return invalid_argument(who() + ": got " + std::to_string(inputs.size()) + " inputs and " +
                            std::to_string(outputs.size()) + " outputs, expected " +
                            std::to_string(partition_.inputs.size()) + " and " +
                            std::to_string(partition_.outputs.size()));
  }
  std::vector<const void*> in(inputs.size());
  std::vector<void*> out(outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    NG_RETURN_IF_ERROR(check_tensor([&] { return who() + ": input " + std::to_string(i); },
                                    partition_.inputs[i], inputs[i]));
    in[i] = inputs[i].data;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    NG_RETURN_IF_ERROR(check_tensor([&] { return who() + ": output " + std::to_string(i); },
                                    partition_.outputs[i], outputs[i]));
    out[i] = outputs[i].data;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status s = kernel_->execute(in, out);
  if (verbose_level() >= 1) {
    std::cerr << "normgrad_verbose,exec," << partition_.id << "," << backend_->name() << ","
              << kernel_->name() << "," << partition_.ops_string() << "," << shapes_of(partition_)
              << "," << ms_since(t0) << "\n";
  }
  return s;
}

namespace {

// The pattern trials by op id, so a partition finds its own in time linear in them.
using TrialsByOp = std::map<int64_t, std::vector<const PatternTrial*>>;
TrialsByOp by_op(const std::vector<PatternTrial>& trials) {
  TrialsByOp index;
  for (const PatternTrial& t : trials) index[t.op_id].push_back(&t);
  return index;
}

// Why the faster backends did not take the ops of `p` (for a partition on ref).
std::string declined_by_others(const Partition& p, const TrialsByOp& trials) {
  std::string why;
  for (const BackendEntry& e : backend_registry()) {
    if (e.backend == nullptr || e.reference) continue;
    const std::string name = e.name;
    std::string said;
    std::set<std::string> seen;  // two patterns often fail on the same rule
    for (const Op& op : p.ops) {
      auto it = trials.find(op.id());
      if (it == trials.end()) continue;
      for (const PatternTrial* t : it->second) {
        if (!t->result.ok() && t->pattern.rfind(name + ".", 0) == 0 &&
            seen.insert(t->result.message()).second)
          said += std::string(said.empty() ? "" : "; ") + t->pattern + ": " + t->result.message();
      }
    }
    if (said.empty()) said = name + ": no pattern anchored at " + p.ops_string();
    why += std::string(why.empty() ? "" : "; ") + said;
  }
  return why;
}

// Compiles `p` on the backend its pattern names. On success `p` is moved
// into the compiled partition (a large graph's partitions are not copied);
// on failure it is left as it was.
StatusOr<std::shared_ptr<const CompiledPartition>> compile_matched(Partition& p,
                                                                   const CompileOptions& options,
                                                                   const CompileContext& ctx,
                                                                   const TrialsByOp& trials) {
  // Built only for a message: a graph of 10^5 ops compiles 10^4 partitions.
  auto who = [&] { return "partition " + std::to_string(p.id) + " (" + p.ops_string() + ")"; };
  const Backend* b = find_backend(p.backend);
  if (b == nullptr) return internal_error(who() + ": backend '" + p.backend + "' is not built in");
  // Only an error or a verbose line needs the reasons.
  const BackendEntry* entry = find_backend_entry(p.backend);
  if (entry != nullptr && entry->reference && options.backend == "auto" &&
      (!options.allow_reference || verbose_level() >= 1)) {
    // Falling back to the oracle is a 10-100x slowdown: never silent.
    const std::string why = declined_by_others(p, trials);
    if (!options.allow_reference)
      return unimplemented(who() +
                           ": only the reference backend would run it, and "
                           "CompileOptions::allow_reference is off (" +
                           why + ")");
    if (verbose_level() >= 1) {
      std::cerr << "normgrad_verbose,fallback," << p.id << ",ref," << p.ops_string() << "," << why
                << "\n";
    }
  }
  const auto t0 = std::chrono::steady_clock::now();  // supports() may already build the kernel
  auto kernel = b->compile(p, ctx);
  if (!kernel.ok()) return kernel.status().with_context(who() + " on " + b->name());
  const double ms = ms_since(t0);
  if (verbose_level() >= 1) {
    std::cerr << "normgrad_verbose,compile," << p.id << "," << b->name() << "," << (*kernel)->name()
              << "," << p.ops_string() << "," << shapes_of(p) << "," << ms << ","
              << (*kernel)->info() << "\n";
  }
  return std::make_shared<const CompiledPartition>(std::move(p), b, std::move(kernel).value(), ms);
}

void print_declines(const std::vector<PatternTrial>& trials) {
  if (verbose_level() < 2) return;
  for (const PatternTrial& t : trials) {
    if (!t.result.ok())
      std::cerr << "normgrad_verbose,decline," << t.op_id << "," << t.pattern << ","
                << t.result.message() << "\n";
  }
}

}  // namespace

StatusOr<std::shared_ptr<const CompiledPartition>> compile_partition(
    const Partition& partition, const CompileOptions& options) {
  const std::string who =
      "partition " + std::to_string(partition.id) + " (" + partition.ops_string() + ")";
  if (!partition.is_supported()) return unimplemented(who + ": " + partition.reason);
  for (const Op& op : partition.ops) {
    for (const LogicalTensor& lt : op.inputs()) {
      if (!lt.dims_known())
        return invalid_graph(who + ": tensor " + std::to_string(lt.id) + " has an unknown shape");
    }
  }
  const CompileContext ctx = compile_context(options);
  NG_ASSIGN_OR_RETURN(PartitionerOptions po, partitioner_options(options, ctx));
  const bool forced_elsewhere = options.backend != "auto" && options.backend != partition.backend;
  std::vector<PatternTrial> trials;
  Partition p = partition;
  if (partition.backend.empty() || partition.anchor() < 0 || forced_elsewhere) {
    // Built by hand, or from a plan for another backend: which pattern takes
    // exactly these ops? The partition's port order stays the caller's.
    Graph alone;
    for (const Op& op : partition.ops) NG_RETURN_IF_ERROR(alone.add_op(op));
    std::vector<int64_t> in, out;
    for (const LogicalTensor& lt : partition.inputs) in.push_back(lt.id);
    for (const LogicalTensor& lt : partition.outputs) out.push_back(lt.id);
    alone.set_input_ports(in);
    alone.set_output_ports(out);
    NG_RETURN_IF_ERROR(alone.finalize());
    auto whole = match_whole(alone, po, &trials);
    print_declines(trials);
    if (!whole.ok()) return whole.status().with_context(who);
    p.backend = whole->backend;
    p.pattern = whole->pattern;
    p.roles = whole->roles;
  }
  return compile_matched(p, options, ctx, by_op(trials));
}

StatusOr<CompiledGraph> CompiledGraph::compile(const Graph& graph, const CompileOptions& options) {
  return compile(Graph(graph), options);
}

StatusOr<CompiledGraph> CompiledGraph::compile(Graph&& graph, const CompileOptions& options) {
  CompiledGraph cg;
  cg.graph_ = std::move(graph);
  if (!cg.graph_.finalized()) NG_RETURN_IF_ERROR(cg.graph_.finalize());
  NG_ASSIGN_OR_RETURN(Plan plan, plan_graph(cg.graph_, options));
  cg.lowered_ = std::move(plan.lowered);
  cg.trials_ = std::move(plan.trials);
  std::vector<Partition> parts = std::move(plan.partitions);
  const CompileContext ctx = compile_context(options);
  print_declines(cg.trials_);
  const TrialsByOp trials = by_op(cg.trials_);
  // A whole-graph executable cannot hand partitions back: unless the caller
  // only wants the plan, say which ops it cannot run.
  // A whole network hands back thousands of partitions: the message names
  // the first few and counts the rest.
  std::string unsupported;
  size_t n_unsupported = 0;
  constexpr size_t kNamed = 3;
  for (Partition& p : parts) {
    if (p.is_supported()) {
      for (const Op& op : p.ops) {
        Status known = cg.lowered_.unknown_shape_error(op);
        if (!known.ok() && p.reason.empty()) p.reason = known.message();
      }
    }
    if (!p.is_supported() && n_unsupported++ < kNamed) {
      std::string ops;
      for (const Op& op : p.ops) ops += (ops.empty() ? "" : "+") + op.label();
      unsupported += (unsupported.empty() ? "" : "; ") + ops + ": " + p.reason;
    }
  }
  if (n_unsupported > kNamed)
    unsupported += "; and " + std::to_string(n_unsupported - kNamed) + " more";
  // Ops we cannot run outrank shapes we do not know: the first is the answer.
  if (!unsupported.empty() && !options.allow_unsupported) {
    return unimplemented(
        "the graph has unsupported partitions (" + unsupported +
        "); partition it and run those ops yourself: plan_graph and compile_partition in C++, "
        "normgrad.partition(graph) in Python, `normgrad partitions` and "
        "`normgrad run --cut-unsupported` from the command line");
  }
  for (Partition& p : parts) {
    if (!p.is_supported() || !p.reason.empty()) {
      if (!options.allow_unsupported) return invalid_graph(p.reason);  // compile needs shapes
      cg.pending_.push_back(std::move(p));
      continue;
    }
    auto cp = compile_matched(p, options, ctx, trials);
    if (!cp.ok() && cp.status().code() == StatusCode::kUnimplemented && options.allow_unsupported) {
      p.supported = false;  // no backend runs it: hand it back, as oneDNN Graph does
      p.reason = cp.status().message();
      cg.pending_.push_back(std::move(p));
      continue;
    }
    if (!cp.ok()) return cp.status();
    cg.partitions_.push_back(std::move(cp).value());
  }
  cg.inputs_ = cg.graph_.graph_inputs();
  cg.outputs_ = cg.graph_.graph_outputs();
  for (const LogicalTensor& lt : cg.outputs_) {
    if (!lt.dims_known()) continue;  // only in a plan with pending partitions
    NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
    if (cg.lowered_.producer(lt.id) == nullptr && bytes != 0) {
      return internal_error("graph output tensor " + std::to_string(lt.id) +
                            " lost its producer in the passes");
    }
  }
  return cg;
}

Status CompiledGraph::check_aliasing(const std::map<int64_t, const void*>& inputs,
                                     const std::map<int64_t, void*>& outputs) const {
  // An output may share memory with an input only as one of inplace_pairs(),
  // at the same address; outputs never overlap each other. Anything else
  // would have a kernel read what it has already overwritten.
  struct Span {
    int64_t id;
    uintptr_t begin, end;
  };
  auto spans = [](const std::vector<LogicalTensor>& ts, const auto& buffers) {
    std::vector<Span> out;
    for (const LogicalTensor& lt : ts) {
      const auto b = lt.buffer_bytes();
      const auto it = buffers.find(lt.id);
      if (!b.ok() || *b == 0 || it == buffers.end()) continue;
      const auto p = reinterpret_cast<uintptr_t>(it->second);
      out.push_back({lt.id, p, p + static_cast<uintptr_t>(*b)});
    }
    return out;
  };
  const std::vector<Span> in = spans(inputs_, inputs), out = spans(outputs_, outputs);
  const auto pairs = inplace_pairs();
  for (size_t k = 0; k < out.size(); ++k) {
    const Span& o = out[k];
    for (const Span& i : in) {
      if (o.begin >= i.end || i.begin >= o.end) continue;
      const bool allowed =
          o.begin == i.begin &&
          std::find(pairs.begin(), pairs.end(), std::make_pair(i.id, o.id)) != pairs.end();
      if (!allowed)
        return invalid_argument("output tensor " + std::to_string(o.id) +
                                " shares memory with input tensor " + std::to_string(i.id) +
                                (o.begin == i.begin ? "" : " (overlapping, not the same buffer)") +
                                "; only CompiledGraph::inplace_pairs() may share a buffer");
    }
    for (size_t j = 0; j < k; ++j) {
      if (o.begin < out[j].end && out[j].begin < o.end)
        return invalid_argument("output tensors " + std::to_string(out[j].id) + " and " +
                                std::to_string(o.id) + " share memory");
    }
  }
  return ok_status();
}

Status CompiledGraph::execute(const std::map<int64_t, const void*>& inputs,
                              const std::map<int64_t, void*>& outputs,
                              std::vector<double>* partition_ms, const Allocator* allocator) const {
  AllocatorScope scope(allocator);
  if (!pending_.empty()) {
    return unimplemented("partition " + std::to_string(pending_[0].id) + " (" +
                         pending_[0].ops_string() + ") was not compiled: " + pending_[0].reason);
  }
  for (const LogicalTensor& lt : inputs_) {
    if (inputs.count(lt.id) == 0)
      return invalid_argument("graph input tensor " + std::to_string(lt.id) + " has no buffer");
  }
  for (const LogicalTensor& lt : outputs_) {
    if (outputs.count(lt.id) == 0)
      return invalid_argument("graph output tensor " + std::to_string(lt.id) + " has no buffer");
  }
  auto listed = [](const std::vector<LogicalTensor>& ts) {
    std::string l;
    for (const LogicalTensor& t : ts) l += (l.empty() ? "" : ", ") + std::to_string(t.id);
    return l;
  };
  for (const auto& entry : inputs) {
    const int64_t id = entry.first;  // a plain variable: C++17 lambdas cannot capture bindings
    if (std::none_of(inputs_.begin(), inputs_.end(),
                     [&](const LogicalTensor& t) { return t.id == id; }))
      return invalid_argument("input buffer for tensor " + std::to_string(id) +
                              ", which is not a graph input (inputs: " + listed(inputs_) + ")");
  }
  for (const auto& entry : outputs) {
    const int64_t id = entry.first;
    if (std::none_of(outputs_.begin(), outputs_.end(),
                     [&](const LogicalTensor& t) { return t.id == id; }))
      return invalid_argument("output buffer for tensor " + std::to_string(id) +
                              ", which is not a graph output (outputs: " + listed(outputs_) + ")");
  }
  NG_RETURN_IF_ERROR(check_aliasing(inputs, outputs));
  // Intermediates: produced by one partition, consumed by another, not a graph output.
  std::map<int64_t, ScratchBuffer> scratch;
  std::map<int64_t, void*> written;
  for (const auto& [id, ptr] : outputs) written[id] = ptr;
  if (partition_ms) partition_ms->assign(partitions_.size(), 0.0);
  for (size_t k = 0; k < partitions_.size(); ++k) {
    const Partition& p = partitions_[k]->partition();
    std::vector<Tensor> in, out;
    for (const LogicalTensor& lt : p.inputs) {
      auto w = written.find(lt.id);
      const void* ptr = nullptr;
      NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
      if (w != written.end() && lowered_.producer(lt.id) != nullptr) {
        ptr = w->second;
      } else if (auto i = inputs.find(lt.id); i != inputs.end()) {
        ptr = i->second;
      } else if (bytes != 0) {  // an empty tensor (a dropped reserve space) needs no buffer
        return internal_error("tensor " + std::to_string(lt.id) + " is read before it is written");
      }
      in.push_back({lt, const_cast<void*>(ptr)});
    }
    for (const LogicalTensor& lt : p.outputs) {
      void* ptr;
      if (auto o = outputs.find(lt.id); o != outputs.end()) {
        ptr = o->second;
      } else {
        NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
        auto& buf = scratch[lt.id] = ScratchBuffer(static_cast<size_t>(bytes));
        if (buf.data() == nullptr)
          return out_of_range("cannot allocate " + std::to_string(bytes) + " bytes for tensor " +
                              std::to_string(lt.id));
        ptr = buf.data();
        written[lt.id] = ptr;
      }
      out.push_back({lt, ptr});
    }
    const auto t0 = std::chrono::steady_clock::now();
    NG_RETURN_IF_ERROR(partitions_[k]->execute(in, out));
    if (partition_ms) (*partition_ms)[k] = ms_since(t0);
  }
  return ok_status();
}

StatusOr<LogicalTensor> CompiledGraph::query_logical_tensor(int64_t id) const {
  for (const auto* list : {&inputs_, &outputs_}) {
    for (const LogicalTensor& lt : *list) {
      if (lt.id != id) continue;
      LogicalTensor q = lt;
      if (!q.dims_known())
        return invalid_graph("tensor " + std::to_string(id) + " has no shape yet");
      q.strides = q.effective_strides();
      q.layout = LayoutType::kStrided;
      return q;
    }
  }
  return not_found("tensor " + std::to_string(id) + " is not a graph input or output");
}

std::vector<std::pair<int64_t, int64_t>> CompiledGraph::inplace_pairs() const {
  // Each backend reads an element of these inputs before it writes the same
  // element of the output (ref per element, the JIT in its apply pass, oneDNN
  // as its in-place support documents), so they may share a buffer when
  // their metadata is the same. A chain of such ops (BatchNormForwardTraining
  // then LeakyReLU: InPlace-ABN's forward) pairs its first input with its
  // last output when every link is read by the next op alone.
  std::map<int64_t, int64_t> link;  // input id -> output id, per op
  for (const Op& op : graph_.ops()) {
    // (input port, output port), as the op's schema declares them.
    const OpSchema* schema = op_registry().find(op.kind());
    if (schema == nullptr) continue;
    const auto& ports = schema->inplace_pairs();
    for (auto [i, o] : ports) {
      if (i >= op.inputs().size() || o >= op.outputs().size()) continue;
      const LogicalTensor& in = op.inputs()[i];
      const LogicalTensor& out = op.outputs()[o];
      if (in.dtype == out.dtype && in.dims == out.dims &&
          in.effective_strides() == out.effective_strides() && sole_consumer(graph_, in.id) == &op)
        link[in.id] = out.id;
    }
  }
  auto is_in = [](const std::vector<LogicalTensor>& ts, int64_t id) {
    return std::any_of(ts.begin(), ts.end(), [&](const LogicalTensor& t) { return t.id == id; });
  };
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const LogicalTensor& start : inputs_) {
    int64_t id = start.id;
    for (auto it = link.find(id); it != link.end(); it = link.find(id)) {
      id = it->second;
      if (is_in(outputs_, id)) {
        pairs.emplace_back(start.id, id);
        break;  // a graph output is not overwritten further
      }
    }
  }
  return pairs;
}

}  // namespace normgrad
