// BatchNormDesc: a typed, checked view of a verified batch-norm op.
//
// Backends read the op through this view instead of re-parsing attributes:
// layout, channel axis, C, the reduction size M = N x spatial, epsilon, the
// data and statistics dtypes, and which form of the backward it is.
#pragma once

#include <cstdint>
#include <initializer_list>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

enum class DataFormat : uint8_t { kNCX, kNXC };
const char* data_format_name(DataFormat f);

// Which maths the backward's diff_src follows (diff_gamma and diff_beta, when
// asked for, are the same sums in both modes).
enum class BackwardMode : uint8_t {
  // Through the batch statistics: gamma s (dy - diff_beta/M - xhat diff_gamma/M).
  kTraining,
  // Frozen statistics: gamma s dy (TensorFlow's is_training = false; oneDNN
  // Graph's single-output form, where gamma is ignored, i.e. use_gamma = false).
  kFrozen,
};

// Which part of the training backward an op computes: all of it, or one half
// of the synchronized form (the per-channel sums; diff_src from global sums).
enum class BackwardPhase : uint8_t { kWhole, kReduce, kApply };

struct BatchNormDesc {
  OpKind kind = OpKind::kBatchNormTrainingBackward;
  DataFormat format = DataFormat::kNXC;
  Dims dims;                // the data tensor's logical dims
  int channel_axis = 1;     // 1 for NCX, rank - 1 for NXC
  int64_t channels = 0;     // C
  int64_t reduce_size = 0;  // M = elements / C (0 for an empty batch)
  float epsilon = 0.f;
  float momentum = 0.1f;  // BatchNormForwardTraining only
  DataType data_dt = DataType::kF32;
  DataType stats_dt = DataType::kF32;
  bool has_gamma = false;  // backward: gamma given; forward: gamma and beta given
  // Backward only:
  BackwardMode mode = BackwardMode::kTraining;
  bool use_gamma = false;            // diff_src is scaled by gamma (else gamma = 1)
  bool variance_is_inv_std = false;  // input 3 holds 1/sqrt(var + eps) (cuDNN, PyTorch save_invstd)
  bool diff_scale_shift = false;     // diff_gamma and diff_beta are computed (3 outputs)
  // BatchNormBackwardReduce/Apply and BatchNormForwardReduce/Apply: the part
  // of the synchronized op (reduce_size is this process's M; the global
  // count comes in as Apply's `count` input).
  BackwardPhase phase = BackwardPhase::kWhole;
  // BatchNormTrainingBackwardFromDst: inputs dst, diff_dst, variance, gamma,
  // beta; xhat = (act^-1(dst) - beta) / gamma and the gradient through act.
  // alpha is leaky_relu's slope; identity is alpha = 1 (the same maths).
  bool from_dst = false;
  bool from_dst_residual = false;  // input 5: dst = act(bn(src) + residual)
  float alpha = 1.f;
};

// The backward's mode when the op carries no explicit `is_training`: oneDNN
// Graph's meaning (3 outputs: training; 1 output: frozen with gamma ignored).

// The op must have passed its schema and shape inference.
StatusOr<BatchNormDesc> describe_batch_norm(const Op& op);

// An NCX batch norm whose data tensors (the non-null ones) all carry
// channels-last strides is NXC in memory: `d` becomes that NXC problem
// (dims N, spatial..., C; channel_axis last) and the answer is true, so a
// kernel walks a framework's channels_last tensors as dense NXC. Otherwise
// `d` is unchanged and the answer is false.
bool view_channels_last(BatchNormDesc* d, std::initializer_list<const LogicalTensor*> data);

// BatchNormBackwardApply's `count` input (the elements per channel summed
// over every process) against this process's M: a smaller count cannot be
// the global one. Backends check it before computing diff_src.
// `who` starts the message (the op's label).
Status check_global_count(const std::string& who, const BatchNormDesc& d, double count);

// The synchronized forward's global `count` (BatchNormForwardMerge and
// BatchNormForwardApply, on every backend) against this process's `local`
// elements per channel: at least that, and above 0 (if every process's batch
// is empty, there are no statistics; torch refuses that too).
Status check_forward_count(const std::string& who, int64_t local, double count);

// BatchNormTrainingBackwardFromDst divides by gamma: |gamma| below
// kMinFromDstGamma (or not finite) on channel c is refused, naming the channel.
constexpr double kMinFromDstGamma = 1e-12;
Status check_from_dst_gamma(const std::string& who, int64_t c, double gamma);

}  // namespace normgrad
