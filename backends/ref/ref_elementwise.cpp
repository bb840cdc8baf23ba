// Reference ReLU, LeakyReLU, Sigmoid, ReLUBackward, Add, TypeCast, StaticTranspose,
// Quantize and Dequantize on strided buffers.
#include <normgrad/backends/ref/ref_ops.hpp>

#include <cmath>

#include <normgrad/graph/indexing.hpp>
#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace ref {

Status elementwise(const Op& op, const std::vector<const void*>& in,
                   const std::vector<void*>& out) {
  // One output each; `in` and `out` follow the op's ports.
  const LogicalTensor& dst = elementwise_dst(op);
  const Dims& dims = dst.dims;
  const Dims dst_strides = dst.effective_strides();
  std::vector<Dims> in_strides;
  for (const LogicalTensor& lt : op.inputs()) in_strides.push_back(lt.effective_strides());
  auto load = [&](size_t i, const std::vector<int64_t>& idx) {
    return load_as_double(in[i], offset_of(idx, in_strides[i]), op.inputs()[i].dtype);
  };
  auto store = [&](const std::vector<int64_t>& idx, double v) {
    store_from_double(out.front(), offset_of(idx, dst_strides), dst.dtype, v);
  };
  switch (op.kind()) {
    case OpKind::kReLU:
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const double x = load(ReLUPorts::src_port(), idx);
        store(idx, x > 0.0 ? x : (x != x ? x : 0.0));  // NaN propagates
      });
      return ok_status();
    case OpKind::kSigmoid:
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const double x = load(SigmoidPorts::src_port(), idx);
        store(idx, 1.0 / (1.0 + std::exp(-x)));  // exp overflows to inf: 0, as it should
      });
      return ok_status();
    case OpKind::kLeakyReLU: {
      NG_ASSIGN_OR_RETURN(float alpha, op.attr_f32("alpha"));
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const double x = load(LeakyReLUPorts::src_port(), idx);
        store(idx, x >= 0.0 ? x : static_cast<double>(alpha) * x);  // NaN: alpha NaN = NaN
      });
      return ok_status();
    }
    case OpKind::kReLUBackward:
      // Input 0 is ReLU's src (use_dst = false) or dst (use_dst = true); in both
      // cases the gradient passes where that value is > 0.
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const double x = load(ReLUBackwardPorts::src_port(), idx);
        store(idx, x > 0.0 ? load(ReLUBackwardPorts::diff_dst_port(), idx) : 0.0);
      });
      return ok_status();
    case OpKind::kAdd: {
      // numpy broadcasting: a source of lower rank aligns on the right, and a
      // dim of 1 repeats (stride 0 along it).
      std::vector<Dims> bstrides(2, Dims(dims.size(), 0));
      for (size_t i = 0; i < 2; ++i) {
        const Dims& d = op.inputs()[i].dims;
        const size_t shift = dims.size() - d.size();
        for (size_t k = 0; k < d.size(); ++k)
          bstrides[i][k + shift] = d[k] == 1 ? 0 : in_strides[i][k];
      }
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const double a = load_as_double(in[AddPorts::src_0_port()], offset_of(idx, bstrides[0]),
                                        AddPorts(op).src_0().dtype);
        const double b = load_as_double(in[AddPorts::src_1_port()], offset_of(idx, bstrides[1]),
                                        AddPorts(op).src_1().dtype);
        store(idx, a + b);
      });
      return ok_status();
    }
    case OpKind::kTypeCast:
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        store(idx, load(TypeCastPorts::src_port(), idx));
      });
      return ok_status();
    case OpKind::kStaticTranspose: {
      NG_ASSIGN_OR_RETURN(std::vector<int64_t> order, op.attr_s64s("order"));
      const auto rank = static_cast<int64_t>(order.size());
      std::vector<int64_t> src_idx(order.size());
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        // dst dim k is src dim order[k].
        for (int64_t k = 0; k < rank; ++k) src_idx[(order[k] + rank) % rank] = idx[k];
        store(idx, load(StaticTransposePorts::src_port(), src_idx));
      });
      return ok_status();
    }
    case OpKind::kQuantize:
    case OpKind::kDequantize: {
      const auto& scales = std::get<std::vector<float>>(op.attrs().at("scales"));
      std::vector<int64_t> zps;
      if (op.has_attr("zps")) zps = std::get<std::vector<int64_t>>(op.attrs().at("zps"));
      int64_t axis = -1;  // per tensor
      if (scales.size() > 1 || (op.has_attr("qtype") &&
                                std::get<std::string>(op.attrs().at("qtype")) == "per_channel")) {
        axis = op.has_attr("axis") ? std::get<int64_t>(op.attrs().at("axis")) : 1;
        if (axis < 0) axis += static_cast<int64_t>(dims.size());
      }
      const bool quantize = op.kind() == OpKind::kQuantize;
      for_each_index(dims, -1, 0, [&](const std::vector<int64_t>& idx) {
        const size_t k = axis < 0 ? 0 : static_cast<size_t>(idx[static_cast<size_t>(axis)]);
        const double scale = scales[k];
        const double zp = zps.empty() ? 0.0 : static_cast<double>(zps[k]);
        const double x = load(QuantizePorts::src_port(), idx);  // Dequantize's too
        // Stores round half to even and saturate for the integer dtypes.
        store(idx, quantize ? x / scale + zp : (x - zp) * scale);
      });
      return ok_status();
    }
    default:
      break;
  }
  return internal_error(op.label() + ": not an elementwise op");
}

Status all_reduce_single(const Op& op, const std::vector<const void*>& in,
                         const std::vector<void*>& out) {
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    const LogicalTensor& src = op.inputs()[i];
    const LogicalTensor& dst = op.outputs()[i];
    const Dims ss = src.effective_strides(), ds = dst.effective_strides();
    for_each_index(src.dims, -1, 0, [&](const std::vector<int64_t>& idx) {
      store_from_double(out[i], offset_of(idx, ds), dst.dtype,
                        load_as_double(in[i], offset_of(idx, ss), src.dtype));
    });
  }
  return ok_status();
}

Status execute_op(const Op& op, const std::vector<const void*>& inputs,
                  const std::vector<void*>& outputs) {
  switch (op.kind()) {
    case OpKind::kBatchNormTrainingBackward:
      return batch_norm_backward(op, inputs, outputs);
    case OpKind::kBatchNormTrainingBackwardFromDst:
      return batch_norm_backward_from_dst(op, inputs, outputs);
    case OpKind::kBatchNormForwardTraining:
      return batch_norm_forward_training(op, inputs, outputs);
    case OpKind::kBatchNormInference:
      return batch_norm_inference(op, inputs, outputs);
    case OpKind::kBatchNormForwardReduce:
      return batch_norm_forward_reduce(op, inputs, outputs);
    case OpKind::kBatchNormForwardMerge:
      return batch_norm_forward_merge(op, inputs, outputs);
    case OpKind::kBatchNormForwardApply:
      return batch_norm_forward_apply(op, inputs, outputs);
    case OpKind::kBatchNormBackwardReduce:
      return batch_norm_backward_reduce(op, inputs, outputs);
    case OpKind::kBatchNormBackwardApply:
      return batch_norm_backward_apply(op, inputs, outputs);
    case OpKind::kAllReduce:
      return all_reduce_single(op, inputs, outputs);
    case OpKind::kEnd:
      return ok_status();
    default:
      return elementwise(op, inputs, outputs);
  }
}

}  // namespace ref
}  // namespace normgrad
