// Reference batch norm: training backward (both forms and the synchronized halves),
// forward training (whole, and the synchronized parts), inference.
//
// Per channel c over its M = N x spatial elements, with s = 1/sqrt(var + eps)
// (or s = the input itself in the inverse-std convention), gamma = 1 unless used:
//   diff_beta  = sum dy
//   diff_gamma = s * sum dy (x - mean)
//   diff_src   = gamma s (dy - diff_beta/M - (x - mean) s diff_gamma/M)   (training)
//   diff_src   = gamma s dy                                     (frozen statistics)
#include <cmath>

#include <normgrad/backends/ref/ref_ops.hpp>
#include <normgrad/graph/indexing.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace ref {
namespace {

// One data tensor: base pointer, dtype and strides.
struct View {
  const void* data;
  DataType dt;
  Dims strides;
  double at(const std::vector<int64_t>& idx) const {
    return load_as_double(data, offset_of(idx, strides), dt);
  }
};

struct OutView {
  void* data;
  DataType dt;
  Dims strides;
  void set(const std::vector<int64_t>& idx, double v) const {
    store_from_double(data, offset_of(idx, strides), dt, v);
  }
};

View in_view(const Op& op, const std::vector<const void*>& in, size_t i) {
  return {in[i], op.inputs()[i].dtype, op.inputs()[i].effective_strides()};
}
OutView out_view(const Op& op, const std::vector<void*>& out, size_t i) {
  return {out[i], op.outputs()[i].dtype, op.outputs()[i].effective_strides()};
}

// Channel c of a 1-D statistics tensor (which may be strided).
double stat_at(const Op& op, const std::vector<const void*>& in, size_t i, int64_t c) {
  return load_as_double(in[i], c * op.inputs()[i].effective_strides()[0], op.inputs()[i].dtype);
}
void stat_set(const Op& op, const std::vector<void*>& out, size_t i, int64_t c, double v) {
  store_from_double(out[i], c * op.outputs()[i].effective_strides()[0], op.outputs()[i].dtype, v);
}

}  // namespace

namespace {

// Channel c's statistics: mean, s = 1/sqrt(var + eps) (or var itself in the
// inverse-std convention) and gamma (1 when not used), from the given ports.
struct ChannelStats {
  double mean, s, gamma;
};
// The training backward and its Apply half read mean and variance at the same ports.
using Bwd = BatchNormTrainingBackwardPorts;
using BwdApply = BatchNormBackwardApplyPorts;
static_assert(Bwd::mean_port() == BwdApply::mean_port() &&
                  Bwd::variance_port() == BwdApply::variance_port() &&
                  Bwd::src_port() == BwdApply::src_port() &&
                  Bwd::diff_dst_port() == BwdApply::diff_dst_port(),
              "the backward and its Apply half share their first ports");

ChannelStats channel_stats(const Op& op, const BatchNormDesc& d, const std::vector<const void*>& in,
                           int64_t c, size_t gamma_port) {
  const double var = stat_at(op, in, Bwd::variance_port(), c);
  return {stat_at(op, in, Bwd::mean_port(), c),
          d.variance_is_inv_std ? var : 1.0 / std::sqrt(var + static_cast<double>(d.epsilon)),
          d.use_gamma ? stat_at(op, in, gamma_port, c) : 1.0};
}

// sum dy and sum dy (x - mean) over channel c.
std::pair<double, double> channel_sums(const BatchNormDesc& d, const View& x, const View& dy,
                                       int64_t c, double mean) {
  double sum_dy = 0.0, sum_dy_xm = 0.0;
  for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
    const double g = dy.at(idx);
    sum_dy += g;
    sum_dy_xm += g * (x.at(idx) - mean);
  });
  return {sum_dy, sum_dy_xm};
}

// diff_src of channel c from its statistics and the sums over M elements.
void write_diff_src(const BatchNormDesc& d, const View& x, const View& dy, const OutView& dx,
                    int64_t c, const ChannelStats& st, double diff_beta, double diff_gamma,
                    double m) {
  for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
    if (d.mode == BackwardMode::kFrozen) {
      dx.set(idx, st.gamma * st.s * dy.at(idx));
      return;
    }
    const double xhat = (x.at(idx) - st.mean) * st.s;
    dx.set(idx, st.gamma * st.s * (dy.at(idx) - diff_beta / m - xhat * diff_gamma / m));
  });
}

}  // namespace

Status batch_norm_backward(const Op& op, const std::vector<const void*>& in,
                           const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, Bwd::src_port()), dy = in_view(op, in, Bwd::diff_dst_port());
  const OutView dx = out_view(op, out, Bwd::diff_src_port());
  const double m = static_cast<double>(d.reduce_size);
  for (int64_t c = 0; c < d.channels; ++c) {
    const ChannelStats st = channel_stats(op, d, in, c, Bwd::gamma_port());
    std::pair<double, double> sums{0.0, 0.0};
    if (d.mode == BackwardMode::kTraining || d.diff_scale_shift)
      sums = channel_sums(d, x, dy, c, st.mean);
    const double diff_beta = sums.first, diff_gamma = st.s * sums.second;
    write_diff_src(d, x, dy, dx, c, st, diff_beta, diff_gamma, m);
    if (d.diff_scale_shift) {
      stat_set(op, out, Bwd::diff_gamma_port(), c, diff_gamma);
      stat_set(op, out, Bwd::diff_beta_port(), c, diff_beta);
    }
  }
  return ok_status();
}

// The synchronized backward's halves: the same sums and diff_src as above,
// with the sums and M taken from inputs (summed over every process).
Status batch_norm_backward_reduce(const Op& op, const std::vector<const void*>& in,
                                  const std::vector<void*>& out) {
  using P = BatchNormBackwardReducePorts;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, P::src_port()), dy = in_view(op, in, P::diff_dst_port());
  for (int64_t c = 0; c < d.channels; ++c) {
    const auto [sum_dy, sum_dy_xm] = channel_sums(d, x, dy, c, stat_at(op, in, P::mean_port(), c));
    stat_set(op, out, P::sum_dy_port(), c, sum_dy);
    stat_set(op, out, P::sum_dy_xm_port(), c, sum_dy_xm);
  }
  stat_set(op, out, P::count_port(), 0, static_cast<double>(d.reduce_size));
  return ok_status();
}

Status batch_norm_backward_apply(const Op& op, const std::vector<const void*>& in,
                                 const std::vector<void*>& out) {
  using P = BwdApply;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, P::src_port()), dy = in_view(op, in, P::diff_dst_port());
  const OutView dx = out_view(op, out, P::diff_src_port());
  const double m = stat_at(op, in, P::count_port(), 0);
  NG_RETURN_IF_ERROR(check_global_count(op.label(), d, m));
  for (int64_t c = 0; c < d.channels; ++c) {
    const ChannelStats st = channel_stats(op, d, in, c, P::gamma_port());
    const double diff_beta = stat_at(op, in, P::sum_dy_port(), c);
    const double diff_gamma = st.s * stat_at(op, in, P::sum_dy_xm_port(), c);
    write_diff_src(d, x, dy, dx, c, st, diff_beta, diff_gamma, m);
    if (d.diff_scale_shift) {
      stat_set(op, out, P::diff_gamma_port(), c, diff_gamma);
      stat_set(op, out, P::diff_beta_port(), c, diff_beta);
    }
  }
  return ok_status();
}

namespace {

// The forward's batch statistics of channel c, in f64 over the data: the
// mean, and M2 = sum (x - mean)^2 about it (two passes: no cancellation).
std::pair<double, double> mean_and_m2(const BatchNormDesc& d, const View& x, int64_t c) {
  const double m = static_cast<double>(d.reduce_size);
  double sum = 0.0;
  for_each_index(d.dims, d.channel_axis, c,
                 [&](const std::vector<int64_t>& idx) { sum += x.at(idx); });
  const double mean = m > 0 ? sum / m : 0.0;
  double m2 = 0.0;
  for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
    const double t = x.at(idx) - mean;
    m2 += t * t;
  });
  return {mean, m2};
}

// The forward's normalisation and statistics outputs of channel c from its
// batch mean and (biased) variance. P: BatchNormForwardTrainingPorts or
// BatchNormForwardApplyPorts, which name the same outputs.
template <typename P>
void forward_channel(const Op& op, const BatchNormDesc& d, const std::vector<const void*>& in,
                     const std::vector<void*>& out, int64_t c, double bmean, double bvar) {
  const View x = in_view(op, in, P::src_port());
  const OutView y = out_view(op, out, P::dst_port());
  const double s = 1.0 / std::sqrt(bvar + static_cast<double>(d.epsilon));
  const double gamma = d.has_gamma ? stat_at(op, in, P::gamma_port(), c) : 1.0;
  const double beta = d.has_gamma ? stat_at(op, in, P::beta_port(), c) : 0.0;
  for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
    y.set(idx, gamma * (x.at(idx) - bmean) * s + beta);
  });
  const double momentum = d.momentum;
  stat_set(op, out, P::running_mean_port(), c,
           momentum * stat_at(op, in, P::mean_port(), c) + (1.0 - momentum) * bmean);
  stat_set(op, out, P::running_variance_port(), c,
           momentum * stat_at(op, in, P::variance_port(), c) + (1.0 - momentum) * bvar);
  stat_set(op, out, P::batch_mean_port(), c, bmean);
  stat_set(op, out, P::batch_variance_port(), c, bvar);
}

}  // namespace

Status batch_norm_forward_training(const Op& op, const std::vector<const void*>& in,
                                   const std::vector<void*>& out) {
  using P = BatchNormForwardTrainingPorts;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, P::src_port());
  const double m = static_cast<double>(d.reduce_size);
  for (int64_t c = 0; c < d.channels; ++c) {
    const auto [bmean, m2] = mean_and_m2(d, x, c);
    forward_channel<P>(op, d, in, out, c, bmean, m > 0 ? m2 / m : 0.0);
  }
  return ok_status();
}

// The synchronized forward's parts (docs/ops/BatchNormForwardReduce.md and
// the Merge and Apply pages): this process's sum, M2 and count; its M2 moved
// to the global mean, M2 + n (mean - global mean)^2 (Chan's merge term); and
// the normalisation with the global sum, M2 and count.
Status batch_norm_forward_reduce(const Op& op, const std::vector<const void*>& in,
                                 const std::vector<void*>& out) {
  using P = BatchNormForwardReducePorts;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, P::src_port());
  const double m = static_cast<double>(d.reduce_size);
  for (int64_t c = 0; c < d.channels; ++c) {
    const auto [mean, m2] = mean_and_m2(d, x, c);
    stat_set(op, out, P::sum_port(), c, mean * m);
    stat_set(op, out, P::m2_port(), c, m2);
  }
  stat_set(op, out, P::count_port(), 0, m);
  return ok_status();
}

Status batch_norm_forward_merge(const Op& op, const std::vector<const void*>& in,
                                const std::vector<void*>& out) {
  using P = BatchNormForwardMergePorts;
  const P ports(op);
  const double n = stat_at(op, in, P::local_count_port(), 0);
  const double total = stat_at(op, in, P::count_port(), 0);
  NG_RETURN_IF_ERROR(check_forward_count(op.label(), static_cast<int64_t>(n), total));
  for (int64_t c = 0; c < ports.m2_part().dims[0]; ++c) {
    const double local_mean = n > 0 ? stat_at(op, in, P::local_sum_port(), c) / n : 0.0;
    const double delta = local_mean - stat_at(op, in, P::sum_port(), c) / total;
    stat_set(op, out, P::m2_part_port(), c,
             stat_at(op, in, P::local_m2_port(), c) + n * delta * delta);
  }
  return ok_status();
}

Status batch_norm_forward_apply(const Op& op, const std::vector<const void*>& in,
                                const std::vector<void*>& out) {
  using P = BatchNormForwardApplyPorts;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const double total = stat_at(op, in, P::count_port(), 0);
  NG_RETURN_IF_ERROR(check_forward_count(op.label(), d.reduce_size, total));
  for (int64_t c = 0; c < d.channels; ++c) {
    const double bmean = stat_at(op, in, P::sum_port(), c) / total;
    const double bvar = stat_at(op, in, P::m2_port(), c) / total;
    forward_channel<P>(op, d, in, out, c, bmean, bvar);
  }
  return ok_status();
}

Status batch_norm_inference(const Op& op, const std::vector<const void*>& in,
                            const std::vector<void*>& out) {
  using P = BatchNormInferencePorts;
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, P::src_port());
  const OutView y = out_view(op, out, P::dst_port());
  for (int64_t c = 0; c < d.channels; ++c) {
    const double gamma = stat_at(op, in, P::gamma_port(), c);
    const double beta = stat_at(op, in, P::beta_port(), c);
    const double mean = stat_at(op, in, P::mean_port(), c);
    const double var = stat_at(op, in, P::variance_port(), c);
    const double s = 1.0 / std::sqrt(var + static_cast<double>(d.epsilon));
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      y.set(idx, gamma * (x.at(idx) - mean) * s + beta);
    });
  }
  return ok_status();
}

}  // namespace ref
}  // namespace normgrad
