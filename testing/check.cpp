// check_output: relative L2 against ref, with a condition-aware limit for sums.
#include <normgrad/testing/check.hpp>

#include <cmath>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/indexing.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>

namespace normgrad {
namespace oracle {
namespace {

constexpr double kLambda = 4.0;
constexpr double kUnitRoundoffF32 = 5.9604644775390625e-08;  // 2^-24

// The value of tensor `id`: an input buffer, or computed with ref from its
// producer's inputs (memoized in `values`).
StatusOr<const Buffer*> value_of(const Graph& g, const std::map<int64_t, Buffer>& inputs,
                                 std::map<int64_t, Buffer>& values, int64_t id, int depth) {
  if (auto it = inputs.find(id); it != inputs.end()) return &it->second;
  if (auto it = values.find(id); it != values.end()) return &it->second;
  const Op* producer = g.producer(id);
  if (producer == nullptr || depth > 64)
    return not_found("tensor " + std::to_string(id) + " has no value");
  const Op& op = *producer;
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const LogicalTensor& lt : op.inputs()) {
    NG_ASSIGN_OR_RETURN(const Buffer* b, value_of(g, inputs, values, lt.id, depth + 1));
    in.push_back(b->data());
  }
  for (const LogicalTensor& lt : op.outputs()) {
    NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
    out.push_back(values.emplace(lt.id, std::move(b)).first->second.data());
  }
  NG_RETURN_IF_ERROR(reference_execute(op, in, out));
  return &values.at(id);
}

// The same for BatchNormTrainingBackwardFromDst: the terms are dy xhat and dy
// with y = act^-1(dst), dy = diff_dst act'(y), xhat = (y - beta) / gamma.
StatusOr<std::vector<double>> from_dst_condition_scales(const Graph& g,
                                                        const std::map<int64_t, Buffer>& inputs,
                                                        const Op& op, const BatchNormDesc& d,
                                                        size_t port) {
  std::map<int64_t, Buffer> values;
  const Buffer* in[6] = {};
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    NG_ASSIGN_OR_RETURN(in[i], value_of(g, inputs, values, op.inputs()[i].id, 0));
  }
  const Dims ys = in[0]->desc.effective_strides(), ds = in[1]->desc.effective_strides();
  auto stat = [&](int i, int64_t c) {
    return load_as_double(in[i]->data(), c * in[i]->desc.effective_strides()[0], in[i]->desc.dtype);
  };
  std::vector<double> scale(static_cast<size_t>(d.channels), 0.0);
  for (int64_t c = 0; c < d.channels; ++c) {
    const double gamma = stat(3, c), beta = stat(4, c);
    double acc = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      const double v = load_as_double(in[0]->data(), offset_of(idx, ys), in[0]->desc.dtype);
      double dy = load_as_double(in[1]->data(), offset_of(idx, ds), in[1]->desc.dtype);
      double y = v >= 0 ? v : v / d.alpha;
      if (in[5]) {
        y -= load_as_double(in[5]->data(), offset_of(idx, in[5]->desc.effective_strides()),
                            in[5]->desc.dtype);
      }
      dy = v >= 0 ? dy : dy * d.alpha;
      acc += port == 2 ? std::fabs(dy) : std::fabs(dy * (y - beta) / gamma);
    });
    scale[static_cast<size_t>(c)] = acc;
  }
  return scale;
}

// sum_i |t_i| per channel for output `port` (1: diff_gamma, 2: diff_beta) of a
// canonical BatchNormTrainingBackward; empty when not available.
StatusOr<std::vector<double>> condition_scales(const Graph& g,
                                               const std::map<int64_t, Buffer>& inputs,
                                               const Op& op, size_t port) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  if (d.from_dst) return from_dst_condition_scales(g, inputs, op, d, port);
  std::map<int64_t, Buffer> values;
  NG_ASSIGN_OR_RETURN(const Buffer* x, value_of(g, inputs, values, op.inputs()[0].id, 0));
  NG_ASSIGN_OR_RETURN(const Buffer* dy, value_of(g, inputs, values, op.inputs()[1].id, 0));
  NG_ASSIGN_OR_RETURN(const Buffer* mean, value_of(g, inputs, values, op.inputs()[2].id, 0));
  NG_ASSIGN_OR_RETURN(const Buffer* var, value_of(g, inputs, values, op.inputs()[3].id, 0));
  const Dims xs = x->desc.effective_strides(), ds = dy->desc.effective_strides();
  const int64_t ms = mean->desc.effective_strides()[0], vs = var->desc.effective_strides()[0];
  std::vector<double> scale(static_cast<size_t>(d.channels), 0.0);
  for (int64_t c = 0; c < d.channels; ++c) {
    const double m = load_as_double(mean->data(), c * ms, mean->desc.dtype);
    const double v = load_as_double(var->data(), c * vs, var->desc.dtype);
    const double s =
        d.variance_is_inv_std ? v : 1.0 / std::sqrt(v + static_cast<double>(d.epsilon));
    double acc = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      const double g_dy = load_as_double(dy->data(), offset_of(idx, ds), dy->desc.dtype);
      if (port == 2) {
        acc += std::fabs(g_dy);
      } else {
        const double xv = load_as_double(x->data(), offset_of(idx, xs), x->desc.dtype);
        acc += std::fabs(g_dy * (xv - m) * s);
      }
    });
    scale[static_cast<size_t>(c)] = acc;
  }
  return scale;
}

}  // namespace

StatusOr<OutputVerdict> check_output(const Graph& lowered, const std::map<int64_t, Buffer>& inputs,
                                     int64_t id, const Buffer& got, const Buffer& want) {
  OutputVerdict v;
  v.error = compare(got, want);
  const int64_t m = reduction_length(lowered, id);
  v.limit = threshold_for(want.desc.dtype, m);
  v.pass = v.error.nan_mismatch == 0 && v.error.rel_l2 <= v.limit;
  if (v.pass || v.error.nan_mismatch != 0 || m == 0) return v;
  const Op& op = *lowered.producer(id);
  if (op.kind() != OpKind::kBatchNormTrainingBackward &&
      op.kind() != OpKind::kBatchNormTrainingBackwardFromDst)
    return v;
  size_t port = 0;
  for (size_t i = 1; i < op.outputs().size(); ++i) port = op.outputs()[i].id == id ? i : port;
  if (port == 0) return v;
  auto scales = condition_scales(lowered, inputs, op, port);
  if (!scales.ok()) return v;  // values not reachable: the plain limit stands
  const Dims gs = got.desc.effective_strides(), ws = want.desc.effective_strides();
  double num = 0.0, den = 0.0;
  for (size_t c = 0; c < scales->size(); ++c) {
    const auto i = static_cast<int64_t>(c);
    const double diff = load_as_double(got.data(), i * gs[0], got.desc.dtype) -
                        load_as_double(want.data(), i * ws[0], want.desc.dtype);
    num += diff * diff;
    den += (*scales)[c] * (*scales)[c];
  }
  v.cond_error = den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
  v.cond_limit = kLambda * std::sqrt(static_cast<double>(m)) * kUnitRoundoffF32;
  v.pass = v.cond_error <= v.cond_limit;
  return v;
}

}  // namespace oracle
}  // namespace normgrad
