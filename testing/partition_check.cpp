// check_partitions: each partition on the values its backend computed, against ref.
#include <normgrad/testing/partition_check.hpp>

#include <iomanip>
#include <sstream>

#include <normgrad/backends/backend.hpp>

namespace normgrad {
namespace oracle {

StatusOr<std::vector<PartitionOutputCheck>> check_partitions(
    const CompiledGraph& cg, const std::map<int64_t, Buffer>& inputs,
    std::map<int64_t, Buffer>* values, bool keep_reference) {
  std::map<int64_t, Buffer>& known = *values;
  known = inputs;
  std::vector<PartitionOutputCheck> checks;
  for (const auto& p : cg.partitions()) {
    const Partition& part = p->partition();
    std::vector<Tensor> in, out;
    for (const LogicalTensor& lt : part.inputs) {
      auto it = known.find(lt.id);
      if (it == known.end()) {
        return internal_error("partition " + std::to_string(part.id) + " (" + part.ops_string() +
                              ") reads tensor " + std::to_string(lt.id) +
                              ", which no input gives and no earlier partition writes");
      }
      in.push_back({lt, it->second.data()});
    }
    std::map<int64_t, Buffer> got;
    for (const LogicalTensor& lt : part.outputs) {
      NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
      out.push_back({lt, got.emplace(lt.id, std::move(b)).first->second.data()});
    }
    NG_RETURN_IF_ERROR(p->execute(in, out));
    std::map<int64_t, Buffer> want;
    for (const Op& op : part.ops) {
      std::vector<const void*> op_in;
      std::vector<void*> op_out;
      for (const LogicalTensor& lt : op.inputs()) {
        auto w = want.find(lt.id);
        op_in.push_back(w != want.end() ? w->second.data() : known.at(lt.id).data());
      }
      for (const LogicalTensor& lt : op.outputs()) {
        NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
        op_out.push_back(want.emplace(lt.id, std::move(b)).first->second.data());
      }
      NG_RETURN_IF_ERROR(reference_execute(op, op_in, op_out));
    }
    const SumOrder order = sum_order_of(p->kernel_name());
    for (const LogicalTensor& lt : part.outputs) {
      PartitionOutputCheck c;
      c.partition_id = part.id;
      c.ops = part.ops_string();
      c.kernel = p->kernel_name();
      c.tensor = lt;
      NG_ASSIGN_OR_RETURN(c.verdict, check_output(cg.lowered_graph(), known, lt.id, got.at(lt.id),
                                                  want.at(lt.id), order));
      if (keep_reference) c.want = std::move(want.at(lt.id));
      checks.push_back(std::move(c));
    }
    for (auto& [id, g] : got) known[id] = std::move(g);
  }
  return checks;
}

std::string describe(const PartitionOutputCheck& c) {
  const OutputVerdict& v = c.verdict;
  std::ostringstream o;
  o << std::scientific << std::setprecision(3);
  o << "partition " << c.partition_id << " (" << c.ops << " on " << c.kernel << "), tensor "
    << c.tensor.id << " (" << dtype_name(c.tensor.dtype) << " " << dims_to_string(c.tensor.dims)
    << "): max_abs=" << v.error.max_abs << " rel_l2=" << v.error.rel_l2 << " limit=" << v.limit;
  if (v.cond_error >= 0.0) o << " sum-relative=" << v.cond_error << " limit=" << v.cond_limit;
  if (v.error.nan_mismatch) o << " nan/inf_mismatch=" << v.error.nan_mismatch;
  o << " " << (v.pass ? "ok" : "FAIL");
  return o.str();
}

}  // namespace oracle
}  // namespace normgrad
