// Reference batch norm: training backward (both forms), forward training, inference.
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
ChannelStats channel_stats(const Op& op, const BatchNormDesc& d, const std::vector<const void*>& in,
                           int64_t c, size_t gamma_port) {
  const double var = stat_at(op, in, 3, c);
  return {stat_at(op, in, 2, c),
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
  const View x = in_view(op, in, 0), dy = in_view(op, in, 1);
  const OutView dx = out_view(op, out, 0);
  const double m = static_cast<double>(d.reduce_size);
  for (int64_t c = 0; c < d.channels; ++c) {
    const ChannelStats st = channel_stats(op, d, in, c, 4);
    std::pair<double, double> sums{0.0, 0.0};
    if (d.mode == BackwardMode::kTraining || d.diff_scale_shift)
      sums = channel_sums(d, x, dy, c, st.mean);
    const double diff_beta = sums.first, diff_gamma = st.s * sums.second;
    write_diff_src(d, x, dy, dx, c, st, diff_beta, diff_gamma, m);
    if (d.diff_scale_shift) {
      stat_set(op, out, 1, c, diff_gamma);
      stat_set(op, out, 2, c, diff_beta);
    }
  }
  return ok_status();
}

// The synchronized backward's halves: the same sums and diff_src as above,
// with the sums and M taken from inputs (summed over every process).
Status batch_norm_backward_reduce(const Op& op, const std::vector<const void*>& in,
                                  const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, 0), dy = in_view(op, in, 1);
  for (int64_t c = 0; c < d.channels; ++c) {
    const auto [sum_dy, sum_dy_xm] = channel_sums(d, x, dy, c, stat_at(op, in, 2, c));
    stat_set(op, out, 0, c, sum_dy);
    stat_set(op, out, 1, c, sum_dy_xm);
  }
  stat_set(op, out, 2, 0, static_cast<double>(d.reduce_size));
  return ok_status();
}

Status batch_norm_backward_apply(const Op& op, const std::vector<const void*>& in,
                                 const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, 0), dy = in_view(op, in, 1);
  const OutView dx = out_view(op, out, 0);
  const double m = stat_at(op, in, 6, 0);
  NG_RETURN_IF_ERROR(check_global_count(op.label(), d, m));
  for (int64_t c = 0; c < d.channels; ++c) {
    const ChannelStats st = channel_stats(op, d, in, c, 7);
    const double diff_beta = stat_at(op, in, 4, c), diff_gamma = st.s * stat_at(op, in, 5, c);
    write_diff_src(d, x, dy, dx, c, st, diff_beta, diff_gamma, m);
    if (d.diff_scale_shift) {
      stat_set(op, out, 1, c, diff_gamma);
      stat_set(op, out, 2, c, diff_beta);
    }
  }
  return ok_status();
}

Status batch_norm_forward_training(const Op& op, const std::vector<const void*>& in,
                                   const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, 0);
  const OutView y = out_view(op, out, 0);
  const double m = static_cast<double>(d.reduce_size);
  const double momentum = d.momentum;
  for (int64_t c = 0; c < d.channels; ++c) {
    double sum = 0.0;
    for_each_index(d.dims, d.channel_axis, c,
                   [&](const std::vector<int64_t>& idx) { sum += x.at(idx); });
    const double bmean = m > 0 ? sum / m : 0.0;
    double sq = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      const double t = x.at(idx) - bmean;
      sq += t * t;
    });
    const double bvar = m > 0 ? sq / m : 0.0;
    const double s = 1.0 / std::sqrt(bvar + static_cast<double>(d.epsilon));
    const double gamma = d.has_gamma ? stat_at(op, in, 3, c) : 1.0;
    const double beta = d.has_gamma ? stat_at(op, in, 4, c) : 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      y.set(idx, gamma * (x.at(idx) - bmean) * s + beta);
    });
    stat_set(op, out, 1, c, momentum * stat_at(op, in, 1, c) + (1.0 - momentum) * bmean);
    stat_set(op, out, 2, c, momentum * stat_at(op, in, 2, c) + (1.0 - momentum) * bvar);
    stat_set(op, out, 3, c, bmean);
    stat_set(op, out, 4, c, bvar);
  }
  return ok_status();
}

Status batch_norm_inference(const Op& op, const std::vector<const void*>& in,
                            const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const View x = in_view(op, in, 0);
  const OutView y = out_view(op, out, 0);
  for (int64_t c = 0; c < d.channels; ++c) {
    const double gamma = stat_at(op, in, 1, c), beta = stat_at(op, in, 2, c);
    const double mean = stat_at(op, in, 3, c), var = stat_at(op, in, 4, c);
    const double s = 1.0 / std::sqrt(var + static_cast<double>(d.epsilon));
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      y.set(idx, gamma * (x.at(idx) - mean) * s + beta);
    });
  }
  return ok_status();
}

}  // namespace ref
}  // namespace normgrad
