// Batch-norm backward on dnnl::batch_normalization_backward.
//
// Our forms map onto oneDNN's flags as follows (s = 1/sqrt(var + eps)):
//   training, diff_gamma/diff_beta wanted or gamma used
//       -> prop backward, use_scale | use_shift (gamma = ones when absent);
//          DNNL_ARG_SHIFT must be passed with use_shift, so a zero shift is given
//   training, no gamma, diff_src only     -> prop backward_data, no flags
//   frozen (use_global_stats), same split -> the above plus use_global_stats
// Unwanted diff_gamma/diff_beta land in per-call scratch. oneDNN's statistics
// are f32 only (bf16 statistics memory runs and gives wrong results), so bf16
// mean, variance, gamma and the diff outputs are converted around the call; an
// inverse standard deviation is turned back into a variance (1/s^2 - eps).
#include <cmath>

#include <normgrad/backends/dnnl/dnnl_common.hpp>
#include <normgrad/backends/dnnl/dnnl_kernels.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace dnnl_impl {
namespace {

using dnnl::normalization_flags;
using dnnl::prop_kind;

struct BnPlan {
  BatchNormDesc d;
  Op op;
  bool use_scale_shift = false;  // scale and shift arguments are passed
  bool global_stats = false;
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
  std::string impl;
};

bool dense_f32(const LogicalTensor& lt) {
  return lt.dtype == DataType::kF32 && (lt.dims[0] <= 1 || lt.effective_strides()[0] == 1);
}

class BnKernel final : public Kernel {
 public:
  explicit BnKernel(std::shared_ptr<const BnPlan> plan) : plan_(std::move(plan)) {}
  std::string name() const override { return plan_->impl; }

  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    const BnPlan& p = *plan_;
    const BatchNormDesc& d = p.d;
    const int64_t c = d.channels;
    // `in` and `out` follow the op's ports (by_slots).
    using P = BatchNormTrainingBackwardPorts;
    const P ports(p.op);
    // Statistics in f32, dense.
    std::vector<float> mean, var, gamma, shift, dscale, dshift;
    const float* mean_p = static_cast<const float*>(in[P::mean_port()]);
    const float* var_p = static_cast<const float*>(in[P::variance_port()]);
    if (!dense_f32(ports.mean())) {
      mean = channel_values_f32(in[P::mean_port()], ports.mean(), c);
      mean_p = mean.data();
    }
    if (!dense_f32(ports.variance()) || d.variance_is_inv_std) {
      var = channel_values_f32(in[P::variance_port()], ports.variance(), c);
      if (d.variance_is_inv_std) {
        for (float& v : var)
          v = std::max(0.0f, static_cast<float>(1.0 / (static_cast<double>(v) * v) - d.epsilon));
      }
      var_p = var.data();
    }
    const float* gamma_p = nullptr;
    float* dscale_p = nullptr;
    float* dshift_p = nullptr;
    if (p.use_scale_shift) {
      if (d.use_gamma && dense_f32(ports.gamma())) {
        gamma_p = static_cast<const float*>(in[P::gamma_port()]);
      } else if (d.use_gamma) {
        gamma = channel_values_f32(in[P::gamma_port()], ports.gamma(), c);
        gamma_p = gamma.data();
      } else {
        gamma.assign(static_cast<size_t>(c), 1.0f);
        gamma_p = gamma.data();
      }
      shift.assign(static_cast<size_t>(c), 0.0f);
      const bool direct =
          d.diff_scale_shift && dense_f32(ports.diff_gamma()) && dense_f32(ports.diff_beta());
      if (direct) {
        dscale_p = static_cast<float*>(out[P::diff_gamma_port()]);
        dshift_p = static_cast<float*>(out[P::diff_beta_port()]);
      } else {
        dscale.resize(static_cast<size_t>(c));
        dshift.resize(static_cast<size_t>(c));
        dscale_p = dscale.data();
        dshift_p = dshift.data();
      }
    }
    Status s = guard("batch_normalization_backward execute", [&] {
      const dnnl::engine& eng = cpu_engine();
      dnnl::stream stream(eng);
      Scratchpad scratch = make_scratchpad(p.pd);
      auto mem = [&](const dnnl::memory::desc& md, const void* ptr) {
        return dnnl::memory(md, eng, const_cast<void*>(ptr));
      };
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, mem(p.pd.src_desc(), in[P::src_port()])},
          {DNNL_ARG_DIFF_DST, mem(p.pd.diff_dst_desc(), in[P::diff_dst_port()])},
          {DNNL_ARG_MEAN, mem(p.pd.mean_desc(), mean_p)},
          {DNNL_ARG_VARIANCE, mem(p.pd.variance_desc(), var_p)},
          {DNNL_ARG_DIFF_SRC, mem(p.pd.diff_src_desc(), out[P::diff_src_port()])},
          {DNNL_ARG_SCRATCHPAD, scratch.mem}};
      if (p.use_scale_shift) {
        const dnnl::memory::desc cmd({c}, dnnl::memory::data_type::f32,
                                     dnnl::memory::format_tag::a);
        args[DNNL_ARG_SCALE] = mem(cmd, gamma_p);
        args[DNNL_ARG_SHIFT] = mem(cmd, shift.data());
        args[DNNL_ARG_DIFF_SCALE] = mem(cmd, dscale_p);
        args[DNNL_ARG_DIFF_SHIFT] = mem(cmd, dshift_p);
      }
      p.prim.execute(stream, args);
      stream.wait();
    });
    NG_RETURN_IF_ERROR(s);
    if (d.diff_scale_shift && dscale_p == dscale.data()) {
      const int64_t s1 = ports.diff_gamma().effective_strides()[0],
                    s2 = ports.diff_beta().effective_strides()[0];
      for (int64_t i = 0; i < c; ++i) {
        store_from_double(out[P::diff_gamma_port()], i * s1, ports.diff_gamma().dtype, dscale[i]);
        store_from_double(out[P::diff_beta_port()], i * s2, ports.diff_beta().dtype, dshift[i]);
      }
    }
    return ok_status();
  }

 private:
  std::shared_ptr<const BnPlan> plan_;
};

StatusOr<std::shared_ptr<const BnPlan>> build_plan(const Op& op) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  if (d.data_dt == DataType::kF16)
    return unimplemented("oneDNN 2.6 has no f16 batch normalization on CPU");
  if (d.dims.size() > 5)
    return unimplemented("oneDNN batch normalization takes ranks 2 to 5, got " +
                         std::to_string(d.dims.size()));
  if (d.reduce_size == 0 || d.channels == 0) return unimplemented("empty tensors are left to ref");
  auto plan = std::make_shared<BnPlan>();
  plan->d = d;
  plan->op = op;
  plan->global_stats = d.mode == BackwardMode::kFrozen;
  plan->use_scale_shift = d.use_gamma || d.diff_scale_shift;
  // oneDNN dim i is our dim perm[i]: N, C, spatial...
  const std::vector<int> perm =
      channel_second_perm(static_cast<int>(d.dims.size()), d.channel_axis);
  const BatchNormTrainingBackwardPorts ports(op);
  NG_ASSIGN_OR_RETURN(dnnl::memory::desc src_md, make_md(ports.src(), d.data_dt, perm));
  NG_ASSIGN_OR_RETURN(dnnl::memory::desc dd_md, make_md(ports.diff_dst(), d.data_dt, perm));
  NG_ASSIGN_OR_RETURN(dnnl::memory::desc ds_md, make_md(ports.diff_src(), d.data_dt, perm));
  normalization_flags flags = normalization_flags::none;
  if (plan->global_stats) flags = flags | normalization_flags::use_global_stats;
  if (plan->use_scale_shift)
    flags = flags | normalization_flags::use_scale | normalization_flags::use_shift;
  const prop_kind prop = plan->use_scale_shift ? prop_kind::backward : prop_kind::backward_data;
  std::string decline;
  const Status built = guard("batch_normalization_backward primitive descriptor", [&] {
    const dnnl::engine& eng = cpu_engine();
    dnnl::batch_normalization_forward::primitive_desc hint(
        dnnl::batch_normalization_forward::desc(prop_kind::forward_training, src_md, d.epsilon,
                                                flags),
        eng);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    plan->pd = dnnl::batch_normalization_backward::primitive_desc(
        dnnl::batch_normalization_backward::desc(prop, dd_md, src_md, d.epsilon, flags), attr, eng,
        hint);
    // The diff_src layout must be ours exactly; oneDNN keeps what we ask for plain strides.
    if (plan->pd.diff_src_desc() != ds_md) {
      decline = "diff_src layout differs";  // a decline is a value, not an exception
      return;
    }
    plan->prim = dnnl::batch_normalization_backward(plan->pd);
    plan->impl = plan->pd.impl_info_str();
  });
  NG_RETURN_IF_ERROR(explain_decline(built, "batch_normalization_backward", d.data_dt));
  if (!decline.empty()) return unimplemented("oneDNN: " + decline);
  return std::shared_ptr<const BnPlan>(std::move(plan));
}

PlanCache<BnPlan>& bn_cache() {
  static PlanCache<BnPlan> cache;
  return cache;
}

}  // namespace

StatusOr<std::shared_ptr<const Kernel>> make_batch_norm_backward(const Op& op) {
  const std::string key = op_signature(op, false, false);
  NG_ASSIGN_OR_RETURN(auto plan, bn_cache().get_or_build(key, [&] { return build_plan(op); }));
  return std::shared_ptr<const Kernel>(std::make_shared<BnKernel>(std::move(plan)));
}

}  // namespace dnnl_impl
}  // namespace normgrad
