// Batch-norm forward on dnnl::batch_normalization_forward: BatchNormInference
// (optionally followed by a fused ReLU, oneDNN's fuse_norm_relu) and
// BatchNormForwardTraining with its running-statistics update.
//
// oneDNN's forward takes f32 statistics, scale and shift only (as its backward
// does), so bf16 statistics are converted around the call. Training writes the
// batch mean and biased variance through DNNL_ARG_MEAN / DNNL_ARG_VARIANCE;
// the running statistics follow oneDNN Graph's update, done here per channel:
//   running = momentum * running_in + (1 - momentum) * batch.
// f16 data is declined (oneDNN 2.6 has no f16 batch norm on CPU), as are ranks
// beyond 5 and empty tensors; ref runs those.
#include <algorithm>

#include <normgrad/backends/dnnl/dnnl_common.hpp>
#include <normgrad/backends/dnnl/dnnl_kernels.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace dnnl_impl {
namespace {

using dnnl::normalization_flags;
using dnnl::prop_kind;

// Where each of the batch norm's ports sits in the partition's port lists.
struct FwdPlan {
  BatchNormDesc d;
  Op bn;
  bool training = false;
  bool fuse_relu = false;
  bool scale_shift = false;
  std::vector<int> in_index;        // bn input i -> partition input index
  int dst_index = 0;                // partition output written with dst (the ReLU's when fused)
  std::vector<int> stat_out_index;  // training: the four statistics -> partition output index
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
  std::string impl;
};

class FwdKernel final : public Kernel {
 public:
  explicit FwdKernel(std::shared_ptr<const FwdPlan> plan) : plan_(std::move(plan)) {}
  std::string name() const override { return plan_->impl; }

  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    const FwdPlan& p = *plan_;
    const int64_t c = p.d.channels;
    auto bn_in = [&](size_t i) { return in[static_cast<size_t>(p.in_index[i])]; };
    // Port numbers of gamma, beta, mean and variance in each op's order.
    using Train = BatchNormForwardTrainingPorts;
    using Infer = BatchNormInferencePorts;
    const size_t gi = p.training ? Train::gamma_port() : Infer::gamma_port();
    const size_t bi = p.training ? Train::beta_port() : Infer::beta_port();
    const size_t mi = p.training ? Train::mean_port() : Infer::mean_port();
    const size_t vi = p.training ? Train::variance_port() : Infer::variance_port();
    std::vector<float> mean(static_cast<size_t>(c)), var(static_cast<size_t>(c)), scale, shift;
    if (!p.training) {
      mean = channel_values_f32(bn_in(mi), p.bn.inputs()[mi], c);
      var = channel_values_f32(bn_in(vi), p.bn.inputs()[vi], c);
    }
    if (p.scale_shift) {
      scale = channel_values_f32(bn_in(gi), p.bn.inputs()[gi], c);
      shift = channel_values_f32(bn_in(bi), p.bn.inputs()[bi], c);
    }
    Status s = guard("batch_normalization_forward execute", [&] {
      const dnnl::engine& eng = cpu_engine();
      dnnl::stream stream(eng);
      Scratchpad scratch = make_scratchpad(p.pd);
      auto mem = [&](const dnnl::memory::desc& md, const void* ptr) {
        return dnnl::memory(md, eng, const_cast<void*>(ptr));
      };
      const dnnl::memory::desc cmd({c}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, mem(p.pd.src_desc(), bn_in(Train::src_port()))},
          {DNNL_ARG_DST, mem(p.pd.dst_desc(), out[static_cast<size_t>(p.dst_index)])},
          {DNNL_ARG_MEAN, mem(cmd, mean.data())},
          {DNNL_ARG_VARIANCE, mem(cmd, var.data())},
          {DNNL_ARG_SCRATCHPAD, scratch.mem}};
      if (p.scale_shift) {
        args[DNNL_ARG_SCALE] = mem(cmd, scale.data());
        args[DNNL_ARG_SHIFT] = mem(cmd, shift.data());
      }
      p.prim.execute(stream, args);
      stream.wait();
    });
    NG_RETURN_IF_ERROR(s);
    if (p.training) {
      const double momentum = p.d.momentum;
      const Train ports(p.bn);
      const std::vector<float> run_mean =
          channel_values_f32(bn_in(Train::mean_port()), ports.mean(), c);
      const std::vector<float> run_var =
          channel_values_f32(bn_in(Train::variance_port()), ports.variance(), c);
      const LogicalTensor* stats[4] = {&ports.running_mean(), &ports.running_variance(),
                                       &ports.batch_mean(), &ports.batch_variance()};
      for (int64_t k = 0; k < c; ++k) {
        const double values[4] = {momentum * run_mean[k] + (1.0 - momentum) * mean[k],
                                  momentum * run_var[k] + (1.0 - momentum) * var[k], mean[k],
                                  var[k]};
        for (size_t o = 0; o < 4; ++o) {
          const LogicalTensor& lt = *stats[o];
          store_from_double(out[static_cast<size_t>(p.stat_out_index[o])],
                            k * lt.effective_strides()[0], lt.dtype, values[o]);
        }
      }
    }
    return ok_status();
  }

 private:
  std::shared_ptr<const FwdPlan> plan_;
};

int index_in(const std::vector<LogicalTensor>& ports, int64_t id) {
  for (size_t i = 0; i < ports.size(); ++i) {
    if (ports[i].id == id) return static_cast<int>(i);
  }
  return -1;
}

StatusOr<std::shared_ptr<const FwdPlan>> build_plan(const Partition& part) {
  const Op& bn = part.ops[0];
  const bool fused = part.ops.size() == 2;
  if (fused && (part.ops[1].kind() != OpKind::kReLU || bn.kind() != OpKind::kBatchNormInference ||
                ReLUPorts(part.ops[1]).src().id != BatchNormInferencePorts(bn).dst().id)) {
    return unimplemented("oneDNN fuses only BatchNormInference followed by ReLU");
  }
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(bn));
  if (d.data_dt == DataType::kF16)
    return unimplemented("oneDNN 2.6 has no f16 batch normalization on CPU");
  if (d.dims.size() > 5)
    return unimplemented("oneDNN batch normalization takes ranks 2 to 5, got " +
                         std::to_string(d.dims.size()));
  if (d.reduce_size == 0 || d.channels == 0) return unimplemented("empty tensors are left to ref");
  const LogicalTensor& dst =
      fused ? ReLUPorts(part.ops[1]).dst()
            : (bn.kind() == OpKind::kBatchNormInference ? BatchNormInferencePorts(bn).dst()
                                                        : BatchNormForwardTrainingPorts(bn).dst());
  if (dst.dtype != d.data_dt) return unimplemented("the fused ReLU changes the dtype");
  auto plan = std::make_shared<FwdPlan>();
  plan->d = d;
  plan->bn = bn;
  plan->training = bn.kind() == OpKind::kBatchNormForwardTraining;
  plan->fuse_relu = fused;
  plan->scale_shift = plan->training ? d.has_gamma : true;
  for (const LogicalTensor& lt : bn.inputs()) {
    plan->in_index.push_back(index_in(part.inputs, lt.id));
    if (plan->in_index.back() < 0)
      return unimplemented("batch-norm inputs must be partition inputs");
  }
  plan->dst_index = index_in(part.outputs, dst.id);
  if (plan->dst_index < 0) return unimplemented("dst must be a partition output");
  if (plan->training) {
    const BatchNormForwardTrainingPorts ports(bn);
    for (const LogicalTensor* lt : {&ports.running_mean(), &ports.running_variance(),
                                    &ports.batch_mean(), &ports.batch_variance()}) {
      plan->stat_out_index.push_back(index_in(part.outputs, lt->id));
      if (plan->stat_out_index.back() < 0)
        return unimplemented("statistics outputs must be partition outputs");
    }
  }
  const std::vector<int> perm =
      channel_second_perm(static_cast<int>(d.dims.size()), d.channel_axis);
  NG_ASSIGN_OR_RETURN(
      dnnl::memory::desc src_md,
      make_md(bn.kind() == OpKind::kBatchNormInference ? BatchNormInferencePorts(bn).src()
                                                       : BatchNormForwardTrainingPorts(bn).src(),
              d.data_dt, perm));
  NG_ASSIGN_OR_RETURN(dnnl::memory::desc dst_md, make_md(dst, d.data_dt, perm));
  normalization_flags flags = normalization_flags::none;
  if (!plan->training) flags = flags | normalization_flags::use_global_stats;
  if (plan->scale_shift)
    flags = flags | normalization_flags::use_scale | normalization_flags::use_shift;
  if (plan->fuse_relu) flags = flags | normalization_flags::fuse_norm_relu;
  const prop_kind prop =
      plan->training ? prop_kind::forward_training : prop_kind::forward_inference;
  std::string decline;  // a decline is a value, not an exception
  const Status built = guard("batch_normalization_forward primitive descriptor", [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    plan->pd = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(prop, src_md, d.epsilon, flags), attr,
        cpu_engine());
    if (plan->pd.dst_desc() != dst_md) {
      decline = "dst layout differs";
      return;
    }
    if (plan->training && plan->pd.workspace_desc().get_size() != 0) {
      decline = "a workspace is needed";
      return;
    }
    plan->prim = dnnl::batch_normalization_forward(plan->pd);
    plan->impl = plan->pd.impl_info_str();
  });
  NG_RETURN_IF_ERROR(explain_decline(built, "batch_normalization_forward", d.data_dt));
  if (!decline.empty()) return unimplemented("oneDNN: " + decline);
  return std::shared_ptr<const FwdPlan>(std::move(plan));
}

PlanCache<FwdPlan>& fwd_cache() {
  static PlanCache<FwdPlan> cache;
  return cache;
}

}  // namespace

StatusOr<std::shared_ptr<const Kernel>> make_batch_norm_forward(const Partition& partition) {
  std::string key = "bnf";
  for (const Op& op : partition.ops) key += "#" + op_signature(op, true, true);
  for (const auto& t : partition.inputs) key += "|i" + std::to_string(t.id);
  for (const auto& t : partition.outputs) key += "|o" + std::to_string(t.id);
  NG_ASSIGN_OR_RETURN(auto plan,
                      fwd_cache().get_or_build(key, [&] { return build_plan(partition); }));
  return std::shared_ptr<const Kernel>(std::make_shared<FwdKernel>(std::move(plan)));
}

}  // namespace dnnl_impl
}  // namespace normgrad
