// Reference BatchNormTrainingBackwardFromDst: the training backward with x̂
// recomputed from the forward's output (InPlace-ABN), literally, in float64.
//
// Per channel c, with act = leaky_relu(alpha) (identity is alpha = 1) and
// s = 1/sqrt(var + eps):
//   y     = act^-1(dst) [- residual] = dst >= 0 ? dst : dst / alpha
//   dy    = diff_dst act'(y)       = dst >= 0 ? diff_dst : alpha diff_dst
//   xhat  = (y - beta) / gamma
//   diff_beta  = sum dy
//   diff_gamma = sum dy xhat
//   diff_src   = gamma s (dy - diff_beta/M - xhat diff_gamma/M)
// The derivation is in docs/ops/BatchNormTrainingBackwardFromDst.md.
#include <cmath>

#include <normgrad/backends/ref/ref_ops.hpp>
#include <normgrad/graph/indexing.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace ref {
namespace {

double stat(const Op& op, const std::vector<const void*>& in, size_t i, int64_t c) {
  return load_as_double(in[i], c * op.inputs()[i].effective_strides()[0], op.inputs()[i].dtype);
}

}  // namespace

Status batch_norm_backward_from_dst(const Op& op, const std::vector<const void*>& in,
                                    const std::vector<void*>& out) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  // Every gamma first: a refused channel leaves every output untouched.
  using Ports = BatchNormTrainingBackwardFromDstPorts;
  const Ports ports(op);
  for (int64_t c = 0; c < d.channels; ++c)
    NG_RETURN_IF_ERROR(check_from_dst_gamma(op.label(), c, stat(op, in, Ports::gamma_port(), c)));
  const Dims ys = ports.dst().effective_strides(), gs = ports.diff_dst().effective_strides();
  const Dims xs = ports.diff_src().effective_strides();
  const DataType dt = ports.dst().dtype;
  const Dims rs = ports.has_residual() ? ports.residual().effective_strides() : Dims{};
  const double alpha = d.alpha, m = static_cast<double>(d.reduce_size);
  auto pre = [&](const std::vector<int64_t>& idx, double* y, double* dy) {
    const double v = load_as_double(in[Ports::dst_port()], offset_of(idx, ys), dt);
    const double g = load_as_double(in[Ports::diff_dst_port()], offset_of(idx, gs), dt);
    const bool pos = v >= 0.0;
    *y = pos ? v : v / alpha;
    if (d.from_dst_residual)
      *y -= load_as_double(in[Ports::residual_port()], offset_of(idx, rs), dt);
    *dy = pos ? g : alpha * g;
  };
  for (int64_t c = 0; c < d.channels; ++c) {
    const double s =
        1.0 / std::sqrt(stat(op, in, Ports::variance_port(), c) + static_cast<double>(d.epsilon));
    const double gamma = stat(op, in, Ports::gamma_port(), c);
    const double beta = stat(op, in, Ports::beta_port(), c);
    double diff_beta = 0.0, diff_gamma = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      double y, dy;
      pre(idx, &y, &dy);
      diff_beta += dy;
      diff_gamma += dy * (y - beta) / gamma;
    });
    // diff_src may share diff_dst's buffer: each element is read before it is written.
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      double y, dy;
      pre(idx, &y, &dy);
      const double xhat = (y - beta) / gamma;
      store_from_double(out[Ports::diff_src_port()], offset_of(idx, xs), ports.diff_src().dtype,
                        gamma * s * (dy - diff_beta / m - xhat * diff_gamma / m));
    });
    if (d.diff_scale_shift) {
      const LogicalTensor &dg = ports.diff_gamma(), &db = ports.diff_beta();
      store_from_double(out[Ports::diff_gamma_port()], c * dg.effective_strides()[0], dg.dtype,
                        diff_gamma);
      store_from_double(out[Ports::diff_beta_port()], c * db.effective_strides()[0], db.dtype,
                        diff_beta);
    }
  }
  return ok_status();
}

}  // namespace ref
}  // namespace normgrad
