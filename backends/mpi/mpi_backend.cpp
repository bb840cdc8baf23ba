// The MPI backend: AllReduce partitions on a Communicator (MPI_Allreduce).
//
// It takes a partition of one AllReduce of dense tensors whose group has more
// than one process. Every input is widened to double and packed into one buffer, so
// the per-channel sums and the element count of a synchronized batch-norm
// backward cross the network in a single collective; the sums are rounded
// back to each output's dtype once. Groups of one are left to ref (identity).
#include <normgrad/backends/backend_registry.hpp>

#include <vector>

namespace normgrad {
namespace {

std::string group_of(const Op& op) {
  return op.has_attr("group") ? std::get<std::string>(op.attrs().at("group")) : "world";
}

class AllReduceKernel final : public Kernel {
 public:
  AllReduceKernel(Op op, std::shared_ptr<const Communicator> comm, std::vector<int64_t> sizes)
      : op_(std::move(op)), comm_(std::move(comm)), sizes_(std::move(sizes)) {
    for (int64_t n : sizes_) total_ += n;
    // FNV-1a of the op's signature attribute: what every process must run alike.
    const std::string sig = op_.has_attr("signature") ? *op_.attr_string("signature") : "";
    for (char ch : sig)
      signature_ = (signature_ ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  std::string name() const override { return "mpi:allreduce"; }
  std::string info() const override { return comm_->name(); }

  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    std::vector<double> buffer(static_cast<size_t>(total_));
    int64_t k = 0;
    for (size_t i = 0; i < op_.inputs().size(); ++i) {  // dense (checked at compile)
      const LogicalTensor& lt = op_.inputs()[i];
      for (int64_t e = 0; e < sizes_[i]; ++e)
        buffer[static_cast<size_t>(k++)] = load_as_double(in[i], e, lt.dtype);
    }
    NG_RETURN_IF_ERROR(
        comm_->all_reduce_sum(buffer.data(), total_, false, signature_).with_context(op_.label()));
    k = 0;
    for (size_t i = 0; i < op_.outputs().size(); ++i) {
      const LogicalTensor& lt = op_.outputs()[i];
      for (int64_t e = 0; e < sizes_[i]; ++e)
        store_from_double(out[i], e, lt.dtype, buffer[static_cast<size_t>(k++)]);
    }
    return ok_status();
  }

 private:
  Op op_;
  std::shared_ptr<const Communicator> comm_;
  std::vector<int64_t> sizes_;  // elements per tensor
  int64_t total_ = 0;
  uint64_t signature_ = 1469598103934665603ull;
};

class MpiBackend final : public Backend {
 public:
  const char* name() const override { return "mpi"; }
  std::vector<Pattern> patterns() const override {
    return {collective_pattern("allreduce", "mpi")};
  }

  Status supports(const Partition& partition, const CompileContext& ctx) const override {
    return check(partition, ctx).status();
  }

  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                  const CompileContext& ctx) const override {
    NG_ASSIGN_OR_RETURN(auto comm, check(partition, ctx));
    std::vector<int64_t> sizes;
    for (const LogicalTensor& lt : partition.ops[0].inputs()) {
      NG_ASSIGN_OR_RETURN(int64_t n, checked_product(lt.dims, partition.ops[0].label()));
      sizes.push_back(n);
    }
    return std::shared_ptr<const Kernel>(
        std::make_shared<AllReduceKernel>(partition.ops[0], std::move(comm), std::move(sizes)));
  }

 private:
  static StatusOr<std::shared_ptr<const Communicator>> check(const Partition& partition,
                                                             const CompileContext& ctx) {
    if (partition.ops.size() != 1 || partition.ops[0].kind() != OpKind::kAllReduce)
      return unimplemented("the MPI backend runs AllReduce only");
    const Op& op = partition.ops[0];
    const std::string group = group_of(op);
    NG_ASSIGN_OR_RETURN(auto comm, resolve_group(ctx.communicators, group));
    if (!comm || comm->size() == 1)
      return unimplemented(op.label() + ": group '" + group +
                           "' is this process alone (ref runs it as the identity)");
    for (const auto* ports : {&op.inputs(), &op.outputs()}) {
      for (const LogicalTensor& lt : *ports) {
        if (!is_loadable_dtype(lt.dtype))
          return unimplemented(op.label() + ": no " + std::string(dtype_name(lt.dtype)) + " sums");
        // The split pass makes dense per-channel tensors; strided ones are not packed here.
        if (lt.effective_strides() != dense_strides(lt.dims))
          return unimplemented(op.label() + ": tensor " + std::to_string(lt.id) +
                               " is strided; the MPI backend sums dense tensors");
      }
    }
    return comm;
  }
};

}  // namespace

const Backend* mpi_backend() {
  static const MpiBackend backend;
  return &backend;
}

}  // namespace normgrad
