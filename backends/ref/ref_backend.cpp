// The reference backend: runs any partition op by op through ref::execute_op.
//
// It supports every valid partition, so every valid graph runs. Tensors that
// live inside a partition (fused groups) get per-call scratch buffers in their
// own dtype (PartitionBuffers), which reproduces the unfused rounding exactly.
#include <normgrad/backends/backend_registry.hpp>
#include <normgrad/backends/ref/ref_ops.hpp>
#include <normgrad/ops/tf_batch_norm.hpp>

namespace normgrad {
namespace {

class RefKernel final : public Kernel {
 public:
  explicit RefKernel(Partition p) : partition_(std::move(p)) {}

  std::string name() const override {
    std::string n = "ref:";
    for (size_t i = 0; i < partition_.ops.size(); ++i)
      n += (i ? "+" : "") + std::string(op_kind_name(partition_.ops[i].kind()));
    return n;
  }

  Status execute(const std::vector<const void*>& inputs,
                 const std::vector<void*>& outputs) const override {
    PartitionBuffers buffers(partition_, inputs, outputs);
    for (const Op& op : partition_.ops) {
      std::vector<const void*> in;
      std::vector<void*> out;
      for (const LogicalTensor& lt : op.inputs()) {
        auto b = buffers.read(lt);
        if (!b.ok()) return b.status().with_context(op.label());
        in.push_back(*b);
      }
      for (const LogicalTensor& lt : op.outputs()) {
        NG_ASSIGN_OR_RETURN(void* b, buffers.write(lt));
        out.push_back(b);
      }
      NG_RETURN_IF_ERROR(ref::execute_op(op, in, out));
    }
    return ok_status();
  }

 private:
  Partition partition_;
};

class RefBackend final : public Backend {
 public:
  const char* name() const override { return "ref"; }

  // Every op alone, and the fusions of the other backends as groups too, so a
  // fused pattern that only ref can run keeps its partition count (what
  // benchdnn's --expected-n-partitions checks); ref runs a group op by op
  // with the intermediates in their own dtype, as unfused.
  std::vector<Pattern> patterns() const override {
    return {bn_backward_producers_pattern("ref"), int8_bn_chain_pattern("ref"),
            bn_inference_relu_pattern("ref"), collective_pattern("allreduce", "ref"),
            single_op_pattern("op", "ref", {})};
  }
  Status supports(const Partition& partition, const CompileContext& ctx) const override {
    if (partition.ops.empty()) return invalid_argument("empty partition");
    for (const Op& op : partition.ops) {
      if (op.kind() == OpKind::kAllReduce) {
        const std::string group = op.has_attr("group") ? *op.attr_string("group") : "world";
        NG_ASSIGN_OR_RETURN(auto comm, resolve_group(ctx.communicators, group));
        if (comm && comm->size() > 1)
          return unimplemented(op.label() + ": ref sums over a group of one process; group '" +
                               group + "' is " + comm->name());
      }
      for (const auto* ports : {&op.inputs(), &op.outputs()}) {
        for (const LogicalTensor& lt : *ports) {
          if (!is_loadable_dtype(lt.dtype))
            return unimplemented(op.label() + ": ref computes no " + dtype_name(lt.dtype) +
                                 " data (tensor " + std::to_string(lt.id) + ")");
        }
      }
      if (op.kind() == OpKind::kQuantize || op.kind() == OpKind::kDequantize) {
        const auto& scales = std::get<std::vector<float>>(op.attrs().at("scales"));
        const Dims& d = op.inputs()[0].dims;
        int64_t axis = op.has_attr("axis") ? std::get<int64_t>(op.attrs().at("axis")) : 1;
        if (axis < 0) axis += static_cast<int64_t>(d.size());
        if (scales.size() > 1 &&
            static_cast<int64_t>(scales.size()) != d[static_cast<size_t>(axis)])
          return unimplemented(op.label() + ": " + std::to_string(scales.size()) +
                               " per-channel scales for a dim of " +
                               std::to_string(d[static_cast<size_t>(axis)]) +
                               " (grouped weights), which normgrad does not run");
      }
      if (is_tf_batch_norm_grad(op.kind())) {
        return unimplemented(op.label() +
                             ": TensorFlow ops run after the canonicalize pass rewrites them");
      }
    }
    return ok_status();
  }
  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                  const CompileContext& ctx) const override {
    NG_RETURN_IF_ERROR(supports(partition, ctx));
    return std::shared_ptr<const Kernel>(std::make_shared<RefKernel>(partition));
  }
};

}  // namespace

const Backend* ref_backend() {
  static const RefBackend backend;
  return &backend;
}

Status reference_execute(const Op& op, const std::vector<const void*>& inputs,
                         const std::vector<void*>& outputs) {
  return ref::execute_op(op, inputs, outputs);
}

}  // namespace normgrad
