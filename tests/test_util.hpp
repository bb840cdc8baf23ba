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

// Sibling batch-norm backwards (a downsampling block's gradient): a
// ReLUBackward (op 1, use_dst; tensors 30 and 31 in) writes tensor 20, the
// diff_dst of bn_bwd (op 2, tensors 0..7, gamma, epsilon 1e-3) and of a
// second one (op 4, the same tensors plus 40, epsilon 1e-5, with gamma and
// all three outputs unless told otherwise). With `add`, an Add (op 3) of
// tensors 32 and 33 writes 31. Not finalized.
inline Graph bn_bwd_siblings(const Dims& shape, const std::string& format, DataType dt,
                             bool add = false, bool second_gamma = true, int second_outputs = 3) {
  Op relu(1, OpKind::kReLUBackward, "relu_bwd");
  relu.set_attr("use_dst", true);
  relu.add_input(lt(30, dt, shape)).add_input(lt(31, dt, shape)).add_output(lt(20, dt, shape));
  Op a = bn_bwd(shape, format, dt, DataType::kF32, true, 3, 1e-3f, 2);
  a.mutable_inputs()[1].id = 20;
  Op b = bn_bwd(shape, format, dt, DataType::kF32, second_gamma, second_outputs, 1e-5f, 4);
  for (LogicalTensor& t : b.mutable_inputs()) t.id += 40;
  for (LogicalTensor& t : b.mutable_outputs()) t.id += 40;
  b.mutable_inputs()[1].id = 20;
  Graph g;
  EXPECT_TRUE(g.add_op(relu).ok());
  EXPECT_TRUE(g.add_op(a).ok());
  if (add) {
    Op sum(3, OpKind::kAdd, "gradient_add");
    sum.add_input(lt(32, dt, shape)).add_input(lt(33, dt, shape)).add_output(lt(31, dt, shape));
    EXPECT_TRUE(g.add_op(sum).ok());
  }
  EXPECT_TRUE(g.add_op(b).ok());
  return g;
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
