// The oneDNN backend against ref: the sweep of DESIGN section 7 for every
// combination oneDNN runs, each decline with its reason, and concurrent execution.
#include <iostream>
#include <thread>

#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::compare_with_ref;
using testing_util::dnnl_refuses_clearly;
using testing_util::dnnl_runs;
using testing_util::lt;
using testing_util::one_op;

// Where oneDNN has no kernel for `dt` on this CPU (asked of oneDNN itself),
// the case must be refused with the reason; returns whether it was.
bool refused_where_onednn_has_none(DataType dt, const Status& status, int* refused) {
  if (dnnl_runs(dt)) return false;
  EXPECT_TRUE(dnnl_refuses_clearly(status)) << status.to_string();
  ++*refused;
  return true;
}

void note_refusals(int refused) {
  if (refused > 0)
    std::cout << "oneDNN has no bf16 batch norm on this CPU: " << refused
              << " bf16 cases checked for the clear refusal instead\n";
}

// The sweeps' dtypes (data, statistics) and shapes: N (8 at rank 2: with M = 2
// the exact diff_src is 0 and any relative error is noise), C, spatial 7, 3, 5.
const std::pair<DataType, DataType> kSweepDtypes[] = {{DataType::kF32, DataType::kF32},
                                                      {DataType::kBF16, DataType::kF32},
                                                      {DataType::kBF16, DataType::kBF16}};

Dims sweep_shape(const std::string& fmt, int rank, int64_t c) {
  Dims shape = {rank == 2 ? 8 : 2};
  const int64_t spatial[] = {7, 3, 5};
  if (fmt == "NCX") shape.push_back(c);
  for (int i = 0; i < rank - 2; ++i) shape.push_back(spatial[i]);
  if (fmt == "NXC") shape.push_back(c);
  return shape;
}

TEST(DnnlBackend, BatchNormBackwardSweep) {
  int ran = 0, refused = 0;
  for (auto [dt, sdt] : kSweepDtypes) {
    for (const char* fmt : {"NCX", "NXC"}) {
      for (int rank = 2; rank <= 5; ++rank) {
        for (int64_t c : {1, 3, 16, 17, 64}) {
          for (int form = 0; form < 6; ++form) {
            // 0: 3 outputs + gamma, 1: 3 outputs no gamma (gamma = 1), 2: oneDNN single output,
            // 3: frozen with gamma (TF is_training=false), 4: training diff_src only, 5: inverse
            // std.
            const bool gamma = form != 1;
            const int outputs = form == 2 || form == 4 ? 1 : 3;
            const Dims shape = sweep_shape(fmt, rank, c);
            Op op = bn_bwd(shape, fmt, dt, sdt, gamma, outputs, 1e-3f);
            if (form == 3) op.set_attr("is_training", false);
            if (form == 4) op.set_attr("is_training", true);
            if (form == 5) op.set_attr("is_training", true).set_attr("variance_is_inv_std", true);
            SCOPED_TRACE(std::string(dtype_name(dt)) + "/" + dtype_name(sdt) + " " + fmt + " " +
                         dims_to_string(shape) + " form " + std::to_string(form));
            const auto r = compare_with_ref(one_op(op), "dnnl", static_cast<uint64_t>(ran++));
            if (refused_where_onednn_has_none(dt, r.status, &refused)) continue;
            ASSERT_TRUE(r.status.ok()) << r.status.to_string();
            EXPECT_LE(r.worst_ratio, 1.0) << r.report;
          }
        }
      }
    }
  }
  EXPECT_EQ(ran, 3 * 2 * 4 * 5 * 6);
  note_refusals(refused);
}

// BatchNormInference (alone and with the fused ReLU, oneDNN's fuse_norm_relu)
// and BatchNormForwardTraining with its running statistics, against ref.
TEST(DnnlBackend, BatchNormForwardSweep) {
  int ran = 0, refused = 0;
  for (auto [dt, sdt] : kSweepDtypes) {
    for (const char* fmt : {"NCX", "NXC"}) {
      for (int rank : {2, 4, 5}) {
        for (int64_t c : {1, 17, 64}) {
          const Dims shape = sweep_shape(fmt, rank, c);
          const LogicalTensor stat = lt(0, sdt, {c});
          auto stat_lt = [&](int64_t id) {
            LogicalTensor t = stat;
            t.id = id;
            return t;
          };
          for (int form = 0; form < 4; ++form) {
            // 0: inference, 1: inference + ReLU, 2: training with gamma/beta, 3: training without.
            Graph g;
            if (form <= 1) {
              Op bn(1, OpKind::kBatchNormInference, "bn");
              bn.set_attr("epsilon", 1e-3f).set_attr("data_format", std::string(fmt));
              bn.add_input(lt(10, dt, shape));
              for (int64_t id = 11; id <= 14; ++id) bn.add_input(stat_lt(id));
              bn.add_output(lt(20, dt, shape));
              ASSERT_TRUE(g.add_op(bn).ok());
              if (form == 1) {
                Op relu(2, OpKind::kReLU, "relu");
                relu.add_input(lt(20, dt, shape)).add_output(lt(21, dt, shape));
                ASSERT_TRUE(g.add_op(relu).ok());
              }
            } else {
              Op bn(1, OpKind::kBatchNormForwardTraining, "bn");
              bn.set_attr("epsilon", 1e-3f).set_attr("data_format", std::string(fmt));
              bn.set_attr("momentum", 0.25f);
              bn.add_input(lt(10, dt, shape)).add_input(stat_lt(11)).add_input(stat_lt(12));
              if (form == 2) bn.add_input(stat_lt(13)).add_input(stat_lt(14));
              bn.add_output(lt(20, dt, shape));
              for (int64_t id = 21; id <= 24; ++id) bn.add_output(stat_lt(id));
              ASSERT_TRUE(g.add_op(bn).ok());
            }
            SCOPED_TRACE(std::string(dtype_name(dt)) + "/" + dtype_name(sdt) + " " + fmt + " " +
                         dims_to_string(shape) + " form " + std::to_string(form));
            const auto r = compare_with_ref(g, "dnnl", static_cast<uint64_t>(ran++));
            if (refused_where_onednn_has_none(dt, r.status, &refused)) continue;
            ASSERT_TRUE(r.status.ok()) << r.status.to_string();
            EXPECT_LE(r.worst_ratio, 1.0) << r.report;
            // One oneDNN primitive for the fused group, not a split.
            EXPECT_EQ(r.kernel.find('+'), std::string::npos) << r.kernel;
          }
        }
      }
    }
  }
  EXPECT_EQ(ran, 3 * 2 * 3 * 3 * 4);
  note_refusals(refused);
}

// Quantize / Dequantize as reorders with scales and zero points, against ref.
TEST(DnnlBackend, QuantizeDequantizeAgainstRef) {
  int ran = 0;
  for (OpKind kind : {OpKind::kQuantize, OpKind::kDequantize}) {
    for (DataType q : {DataType::kS8, DataType::kU8}) {
      for (int form = 0; form < 3; ++form) {
        // 0: per tensor, zp 0; 1: per tensor, zp 3; 2: per channel along axis 1.
        Op op(1, kind, "q");
        op.set_attr("qtype", std::string(form == 2 ? "per_channel" : "per_tensor"));
        op.set_attr("axis", int64_t{1});
        op.set_attr("scales",
                    form == 2 ? std::vector<float>{0.5f, 0.25f, 2.0f} : std::vector<float>{0.125f});
        op.set_attr("zps", form == 1   ? std::vector<int64_t>{3}
                           : form == 2 ? std::vector<int64_t>{0, 0, 0}
                                       : std::vector<int64_t>{0});
        const bool quantize = kind == OpKind::kQuantize;
        op.add_input(lt(0, quantize ? DataType::kF32 : q, {2, 3, 5, 7}));
        op.add_output(lt(1, quantize ? q : DataType::kF32, {2, 3, 5, 7}));
        SCOPED_TRACE(std::string(op_kind_name(kind)) + " " + dtype_name(q) + " form " +
                     std::to_string(form));
        const auto r = compare_with_ref(one_op(op), "dnnl", static_cast<uint64_t>(ran));
        ASSERT_TRUE(r.status.ok()) << r.status.to_string();
        EXPECT_LE(r.worst_ratio, 1.0) << r.report;
        ++ran;
      }
    }
  }
  EXPECT_EQ(ran, 12);
  // Per-channel zero points do not map onto oneDNN 2.6 reorders.
  Op op(1, OpKind::kDequantize, "dq");
  op.set_attr("qtype", std::string("per_channel"));
  op.set_attr("scales", std::vector<float>{1.f, 2.f});
  op.set_attr("zps", std::vector<int64_t>{1, 2});
  op.add_input(lt(0, DataType::kS8, {4, 2})).add_output(lt(1, DataType::kF32, {4, 2}));
  EXPECT_STATUS_HAS(compare_with_ref(one_op(op), "dnnl").status,
                    "oneDNN 2.6 reorders take one zero point");
}

TEST(DnnlBackend, LargeOffsetData) {
  // mean 1e4 exposes cancellation in one-pass statistics; the inputs carry exact batch stats.
  for (const char* fmt : {"NCX", "NXC"}) {
    Op op = bn_bwd({4, 32, 9, 9}, fmt, DataType::kF32, DataType::kF32, true, 3);
    const auto r = compare_with_ref(one_op(op), "dnnl", 99, 1e4);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_LE(r.worst_ratio, 1.0) << r.report;
  }
}

TEST(DnnlBackend, DeclinesWithReasons) {
  auto reason = [](const Op& op) { return compare_with_ref(one_op(op), "dnnl").status; };
  EXPECT_STATUS_HAS(reason(bn_bwd({2, 3, 4}, "NCX", DataType::kF16, DataType::kF32, true, 3)),
                    "oneDNN 2.6 has no f16 batch normalization on CPU");
  EXPECT_STATUS_HAS(
      reason(bn_bwd({2, 3, 2, 2, 2, 2}, "NCX", DataType::kF32, DataType::kF32, true, 3)),
      "oneDNN batch normalization takes ranks 2 to 5");
  EXPECT_STATUS_HAS(reason(bn_bwd({0, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3)),
                    "empty tensors are left to ref");
  Op inf(0, OpKind::kBatchNormInference, "i");
  inf.set_attr("epsilon", 1e-5f);
  inf.add_input(lt(0, DataType::kF16, {2, 3}));
  for (int i = 1; i <= 4; ++i) inf.add_input(lt(i, DataType::kF32, {3}));
  inf.add_output(lt(5, DataType::kF16, {2, 3}));
  EXPECT_STATUS_HAS(reason(inf), "oneDNN 2.6 has no f16 batch normalization on CPU");
  // diff_src strided differently from diff_dst: oneDNN would write diff_dst's layout.
  Op strided = bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  strided.mutable_outputs()[0].strides = {1, 2, 6};
  EXPECT_STATUS_HAS(reason(strided), "diff_src layout differs");
  // auto runs them elsewhere (the JIT takes f16).
  const auto r = compare_with_ref(
      one_op(bn_bwd({2, 3, 4}, "NCX", DataType::kF16, DataType::kF32, true, 3)), "auto");
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.kernel.rfind("jit:", 0), 0u) << r.kernel;
}

TEST(DnnlBackend, Neighbours) {
  int refused = 0;
  for (DataType dt : {DataType::kF32, DataType::kBF16}) {
    for (bool use_dst : {true, false}) {
      Op op(0, OpKind::kReLUBackward, "rb");
      op.set_attr("use_dst", use_dst);
      op.add_input(lt(0, dt, {2, 5, 3, 3}))
          .add_input(lt(1, dt, {2, 5, 3, 3}))
          .add_output(lt(2, dt, {2, 5, 3, 3}));
      const auto r = compare_with_ref(one_op(op), "dnnl");
      if (refused_where_onednn_has_none(dt, r.status, &refused)) continue;
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.worst_ratio, 0.0) << r.report;  // a mask is exact
    }
    Op add(0, OpKind::kAdd, "a");
    add.add_input(lt(0, dt, {3, 7})).add_input(lt(1, dt, {3, 7})).add_output(lt(2, dt, {3, 7}));
    auto r = compare_with_ref(one_op(add), "dnnl");
    if (!refused_where_onednn_has_none(dt, r.status, &refused)) {
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_LE(r.worst_ratio, 1.0) << r.report;
    }
    Op tr(0, OpKind::kStaticTranspose, "t");
    tr.set_attr("order", std::vector<int64_t>{0, 2, 3, 1});
    tr.add_input(lt(0, dt, {2, 3, 4, 5})).add_output(lt(1, dt, {2, 4, 5, 3}));
    r = compare_with_ref(one_op(tr), "dnnl");
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_EQ(r.worst_ratio, 0.0) << r.report;
  }
  Op cast(0, OpKind::kTypeCast, "c");
  cast.add_input(lt(0, DataType::kF32, {4, 9})).add_output(lt(1, DataType::kBF16, {4, 9}));
  const auto r = compare_with_ref(one_op(cast), "dnnl");
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.worst_ratio, 0.0) << r.report;  // round to nearest even, like ref
  note_refusals(refused);
}

TEST(DnnlBackend, ConcurrentExecutionMatchesSerial) {
  Graph g = one_op(bn_bwd({4, 48, 12, 12}, "NXC", DataType::kF32, DataType::kF32, true, 3));
  auto cg = CompiledGraph::compile(g, CompileOptions{"dnnl"});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 5, &sources);
  ASSERT_TRUE(inputs.ok());
  std::map<int64_t, const void*> in;
  for (auto& [id, b] : *inputs) in[id] = b.data();
  auto run_once = [&](std::map<int64_t, oracle::Buffer>& outs) {
    std::map<int64_t, void*> p;
    for (const LogicalTensor& lt : cg->outputs())
      p[lt.id] = outs.emplace(lt.id, *oracle::allocate(lt)).first->second.data();
    return cg->execute(in, p);
  };
  std::map<int64_t, oracle::Buffer> serial;
  ASSERT_TRUE(run_once(serial).ok());
  constexpr int kThreads = 4;
  std::vector<std::map<int64_t, oracle::Buffer>> results(kThreads);
  std::vector<Status> status(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3 && status[t].ok(); ++rep) {
        results[t].clear();
        status[t] = run_once(results[t]);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(status[t].ok()) << status[t].to_string();
    for (const auto& [id, b] : serial)
      EXPECT_EQ(results[t].at(id).bytes, b.bytes) << "thread " << t << " tensor " << id;
  }
}

}  // namespace
}  // namespace normgrad
