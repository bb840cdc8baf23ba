// The oneDNN backend: lowers single-op partitions, the BatchNormInference+ReLU
// group, and the int8 chain Dequantize -> BatchNormInference -> ReLU ->
// Quantize to oneDNN 2.6 primitives, and declines, with the reason, whatever
// oneDNN cannot run exactly.
#include <dlfcn.h>

#include <normgrad/backends/backend_registry.hpp>
#include <normgrad/backends/dnnl/dnnl_kernels.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/passes/partitioner.hpp>

namespace normgrad {
namespace {

// A chain of oneDNN kernels for one partition: each segment is a sub-partition
// (one op, or BatchNormInference+ReLU) with its own primitive; the tensors
// between segments live in per-call scratch (PartitionBuffers), so the kernel
// stays re-entrant.
class ChainKernel final : public Kernel {
 public:
  struct Segment {
    Partition part;
    std::shared_ptr<const Kernel> kernel;
  };
  ChainKernel(Partition whole, std::vector<Segment> segments)
      : whole_(std::move(whole)), segments_(std::move(segments)) {}

  std::string name() const override {
    std::string n;
    for (const Segment& s : segments_) n += (n.empty() ? "" : "+") + s.kernel->name();
    return n;
  }

  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    PartitionBuffers buffers(whole_, in, out);
    for (const Segment& s : segments_) {
      std::vector<const void*> sin;
      std::vector<void*> sout;
      for (const LogicalTensor& lt : s.part.inputs) {
        NG_ASSIGN_OR_RETURN(const void* b, buffers.read(lt));
        sin.push_back(b);
      }
      for (const LogicalTensor& lt : s.part.outputs) {
        NG_ASSIGN_OR_RETURN(void* b, buffers.write(lt));
        sout.push_back(b);
      }
      NG_RETURN_IF_ERROR(s.kernel->execute(sin, sout));
    }
    return ok_status();
  }

 private:
  Partition whole_;
  std::vector<Segment> segments_;
};

// One op's kernel reads its inputs in the op's slot order, while a
// partition's ports hold each tensor once: an op that reads one tensor on two
// slots (Add(x, x), a backward whose src is its diff_dst) gets that buffer on
// each of them.
class SlotKernel final : public Kernel {
 public:
  SlotKernel(std::shared_ptr<const Kernel> op_kernel, std::vector<size_t> port_of_slot)
      : op_kernel_(std::move(op_kernel)), port_of_slot_(std::move(port_of_slot)) {}
  std::string name() const override { return op_kernel_->name(); }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    std::vector<const void*> slots;
    slots.reserve(port_of_slot_.size());
    for (size_t port : port_of_slot_) {
      if (port >= in.size()) return internal_error("oneDNN: an input port is missing");
      slots.push_back(in[port]);
    }
    return op_kernel_->execute(slots, out);
  }

 private:
  std::shared_ptr<const Kernel> op_kernel_;
  std::vector<size_t> port_of_slot_;
};

// `kernel` for the one op of `partition`, behind a SlotKernel when the op's
// input slots are not the partition's ports one to one.
StatusOr<std::shared_ptr<const Kernel>> by_slots(const Partition& partition,
                                                 StatusOr<std::shared_ptr<const Kernel>> kernel) {
  if (!kernel.ok()) return kernel;
  const Op& op = partition.ops[0];
  std::vector<size_t> port_of_slot;
  bool identity = op.inputs().size() == partition.inputs.size();
  for (size_t slot = 0; slot < op.inputs().size(); ++slot) {
    size_t port = 0;
    while (port < partition.inputs.size() && partition.inputs[port].id != op.inputs()[slot].id)
      ++port;
    if (port == partition.inputs.size())
      return internal_error("oneDNN: tensor " + std::to_string(op.inputs()[slot].id) +
                            " is no input of the partition");
    identity = identity && port == slot;
    port_of_slot.push_back(port);
  }
  if (identity) return kernel;
  return std::shared_ptr<const Kernel>(
      std::make_shared<SlotKernel>(std::move(kernel).value(), std::move(port_of_slot)));
}

// The ops of `part` from `first` to `last` as a partition of their own (its
// boundary tensors within `part`, as the partitioner cuts them).
StatusOr<Partition> sub_partition(const Partition& part, size_t first, size_t last) {
  Graph g;
  std::vector<int64_t> outputs, ids;
  for (const Op& op : part.ops) NG_RETURN_IF_ERROR(g.add_op(op));
  for (const LogicalTensor& lt : part.outputs) outputs.push_back(lt.id);
  g.set_output_ports(outputs);
  NG_RETURN_IF_ERROR(g.finalize());
  for (size_t k = first; k <= last; ++k) ids.push_back(part.ops[k].id());
  Partition sub = make_partition(g, ids);
  sub.id = part.id;
  return sub;
}

class DnnlBackend final : public Backend {
 public:
  const char* name() const override { return "dnnl"; }

  // oneDNN's int8 batch-norm chain and fuse_norm_relu, then one primitive per op.
  std::vector<Pattern> patterns() const override {
    return {int8_bn_chain_pattern("dnnl"), bn_inference_relu_pattern("dnnl"),
            single_op_pattern("op", "dnnl",
                              {OpKind::kBatchNormInference, OpKind::kBatchNormForwardTraining,
                               OpKind::kBatchNormTrainingBackward, OpKind::kAdd, OpKind::kQuantize,
                               OpKind::kDequantize, OpKind::kReLU, OpKind::kReLUBackward,
                               OpKind::kTypeCast, OpKind::kStaticTranspose})};
  }

  Status supports(const Partition& partition, const CompileContext&) const override {
    return build(partition).status();
  }

  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                  const CompileContext&) const override {
    return build(partition);
  }

 private:
  // oneDNN's int8 batch-norm pattern, Dequantize -> BatchNormInference [-> ReLU]
  // -> Quantize: one reorder, one batch norm (with fuse_norm_relu), one reorder.
  static StatusOr<std::shared_ptr<const Kernel>> build_chain(const Partition& partition) {
    std::vector<ChainKernel::Segment> segments;
    for (size_t k = 0; k < partition.ops.size(); ++k) {
      const OpKind kind = partition.ops[k].kind();
      if (kind != OpKind::kDequantize && kind != OpKind::kQuantize &&
          kind != OpKind::kBatchNormInference)
        return unimplemented(std::string(op_kind_name(kind)) +
                             " does not belong in oneDNN's int8 batch-norm chain");
      size_t last = k;
      if (kind == OpKind::kBatchNormInference && k + 1 < partition.ops.size() &&
          partition.ops[k + 1].kind() == OpKind::kReLU)
        last = k + 1;
      NG_ASSIGN_OR_RETURN(Partition sub, sub_partition(partition, k, last));
      NG_ASSIGN_OR_RETURN(auto kernel, build(sub));
      segments.push_back({std::move(sub), std::move(kernel)});
      k = last;
    }
    return std::shared_ptr<const Kernel>(
        std::make_shared<ChainKernel>(partition, std::move(segments)));
  }

  // Plans are cached by signature, so supports() followed by compile() builds once.
  static StatusOr<std::shared_ptr<const Kernel>> build(const Partition& partition) {
    // The int8 chain's match bound a Dequantize (passes/pattern.hpp).
    if (partition.bound(FusionRole::kDequantize) != nullptr) return build_chain(partition);
    const Op& op = partition.ops[0];
    if (op.kind() == OpKind::kBatchNormInference || op.kind() == OpKind::kBatchNormForwardTraining)
      return dnnl_impl::make_batch_norm_forward(partition);
    if (partition.ops.size() != 1)
      return internal_error("oneDNN: " + partition.ops_string() + " is not one of its patterns");
    switch (op.kind()) {
      case OpKind::kBatchNormTrainingBackward:
        return by_slots(partition, dnnl_impl::make_batch_norm_backward(op));
      case OpKind::kAdd:
        if (const AddPorts add(op); add.src_0().dims != add.src_1().dims ||
                                    add.src_0().dtype != add.src_1().dtype ||
                                    add.src_0().dtype != add.dst().dtype) {
          return unimplemented("Add with broadcasting or mixed dtypes is not lowered to oneDNN");
        }
        return by_slots(partition, dnnl_impl::make_neighbour(op));
      case OpKind::kQuantize:
      case OpKind::kDequantize:
      case OpKind::kReLU:
      case OpKind::kReLUBackward:
      case OpKind::kTypeCast:
      case OpKind::kStaticTranspose:
        return by_slots(partition, dnnl_impl::make_neighbour(op));
      default:
        break;
    }
    return unimplemented(std::string(op_kind_name(op.kind())) +
                         " is not lowered to oneDNN (ref runs it)");
  }
};

}  // namespace

const Backend* dnnl_backend() {
  static const DnnlBackend backend;
  return &backend;
}

// oneDNN on Debian threads with OpenMP (libgomp, loaded with libdnnl). The call
// is looked up at run time so normgrad itself never links an OpenMP runtime,
// which keeps clang builds (whose -fopenmp means libomp) from mixing two.
void set_dnnl_threads(int n) {
  using SetThreads = void (*)(int);
  static const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set != nullptr) set(n);
}

}  // namespace normgrad
