// BatchNormDesc: a typed, checked view of a verified batch-norm op.
//
// Backends read the op through this view instead of re-parsing attributes:
// layout, channel axis, C, the reduction size M = N x spatial, epsilon, the
// data and statistics dtypes, and which form of the backward it is.
#pragma once

#include <cstdint>

#include "graph/op.hpp"
#include "graph/status.hpp"

namespace normgrad {

enum class DataFormat : uint8_t { kNCX, kNXC };
const char* data_format_name(DataFormat f);

// Which maths the backward computes.
enum class BackwardMode : uint8_t {
  // 3 outputs: diff_src, diff_gamma, diff_beta through the batch statistics.
  kTraining,
  // oneDNN Graph's single-output form: diff_src = dy / sqrt(var + eps), gamma ignored.
  kFrozenNoScale,
};

struct BatchNormDesc {
  OpKind kind = OpKind::kBatchNormTrainingBackward;
  DataFormat format = DataFormat::kNXC;
  Dims dims;                  // the data tensor's logical dims
  int channel_axis = 1;       // 1 for NCX, rank - 1 for NXC
  int64_t channels = 0;       // C
  int64_t reduce_size = 0;    // M = elements / C (0 for an empty batch)
  float epsilon = 0.f;
  float momentum = 0.1f;      // BatchNormForwardTraining only
  DataType data_dt = DataType::kF32;
  DataType stats_dt = DataType::kF32;
  bool has_gamma = false;     // backward: gamma given; forward: gamma and beta given
  BackwardMode mode = BackwardMode::kTraining;
};

// The op must have passed its schema and shape inference.
StatusOr<BatchNormDesc> describe_batch_norm(const Op& op);

}  // namespace normgrad
