// Helpers shared by the test suites: tensor and op builders, dense buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/op.hpp>

namespace normgrad {
namespace testing_util {

inline LogicalTensor lt(int64_t id, DataType dt, Dims dims) {
  return LogicalTensor(id, dt, std::move(dims));
}

// BatchNormTrainingBackward with tensor ids 0..4 in, 5..7 out.
inline Op bn_bwd(const Dims& shape, const std::string& format, DataType dt, DataType sdt,
                 bool gamma, int outputs, float eps = 1e-5f, int64_t op_id = 0) {
  // Rank-1 shapes (invalid for the op, used by error tests) take C from their only dim.
  const int64_t c = format == "NCX" && shape.size() > 1 ? shape[1] : shape.back();
  Op op(op_id, OpKind::kBatchNormTrainingBackward, "bn");
  op.set_attr("epsilon", eps).set_attr("data_format", format);
  op.add_input(lt(0, dt, shape))
      .add_input(lt(1, dt, shape))
      .add_input(lt(2, sdt, {c}))
      .add_input(lt(3, sdt, {c}));
  if (gamma) op.add_input(lt(4, sdt, {c}));
  op.add_output(lt(5, dt, shape));
  if (outputs == 3) op.add_output(lt(6, sdt, {c})).add_output(lt(7, sdt, {c}));
  return op;
}

inline Status status_of(const Status& s) {
  return s;
}
template <typename T>
Status status_of(const StatusOr<T>& s) {
  return s.status();
}

// Expects `expr` (a Status or StatusOr) to fail and its message to contain `fragment`.
#define EXPECT_STATUS_HAS(expr, fragment)                                            \
  do {                                                                               \
    const ::normgrad::Status ng_st_ = ::normgrad::testing_util::status_of(expr);     \
    EXPECT_FALSE(ng_st_.ok()) << "expected an error containing: " << (fragment);     \
    EXPECT_NE(ng_st_.message().find(fragment), std::string::npos)                    \
        << "message: " << ng_st_.message() << "\nexpected fragment: " << (fragment); \
  } while (false)

}  // namespace testing_util
}  // namespace normgrad
