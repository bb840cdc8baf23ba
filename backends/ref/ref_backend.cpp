// The reference backend: runs any partition op by op through ref::execute_op.
//
// It supports every valid partition, so every valid graph runs. Tensors that
// live inside a partition (fused groups) get per-call scratch buffers in their
// own dtype (PartitionBuffers), which reproduces the unfused rounding exactly.
#include <normgrad/backends/backend_registry.hpp>
#include <normgrad/backends/ref/ref_ops.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace {

// The kinds whose schema says ref runs them (OpSchema::not_on_ref): the
// anchors of ref's catch-all pattern, so a kind added with a schema, a ref
// kernel and nothing else is partitioned to ref.
std::vector<OpKind> kinds_ref_runs() {
  std::vector<OpKind> kinds;
  for (size_t k = 0; k < static_cast<size_t>(OpKind::kCount); ++k) {
    const OpSchema* schema = op_registry().find(static_cast<OpKind>(k));
    if (schema != nullptr && schema->ref_refusal().empty()) kinds.push_back(schema->kind());
  }
  return kinds;
}

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
            single_op_pattern("op", "ref", kinds_ref_runs())};
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
      const OpSchema* schema = op_registry().find(op.kind());
      if (schema == nullptr)
        return unimplemented(op.label() + ": normgrad has no schema (and no kernel) for " +
                             op.kind_spelling());
      if (!schema->ref_refusal().empty())
        return unimplemented(op.label() + ": " + schema->ref_refusal());
      if (op.kind() == OpKind::kQuantize || op.kind() == OpKind::kDequantize) {
        const auto& scales = std::get<std::vector<float>>(op.attrs().at("scales"));
        const Dims& d = op.kind() == OpKind::kQuantize ? QuantizePorts(op).src().dims
                                                       : DequantizePorts(op).src().dims;
        int64_t axis = op.has_attr("axis") ? std::get<int64_t>(op.attrs().at("axis")) : 1;
        if (axis < 0) axis += static_cast<int64_t>(d.size());
        if (scales.size() > 1 &&
            static_cast<int64_t>(scales.size()) != d[static_cast<size_t>(axis)])
          return unimplemented(op.label() + ": " + std::to_string(scales.size()) +
                               " per-channel scales for a dim of " +
                               std::to_string(d[static_cast<size_t>(axis)]) +
                               " (grouped weights), which normgrad does not run");
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
