// One tensor read on two ports of one op: Add(x, x), ReLUBackward(x, x), a
// batch-norm backward whose src is its diff_dst, a forward whose gamma is its
// beta, and a fused producer whose output is both of a backward's data
// inputs. A partition lists each tensor once, so a kernel that reads its
// inputs by the op's slots would read past the partition's ports. Every
// backend runs each graph or declines it clearly, and what it runs matches
// ref. With diff_dst = src and the true batch statistics, diff_src is
// gamma * rstd * (x - mean) * eps / (var + eps): the backwards take epsilon
// 1, so that it does not cancel to rounding noise.
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/text_io.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

struct Case {
  const char* name;
  const char* text;
};

const Case kCases[] = {
    {"add_x_x", R"(%1:f32[2,8,5,5] = Add#0 "add"(%0:f32[2,8,5,5], %0:f32[2,8,5,5]))"},
    {"relu_backward_x_x",
     R"(%1:f32[2,8,5,5] = ReLUBackward#0 "rb"(%0:f32[2,8,5,5], %0:f32[2,8,5,5]) {use_dst=true})"},
    {"bn_backward_src_is_diff_dst_ncx",
     R"(%5:f32[2,8,5,5], %6:f32[8], %7:f32[8] = BatchNormTrainingBackward#0 "bn"(%0:f32[2,8,5,5], %0:f32[2,8,5,5], %2:f32[8], %3:f32[8], %4:f32[8]) {data_format="NCX", epsilon=1f})"},
    {"bn_backward_src_is_diff_dst_nxc_bf16",
     R"(%5:bf16[2,5,5,40], %6:f32[40], %7:f32[40] = BatchNormTrainingBackward#0 "bn"(%0:bf16[2,5,5,40], %0:bf16[2,5,5,40], %2:f32[40], %3:f32[40], %4:f32[40]) {data_format="NXC", epsilon=1f})"},
    {"bn_forward_gamma_is_beta",
     R"(%10:f32[2,8,4,4], %11:f32[8], %12:f32[8], %13:f32[8], %14:f32[8] = BatchNormForwardTraining#0 "bn"(%0:f32[2,8,4,4], %1:f32[8], %2:f32[8], %3:f32[8], %3:f32[8]) {data_format="NCX", epsilon=0.001f, momentum=0.1f})"},
    {"fused_producer_on_both_ports",
     R"(%2:f32[2,8,5,5] = ReLUBackward#0 "rb"(%0:f32[2,8,5,5], %1:f32[2,8,5,5]) {use_dst=true}
%5:f32[2,8,5,5], %6:f32[8], %7:f32[8] = BatchNormTrainingBackward#1 "bn"(%2:f32[2,8,5,5], %2:f32[2,8,5,5], %3:f32[8], %4:f32[8], %8:f32[8]) {data_format="NCX", epsilon=1f})"},
};

TEST(SharedInputs, EveryBackendRunsOrDeclinesAndMatchesRef) {
  int ran = 0;
  for (const Case& c : kCases) {
    auto g = graph_from_text(c.text);
    ASSERT_TRUE(g.ok()) << c.name << ": " << g.status().to_string();
    ASSERT_TRUE(g->finalize().ok()) << c.name;
    std::vector<std::string> backends = {"auto"};
    for (const BackendEntry& e : backend_registry()) {
      if (e.backend != nullptr && !e.reference && std::string(e.name) != "mpi")
        backends.emplace_back(e.name);
    }
    for (const std::string& backend : backends) {
      const auto r = testing_util::compare_with_ref(*g, backend, 7);
      if (!r.status.ok()) {
        // A decline names what is missing; anything else is a failure.
        EXPECT_EQ(r.status.code(), StatusCode::kUnimplemented)
            << c.name << " on " << backend << ": " << r.status.to_string();
        continue;
      }
      ++ran;
      EXPECT_LE(r.worst_ratio, 1.0)
          << c.name << " on " << backend << " (" << r.kernel << "): " << r.report;
    }
  }
  EXPECT_GE(ran, static_cast<int>(std::size(kCases)));  // "auto" runs every case at least
}

}  // namespace
}  // namespace normgrad
