// Partition-by-partition checking (testing/partition_check.hpp) on
// ResNet-shaped training graphs (scripts/resnet_graph.py: three residual
// blocks, forward and backward, no convolutions), where one batch norm's
// 16-bit diff_src is the next one's gradient and the per-channel sums
// cancel. Every seed passes in every dtype and layout, and a sum scaled by
// 1 + 1e-3 or missing one 32-term partial still fails.
#include <cmath>

#include <normgrad/graph/indexing.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/testing/partition_check.hpp>
#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

std::string resnet_graph(const std::string& dt, const std::string& layout) {
  return std::string(NORMGRAD_TEST_DATA) + "/resnet/resnet3_noconv_" + dt + "_" + layout + ".json";
}

struct Checked {
  CompiledGraph cg;
  std::map<int64_t, oracle::Buffer> inputs, values;
  std::vector<oracle::PartitionOutputCheck> checks;
};

StatusOr<Checked> check(const std::string& path, uint64_t seed) {
  NG_ASSIGN_OR_RETURN(Graph g, load_graph(path));
  NG_RETURN_IF_ERROR(g.finalize());
  NG_ASSIGN_OR_RETURN(CompiledGraph cg, CompiledGraph::compile(g, CompileOptions{}));
  NG_ASSIGN_OR_RETURN(auto inputs,
                      oracle::make_inputs(cg.graph(), cg.lowered_graph(), "", seed, nullptr));
  std::map<int64_t, oracle::Buffer> values;
  NG_ASSIGN_OR_RETURN(auto checks, oracle::check_partitions(cg, inputs, &values, true));
  return Checked{std::move(cg), std::move(inputs), std::move(values), std::move(checks)};
}

TEST(PartitionCheck, ResNetTrainingGraphsPassOnEverySeed) {
  int judged = 0;
  for (const char* dt : {"f32", "bf16", "f16"}) {
    for (const char* layout : {"ncx", "nxc"}) {
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        auto c = check(resnet_graph(dt, layout), seed);
        ASSERT_TRUE(c.ok()) << dt << " " << layout << ": " << c.status().to_string();
        for (const auto& pc : c->checks) {
          EXPECT_TRUE(pc.verdict.pass)
              << dt << " " << layout << " seed " << seed << ": " << oracle::describe(pc);
          ++judged;
        }
        // The whole graph's run computes the same bits as its partitions one by one.
        auto got = oracle::run_outputs(c->cg, c->inputs);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        for (const auto& [id, buf] : *got) {
          auto each = c->values.find(id);
          if (each == c->values.end() || c->inputs.count(id)) continue;
          EXPECT_EQ(buf.bytes, each->second.bytes) << dt << " " << layout << " tensor " << id;
        }
      }
    }
  }
  EXPECT_GT(judged, 6 * 20 * 30);
}

// The diff_beta of the last block's BatchNormTrainingBackward whose
// diff_dst is the residual ReLUBackward's output (fused, with that output
// written as a side output for the gradient Add): a cancelling sum.
const oracle::PartitionOutputCheck* last_diff_beta(const Checked& c) {
  const oracle::PartitionOutputCheck* found = nullptr;
  for (const auto& pc : c.checks) {
    const Op* op = c.cg.lowered_graph().producer(pc.tensor.id);
    if (op != nullptr && op->kind() == OpKind::kBatchNormTrainingBackward &&
        pc.kernel.find("+side_out") != std::string::npos && op->outputs().size() == 3 &&
        op->outputs()[2].id == pc.tensor.id)
      found = &pc;
  }
  return found;
}

TEST(PartitionCheck, AScaledSumOrALostPartialStillFails) {
  for (const char* layout : {"ncx", "nxc"}) {
    auto c = check(resnet_graph("bf16", layout), 3);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const oracle::PartitionOutputCheck* pc = last_diff_beta(*c);
    ASSERT_NE(pc, nullptr);
    ASSERT_TRUE(pc->verdict.pass) << oracle::describe(*pc);
    const Graph& lowered = c->cg.lowered_graph();
    const Op& op = *lowered.producer(pc->tensor.id);
    const oracle::Buffer& good = c->values.at(pc->tensor.id);
    // A variant judged against ref's diff_beta on the partition's own inputs.
    ASSERT_TRUE(pc->want.has_value());
    auto judge = [&](const oracle::Buffer& got) {
      auto v = oracle::check_output(lowered, c->values, pc->tensor.id, got, *pc->want);
      EXPECT_TRUE(v.ok());
      return v.ok() ? *v : oracle::OutputVerdict{};
    };
    EXPECT_TRUE(judge(good).pass);
    // Scaled by 1 + 1e-3.
    oracle::Buffer scaled = good;
    float* s = static_cast<float*>(scaled.data());
    const int64_t channels = good.desc.dims[0];
    for (int64_t k = 0; k < channels; ++k) s[k] *= 1.001f;
    const oracle::OutputVerdict v_scaled = judge(scaled);
    EXPECT_FALSE(v_scaled.pass) << layout << ": scaled by 1+1e-3 passed, rel_l2 "
                                << v_scaled.error.rel_l2 << " sum-relative " << v_scaled.cond_error
                                << " <= " << v_scaled.cond_limit;
    // Channel 0 without the partial sum of its first 32 elements of diff_dst.
    const oracle::Buffer& dy = c->values.at(op.inputs()[1].id);
    const BatchNormDesc d = *describe_batch_norm(op);
    double partial = 0.0;
    int taken = 0;
    for_each_index(d.dims, d.channel_axis, 0, [&](const std::vector<int64_t>& idx) {
      if (taken++ < 32)
        partial +=
            load_as_double(dy.data(), offset_of(idx, dy.desc.effective_strides()), dy.desc.dtype);
    });
    ASSERT_NE(partial, 0.0);
    oracle::Buffer lost = good;
    static_cast<float*>(lost.data())[0] -= static_cast<float>(partial);
    const oracle::OutputVerdict v_lost = judge(lost);
    EXPECT_FALSE(v_lost.pass) << layout << ": a lost partial passed, sum-relative "
                              << v_lost.cond_error << " <= " << v_lost.cond_limit;
  }
}

}  // namespace
}  // namespace normgrad
