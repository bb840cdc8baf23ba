// Partitions from Python, as oneDNN Graph's get_partitions: every partition of
// a graph as compile sees it, supported or not (with the reason), each of
// which compiles and executes on its own. A graph normgrad runs only in part
// is run this way: normgrad's partitions here, the rest by the caller, in
// the order the list gives.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <set>

#include <normgrad/compile/compiler.hpp>
#include "arrays.hpp"

namespace normgrad {
namespace python {
namespace {

class PyCompiledPartition {
 public:
  explicit PyCompiledPartition(std::shared_ptr<const CompiledPartition> cp) : cp_(std::move(cp)) {}

  std::string kernel() const { return cp_->kernel_name(); }
  std::string backend() const { return cp_->backend_name(); }

  // inputs: {id: array} for exactly the partition's inputs; outputs: {id:
  // array} to write into, the rest allocated. Returns {id: array} for every output.
  py::dict execute(const py::dict& inputs, const std::optional<py::dict>& outputs) const {
    const Partition& p = cp_->partition();
    const std::string who = "partition " + std::to_string(p.id) + " (" + p.ops_string() + ")";
    // Ids that are not the partition's are refused, not ignored.
    auto only = [&](const py::dict& given, const std::vector<LogicalTensor>& ports,
                    const char* role) {
      std::set<int64_t> ids;
      for (const LogicalTensor& lt : ports) ids.insert(lt.id);
      for (auto item : given) {
        const auto id = item.first.cast<int64_t>();
        if (!ids.count(id))
          raise(invalid_argument(who + ": tensor " + std::to_string(id) + " is not one of its " +
                                 role + " (Partition." + role + " lists them)"));
      }
    };
    only(inputs, p.inputs, "inputs");
    if (outputs) only(*outputs, p.outputs, "outputs");
    std::vector<ArrayView> views;
    std::vector<Tensor> in, out;
    py::dict result;
    for (const LogicalTensor& lt : p.inputs) {
      const std::string what = who + ": input " + std::to_string(lt.id);
      if (!inputs.contains(py::int_(lt.id))) raise(invalid_argument(what + " is not given"));
      ArrayView v = view_for(inputs[py::int_(lt.id)], lt, what, false);
      in.push_back(Tensor{lt, v.data});
      views.push_back(std::move(v));
    }
    for (const LogicalTensor& lt : p.outputs) {
      const std::string what = who + ": output " + std::to_string(lt.id);
      if (outputs && outputs->contains(py::int_(lt.id))) {
        ArrayView v = view_for((*outputs)[py::int_(lt.id)], lt, what, true);
        out.push_back(Tensor{lt, v.data});
        result[py::int_(lt.id)] = (*outputs)[py::int_(lt.id)];
        views.push_back(std::move(v));
        continue;
      }
      py::array a = new_array(lt);
      out.push_back(Tensor{lt, a.mutable_data()});
      result[py::int_(lt.id)] = a;
    }
    Status s;
    {
      py::gil_scoped_release release;
      s = cp_->execute(in, out);
    }
    check(s);
    return result;
  }

 private:
  std::shared_ptr<const CompiledPartition> cp_;
};

struct PyPartition {
  Partition partition;
  CompileOptions options;

  std::vector<std::string> ops() const {
    std::vector<std::string> v;
    for (const Op& op : partition.ops) v.emplace_back(op.kind_spelling());
    return v;
  }
  PyCompiledPartition compile() const {
    if (!partition.is_supported())
      raise(unimplemented("partition " + std::to_string(partition.id) + " (" +
                          partition.ops_string() + ") is not supported: " + partition.reason +
                          "; run its ops yourself"));
    StatusOr<std::shared_ptr<const CompiledPartition>> cp = invalid_argument("not compiled");
    {
      py::gil_scoped_release release;
      cp = compile_partition(partition, options);
    }
    return PyCompiledPartition(unwrap(std::move(cp)));
  }
};

std::vector<PyPartition> partition_graph_py(const Graph& graph, const std::string& backend,
                                            bool optimize) {
  CompileOptions options;
  options.backend = backend;
  options.optimize = optimize;
  StatusOr<Plan> plan = invalid_argument("not planned");
  {
    py::gil_scoped_release release;
    if (graph.finalized()) {
      plan = plan_graph(graph, options);
    } else {
      Graph copy = graph;
      const Status s = copy.finalize();
      plan = s.ok() ? plan_graph(copy, options) : StatusOr<Plan>(s);
    }
  }
  std::vector<PyPartition> out;
  for (Partition& p : unwrap(std::move(plan)).partitions) out.push_back({std::move(p), options});
  return out;
}

}  // namespace

void register_partitions(py::module_& m) {
  py::class_<PyCompiledPartition>(m, "CompiledPartition")
      .def_property_readonly("kernel", &PyCompiledPartition::kernel)
      .def_property_readonly("backend", &PyCompiledPartition::backend)
      .def("execute", &PyCompiledPartition::execute, py::arg("inputs"),
           py::arg("outputs") = py::none(),
           "Run on {tensor id: array} (the partition's inputs); returns {tensor id: array} for "
           "every output");
  py::class_<PyPartition>(m, "GraphPartition")
      .def_property_readonly("id", [](const PyPartition& p) { return p.partition.id; })
      .def_property_readonly("supported",
                             [](const PyPartition& p) { return p.partition.is_supported(); })
      .def_property_readonly("reason", [](const PyPartition& p) { return p.partition.reason; })
      .def_property_readonly("backend", [](const PyPartition& p) { return p.partition.backend; })
      .def_property_readonly("pattern", [](const PyPartition& p) { return p.partition.pattern; })
      .def_property_readonly("ops", &PyPartition::ops)
      .def_property_readonly("inputs", [](const PyPartition& p) { return p.partition.inputs; })
      .def_property_readonly("outputs", [](const PyPartition& p) { return p.partition.outputs; })
      .def("compile", &PyPartition::compile,
           "Compile this partition alone (the GIL is released); an unsupported one raises")
      .def("__repr__", [](const PyPartition& p) {
        return "GraphPartition(" + std::to_string(p.partition.id) + ", " +
               p.partition.ops_string() +
               (p.partition.is_supported() ? ", backend=" + p.partition.backend
                                           : ", unsupported: " + p.partition.reason) +
               ")";
      });
  m.def("partition", &partition_graph_py, py::arg("graph"), py::arg("backend") = "auto",
        py::arg("optimize") = true,
        "Every partition of `graph` as compile sees it (after its passes), in execution "
        "order, supported or not: oneDNN Graph's get_partitions. Tensor ids are the graph's, "
        "plus those the passes made between partitions");
}

}  // namespace python
}  // namespace normgrad
