// Google Benchmark micro benchmarks: the conversion loops, the JIT reduction
// kernel on one row walk, and the driver overhead on a tiny problem. Not part
// of ctest; build with -DNORMGRAD_BUILD_BENCH=ON and run build/bin/normgrad_micro_bench.
#include <benchmark/benchmark.h>

#include <vector>

#include <normgrad/backends/jit/jit_kernels.hpp>
#include <normgrad/compile/compiler.hpp>

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

// The rows-walk reduction kernel on one channel of a 32x1x56x56 tensor (L2-resident).
void BM_JitReduceRows(benchmark::State& state) {
  const Dims shape = {32, 1, 56, 56};
  auto conf = jit::make_conf(bn_op(shape, DataType::kF32), jit::detect_isa());
  auto kernels = jit::generate_kernels(*conf);
  if (!conf.ok() || !kernels.ok()) {
    state.SkipWithError("no JIT here");
    return;
  }
  std::vector<float> x(32 * 56 * 56, 0.5f), dy(x.size(), 0.25f);
  const float coef[4] = {0.f, 0.f, 0.f, 0.5f};
  for (auto _ : state) {
    double sums[2] = {0.0, 0.0};
    jit::KernelArgs a{x.data(), dy.data(), nullptr, coef, sums, 32, nullptr, nullptr};
    (*kernels)->reduce(a);
    benchmark::DoNotOptimize(sums[0]);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(x.size()) * 8);
}
BENCHMARK(BM_JitReduceRows);

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
