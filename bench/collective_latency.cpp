// collective_latency: the all-reduce's latency α and inverse bandwidth β on
// this machine, the inputs of docs/scale-out.md's scaling model.
//
//   mpirun -np 2 build/bin/normgrad_collective_latency [--iters N]
//
// Times normgrad's Communicator::all_reduce_sum (the MPI backend's path: a
// 3-integer agreement collective, then MPI_Iallreduce of the doubles, both
// polled) for messages of 1 to 65,536 doubles, the median of N calls after a
// warm-up, and fits time = α + bytes·β by least squares over the sizes.
// Rank 0 prints; every rank takes part.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <normgrad/backends/communicator.hpp>

int main(int argc, char** argv) {
  using normgrad::Status;
  Status s = normgrad::mpi_init_if_launched(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "collective_latency: %s\n", s.to_string().c_str());
    return 1;
  }
  int iters = 300;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(10, std::atoi(argv[i + 1]));
  }
  const auto comm = normgrad::mpi_world();
  if (!comm || comm->size() < 2) {
    std::fprintf(stderr, "collective_latency: run it under mpirun with 2 or more processes (%s)\n",
                 normgrad::built_with_mpi() ? "this process is alone" : "this build has no MPI");
    return 2;
  }
  const bool root = comm->rank() == 0;
  if (root)
    std::printf("all_reduce_sum over %s, median of %d calls each\n%10s %12s %12s\n",
                comm->name().c_str(), iters, "doubles", "bytes", "us");
  const std::vector<int64_t> sizes = {1, 8, 65, 129, 513, 1025, 2049, 4097, 16384, 65536};
  std::vector<double> xs, ys;
  for (int64_t n : sizes) {
    std::vector<double> data(static_cast<size_t>(n), 1.0);
    std::vector<double> us;
    for (int it = 0; it < iters + 20; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      s = comm->all_reduce_sum(data.data(), n);
      const double t =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) {
        std::fprintf(stderr, "collective_latency: %s\n", s.to_string().c_str());
        return 1;
      }
      if (it >= 20) us.push_back(t);  // the first calls set up MPI's buffers
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    xs.push_back(static_cast<double>(n) * 8.0);
    ys.push_back(median);
    if (root)
      std::printf("%10lld %12lld %12.2f\n", static_cast<long long>(n),
                  static_cast<long long>(n * 8), median);
  }
  // Least squares of us = alpha + bytes * beta.
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i) mx += xs[i], my += ys[i];
  mx /= static_cast<double>(xs.size());
  my /= static_cast<double>(ys.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  const double beta = sxy / sxx, alpha = my - beta * mx;
  if (root)
    std::printf("fit: alpha = %.2f us, beta = %.4f us/KiB (%.2f GB/s)\n", alpha, beta * 1024.0,
                beta > 0 ? 1e-3 / beta : 0.0);
  return 0;
}
