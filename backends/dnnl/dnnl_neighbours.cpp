// The ops around batch norm on oneDNN primitives: ReLU -> eltwise_forward,
// ReLUBackward -> eltwise_backward (relu, or relu_use_dst_for_bwd when
// use_dst), Add -> binary add, TypeCast and StaticTranspose -> reorder.
// Every tensor keeps its own strides; a transpose is a reorder from a
// permuted view of the source. Quantize and Dequantize are reorders with
// output scales (1/scale to quantize, scale to dequantize; per channel with
// the mask of `axis`) and a zero point on the quantized side, common to all
// channels (oneDNN 2.6 reorders take no per-channel zero points).
#include <normgrad/backends/dnnl/dnnl_common.hpp>
#include <normgrad/backends/dnnl/dnnl_kernels.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace dnnl_impl {
namespace {

struct NeighbourPlan {
  OpKind kind;
  std::vector<dnnl::memory::desc> in_mds, out_mds;
  std::vector<int> in_args, out_args;
  dnnl::primitive prim;
  std::shared_ptr<dnnl::primitive_desc_base> pd;
  std::string impl;
};

class NeighbourKernel final : public Kernel {
 public:
  explicit NeighbourKernel(std::shared_ptr<const NeighbourPlan> plan) : plan_(std::move(plan)) {}
  std::string name() const override { return plan_->impl; }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    const NeighbourPlan& p = *plan_;
    return guard(std::string(op_kind_name(p.kind)) + " execute", [&] {
      const dnnl::engine& eng = cpu_engine();
      dnnl::stream stream(eng);
      Scratchpad scratch = make_scratchpad(*p.pd);
      std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SCRATCHPAD, scratch.mem}};
      for (size_t i = 0; i < p.in_args.size(); ++i) {
        args[p.in_args[i]] = dnnl::memory(p.in_mds[i], eng, const_cast<void*>(in[i]));
      }
      for (size_t i = 0; i < p.out_args.size(); ++i)
        args[p.out_args[i]] = dnnl::memory(p.out_mds[i], eng, out[i]);
      p.prim.execute(stream, args);
      stream.wait();
    });
  }

 private:
  std::shared_ptr<const NeighbourPlan> plan_;
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

StatusOr<std::shared_ptr<const NeighbourPlan>> build(const Op& op) {
  for (const auto& t : op.inputs()) {
    if (t.dtype == DataType::kF16) return unimplemented("f16 is not lowered to oneDNN 2.6 on CPU");
    NG_ASSIGN_OR_RETURN(int64_t n, t.element_count());
    if (n == 0) return unimplemented("empty tensors are left to ref");
  }
  for (const auto& t : op.outputs()) {
    if (t.dtype == DataType::kF16) return unimplemented("f16 is not lowered to oneDNN 2.6 on CPU");
  }
  auto plan = std::make_shared<NeighbourPlan>();
  plan->kind = op.kind();
  if (!is_elementwise_kind(op))
    return internal_error("oneDNN neighbour kernels do not take " + op.label());
  const LogicalTensor& src = elementwise_src(op);
  const LogicalTensor& dst = elementwise_dst(op);
  NG_ASSIGN_OR_RETURN(dnnl::memory::desc dst_md, make_md(dst, dst.dtype));
  Status s;
  std::string decline;  // set by a builder that finds oneDNN cannot match our layout
  switch (op.kind()) {
    case OpKind::kReLU: {
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc src_md, make_md(src, src.dtype));
      s = guard("eltwise_forward", [&] {
        auto pd = std::make_shared<dnnl::eltwise_forward::primitive_desc>(
            dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::eltwise_relu, src_md, 0.f),
            user_scratchpad(), cpu_engine());
        // oneDNN 2.6's eltwise writes dst in src's layout: a dst of other
        // strides would be written in the wrong order.
        if (pd->dst_desc() != dst_md) {
          decline = "dst layout differs from src's";
          return;
        }
        plan->prim = dnnl::eltwise_forward(*pd);
        plan->pd = pd;
      });
      if (s.ok() && !decline.empty()) return unimplemented("oneDNN: " + decline);
      plan->in_mds = {src_md};
      plan->in_args = {DNNL_ARG_SRC};
      plan->out_args = {DNNL_ARG_DST};
      break;
    }
    case OpKind::kReLUBackward: {
      bool use_dst = true;
      if (op.has_attr("use_dst")) {
        NG_ASSIGN_OR_RETURN(use_dst, op.attr_bool("use_dst"));
      }
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc data_md, make_md(src, src.dtype));
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc dd_md,
                          make_md(ReLUBackwardPorts(op).diff_dst(), src.dtype));
      const auto alg =
          use_dst ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd : dnnl::algorithm::eltwise_relu;
      s = guard("eltwise_backward", [&] {
        const dnnl::engine& eng = cpu_engine();
        dnnl::eltwise_forward::primitive_desc hint(
            dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, data_md, 0.f), eng);
        auto pd = std::make_shared<dnnl::eltwise_backward::primitive_desc>(
            dnnl::eltwise_backward::desc(alg, dd_md, data_md, 0.f), user_scratchpad(), eng, hint);
        if (pd->diff_src_desc() != dst_md) {
          decline = "diff_src layout differs from diff_dst's";  // a value, not an exception
          return;
        }
        plan->prim = dnnl::eltwise_backward(*pd);
        plan->pd = pd;
      });
      if (s.ok() && !decline.empty()) return unimplemented("oneDNN: " + decline);
      plan->in_mds = {data_md, dd_md};
      plan->in_args = {use_dst ? DNNL_ARG_DST : DNNL_ARG_SRC, DNNL_ARG_DIFF_DST};
      plan->out_args = {DNNL_ARG_DIFF_SRC};
      break;
    }
    case OpKind::kAdd: {
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc a_md, make_md(src, src.dtype));
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc b_md, make_md(AddPorts(op).src_1(), src.dtype));
      s = guard("binary add", [&] {
        auto pd = std::make_shared<dnnl::binary::primitive_desc>(
            dnnl::binary::desc(dnnl::algorithm::binary_add, a_md, b_md, dst_md), user_scratchpad(),
            cpu_engine());
        plan->prim = dnnl::binary(*pd);
        plan->pd = pd;
      });
      plan->in_mds = {a_md, b_md};
      plan->in_args = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1};
      plan->out_args = {DNNL_ARG_DST};
      break;
    }
    case OpKind::kTypeCast:
    case OpKind::kStaticTranspose: {
      // Describe the source in the destination's dim order: dst dim k is src dim order[k].
      std::vector<int> perm;
      if (op.kind() == OpKind::kStaticTranspose) {
        NG_ASSIGN_OR_RETURN(std::vector<int64_t> order, op.attr_s64s("order"));
        const auto rank = static_cast<int64_t>(order.size());
        for (int64_t o : order) perm.push_back(static_cast<int>((o + rank) % rank));
      }
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc src_md, make_md(src, src.dtype, perm));
      s = guard("reorder", [&] {
        const dnnl::engine& eng = cpu_engine();
        auto pd = std::make_shared<dnnl::reorder::primitive_desc>(eng, src_md, eng, dst_md,
                                                                  user_scratchpad());
        plan->prim = dnnl::reorder(*pd);
        plan->pd = pd;
      });
      plan->in_mds = {src_md};
      plan->in_args = {DNNL_ARG_FROM};
      plan->out_args = {DNNL_ARG_TO};
      break;
    }
    case OpKind::kQuantize:
    case OpKind::kDequantize: {
      const bool quantize = op.kind() == OpKind::kQuantize;
      const auto& scales = std::get<std::vector<float>>(op.attrs().at("scales"));
      std::vector<int64_t> zps;
      if (op.has_attr("zps")) zps = std::get<std::vector<int64_t>>(op.attrs().at("zps"));
      for (int64_t z : zps) {
        if (z != zps[0])
          return unimplemented("oneDNN 2.6 reorders take one zero point, not one per channel");
      }
      // oneDNN 2.6 drops a zero point (and rounds differently) when the same
      // reorder also changes the layout: take only dense to dense.
      if (src.effective_strides() != dense_strides(src.dims) ||
          dst.effective_strides() != dense_strides(dst.dims))
        return unimplemented(
            "oneDNN 2.6's quantizing reorders are exact only between dense tensors; a strided "
            "one is left to ref");
      int mask = 0;
      if (scales.size() > 1) {
        int64_t axis = op.has_attr("axis") ? std::get<int64_t>(op.attrs().at("axis")) : 1;
        if (axis < 0) axis += static_cast<int64_t>(src.dims.size());
        if (static_cast<int64_t>(scales.size()) != src.dims[static_cast<size_t>(axis)])
          return unimplemented("per-channel scales do not match the axis dim");
        mask = 1 << axis;
      }
      std::vector<float> oscales;
      for (float sc : scales) oscales.push_back(quantize ? 1.0f / sc : sc);
      NG_ASSIGN_OR_RETURN(dnnl::memory::desc src_md, make_md(src, src.dtype));
      s = guard(quantize ? "quantize reorder" : "dequantize reorder", [&] {
        const dnnl::engine& eng = cpu_engine();
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        attr.set_output_scales(mask, oscales);
        if (!zps.empty() && zps[0] != 0) {
          attr.set_zero_points(quantize ? DNNL_ARG_DST : DNNL_ARG_SRC, 0,
                               {static_cast<int32_t>(zps[0])});
        }
        auto pd = std::make_shared<dnnl::reorder::primitive_desc>(eng, src_md, eng, dst_md, attr);
        plan->prim = dnnl::reorder(*pd);
        plan->pd = pd;
      });
      plan->in_mds = {src_md};
      plan->in_args = {DNNL_ARG_FROM};
      plan->out_args = {DNNL_ARG_TO};
      break;
    }
    default:
      return unimplemented(std::string(op_kind_name(op.kind())) +
                           " is not lowered to oneDNN (ref runs it)");
  }
  NG_RETURN_IF_ERROR(explain_decline(s, op_kind_name(op.kind()), src.dtype));
  plan->out_mds = {dst_md};
  plan->impl = plan->pd->impl_info_str();
  return std::shared_ptr<const NeighbourPlan>(std::move(plan));
}

PlanCache<NeighbourPlan>& cache() {
  static PlanCache<NeighbourPlan> c;
  return c;
}

}  // namespace

StatusOr<std::shared_ptr<const Kernel>> make_neighbour(const Op& op) {
  const std::string key = op_signature(op, false, false);
  NG_ASSIGN_OR_RETURN(auto plan, cache().get_or_build(key, [&] { return build(op); }));
  return std::shared_ptr<const Kernel>(std::make_shared<NeighbourKernel>(std::move(plan)));
}

}  // namespace dnnl_impl
}  // namespace normgrad
