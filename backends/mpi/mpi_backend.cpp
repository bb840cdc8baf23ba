// The MPI backend: AllReduce partitions on a Communicator (MPI_Allreduce).
//
// It takes a partition of one AllReduce whose group has more than one
// process. Every input is widened to double and packed into one buffer, so
// the per-channel sums and the element count of a synchronized batch-norm
// backward cross the network in a single collective; the sums are rounded
// back to each output's dtype once. Groups of one are left to ref (identity).
#include <normgrad/backends/backend_registry.hpp>

#include <vector>

namespace normgrad {
namespace {

// Calls fn(offset) for every element of `dims` in row-major order.
template <typename Fn>
void for_each_offset(const Dims& dims, const Dims& strides, const Fn& fn) {
  for (int64_t d : dims) {
    if (d == 0) return;
  }
  std::vector<int64_t> idx(dims.size(), 0);
  int64_t off = 0;
  while (true) {
    fn(off);
    size_t k = dims.size();
    for (; k-- > 0;) {
      off += strides[k];
      if (++idx[k] < dims[k]) break;
      off -= strides[k] * dims[k];
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return;
  }
}

std::string group_of(const Op& op) {
  return op.has_attr("group") ? std::get<std::string>(op.attrs().at("group")) : "world";
}

class AllReduceKernel final : public Kernel {
 public:
  AllReduceKernel(Op op, std::shared_ptr<const Communicator> comm, int64_t total)
      : op_(std::move(op)), comm_(std::move(comm)), total_(total) {}
  std::string name() const override { return "mpi:allreduce"; }
  std::string info() const override { return comm_->name(); }

  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    std::vector<double> buffer(static_cast<size_t>(total_));
    int64_t k = 0;
    for (size_t i = 0; i < op_.inputs().size(); ++i) {
      const LogicalTensor& lt = op_.inputs()[i];
      const Dims strides = lt.effective_strides();
      for_each_offset(lt.dims, strides, [&](int64_t off) {
        buffer[static_cast<size_t>(k++)] = load_as_double(in[i], off, lt.dtype);
      });
    }
    NG_RETURN_IF_ERROR(comm_->all_reduce_sum(buffer.data(), total_).with_context(op_.label()));
    k = 0;
    for (size_t i = 0; i < op_.outputs().size(); ++i) {
      const LogicalTensor& lt = op_.outputs()[i];
      const Dims strides = lt.effective_strides();
      for_each_offset(lt.dims, strides, [&](int64_t off) {
        store_from_double(out[i], off, lt.dtype, buffer[static_cast<size_t>(k++)]);
      });
    }
    return ok_status();
  }

 private:
  Op op_;
  std::shared_ptr<const Communicator> comm_;
  int64_t total_;
};

class MpiBackend final : public Backend {
 public:
  const char* name() const override { return "mpi"; }

  Status supports(const Partition& partition, const CompileContext& ctx) const override {
    return check(partition, ctx).status();
  }

  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                  const CompileContext& ctx) const override {
    NG_ASSIGN_OR_RETURN(auto comm, check(partition, ctx));
    int64_t total = 0;
    for (const LogicalTensor& lt : partition.ops[0].inputs()) {
      NG_ASSIGN_OR_RETURN(int64_t n, checked_product(lt.dims, partition.ops[0].label()));
      total += n;
    }
    return std::shared_ptr<const Kernel>(
        std::make_shared<AllReduceKernel>(partition.ops[0], std::move(comm), total));
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
    for (const LogicalTensor& lt : op.inputs()) {
      if (!is_loadable_dtype(lt.dtype))
        return unimplemented(op.label() + ": no " + std::string(dtype_name(lt.dtype)) + " sums");
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
