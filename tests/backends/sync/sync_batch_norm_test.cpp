// The synchronized backward: the split ops' schemas, the split pass, and the
// split graph on every backend against the whole op on ref (float64), for a
// process alone and for a simulated two-process group.
#include <algorithm>
#include <cstring>
#include <set>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace testing_util {
namespace {

struct SyncCase {
  DataType dt = DataType::kF32;
  std::string format = "NCX";
  bool gamma = true;
  bool relu = false;     // diff_dst comes from a ReLUBackward (ids 10, 11)
  bool training = true;  // false: is_training = false (frozen statistics)
  int outputs = 3;
  Dims shape = {5, 24, 6, 7};
};

std::string name_of(const SyncCase& c) {
  return std::string(dtype_name(c.dt)) + "/" + c.format + (c.gamma ? "/gamma" : "") +
         (c.relu ? "/relu" : "") + (c.training ? "" : "/frozen") + "/" + std::to_string(c.outputs) +
         "out";
}

// The user's graph; `sync` sets sync_group = "world" on the batch norm.
Graph make_graph(const SyncCase& c, bool sync) {
  Dims shape = c.shape;
  if (c.format == "NXC") std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  Op bn = bn_bwd(shape, c.format, c.dt, DataType::kF32, c.gamma, c.outputs);
  if (sync) bn.set_attr("sync_group", "world");
  if (!c.training) bn.set_attr("is_training", false);
  Graph g;
  if (c.relu) {
    Op relu(1, OpKind::kReLUBackward, "relu_bwd");
    relu.add_input(lt(10, c.dt, shape))
        .add_input(lt(11, c.dt, shape))
        .add_output(lt(1, c.dt, shape));
    EXPECT_TRUE(g.add_op(relu).ok());
  }
  EXPECT_TRUE(g.add_op(bn).ok());
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

struct Outputs {
  Status status;
  std::map<int64_t, oracle::Buffer> buffers;
  std::string kernels;
};

Outputs run(const Graph& g, const CompileOptions& options,
            const std::map<int64_t, oracle::Buffer>& inputs) {
  Outputs o;
  auto cg = CompiledGraph::compile(g, options);
  if (!cg.ok()) {
    o.status = cg.status();
    return o;
  }
  for (const auto& p : cg->partitions())
    o.kernels +=
        (o.kernels.empty() ? "" : " ") + std::string(p->backend_name()) + ":" + p->kernel_name();
  std::map<int64_t, const void*> in;
  for (const auto& [id, b] : inputs) in[id] = b.data();
  std::map<int64_t, void*> out;
  for (const LogicalTensor& t : cg->outputs())
    out[t.id] = o.buffers.emplace(t.id, *oracle::allocate(t)).first->second.data();
  o.status = cg->execute(in, out);
  return o;
}

// The whole graph on ref and its inputs (true batch statistics).
struct Oracle {
  CompiledGraph whole;
  std::map<int64_t, oracle::Buffer> inputs;
  Outputs want;
};

Oracle oracle_for(const SyncCase& c) {
  Graph whole = make_graph(c, false);
  CompileOptions ref;
  ref.backend = "ref";
  auto cg = CompiledGraph::compile(whole, ref);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  Oracle o{*cg, {}, {}};
  std::map<int64_t, std::string> sources;
  o.inputs = *oracle::make_inputs(o.whole.graph(), o.whole.lowered_graph(), "", 7, &sources);
  o.want = run(whole, ref, o.inputs);
  EXPECT_TRUE(o.want.status.ok()) << o.want.status.to_string();
  return o;
}

std::vector<SyncCase> all_cases() {
  std::vector<SyncCase> v;
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (const char* f : {"NCX", "NXC"}) {
      for (bool gamma : {true, false}) {
        for (bool relu : {false, true}) {
          SyncCase c;
          c.dt = dt, c.format = f, c.gamma = gamma, c.relu = relu;
          v.push_back(c);
        }
      }
      SyncCase frozen;
      frozen.dt = dt, frozen.format = f, frozen.training = false;
      v.push_back(frozen);
    }
  }
  return v;
}

TEST(SyncBatchNorm, SplitGraphMatchesTheWholeOpOnRef) {
  for (const SyncCase& c : all_cases()) {
    const Oracle o = oracle_for(c);
    for (const char* backend : {"auto", "jit", "ref"}) {
      CompileOptions options;
      options.backend = backend;
      const Outputs got = run(make_graph(c, true), options, o.inputs);
      if (std::string(backend) == "jit" && !find_backend("jit")) continue;
      ASSERT_TRUE(got.status.ok())
          << name_of(c) << " " << backend << ": " << got.status.to_string();
      EXPECT_NE(got.kernels.find("AllReduce"), std::string::npos) << got.kernels;
      if (std::string(backend) != "ref" && find_backend("jit")) {
        EXPECT_NE(got.kernels.find(":reduce"), std::string::npos) << got.kernels;
        EXPECT_NE(got.kernels.find(":apply"), std::string::npos) << got.kernels;
        if (c.relu) {
          EXPECT_NE(got.kernels.find("relu_bwd:reduce"), std::string::npos) << got.kernels;
        }
      }
      for (const auto& [id, want] : o.want.buffers) {
        auto v =
            oracle::check_output(o.whole.lowered_graph(), o.inputs, id, got.buffers.at(id), want);
        ASSERT_TRUE(v.ok()) << v.status().to_string();
        EXPECT_TRUE(v->pass) << name_of(c) << " " << backend << " tensor " << id
                             << " rel_l2=" << v->error.rel_l2 << " limit=" << v->limit;
      }
    }
  }
}

// The split halves keep the JIT's fixed reduction partition: the same bits
// for one thread and for two.
TEST(SyncBatchNorm, SameBitsForAnyThreadCount) {
  if (!find_backend("jit")) GTEST_SKIP() << "no JIT in this build";
  for (const char* f : {"NCX", "NXC"}) {
    SyncCase c;
    c.format = f;
    c.relu = true;
    c.shape = {8, 64, 28, 28};
    const Oracle o = oracle_for(c);
    CompileOptions options;
    options.backend = "jit";
    set_num_threads(1);
    const Outputs one = run(make_graph(c, true), options, o.inputs);
    set_num_threads(2);
    const Outputs two = run(make_graph(c, true), options, o.inputs);
    set_num_threads(0);
    ASSERT_TRUE(one.status.ok() && two.status.ok()) << one.status.to_string();
    for (const auto& [id, b] : one.buffers)
      EXPECT_TRUE(b.bytes == two.buffers.at(id).bytes) << f << " tensor " << id;
  }
}

TEST(SyncBatchNorm, PassSplitsTrainingAndFrozenSumsButNotFrozenDiffSrcAlone) {
  auto kinds_after = [](const Graph& g) {
    auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
    EXPECT_TRUE(cg.ok()) << cg.status().to_string();
    std::string k;
    for (const Op& op : cg->lowered_graph().ops()) k += std::string(op_kind_name(op.kind())) + " ";
    return k;
  };
  SyncCase c;
  EXPECT_EQ(kinds_after(make_graph(c, true)),
            "BatchNormBackwardReduce AllReduce BatchNormBackwardApply ");
  EXPECT_EQ(kinds_after(make_graph(c, false)), "BatchNormTrainingBackward ");
  c.training = false;
  EXPECT_EQ(kinds_after(make_graph(c, true)),
            "BatchNormBackwardReduce AllReduce BatchNormBackwardApply ");
  c.outputs = 1;
  EXPECT_EQ(kinds_after(make_graph(c, true)), "BatchNormTrainingBackward ");
  // A fusible producer is cloned so that each half reads its own copy.
  SyncCase r;
  r.relu = true;
  EXPECT_EQ(kinds_after(make_graph(r, true)),
            "ReLUBackward ReLUBackward BatchNormBackwardReduce AllReduce BatchNormBackwardApply ");
}

// New tensors must not take ids the caller still uses: TensorFlow's reserve
// outputs leave the graph in canonicalize but stay the caller's buffers.
TEST(SyncBatchNorm, NewTensorIdsAvoidDroppedGraphOutputs) {
  auto g = load_graph(std::string(NORMGRAD_EXAMPLES) + "/tf_fused_batch_norm_grad_nhwc.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::vector<Op> ops = g->ops().to_vector();
  for (Op& op : ops) op.set_attr("sync_group", "world");
  Graph graph = g->with_ops(std::move(ops));
  ASSERT_TRUE(graph.finalize().ok());
  auto cg = CompiledGraph::compile(graph, CompileOptions{});
  ASSERT_TRUE(cg.ok()) << cg.status().to_string();
  std::set<int64_t> user;
  for (const LogicalTensor& t : cg->outputs()) user.insert(t.id);
  for (const LogicalTensor& t : cg->inputs()) user.insert(t.id);
  for (const Op& op : cg->lowered_graph().ops()) {
    if (op.kind() != OpKind::kBatchNormBackwardReduce) continue;
    for (const LogicalTensor& t : op.outputs()) EXPECT_EQ(user.count(t.id), 0u) << t.id;
  }
}

// Two processes with the same slice each: the global sums and count are
// twice the local ones, so diff_src equals the one-process answer and
// diff_gamma/diff_beta double. The communicator stands in for MPI.
class TwinCommunicator final : public Communicator {
 public:
  int size() const override { return 2; }
  int rank() const override { return 0; }
  std::string name() const override { return "twin (2 processes)"; }
  Status all_reduce_sum(double* data, int64_t count, bool failed,
                        uint64_t /*signature*/) const override {
    if (failed) return aborted("twin: this process failed");
    for (int64_t i = 0; i < count; ++i) data[i] *= 2.0;
    ++calls;
    return ok_status();
  }
  mutable int calls = 0;
};

TEST(SyncBatchNorm, TwoProcessGroupSumsOnceThroughTheCommunicator) {
  SyncCase c;
  const Oracle o = oracle_for(c);
  auto twin = std::make_shared<TwinCommunicator>();
  CompileOptions options;
  options.communicators["world"] = twin;
  const Outputs got = run(make_graph(c, true), options, o.inputs);
  if (!built_with_mpi()) {
    // Only the MPI backend sums over more than one process; ref says why it declines.
    EXPECT_STATUS_HAS(got.status, "ref sums over a group of one process");
    return;
  }
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  EXPECT_NE(got.kernels.find("mpi:mpi:allreduce"), std::string::npos) << got.kernels;
  EXPECT_EQ(twin->calls, 1);  // the two sums and the count in one collective
  for (const auto& [id, want] : o.want.buffers) {
    oracle::Buffer expect = want;
    if (id != 5) {  // diff_gamma, diff_beta: twice the one-process sums
      for (int64_t i = 0; i < want.desc.dims[0]; ++i)
        reinterpret_cast<float*>(expect.data())[i] *= 2.f;
    }
    const oracle::ErrorStats e = oracle::compare(got.buffers.at(id), expect);
    EXPECT_LE(e.rel_l2, id == 5 ? 6e-7 : 1e-5) << "tensor " << id;
  }
}

TEST(SyncBatchNorm, SchemasNameThePortAndRule) {
  Op reduce(0, OpKind::kBatchNormBackwardReduce, "r");
  reduce.set_attr("data_format", "NCX");
  reduce.add_input(lt(0, DataType::kF32, {2, 4, 3})).add_input(lt(1, DataType::kF32, {2, 4, 3}));
  reduce.add_input(lt(2, DataType::kF32, {4}));
  reduce.add_output(lt(3, DataType::kF32, {4})).add_output(lt(4, DataType::kF32, {4}));
  Op bad_count = reduce;
  bad_count.add_output(lt(5, DataType::kF32, {1}));
  Graph g1;
  EXPECT_STATUS_HAS(g1.add_op(bad_count), "output 2 'count': dtype f32, expected s64");
  Op good = reduce;
  good.add_output(lt(5, DataType::kS64, {1}));
  Graph g2;
  EXPECT_TRUE(g2.add_op(good).ok());

  Op apply(1, OpKind::kBatchNormBackwardApply, "a");
  apply.set_attr("epsilon", 1e-5).set_attr("data_format", "NCX");
  for (int64_t id : {0, 1}) apply.add_input(lt(id, DataType::kF32, {2, 4, 3}));
  for (int64_t id : {2, 3, 6, 7}) apply.add_input(lt(id, DataType::kF32, {4}));
  apply.add_input(lt(8, DataType::kS64, {2}));
  apply.add_output(lt(9, DataType::kF32, {2, 4, 3}));
  Graph g3;
  EXPECT_STATUS_HAS(g3.add_op(apply), "input 6 'count': must have shape [1], got 2");

  Op ar(2, OpKind::kAllReduce, "ar");
  ar.add_input(lt(0, DataType::kF32, {4})).add_input(lt(1, DataType::kS64, {1}));
  ar.add_output(lt(2, DataType::kF32, {4}));
  Graph g4;
  EXPECT_STATUS_HAS(g4.add_op(ar), "2 inputs but 1 outputs");
  Op ar2(3, OpKind::kAllReduce, "ar2");
  ar2.set_attr("group", "");
  ar2.add_input(lt(0, DataType::kF32, {4})).add_output(lt(2, DataType::kF32, {4}));
  Graph g5;
  EXPECT_STATUS_HAS(g5.add_op(ar2), "attribute 'group' is empty");
}

// Apply's count must cover at least this process's elements: a count from the
// wrong place is an error on every backend, never a silent wrong answer.
TEST(SyncBatchNorm, ApplyRejectsACountBelowTheLocalBatch) {
  Op apply(0, OpKind::kBatchNormBackwardApply, "a");
  apply.set_attr("epsilon", 1e-5).set_attr("data_format", "NCX");
  for (int64_t id : {0, 1}) apply.add_input(lt(id, DataType::kF32, {4, 16, 30}));
  for (int64_t id : {2, 3, 4, 5}) apply.add_input(lt(id, DataType::kF32, {16}));
  apply.add_input(lt(6, DataType::kS64, {1}));
  apply.add_output(lt(9, DataType::kF32, {4, 16, 30}));
  Graph g;
  ASSERT_TRUE(g.add_op(apply).ok());
  ASSERT_TRUE(g.finalize().ok());
  for (const char* backend : {"ref", "jit"}) {
    if (!find_backend(backend)) continue;
    auto cg = CompiledGraph::compile(g, CompileOptions{backend});
    ASSERT_TRUE(cg.ok()) << cg.status().to_string();
    std::map<int64_t, oracle::Buffer> bufs;
    std::map<int64_t, const void*> in;
    for (const LogicalTensor& t : cg->inputs()) {
      oracle::Buffer b = *oracle::allocate(t);
      std::memset(b.data(), 0, b.bytes.size());
      in[t.id] = bufs.emplace(t.id, std::move(b)).first->second.data();
    }
    *static_cast<int64_t*>(bufs.at(6).data()) = 100;  // M here is 4 x 30 = 120
    oracle::Buffer out = *oracle::allocate(cg->outputs()[0]);
    EXPECT_STATUS_HAS(cg->execute(in, {{9, out.data()}}), "below");
  }
}

}  // namespace
}  // namespace testing_util
}  // namespace normgrad
