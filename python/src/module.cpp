// The `normgrad` Python extension (_normgrad): graphs, compile and execute,
// mirroring the C++ API. Errors raise normgrad.Error with the C++ message;
// compile and execute release the GIL; arrays are borrowed, never copied.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <map>
#include <memory>

#include <normgrad/backends/caching_allocator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/version.hpp>
#include "arrays.hpp"
#include "dlpack_view.hpp"

namespace normgrad {
namespace python {

void register_partitions(py::module_& m);  // partitions.cpp

namespace {

DataType dtype_arg(const std::string& name) {
  return unwrap(parse_dtype(name));
}

// shape: a sequence whose None (or -1, oneDNN Graph's DNNL_GRAPH_UNKNOWN_DIM)
// entries are unknown dims, or None for an unknown rank: finalize infers them.
LogicalTensor make_tensor(int64_t id, const std::string& dtype, const py::object& shape,
                          const std::optional<std::vector<int64_t>>& strides) {
  LogicalTensor lt(id, dtype_arg(dtype), {});
  const std::string what = "LogicalTensor " + std::to_string(id);
  if (shape.is_none()) {
    lt.rank_unknown = true;
  } else {
    if (!py::isinstance<py::sequence>(shape) || py::isinstance<py::str>(shape))
      raise(invalid_argument(what + ": shape must be a sequence of ints (None or -1 for an "
                                    "unknown dim), or None for an unknown rank"));
    for (py::handle d : shape.cast<py::sequence>()) {
      if (d.is_none()) {
        lt.dims.push_back(kUnknownDim);
        continue;
      }
      if (!py::isinstance<py::int_>(d))
        raise(invalid_argument(what + ": dim " + std::string(py::repr(d)) +
                               " is not an int or None"));
      const auto v = d.cast<int64_t>();
      lt.dims.push_back(v == -1 ? kUnknownDim : v);
    }
  }
  if (strides) lt.strides = *strides;
  check(lt.validate(what));
  return lt;
}

py::object shape_of(const LogicalTensor& t) {
  if (t.rank_unknown) return py::none();
  py::list dims;
  for (int64_t d : t.dims) {
    if (d == kUnknownDim) {
      dims.append(py::none());
    } else {
      dims.append(py::int_(d));
    }
  }
  return std::move(dims);
}

// Python values to attributes: bool, int, float, str and lists of int or float.
void set_attr(Op& op, const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v)) {
    op.set_attr(key, v.cast<bool>());
  } else if (py::isinstance<py::int_>(v)) {
    op.set_attr(key, v.cast<int64_t>());
  } else if (py::isinstance<py::float_>(v)) {
    op.set_attr(key, v.cast<double>());
  } else if (py::isinstance<py::str>(v)) {
    op.set_attr(key, AttrValue(v.cast<std::string>()));
  } else if (py::isinstance<py::sequence>(v)) {
    auto seq = v.cast<py::sequence>();
    bool all_int = true;
    for (py::handle e : seq) all_int = all_int && py::isinstance<py::int_>(e);
    if (all_int) {
      op.set_attr(key, AttrValue(v.cast<std::vector<int64_t>>()));
    } else {
      op.set_attr(key, AttrValue(v.cast<std::vector<float>>()));
    }
  } else {
    raise(invalid_argument(op.label() + ": attribute '" + key + "' has an unsupported type " +
                           std::string(py::str(py::type::of(v)))));
  }
}

py::object attr_to_python(const AttrValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

Op make_op(const std::string& kind, const std::vector<LogicalTensor>& inputs,
           const std::vector<LogicalTensor>& outputs, const py::dict& attrs, int64_t id,
           const std::string& name) {
  Op op(id, unwrap(parse_op_kind(kind)), name);
  for (const LogicalTensor& lt : inputs) op.add_input(lt);
  for (const LogicalTensor& lt : outputs) op.add_output(lt);
  for (auto item : attrs) set_attr(op, item.first.cast<std::string>(), item.second);
  return op;
}

struct PartitionInfo {
  int64_t id;
  std::string backend, pattern, kernel;
  std::vector<std::string> ops;
  std::vector<int64_t> inputs, outputs;
};

// A compiled graph, shared so that partitions can be listed after compile.
class Compiled {
 public:
  explicit Compiled(CompiledGraph cg) : cg_(std::make_shared<CompiledGraph>(std::move(cg))) {}

  std::vector<PartitionInfo> partitions() const {
    std::vector<PartitionInfo> v;
    for (const auto& cp : cg_->partitions()) {
      PartitionInfo p{cp->partition().id,
                      cp->backend_name(),
                      cp->partition().pattern,
                      cp->kernel_name(),
                      {},
                      {},
                      {}};
      for (const Op& op : cp->partition().ops) p.ops.emplace_back(op_kind_name(op.kind()));
      for (const LogicalTensor& lt : cp->partition().inputs) p.inputs.push_back(lt.id);
      for (const LogicalTensor& lt : cp->partition().outputs) p.outputs.push_back(lt.id);
      v.push_back(std::move(p));
    }
    return v;
  }
  std::vector<LogicalTensor> inputs() const { return cg_->inputs(); }
  std::vector<LogicalTensor> outputs() const { return cg_->outputs(); }
  std::vector<std::pair<int64_t, int64_t>> inplace_pairs() const { return cg_->inplace_pairs(); }

  // inputs: {id: array}; outputs: {id: array} to write into, the rest allocated.
  py::dict execute(const py::dict& inputs, const std::optional<py::dict>& outputs) const {
    std::vector<ArrayView> views;
    std::map<int64_t, const void*> in;
    std::map<int64_t, void*> out;
    py::dict result;
    for (auto item : inputs) {
      const auto id = item.first.cast<int64_t>();
      const std::string what = "input " + std::to_string(id);
      const LogicalTensor want = unwrap(cg_->query_logical_tensor(id));
      ArrayView v = view_for(item.second, want, what, false);
      in[id] = v.data;
      views.push_back(std::move(v));
    }
    if (outputs) {
      for (auto item : *outputs) {
        const auto id = item.first.cast<int64_t>();
        const std::string what = "output " + std::to_string(id);
        const LogicalTensor want = unwrap(cg_->query_logical_tensor(id));
        ArrayView v = view_for(item.second, want, what, true);
        out[id] = v.data;
        result[item.first] = item.second;
        views.push_back(std::move(v));
      }
    }
    for (const LogicalTensor& lt : cg_->outputs()) {
      if (out.count(lt.id)) continue;
      const LogicalTensor want = unwrap(cg_->query_logical_tensor(lt.id));
      if (want.effective_strides() != dense_strides(want.dims))
        raise(invalid_argument("output " + std::to_string(lt.id) +
                               " is strided: pass an array for it in `outputs`"));
      py::array a = new_array(want);
      out[lt.id] = a.mutable_data();
      result[py::int_(lt.id)] = a;
    }
    Status s;
    {
      py::gil_scoped_release release;
      s = cg_->execute(in, out);
    }
    check(s);
    return result;
  }

  // normgrad.torch's per-call path: data pointers by tensor id, the first
  // `inputs` of them inputs. Shapes, dtypes and strides are not checked here:
  // the caller compiled this graph from these very tensors' metadata (its
  // cache key), so they match; every id must still be one of the graph's.
  void execute_unchecked(const std::vector<int64_t>& ids, const std::vector<uintptr_t>& ptrs,
                         size_t inputs) const {
    if (ids.size() != ptrs.size() || inputs > ids.size())
      raise(invalid_argument("_execute_unchecked: " + std::to_string(ids.size()) + " ids, " +
                             std::to_string(ptrs.size()) + " pointers"));
    std::map<int64_t, const void*> in;
    std::map<int64_t, void*> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ptrs[i] == 0) raise(invalid_argument("_execute_unchecked: a null pointer"));
      if (i < inputs) {
        in[ids[i]] = reinterpret_cast<const void*>(ptrs[i]);
      } else {
        out[ids[i]] = reinterpret_cast<void*>(ptrs[i]);
      }
    }
    Status s;
    {
      py::gil_scoped_release release;
      s = cg_->execute(in, out);
    }
    check(s);
  }

 private:
  std::shared_ptr<CompiledGraph> cg_;
};

// A DLPack tensor over a block of the process-wide caching pool: the
// consumer's deleter (torch frees it when the tensor dies) returns the block.
struct PooledTensor {
  DLManagedTensor managed;
  std::vector<int64_t> shape, strides;
};

void pooled_deleter(DLManagedTensor* self) {
  auto* t = static_cast<PooledTensor*>(self->manager_ctx);
  default_caching_allocator().deallocate(self->dl_tensor.data);
  delete t;
}

// empty(shape, strides, dtype) -> a "dltensor" capsule for torch's from_dlpack.
py::capsule pooled_empty(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                         const std::string& dtype) {
  const DataType dt = dtype_arg(dtype);
  if (strides.size() != shape.size())
    raise(invalid_argument("empty: " + std::to_string(strides.size()) + " strides for " +
                           std::to_string(shape.size()) + " dims"));
  // The span the strides reach, overflow-checked: the block must hold it.
  int64_t span = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) raise(invalid_argument("empty: negative dims or strides"));
    if (shape[i] == 0) span = 0;
  }
  if (span != 0) {
    int64_t last = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t step = 0;
      if (__builtin_mul_overflow(shape[i] - 1, strides[i], &step) ||
          __builtin_add_overflow(last, step, &last))
        raise(invalid_argument("empty: the tensor's span overflows"));
    }
    span = last + 1;
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(span, dtype_size(dt), &bytes))
    raise(invalid_argument("empty: the tensor's size overflows"));
  void* p = default_caching_allocator().allocate(static_cast<size_t>(bytes), 64);
  if (p == nullptr) throw std::bad_alloc();
  auto* t = new PooledTensor;
  t->shape = shape;
  t->strides = strides;
  DLTensor& d = t->managed.dl_tensor;
  d.data = p;
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<int32_t>(shape.size());
  d.dtype = {static_cast<uint8_t>(dt == DataType::kBF16 ? kDLBfloat : kDLFloat),
             static_cast<uint8_t>(dtype_size(dt) * 8), 1};
  d.shape = t->shape.data();
  d.strides = t->strides.data();
  d.byte_offset = 0;
  t->managed.manager_ctx = t;
  t->managed.deleter = pooled_deleter;
  // A capsule nobody consumed (still named "dltensor") frees its tensor.
  return py::capsule(&t->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

// torch's running-statistics update on f32 buffers, in f64 as torch's CPU
// kernel accumulates: running = (1 - factor) running + factor batch, the
// variance unbiased by `unbias` = n / (n - 1). Pointers from normgrad.torch,
// which checked that all four are contiguous f32 vectors of c elements.
void update_running(uintptr_t rm, uintptr_t rv, uintptr_t mean, uintptr_t var, int64_t c,
                    double factor, double unbias) {
  if (rm == 0 || rv == 0 || mean == 0 || var == 0 || c < 0)
    raise(invalid_argument("_update_running: null pointer or negative size"));
  auto* m = reinterpret_cast<float*>(rm);
  auto* v = reinterpret_cast<float*>(rv);
  const auto* bm = reinterpret_cast<const float*>(mean);
  const auto* bv = reinterpret_cast<const float*>(var);
  for (int64_t i = 0; i < c; ++i) {
    m[i] = static_cast<float>(factor * bm[i] + (1.0 - factor) * m[i]);
    v[i] = static_cast<float>(factor * unbias * bv[i] + (1.0 - factor) * v[i]);
  }
}

// Whether any channel's mean is more than `sigmas` standard deviations from
// zero (f32 vectors by data pointer; NaN is not): normgrad.torch's test for
// data whose mean needs its low part, in C++ as it runs on every forward.
bool far_from_zero(uintptr_t mean, uintptr_t var, int64_t c, double eps, double sigmas) {
  if (mean == 0 || var == 0 || c < 0)
    raise(invalid_argument("_far_from_zero: null pointer or negative size"));
  const auto* m = reinterpret_cast<const float*>(mean);
  const auto* v = reinterpret_cast<const float*>(var);
  for (int64_t i = 0; i < c; ++i) {
    if (std::fabs(static_cast<double>(m[i])) > sigmas * std::sqrt(static_cast<double>(v[i]) + eps))
      return true;
  }
  return false;
}

Compiled compile(const Graph& graph, const std::string& backend,
                 const std::optional<std::vector<std::string>>& passes, bool optimize) {
  CompileOptions options;
  options.backend = backend;
  options.optimize = optimize;
  // An empty list is no pass at all (not the default pipeline): canonicalize
  // only, which always runs. Fusion is the backends' patterns, not a pass:
  // `optimize=False` turns it off.
  if (passes)
    options.pipeline = passes->empty() ? std::vector<std::string>{"canonicalize"} : *passes;
  StatusOr<CompiledGraph> cg = invalid_argument("not compiled");
  {
    py::gil_scoped_release release;
    cg = CompiledGraph::compile(graph, options);
  }
  return Compiled(unwrap(std::move(cg)));
}

}  // namespace
}  // namespace python
}  // namespace normgrad

PYBIND11_MODULE(_normgrad, m) {
  using namespace normgrad;
  using namespace normgrad::python;
  m.doc() = "normgrad: a batch-norm-backward graph compiler (C++ core)";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  m.attr("__version__") = version_string();

  py::class_<LogicalTensor>(m, "LogicalTensor")
      .def(py::init(&make_tensor), py::arg("id"), py::arg("dtype"), py::arg("shape"),
           py::arg("strides") = py::none())
      .def_readonly("id", &LogicalTensor::id)
      .def_property_readonly("dtype", [](const LogicalTensor& t) { return dtype_name(t.dtype); })
      .def_property_readonly("shape", &shape_of)
      .def_property_readonly("strides",
                             [](const LogicalTensor& t) { return t.effective_strides(); })
      .def("__repr__",
           [](const LogicalTensor& t) { return "LogicalTensor(" + t.to_string() + ")"; });

  py::class_<Op>(m, "Op")
      .def(py::init([](int64_t id, const std::string& kind, const std::string& name) {
             return Op(id, unwrap(parse_op_kind(kind)), name);
           }),
           py::arg("id"), py::arg("kind"), py::arg("name") = "")
      .def(
          "set_attr",
          [](Op& op, const std::string& k, py::handle v) -> Op& {
            set_attr(op, k, v);
            return op;
          },
          py::return_value_policy::reference_internal)
      .def(
          "add_input", [](Op& op, const LogicalTensor& t) -> Op& { return op.add_input(t); },
          py::return_value_policy::reference_internal)
      .def(
          "add_output", [](Op& op, const LogicalTensor& t) -> Op& { return op.add_output(t); },
          py::return_value_policy::reference_internal)
      .def_property_readonly("id", &Op::id)
      .def_property_readonly("kind", [](const Op& op) { return std::string(op.kind_spelling()); })
      .def_property_readonly("name", &Op::name)
      .def_property_readonly("inputs", &Op::inputs)
      .def_property_readonly("outputs", &Op::outputs)
      .def_property_readonly("attrs",
                             [](const Op& op) {
                               py::dict d;
                               for (const auto& [k, v] : op.attrs())
                                 d[py::str(k)] = attr_to_python(v);
                               return d;
                             })
      .def("__repr__", [](const Op& op) { return "Op(" + op.label() + ")"; });

  py::class_<Graph>(m, "Graph")
      .def(py::init<>())
      .def(
          "add_op", [](Graph& g, const Op& op) { check(g.add_op(op)); }, py::arg("op"))
      .def(
          "add_op",
          [](Graph& g, const std::string& kind, const std::vector<LogicalTensor>& inputs,
             const std::vector<LogicalTensor>& outputs, const py::dict& attrs,
             std::optional<int64_t> id, const std::string& name) {
            const int64_t op_id = id ? *id : static_cast<int64_t>(g.ops().size());
            check(g.add_op(make_op(kind, inputs, outputs, attrs, op_id, name)));
          },
          py::arg("kind"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs") = py::dict(),
          py::arg("id") = py::none(), py::arg("name") = "")
      .def("finalize", [](Graph& g) { check(g.finalize()); })
      .def_property_readonly("finalized", &Graph::finalized)
      .def_property_readonly("ops", [](const Graph& g) { return g.ops(); })
      .def("to_json", [](const Graph& g) { return graph_to_json(g); })
      .def("set_input_ports", &Graph::set_input_ports)
      .def("set_output_ports", &Graph::set_output_ports)
      .def_property_readonly("inputs",
                             [](const Graph& g) {
                               if (!g.finalized())
                                 raise(invalid_graph("Graph.inputs: finalize() the graph first"));
                               return g.graph_inputs();
                             })
      .def_property_readonly("outputs", [](const Graph& g) {
        if (!g.finalized()) raise(invalid_graph("Graph.outputs: finalize() the graph first"));
        return g.graph_outputs();
      });

  m.def(
      "load_graph",
      [](const std::string& path) {
        Graph g = unwrap(load_graph(path));
        check(g.finalize());
        return g;
      },
      py::arg("path"),
      "Load a oneDNN-format JSON graph file, finalized (shapes inferred, inputs and outputs "
      "known): ready for compile, partition, .inputs and .outputs");
  m.def(
      "graph_from_json",
      [](const std::string& text) {
        Graph g = unwrap(graph_from_json(text));
        check(g.finalize());
        return g;
      },
      py::arg("text"), "A oneDNN-format JSON graph from a string, finalized as load_graph's");

  py::class_<PartitionInfo>(m, "Partition")
      .def_readonly("id", &PartitionInfo::id)
      .def_readonly("backend", &PartitionInfo::backend)
      .def_readonly("pattern", &PartitionInfo::pattern)
      .def_readonly("kernel", &PartitionInfo::kernel)
      .def_readonly("ops", &PartitionInfo::ops)
      .def_readonly("inputs", &PartitionInfo::inputs)
      .def_readonly("outputs", &PartitionInfo::outputs)
      .def("__repr__", [](const PartitionInfo& p) {
        std::string ops;
        for (const std::string& o : p.ops) ops += (ops.empty() ? "" : "+") + o;
        return "Partition(" + std::to_string(p.id) + ", " + ops + ", backend=" + p.backend +
               ", pattern=" + p.pattern + ", kernel=" + p.kernel + ")";
      });

  py::class_<Compiled>(m, "CompiledGraph")
      .def_property_readonly("partitions", &Compiled::partitions)
      .def_property_readonly("inputs", &Compiled::inputs)
      .def_property_readonly("outputs", &Compiled::outputs)
      .def("inplace_pairs", &Compiled::inplace_pairs,
           "(input id, output id) pairs whose buffers may be the same (oneDNN's get_inplace_ports)")
      .def("_execute_unchecked", &Compiled::execute_unchecked, py::arg("ids"), py::arg("ptrs"),
           py::arg("inputs"),
           "normgrad.torch's per-call path: data pointers by id, no metadata checks")
      .def("execute", &Compiled::execute, py::arg("inputs"), py::arg("outputs") = py::none(),
           "Run on {tensor id: array}; returns {tensor id: array} for every output");

  m.def("compile", &compile, py::arg("graph"), py::arg("backend") = "auto",
        py::arg("passes") = py::none(), py::arg("optimize") = true,
        "Lower, partition and compile a graph (the GIL is released)");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Cap the threads every backend uses (0: no cap)");
  m.def("num_threads", &num_threads);
  m.def(
      "set_thread_runtime",
      [](const std::string& name) {
        if (name != "tbb" && name != "openmp")
          raise(invalid_argument("set_thread_runtime: '" + name + "' is neither tbb nor openmp"));
        check(set_thread_runtime(name == "openmp" ? ThreadRuntime::kOpenMP : ThreadRuntime::kTbb));
      },
      py::arg("name"),
      "Where the JIT runs its loops: 'tbb' (its own oneTBB arena) or 'openmp' (the process's "
      "libgomp pool, which torch's CPU ops use; normgrad.torch chooses it when torch does)");
  m.def("thread_runtime",
        [] { return thread_runtime() == ThreadRuntime::kOpenMP ? "openmp" : "tbb"; });
  m.def("has_openmp_runtime", &has_openmp_runtime,
        "Whether this build can run the JIT on OpenMP (libgomp)");
  m.def("_pooled_empty", &pooled_empty, py::arg("shape"), py::arg("strides"), py::arg("dtype"),
        "A DLPack capsule over a block of the caching pool (torch.from_dlpack takes it)");
  m.def("_update_running", &update_running, py::arg("running_mean"), py::arg("running_var"),
        py::arg("mean"), py::arg("var"), py::arg("c"), py::arg("factor"), py::arg("unbias"),
        "normgrad.torch's running-statistics update (f32 vectors by data pointer)");
  m.def("_far_from_zero", &far_from_zero, py::arg("mean"), py::arg("var"), py::arg("c"),
        py::arg("eps"), py::arg("sigmas"),
        "normgrad.torch's test for means far from zero (f32 vectors by data pointer)");
  m.def(
      "empty_cache", [] { default_caching_allocator().empty_cache(); },
      "Give the caching pool's free blocks back to the system");
  m.def(
      "set_cache_limit",
      [](int64_t bytes) { default_caching_allocator().set_max_cached_bytes(bytes); },
      py::arg("bytes"), "Bound the bytes the caching pool keeps in free blocks");
  m.def(
      "set_cache_policy",
      [](const std::string& name) {
        if (name != "peak" && name != "limit")
          raise(invalid_argument("set_cache_policy: '" + name + "' is neither peak nor limit"));
        default_caching_allocator().set_policy(name == "peak"
                                                   ? CachingAllocator::CachePolicy::kPeak
                                                   : CachingAllocator::CachePolicy::kLimit);
      },
      py::arg("policy"),
      "'peak' (the default): keep free blocks only within the most the pool has had in use at "
      "once; 'limit': keep every freed block up to set_cache_limit's bound");
  m.def(
      "reset_peak_memory_stats", [] { default_caching_allocator().reset_peak(); },
      "Start the pool's peak_allocated_bytes over from what is in use now");
  m.def("cache_policy", [] {
    return default_caching_allocator().policy() == CachingAllocator::CachePolicy::kPeak ? "peak"
                                                                                        : "limit";
  });
  m.def(
      "set_heap_retention",
      [](bool on) {
        if (!set_heap_retention(on))
          raise(unimplemented(
              "set_heap_retention: the C library is not glibc, or mallopt refused the thresholds"));
      },
      py::arg("on"),
      "Keep freed memory in glibc's heap for the process's next allocations (blocks up to 32 "
      "MiB), or put glibc's default thresholds back");
  m.attr("HEAP_BLOCK_MAX_BYTES") = kHeapBlockMaxBytes;
  m.def(
      "heap_retention", [] { return heap_retention(); },
      "Whether set_heap_retention(True) is in force");
  m.def(
      "memory_stats",
      [] {
        const CachingAllocator::Stats s = default_caching_allocator().stats();
        py::dict d;
        d["allocated_bytes"] = s.allocated_bytes;
        d["cached_bytes"] = s.cached_bytes;
        d["peak_allocated_bytes"] = s.peak_allocated_bytes;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["released"] = s.released;
        d["recycled"] = s.recycled;
        return d;
      },
      "The caching pool's counters");
  register_partitions(m);
  m.def("backends", [] {
    std::vector<std::string> v;
    for (const Backend* b : available_backends()) v.emplace_back(b->name());
    return v;
  });
}
