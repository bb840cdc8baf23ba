// Example: a synchronized batch-norm backward across MPI processes.
//
//   mpirun -np 2 example_mpi_sync_backward
//
// Each process holds its slice of a batch of 8 images (uneven slices are
// fine) and builds the same BatchNormTrainingBackward with
// sync_group = "world": compiling splits it into BatchNormBackwardReduce ->
// AllReduce (on MPI_COMM_WORLD, which mpi_init_if_launched set up) ->
// BatchNormBackwardApply, so every process's diff_src uses the whole batch's
// sums. To show that, every process also computes the full batch on its own
// (the data is generated from the image index) and compares its slice.
#include <cmath>
#include <cstdio>
#include <vector>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/normgrad.hpp>

using namespace normgrad;

namespace {

constexpr int64_t kBatch = 8, kC = 4, kH = 5, kW = 5;

// The backward over `n` images, synchronized over "world" when `sync`.
Graph backward(int64_t n, bool sync) {
  const Dims shape = {n, kC, kH, kW};
  Op bn(0, OpKind::kBatchNormTrainingBackward, "bn");
  bn.set_attr("epsilon", 1e-5f).set_attr("data_format", std::string("NCX"));
  if (sync) bn.set_attr("sync_group", std::string("world"));
  bn.add_input(LogicalTensor(0, DataType::kF32, shape))
      .add_input(LogicalTensor(1, DataType::kF32, shape));
  for (int64_t id : {2, 3, 4}) bn.add_input(LogicalTensor(id, DataType::kF32, {kC}));
  bn.add_output(LogicalTensor(5, DataType::kF32, shape))
      .add_output(LogicalTensor(6, DataType::kF32, {kC}))
      .add_output(LogicalTensor(7, DataType::kF32, {kC}));
  Graph g;
  (void)g.add_op(bn);
  return g;
}

// src and diff_dst of images [first, first + n), the same on every process.
void fill(int64_t first, int64_t n, std::vector<float>* x, std::vector<float>* dy) {
  const int64_t per_image = kC * kH * kW;
  x->resize(static_cast<size_t>(n * per_image));
  dy->resize(x->size());
  for (int64_t i = 0; i < n * per_image; ++i) {
    const double k = static_cast<double>((first * per_image) + i);
    (*x)[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.37 * k) + 0.1 * (k / per_image));
    (*dy)[static_cast<size_t>(i)] = static_cast<float>(std::cos(0.11 * k));
  }
}

struct Result {
  std::vector<float> dx, dgamma, dbeta;
};

StatusOr<Result> run(int64_t first, int64_t n, bool sync) {
  NG_ASSIGN_OR_RETURN(CompiledGraph cg,
                      CompiledGraph::compile(backward(n, sync), CompileOptions{}));
  std::vector<float> x, dy;
  fill(first, n, &x, &dy);
  // The batch statistics of the whole batch, as the forward would have kept them.
  const std::vector<float> mean = {0.25f, 0.5f, 0.75f, 1.0f}, var = {0.6f, 0.7f, 0.8f, 0.9f},
                           gamma = {1.5f, 0.5f, 1.0f, 2.0f};
  Result r;
  r.dx.resize(x.size());
  r.dgamma.resize(kC);
  r.dbeta.resize(kC);
  char empty = 0;  // an empty slice still passes a pointer
  NG_RETURN_IF_ERROR(cg.execute({{0, x.empty() ? &empty : static_cast<const void*>(x.data())},
                                 {1, dy.empty() ? &empty : static_cast<const void*>(dy.data())},
                                 {2, mean.data()},
                                 {3, var.data()},
                                 {4, gamma.data()}},
                                {{5, r.dx.empty() ? &empty : static_cast<void*>(r.dx.data())},
                                 {6, r.dgamma.data()},
                                 {7, r.dbeta.data()}}));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (Status s = mpi_init_if_launched(&argc, &argv); !s.ok())
    return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  const auto world = mpi_world();
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  // Rank r takes images [r * N / size, (r + 1) * N / size).
  const int64_t first = rank * kBatch / size, last = (rank + 1) * kBatch / size;
  auto mine = run(first, last - first, true);
  auto whole = run(0, kBatch, false);
  if (!mine.ok() || !whole.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 (mine.ok() ? whole.status() : mine.status()).to_string().c_str());
    return 1;
  }
  double worst = 0.0;
  const size_t offset = static_cast<size_t>(first * kC * kH * kW);
  for (size_t i = 0; i < mine->dx.size(); ++i)
    worst = std::max(worst, std::abs(double(mine->dx[i]) - whole->dx[offset + i]));
  // diff_gamma and diff_beta come from the summed sums: the whole batch's.
  for (int64_t c = 0; c < kC; ++c) {
    worst = std::max(worst, std::abs(double(mine->dgamma[c]) - whole->dgamma[c]) /
                                (1.0 + std::abs(double(whole->dgamma[c]))));
    worst = std::max(worst, std::abs(double(mine->dbeta[c]) - whole->dbeta[c]) /
                                (1.0 + std::abs(double(whole->dbeta[c]))));
  }
  std::printf(
      "rank %d of %d: images %lld..%lld; diff_src, diff_gamma and diff_beta against the "
      "whole batch computed alone: max error %.2e\n",
      rank, size, static_cast<long long>(first), static_cast<long long>(last - 1), worst);
  const bool ok = worst < 1e-5;
  std::printf("rank %d: %s\n", rank, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
