// The timing core of `normgrad bench` (bench_run.hpp): runners, one per
// column, each with its own copy of the inputs, timed in a balanced
// interleaved order.
#include "tools/bench_run.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include <normgrad/backends/caching_allocator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tools/bench_graphs.hpp"
#include "tools/bench_probe.hpp"
#include "tools/cli_driver.hpp"

namespace normgrad {
namespace cli {

using oracle::allocate;
using oracle::Buffer;
using oracle::make_inputs;

namespace {

// A timed unit: one backend's compiled graph, or a blocked column. Each has
// its own copy of the inputs (the same values), as the blocked columns have
// their own tensors: on shared inputs, a backend would find them in the L3
// whenever the backend before it had just read them, and on layers that fit
// the L3 that favours whichever backend follows another on the same buffers.
struct Runner {
  BenchResult result;
  std::unique_ptr<CompiledGraph> graph;
  std::unique_ptr<BlockedRunner> blocked;
  std::map<int64_t, Buffer> inputs;
  std::map<int64_t, const void*> in_ptrs;
  std::map<int64_t, Buffer> outputs;
  std::map<int64_t, void*> out_ptrs;
};

// Intermediates between partitions (the unfused column's) and kernel scratch
// come from one caching pool, as a framework's allocator serves them through
// oneDNN Graph's hook: otherwise a DRAM-sized intermediate would be a fresh
// mapping, page faults and all, on every call of the unfused sequence.
const Allocator* bench_allocator() {
  static CachingAllocator* pool = new CachingAllocator();
  return &pool->allocator();
}

double run_once(Runner& r) {
  if (r.blocked) return r.blocked->run_once();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = r.graph->execute(r.in_ptrs, r.out_ptrs, nullptr, bench_allocator());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) r.result.reason = s.to_string();
  return ms;
}

// --cold: the runner's own tensors out of every cache level.
void evict(const Runner& r) {
  if (r.blocked) {
    r.blocked->evict();
    return;
  }
  for (const auto& [id, b] : r.inputs) evict_lines(b.data(), b.bytes.size());
  for (const auto& [id, b] : r.outputs) evict_lines(b.data(), b.bytes.size());
}

// The columns of a case. Fused cases also time the unfused sequence (passes
// off, each op on the fastest backend that takes it), to show what fusion
// saves; --jit-variant adds the JIT again under each named variant,
// "jit[NAME]", or with --backends=auto (and not jit) every backend with the
// JIT under it, "auto[NAME]" (a variant that declines a JIT partition then
// times what runs instead); --from-dst adds BatchNormTrainingBackwardFromDst
// of the same shape, its own graph and inputs.
std::vector<std::string> columns_of(const BenchOptions& opt, const BenchCase& cr, bool from_dst) {
  std::vector<std::string> columns = opt.backends;
  if (cr.fused != "none") columns.push_back("unfused");
  const bool on_auto =
      std::find(opt.backends.begin(), opt.backends.end(), "auto") != opt.backends.end() &&
      std::find(opt.backends.begin(), opt.backends.end(), "jit") == opt.backends.end();
  for (const std::string& v : opt.jit_variants)
    columns.push_back((on_auto ? "auto[" : "jit[") + v + "]");
  if (from_dst) columns.push_back("jit-from-dst");
  return columns;
}

// Column `b` compiled twice (the second compile from the caches, timed
// apart), with its outputs allocated; a compile that fails leaves its reason.
Status compile_runner(const std::string& b, const Graph& graph, Runner& r) {
  r.result.backend = b;
  const size_t bracket = b.find('[');
  const bool variant = bracket != std::string::npos && b.back() == ']';
  const bool own_graph = b == "jit-from-dst";
  CompileOptions options{b == "unfused" ? "auto"
                         : variant      ? b.substr(0, bracket)
                         : own_graph    ? "jit"
                                        : b};
  options.optimize = b != "unfused";
  if (variant) options.jit_variant = b.substr(bracket + 1, b.size() - bracket - 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto cg = CompiledGraph::compile(graph, options);
  r.result.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!cg.ok()) {
    r.result.reason = cg.status().message();
    return ok_status();
  }
  const auto t1 = std::chrono::steady_clock::now();
  auto again = CompiledGraph::compile(graph, options);
  r.result.cached_compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  if (!again.ok()) {  // the first compile went through: a second one must too
    r.result.reason = "the cached compile failed: " + again.status().message();
    return ok_status();
  }
  r.graph = std::make_unique<CompiledGraph>(std::move(cg).value());
  for (const auto& p : r.graph->partitions())
    r.result.kernel += (r.result.kernel.empty() ? "" : "+") + p->kernel_name();
  for (const LogicalTensor& lt : r.graph->outputs()) {
    NG_ASSIGN_OR_RETURN(Buffer buf, allocate(lt));
    r.out_ptrs[lt.id] = r.outputs.emplace(lt.id, std::move(buf)).first->second.data();
  }
  if (own_graph) {
    NG_ASSIGN_OR_RETURN(r.inputs,
                        make_inputs(r.graph->graph(), r.graph->lowered_graph(), "", 1, nullptr));
  }
  return ok_status();
}

// oneDNN's pre-blocked kernel, where the baseline backend is asked for:
// dnnl-blocked, the kernel alone on nChw16c tensors; dnnl-reorder, the same
// with the reorders from and to the case's plain layout timed.
void add_blocked_runners(const BenchOptions& opt, const BenchCase& cr,
                         std::vector<Runner>& runners) {
  const bool baseline =
      std::any_of(opt.backends.begin(), opt.backends.end(), [](const std::string& b) {
        const BackendEntry* e = find_backend_entry(b);
        return e != nullptr && e->baseline;
      });
  if (!baseline || opt.dir != "bwd" || cr.fused != "none" || cr.shape.size() != 4 ||
      cr.dtype == "f16")
    return;
  for (const bool reorders : {false, true}) {
    Runner r;
    r.result.backend = reorders ? "dnnl-reorder" : "dnnl-blocked";
    const Dims& s = cr.shape;
    const Dims nchw = cr.layout == "NCX" ? s : Dims{s[0], s[3], s[1], s[2]};
    auto blocked = BlockedRunner::make(nchw[0], nchw[1], nchw[2], nchw[3], *parse_dtype(cr.dtype),
                                       reorders ? cr.layout : "");
    if (blocked.ok()) {
      r.blocked = std::move(blocked).value();
      r.result.kernel =
          r.blocked->impl() + (reorders ? " (" + cr.layout + " -> nChw16c -> " + cr.layout + ")"
                                        : std::string(" (nChw16c)"));
    } else {
      r.result.reason = blocked.status().message();
    }
    runners.push_back(std::move(r));
  }
}

bool shares_inputs(const Runner& r) {
  return r.graph && r.result.backend != "jit-from-dst";
}
bool active(const Runner& r) {
  return (r.graph || r.blocked) && r.result.reason.empty();
}

// The case's inputs, made once from the first compiled column's graph, a copy
// per runner (see Runner); false when no column compiled.
StatusOr<bool> give_inputs(std::vector<Runner>& runners) {
  const Runner* any = nullptr;
  for (const Runner& r : runners) {
    if (shares_inputs(r) && !any) any = &r;
  }
  if (!any) return false;
  NG_ASSIGN_OR_RETURN(
      auto inputs, make_inputs(any->graph->graph(), any->graph->lowered_graph(), "", 1, nullptr));
  Runner* last = nullptr;  // the last one takes the originals
  for (Runner& r : runners) {
    if (!shares_inputs(r)) continue;
    if (last) last->inputs = inputs;
    last = &r;
  }
  last->inputs = std::move(inputs);
  for (Runner& r : runners) {
    for (auto& [id, b] : r.inputs) r.in_ptrs[id] = b.data();
  }
  return true;
}

// Interleaved, so drift hits every backend alike, and in a balanced order
// (williams_order), so each runs right after every other equally often:
// oneDNN's OpenMP threads spin after a call (libgomp's default wait policy)
// and on a 2-core host take a core from whatever runs next, so in a fixed
// order the column after a oneDNN one measures slower than the same kernel
// elsewhere in the row (docs/performance.md, method).
void time_interleaved(const BenchOptions& opt, std::vector<Runner>& runners) {
  for (int64_t w = 0; w < opt.warmup; ++w) {
    for (Runner& r : runners) {
      if (active(r)) run_once(r);
    }
  }
  std::vector<size_t> live;
  for (size_t i = 0; i < runners.size(); ++i) {
    if (active(runners[i])) live.push_back(i);
  }
  const auto nr = static_cast<int64_t>(live.size());
  for (int64_t it = 0; it < opt.iters; ++it) {
    for (int64_t k : williams_order(nr, it)) {
      Runner& r = runners[live[static_cast<size_t>(k)]];
      if (!active(r)) continue;  // its run failed: the reason stands, no more timings
      if (opt.cold) {
        flush_caches();
        evict(r);
      }
      r.result.ms.push_back(run_once(r));
    }
  }
}

// Medians, extremes, GB/s and the ratio against the baseline backend.
void summarize(BenchCase& cr, std::vector<Runner>& runners) {
  double baseline_median = 0.0;
  for (Runner& r : runners) {
    BenchResult& b = r.result;
    if (b.ms.empty() || !b.reason.empty()) continue;
    b.median = median_of(b.ms);
    b.min = *std::min_element(b.ms.begin(), b.ms.end());
    b.max = *std::max_element(b.ms.begin(), b.ms.end());
    b.gbps = cr.bytes / (b.median * 1e-3) / 1e9;
    const BackendEntry* e = find_backend_entry(b.backend);
    if (e != nullptr && e->baseline) baseline_median = b.median;
  }
  for (Runner& r : runners) {
    if (baseline_median > 0 && r.result.median > 0)
      r.result.ratio = baseline_median / r.result.median;
    cr.results.push_back(r.result);
  }
}

}  // namespace

Status run_bench_case(const BenchOptions& opt, BenchCase& cr, const Graph& graph) {
  const bool from_dst = opt.from_dst && opt.dir == "bwd" && cr.fused == "none" && cr.phase.empty();
  std::optional<Graph> from_dst_graph;
  if (from_dst) {
    const Dims& s = cr.shape;
    const Dims nchw = cr.layout == "NCX" ? s : Dims{s[0], s[3], s[1], s[2]};
    from_dst_graph = make_from_dst_graph(nchw, cr.layout, *parse_dtype(cr.dtype), 0.01f);
  }
  std::vector<Runner> runners;
  for (const std::string& b : columns_of(opt, cr, from_dst)) {
    Runner r;
    NG_RETURN_IF_ERROR(compile_runner(b, b == "jit-from-dst" ? *from_dst_graph : graph, r));
    runners.push_back(std::move(r));
  }
  add_blocked_runners(opt, cr, runners);
  NG_ASSIGN_OR_RETURN(const bool any, give_inputs(runners));
  if (!any) {
    for (Runner& r : runners) cr.results.push_back(r.result);
    return ok_status();
  }
  time_interleaved(opt, runners);
  summarize(cr, runners);
  return ok_status();
}

}  // namespace cli
}  // namespace normgrad
