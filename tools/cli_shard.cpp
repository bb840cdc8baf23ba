// `--shard-batch`: a synchronized graph run on a slice of the batch per process.
#include "tools/cli_shard.hpp"
#include "tools/bench_graphs.hpp"
#include "tools/cli.hpp"
#include "tools/cli_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>

namespace normgrad {
namespace cli {
namespace {

// Every op of `graph` with a sync_group attribute set to `group` (empty: the
// attribute removed, which makes every batch norm local to its process).
Status set_sync_group(Graph* graph, const std::string& group) {
  std::vector<int64_t> ids;
  for (const Op& op : graph->ops()) ids.push_back(op.id());
  for (int64_t id : ids) {
    Op op = *graph->op(id);
    if (group.empty() && !op.has_attr("sync_group")) continue;
    if (group.empty()) {
      op.erase_attr("sync_group");
    } else {
      op.set_attr("sync_group", group);
    }
    NG_RETURN_IF_ERROR(graph->replace_op(id, std::move(op)));
  }
  return ok_status();
}

using oracle::Buffer;

// What one process holds once set up: the full-batch oracle, its slice's
// compiled graph and buffers.
struct ShardState {
  std::shared_ptr<const Communicator> comm;
  int processes = 1, rank = 0;
  int64_t batch = 0, begin = 0, rows = 0;  // this process's rows [begin, begin + rows)
  std::set<int64_t> sharded;               // tensor ids whose dim 0 is the batch
  CompiledGraph whole;                     // ref, full batch, no synchronization
  CompiledGraph slice;                     // this process's graph
  std::map<int64_t, Buffer> inputs;        // full batch
  std::map<int64_t, const void*> slice_in;
  std::map<int64_t, Buffer> slice_out;
};

// The byte offset of row `begin` of tensor `lt`, after checking that dim 0
// is the outermost (a slice of rows is then one contiguous range).
StatusOr<int64_t> row_offset(const LogicalTensor& lt, int64_t begin) {
  const Dims st = lt.effective_strides();
  LogicalTensor one = lt;
  one.dims[0] = 1;
  NG_ASSIGN_OR_RETURN(int64_t inner, one.buffer_elements());
  if (lt.dims[0] > 1 && st[0] < inner)
    return invalid_argument("--shard-batch: tensor " + std::to_string(lt.id) + " has strides " +
                            dims_to_string(st) + "; dim 0 must be the outermost to be sliced");
  return begin * st[0] * static_cast<int64_t>(dtype_size(lt.dtype));
}

// Everything before the first collective; each process may fail on its own.
Status set_up(const Graph& full, const ShardOptions& opt, ShardState* s) {
  // The oracle: the same graph, every batch norm over this process's data alone.
  Graph unsynced = full;
  NG_RETURN_IF_ERROR(set_sync_group(&unsynced, ""));
  if (!unsynced.finalized()) NG_RETURN_IF_ERROR(unsynced.finalize());
  CompileOptions ref_options;
  ref_options.backend = "ref";
  NG_ASSIGN_OR_RETURN(s->whole, CompiledGraph::compile(unsynced, ref_options));
  // The batch: dim 0 of the first training batch norm's src (forward or backward).
  for (const Op& op : s->whole.lowered_graph().ops()) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) {
      s->batch = BatchNormTrainingBackwardPorts(op).src().dims[0];
      break;
    }
    if (op.kind() == OpKind::kBatchNormForwardTraining) {
      s->batch = BatchNormForwardTrainingPorts(op).src().dims[0];
      break;
    }
  }
  if (s->batch == 0)
    return invalid_argument(
        "--shard-batch: the graph has no training batch norm (forward or backward) with a batch");
  s->begin = s->batch * s->rank / s->processes;
  s->rows = s->batch * (s->rank + 1) / s->processes - s->begin;
  std::map<int64_t, std::string> sources;
  NG_ASSIGN_OR_RETURN(
      s->inputs, oracle::make_inputs(s->whole.graph(), s->whole.lowered_graph(), "",
                                     static_cast<uint64_t>(opt.seed), &sources, opt.data_offset));
  // The slice's graph: dim 0 of every batched tensor becomes this process's rows.
  Graph slice = full;
  NG_RETURN_IF_ERROR(slice.update_tensors([&](LogicalTensor& lt) {
    if (lt.rank() >= 2 && lt.dims[0] == s->batch) {
      s->sharded.insert(lt.id);
      lt.dims[0] = s->rows;
    }
  }));
  if (!slice.finalized()) NG_RETURN_IF_ERROR(slice.finalize());
  CompileOptions options;
  options.backend = opt.backend;
  // Every group the graph names is the processes mpirun started: they share the batch.
  for (const Op& op : full.ops()) {
    if (op.has_attr("sync_group") && s->comm && s->processes > 1)
      options.communicators[std::get<std::string>(op.attrs().at("sync_group"))] = s->comm;
  }
  NG_ASSIGN_OR_RETURN(s->slice, CompiledGraph::compile(slice, options));
  for (const LogicalTensor& lt : s->slice.inputs()) {
    auto it = s->inputs.find(lt.id);
    if (it == s->inputs.end())
      return internal_error("--shard-batch: no input made for tensor " + std::to_string(lt.id));
    const char* base = static_cast<const char*>(it->second.data());
    int64_t off = 0;
    if (s->sharded.count(lt.id)) {
      NG_ASSIGN_OR_RETURN(off, row_offset(it->second.desc, s->begin));
    }
    s->slice_in[lt.id] = base + off;
  }
  for (const LogicalTensor& lt : s->slice.outputs()) {
    NG_ASSIGN_OR_RETURN(Buffer b, oracle::allocate(lt));
    s->slice_out.emplace(lt.id, std::move(b));
  }
  return ok_status();
}

// Every process learns whether all set up; the first error of its own, else
// that another failed.
Status agree(const ShardState& s, const Status& mine) {
  if (!s.comm || s.processes == 1) return mine;
  double unused = 0.0;
  Status all = s.comm->all_reduce_sum(&unused, 1, !mine.ok());
  return mine.ok() ? all : mine;
}

// The sum over processes of a per-process vector (each process fills its slot).
StatusOr<std::vector<double>> gather(const ShardState& s, double mine) {
  std::vector<double> v(static_cast<size_t>(s.processes), 0.0);
  v[static_cast<size_t>(s.rank)] = mine;
  if (s.comm && s.processes > 1)
    NG_RETURN_IF_ERROR(s.comm->all_reduce_sum(v.data(), static_cast<int64_t>(v.size())));
  return v;
}

}  // namespace

StatusOr<ShardResult> run_sharded(const Graph& full, const ShardOptions& opt) {
  ShardState s;
  s.comm = mpi_world();
  if (s.comm) {
    s.processes = s.comm->size();
    s.rank = s.comm->rank();
  }
  NG_RETURN_IF_ERROR(agree(s, set_up(full, opt, &s)));
  ShardResult result;
  result.processes = s.processes;
  std::ostringstream kernels;
  for (const auto& cp : s.slice.partitions()) {
    kernels << "  partition " << cp->partition().id << ": " << cp->partition().ops_string()
            << "  backend=" << cp->backend_name() << "  kernel=" << cp->kernel_name() << "\n";
  }
  result.kernels = kernels.str();
  std::map<int64_t, void*> out_ptrs;
  for (auto& [id, b] : s.slice_out) out_ptrs[id] = b.data();
  std::vector<double> steps, collectives;
  for (int64_t it = 0; it < std::max<int64_t>(1, opt.iters); ++it) {
    std::vector<double> part_ms;
    const auto t0 = std::chrono::steady_clock::now();
    NG_RETURN_IF_ERROR(s.slice.execute(s.slice_in, out_ptrs, &part_ms));
    steps.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    double coll = 0.0;
    for (size_t k = 0; k < part_ms.size(); ++k) {
      for (const Op& op : s.slice.partitions()[k]->partition().ops)
        coll += op.kind() == OpKind::kAllReduce ? part_ms[k] : 0.0;
    }
    collectives.push_back(coll);
  }
  NG_ASSIGN_OR_RETURN(auto all_steps, gather(s, median_of(steps)));
  NG_ASSIGN_OR_RETURN(auto all_coll, gather(s, median_of(collectives)));
  const size_t slowest =
      static_cast<size_t>(std::max_element(all_steps.begin(), all_steps.end()) - all_steps.begin());
  result.step_ms = all_steps[slowest];
  result.collective_ms = all_coll[slowest];
  if (!opt.check) return result;

  std::map<int64_t, Buffer> expected;
  std::map<int64_t, const void*> in_ptrs;
  std::map<int64_t, void*> exp_ptrs;
  for (auto& [id, b] : s.inputs) in_ptrs[id] = b.data();
  Status checked = ok_status();
  for (const LogicalTensor& lt : s.whole.outputs()) {
    auto b = oracle::allocate(lt);
    if (!b.ok()) {
      checked = b.status();
      break;
    }
    exp_ptrs[lt.id] = expected.emplace(lt.id, std::move(b).value()).first->second.data();
  }
  if (checked.ok()) checked = s.whole.execute(in_ptrs, exp_ptrs);
  bool pass = checked.ok();
  std::ostringstream report;
  report << std::scientific << std::setprecision(3);
  for (auto& [id, got] : s.slice_out) {
    if (!checked.ok()) break;
    auto it = expected.find(id);
    if (it == expected.end()) continue;
    Buffer want;  // this process's rows of the full-batch answer
    auto w = oracle::allocate(got.desc);
    auto off = s.sharded.count(id) ? row_offset(it->second.desc, s.begin) : StatusOr<int64_t>(0);
    if (!w.ok() || !off.ok()) {
      checked = !w.ok() ? w.status() : off.status();
      break;
    }
    want = std::move(w).value();
    std::memcpy(want.data(), static_cast<const char*>(it->second.data()) + *off, want.bytes.size());
    auto verdict = oracle::check_output(s.whole.lowered_graph(), s.inputs, id, got, want);
    if (!verdict.ok()) {
      checked = verdict.status();
      break;
    }
    pass = pass && verdict->pass;
    if (!opt.quiet) {
      report << "rank " << s.rank << ": check tensor " << id << " (" << dtype_name(got.desc.dtype)
             << " " << dims_to_string(got.desc.dims) << ", rows "
             << (s.sharded.count(id)
                     ? std::to_string(s.begin) + ".." + std::to_string(s.begin + s.rows)
                     : std::string("all"))
             << "): rel_l2=" << verdict->error.rel_l2 << " limit=" << verdict->limit
             << (verdict->cond_error >= 0.0 ? " sum-relative=" + std::to_string(verdict->cond_error)
                                            : std::string())
             << " " << (verdict->pass ? "ok" : "FAIL") << "\n";
    }
  }
  if (!checked.ok()) {
    std::cerr << "normgrad run: rank " << s.rank << ": " << checked.to_string() << "\n";
    pass = false;
  }
  std::cout << report.str() << std::flush;
  NG_ASSIGN_OR_RETURN(auto fails, gather(s, pass ? 0.0 : 1.0));
  int failed = 0;
  for (double f : fails) failed += f > 0 ? 1 : 0;
  result.passed = failed == 0;
  return result;
}

int shard_run_command(const std::string& path, const RunOptions& opt) {
  auto loaded = load_graph_file(path);
  Status st = loaded.ok() ? loaded->finalize() : loaded.status();
  ShardOptions so;
  so.backend = opt.knobs.backend;
  so.check = opt.check;
  so.iters = opt.iters;
  so.seed = opt.seed;
  so.data_offset = opt.data_offset;
  auto comm = mpi_world();
  const int rank = comm ? comm->rank() : 0;
  if (!st.ok() && comm && comm->size() > 1) {
    // Tell the others this process cannot take part, so they stop too.
    double unused = 0.0;
    (void)comm->all_reduce_sum(&unused, 1, true);
  }
  StatusOr<ShardResult> r = st.ok() ? run_sharded(*loaded, so) : StatusOr<ShardResult>(st);
  if (!r.ok()) {
    std::cerr << "normgrad run: rank " << rank << ": " << r.status().to_string() << "\n";
    return 1;
  }
  if (rank == 0) {
    std::cout << "shard-batch: " << r->processes << (r->processes == 1 ? " process" : " processes")
              << ", rank 0's partitions:\n"
              << r->kernels << std::fixed << std::setprecision(3) << "step: " << r->step_ms
              << " ms (slowest process, median of " << so.iters << "), collective "
              << r->collective_ms << " ms\n";
    if (opt.check) std::cout << (r->passed ? "PASSED" : "FAILED") << "\n";
  }
  return opt.check && !r->passed ? 1 : 0;
}

// `bench --shard-batch` (under mpirun): each layer's synchronized backward
// with the batch split over the processes; the step time is the slowest
// process's median, and the collective's share is its AllReduce partition.
int bench_sharded(const std::vector<std::pair<std::string, Dims>>& shapes,
                  const std::vector<std::string>& dts, const std::vector<std::string>& layouts,
                  const std::string& backend, int64_t iters, int64_t threads) {
  const auto world = mpi_world();
  const int rank = world ? world->rank() : 0;
  const int processes = world ? world->size() : 1;
  if (rank == 0) {
    std::cout << "shard-batch: " << processes << " processes x " << threads
              << " threads, median of " << iters << " steps\n";
  }
  int failures = 0;
  for (const auto& [name, nchw] : shapes) {
    for (const std::string& dt_name : dts) {
      auto dt = parse_dtype(dt_name);
      if (!dt.ok()) return std::cerr << "normgrad bench: " << dt.status().message() << "\n", 2;
      for (const std::string& layout : layouts) {
        Graph g = make_graph(nchw, layout, *dt, "none");
        ShardOptions so;
        so.iters = iters;
        so.backend = backend;
        Status st = set_sync_group(&g, "world");
        if (st.ok() && !g.finalized()) st = g.finalize();
        auto r = st.ok() ? run_sharded(g, so) : StatusOr<ShardResult>(st);
        if (!r.ok()) {
          std::cerr << "normgrad bench: rank " << rank << ": " << name << ": "
                    << r.status().to_string() << "\n";
          return 1;
        }
        if (rank == 0) {
          std::cout << std::fixed << std::setprecision(3) << "  " << name << " " << dt_name << " "
                    << layout << ": step " << r->step_ms << " ms, collective " << r->collective_ms
                    << " ms (" << std::setprecision(1)
                    << 100.0 * r->collective_ms / std::max(r->step_ms, 1e-9) << "%)\n";
        }
        failures += r->passed ? 0 : 1;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace cli
}  // namespace normgrad
