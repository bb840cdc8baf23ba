// The execution API an integrator relies on, on every built backend: in-place
// pairs, unknown buffer ids, concrete strides of outputs, and the allocator hook.
#include <atomic>

#include "tests/backend_test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;
using testing_util::lt;
using testing_util::one_op;

std::vector<std::string> backends() {
  std::vector<std::string> v = {"ref"};
  for (const char* b : {"jit", "dnnl"}) {
    if (find_backend(b) != nullptr) v.push_back(b);
  }
  return v;
}

// Random valid inputs and fresh output buffers for one compiled graph.
struct Io {
  std::map<int64_t, oracle::Buffer> inputs, outputs;
  std::map<int64_t, const void*> in;
  std::map<int64_t, void*> out;
};

Io make_io(const CompiledGraph& cg, uint64_t seed) {
  Io io;
  std::map<int64_t, std::string> sources;
  auto inputs = oracle::make_inputs(cg.graph(), cg.lowered_graph(), "", seed, &sources);
  EXPECT_TRUE(inputs.ok()) << inputs.status().to_string();
  if (inputs.ok()) io.inputs = std::move(inputs).value();
  for (auto& entry : io.inputs) io.in[entry.first] = entry.second.data();
  for (const LogicalTensor& t : cg.outputs())
    io.out[t.id] = io.outputs.emplace(t.id, *oracle::allocate(t)).first->second.data();
  return io;
}

TEST(ExecuteApi, InPlaceDiffSrcOverDiffDstOnEveryBackend) {
  for (const std::string& backend : backends()) {
    for (const char* fmt : {"NCX", "NXC"}) {
      Graph g = one_op(bn_bwd({4, 16, 9, 9}, fmt, DataType::kF32, DataType::kF32, true, 3));
      auto cg = CompiledGraph::compile(g, CompileOptions{backend});
      ASSERT_TRUE(cg.ok()) << backend << ": " << cg.status().to_string();
      const auto pairs = cg->inplace_pairs();
      ASSERT_EQ(pairs.size(), 1u);
      EXPECT_EQ(pairs[0], std::make_pair(int64_t{1}, int64_t{5}));  // diff_dst -> diff_src
      Io apart = make_io(*cg, 3);
      ASSERT_TRUE(cg->execute(apart.in, apart.out).ok());
      // The same call with diff_src written over (a copy of) diff_dst.
      Io over = make_io(*cg, 3);
      oracle::Buffer& dy = over.inputs.at(1);
      over.out[5] = dy.data();
      ASSERT_TRUE(cg->execute(over.in, over.out).ok());
      EXPECT_EQ(dy.bytes, apart.outputs.at(5).bytes) << backend << " " << fmt;
      EXPECT_EQ(over.outputs.at(6).bytes, apart.outputs.at(6).bytes) << backend << " " << fmt;
    }
  }
}

TEST(ExecuteApi, UnknownBufferIdsAreErrors) {
  Graph g = one_op(bn_bwd({2, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3));
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  ASSERT_TRUE(cg.ok());
  std::vector<float> buf(64, 1.0f);
  std::map<int64_t, const void*> in;
  for (const LogicalTensor& t : cg->inputs()) in[t.id] = buf.data();
  std::map<int64_t, void*> out;
  for (const LogicalTensor& t : cg->outputs()) out[t.id] = buf.data() + 32;
  in[42] = buf.data();
  EXPECT_STATUS_HAS(
      cg->execute(in, out),
      "input buffer for tensor 42, which is not a graph input (inputs: 0, 1, 2, 3, 4)");
  in.erase(42);
  out[5] = buf.data() + 32;
  out[43] = buf.data();
  EXPECT_STATUS_HAS(cg->execute(in, out),
                    "output buffer for tensor 43, which is not a graph output");
}

TEST(ExecuteApi, QueryGivesConcreteStrides) {
  Op op = bn_bwd({2, 3, 4, 5}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  op.mutable_outputs()[0].layout = LayoutType::kAny;
  auto cg = CompiledGraph::compile(one_op(op), CompileOptions{});
  ASSERT_TRUE(cg.ok());
  auto q = cg->query_logical_tensor(5);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->layout, LayoutType::kStrided);
  EXPECT_EQ(q->strides, (Dims{60, 20, 5, 1}));
  EXPECT_STATUS_HAS(cg->query_logical_tensor(99).status(),
                    "tensor 99 is not a graph input or output");
}

TEST(ExecuteApi, AllocatorServesIntermediatesAndScratch) {
  // ReLU -> BatchNormTrainingBackward's src: two partitions and one intermediate;
  // oneDNN's scratchpad for the ReLU comes from the allocator too.
  Graph g;
  Op relu(10, OpKind::kReLU, "relu");
  relu.add_input(lt(20, DataType::kF32, {4, 8, 6, 6}))
      .add_output(lt(0, DataType::kF32, {4, 8, 6, 6}));
  ASSERT_TRUE(g.add_op(relu).ok());
  Op bn = bn_bwd({4, 8, 6, 6}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  bn.mutable_inputs()[1].strides = {8 * 6 * 8, 6 * 8, 8, 1};
  ASSERT_TRUE(g.add_op(bn).ok());
  std::atomic<int> live{0}, calls{0};
  Allocator counting;
  counting.allocate = [&](size_t bytes, size_t alignment) -> void* {
    ++calls;
    ++live;
    return std::aligned_alloc(alignment, bytes);
  };
  counting.deallocate = [&](void* p) {
    --live;
    std::free(p);
  };
  for (const std::string& backend : {std::string("auto"), std::string("ref")}) {
    CompileOptions options{backend};
    options.optimize = false;  // keep ReLU apart: an intermediate between partitions
    auto cg = CompiledGraph::compile(g, options);
    ASSERT_TRUE(cg.ok()) << cg.status().to_string();
    ASSERT_EQ(cg->partitions().size(), 2u);
    Io io = make_io(*cg, 1);
    calls = 0;
    ASSERT_TRUE(cg->execute(io.in, io.out, nullptr, &counting).ok());
    EXPECT_GE(calls.load(), backend == "auto" && find_backend("jit") ? 2 : 1) << backend;
    EXPECT_EQ(live.load(), 0) << backend;  // everything given back
  }
}

}  // namespace
}  // namespace normgrad
