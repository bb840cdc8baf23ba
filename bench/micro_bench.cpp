// Google Benchmark micro benchmarks: the conversion loops, the JIT backward
// on one L2-resident channel, and the driver overhead on a tiny problem. Not part
// of ctest; build with -DNORMGRAD_BUILD_BENCH=ON and run build/bin/normgrad_micro_bench.
#include <benchmark/benchmark.h>

#include <map>
#include <vector>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/data_type.hpp>

namespace normgrad {
namespace {

void BM_F32ToBf16(benchmark::State& state) {
  std::vector<float> in(static_cast<size_t>(state.range(0)), 1.2345f);
  std::vector<uint16_t> out(in.size());
  for (auto _ : state) {
    for (size_t i = 0; i < in.size(); ++i) out[i] = f32_to_bf16_bits(in[i]);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 6);
}
BENCHMARK(BM_F32ToBf16)->Arg(1 << 16);

void BM_F32ToF16(benchmark::State& state) {
  std::vector<float> in(static_cast<size_t>(state.range(0)), 1.2345f);
  std::vector<uint16_t> out(in.size());
  for (auto _ : state) {
    for (size_t i = 0; i < in.size(); ++i) out[i] = f32_to_f16_bits(in[i]);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 6);
}
BENCHMARK(BM_F32ToF16)->Arg(1 << 16);

Op bn_op(const Dims& shape, DataType dt) {
  Op op(0, OpKind::kBatchNormTrainingBackward, "bn");
  op.set_attr("epsilon", 1e-5f).set_attr("data_format", std::string("NCX"));
  op.add_input(LogicalTensor(0, dt, shape)).add_input(LogicalTensor(1, dt, shape));
  for (int i = 2; i <= 4; ++i) op.add_input(LogicalTensor(i, DataType::kF32, {shape[1]}));
  op.add_output(LogicalTensor(5, dt, shape))
      .add_output(LogicalTensor(6, DataType::kF32, {shape[1]}));
  op.add_output(LogicalTensor(7, DataType::kF32, {shape[1]}));
  return op;
}

// The JIT's whole backward on one channel of 32x1x56x56 (L2-resident): its
// reduce and apply kernels with the driver around them, through the public API.
void BM_JitOneChannelL2(benchmark::State& state) {
  const Dims shape = {32, 1, 56, 56};
  Graph g;
  (void)g.add_op(bn_op(shape, DataType::kF32));
  auto cg = CompiledGraph::compile(g, CompileOptions{"jit"});
  if (!cg.ok()) {
    state.SkipWithError(cg.status().message().c_str());
    return;
  }
  std::vector<float> x(32 * 56 * 56, 0.5f), dy(x.size(), 0.25f), dx(x.size()), stats(1, 1.f);
  float dg = 0.f, db = 0.f;
  const std::map<int64_t, const void*> in = {
      {0, x.data()}, {1, dy.data()}, {2, stats.data()}, {3, stats.data()}, {4, stats.data()}};
  const std::map<int64_t, void*> out = {{5, dx.data()}, {6, &dg}, {7, &db}};
  for (auto _ : state) {
    if (!cg->execute(in, out).ok()) state.SkipWithError("execute failed");
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(x.size()) * 12);
}
BENCHMARK(BM_JitOneChannelL2);

// Whole compiled-graph execute on 1x8x4x4: what the driver costs around tiny kernels.
void BM_DriverOverheadTiny(benchmark::State& state) {
  Graph g;
  (void)g.add_op(bn_op({1, 8, 4, 4}, DataType::kF32));
  auto cg = CompiledGraph::compile(g, CompileOptions{state.range(0) == 0 ? "jit" : "dnnl"});
  if (!cg.ok()) {
    state.SkipWithError(cg.status().message().c_str());
    return;
  }
  std::vector<float> x(128, 0.5f), dy(128, 0.1f), stats(8, 1.f), dx(128), dg(8), db(8);
  const std::map<int64_t, const void*> in = {
      {0, x.data()}, {1, dy.data()}, {2, stats.data()}, {3, stats.data()}, {4, stats.data()}};
  const std::map<int64_t, void*> out = {{5, dx.data()}, {6, dg.data()}, {7, db.data()}};
  for (auto _ : state) benchmark::DoNotOptimize(cg->execute(in, out).ok());
  state.SetLabel(cg->partitions()[0]->kernel_name());
}
BENCHMARK(BM_DriverOverheadTiny)->Arg(0)->Arg(1);

}  // namespace
}  // namespace normgrad

BENCHMARK_MAIN();
