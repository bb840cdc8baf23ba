// The synchronized forward: BatchNormForwardTraining with sync_group, split
// into Reduce -> AllReduce -> Merge -> AllReduce -> Apply, against the whole
// batch's forward on ref (float64): on one process, and on groups of 2 and 3
// simulated by threads (uneven slices, an empty one, data 1e4 from zero).
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <normgrad/backends/communicator.hpp>
#include <normgrad/compile/compiler.hpp>
#include <normgrad/testing/check.hpp>
#include <normgrad/testing/oracle.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace testing_util {
namespace {

struct FwdCase {
  DataType dt = DataType::kF32;
  std::string format = "NCX";
  bool affine = true;
  std::string epilogue;  // "", "relu", "add_leaky"
  Dims shape = {5, 12, 6, 7};
};

std::string name_of(const FwdCase& c) {
  return std::string(dtype_name(c.dt)) + "/" + c.format + (c.affine ? "/affine" : "") + "/" +
         (c.epilogue.empty() ? "plain" : c.epilogue);
}

// The forward (ids: src 0, mean 1, variance 2, gamma 3, beta 4; outputs 5..9;
// residual 10; the epilogue's output 12). `batch` replaces dim 0.
Graph make_graph(const FwdCase& c, bool sync, int64_t batch = -1) {
  Dims shape = c.shape;
  if (batch >= 0) shape[0] = batch;
  if (c.format == "NXC") std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
  const int64_t ch = c.format == "NCX" ? shape[1] : shape.back();
  Op bn(1, OpKind::kBatchNormForwardTraining, "bn_fwd");
  bn.set_attr("epsilon", 1e-3).set_attr("momentum", 0.1).set_attr("data_format", c.format);
  if (sync) bn.set_attr("sync_group", "world");
  bn.add_input(lt(0, c.dt, shape));
  for (int64_t id = 1; id <= (c.affine ? 4 : 2); ++id) bn.add_input(lt(id, DataType::kF32, {ch}));
  bn.add_output(lt(5, c.dt, shape));
  for (int64_t id = 6; id <= 9; ++id) bn.add_output(lt(id, DataType::kF32, {ch}));
  Graph g;
  EXPECT_TRUE(g.add_op(bn).ok());
  if (c.epilogue == "relu") {
    Op relu(2, OpKind::kReLU, "relu");
    relu.add_input(lt(5, c.dt, shape)).add_output(lt(12, c.dt, shape));
    EXPECT_TRUE(g.add_op(relu).ok());
  } else if (c.epilogue == "add_leaky") {
    Op add(2, OpKind::kAdd, "residual");
    add.add_input(lt(5, c.dt, shape)).add_input(lt(10, c.dt, shape));
    add.add_output(lt(11, c.dt, shape));
    Op leaky(3, OpKind::kLeakyReLU, "leaky");
    leaky.set_attr("alpha", 0.1).add_input(lt(11, c.dt, shape)).add_output(lt(12, c.dt, shape));
    EXPECT_TRUE(g.add_op(add).ok());
    EXPECT_TRUE(g.add_op(leaky).ok());
  }
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

// A reusable barrier for n threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, waiting_ = 0;
  int64_t generation_ = 0;
};

// N ranks in N threads of one process: each call waits for all, and every
// rank gets the sum in rank order (the same bits everywhere).
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), sync_(n), slots_(static_cast<size_t>(n)) {}

  class Rank final : public Communicator {
   public:
    Rank(ThreadGroup* g, int r) : g_(g), r_(r) {}
    int size() const override { return g_->n_; }
    int rank() const override { return r_; }
    std::string name() const override { return "threads (" + std::to_string(g_->n_) + ")"; }
    Status all_reduce_sum(double* data, int64_t count, bool failed,
                          uint64_t /*signature*/) const override {
      if (failed) return aborted("a rank failed");
      g_->slots_[static_cast<size_t>(r_)].assign(data, data + count);
      g_->sync_.arrive_and_wait();
      for (int64_t i = 0; i < count; ++i) {
        double s = 0.0;
        for (const auto& slot : g_->slots_) s += slot[static_cast<size_t>(i)];
        data[i] = s;
      }
      g_->sync_.arrive_and_wait();  // everyone read the slots before the next call
      return ok_status();
    }

   private:
    ThreadGroup* g_;
    int r_;
  };

 private:
  int n_;
  Barrier sync_;
  std::vector<std::vector<double>> slots_;
};

// Rank r's rows [N r / P, N (r + 1) / P) of a batch-major tensor.
oracle::Buffer rows_of(const oracle::Buffer& full, int64_t begin, int64_t rows, int64_t batch) {
  oracle::Buffer b = full;
  b.desc.dims[0] = rows;
  b.desc.strides.clear();
  const size_t row_bytes = batch == 0 ? 0 : full.bytes.size() / static_cast<size_t>(batch);
  b.bytes.assign(full.bytes.begin() + static_cast<std::ptrdiff_t>(row_bytes * begin),
                 full.bytes.begin() + static_cast<std::ptrdiff_t>(row_bytes * (begin + rows)));
  return b;
}

struct Whole {
  std::map<int64_t, oracle::Buffer> inputs, want;
  CompiledGraph ref;
};

Whole whole_batch(const FwdCase& c, double offset) {
  auto ref = CompiledGraph::compile(make_graph(c, false), CompileOptions{"ref"});
  EXPECT_TRUE(ref.ok()) << ref.status().to_string();
  Whole w{{}, {}, *ref};
  w.inputs = *oracle::make_inputs(w.ref.graph(), w.ref.lowered_graph(), "", 3, nullptr, offset);
  w.want = *oracle::run_outputs(w.ref, w.inputs);
  return w;
}

// One process (a group of one: its AllReduces are identities on ref).
TEST(SyncForward, SplitGraphMatchesTheWholeForwardOnOneProcess) {
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (const char* f : {"NCX", "NXC"}) {
      for (const char* epi : {"", "relu", "add_leaky"}) {
        for (double offset : {0.0, 1e4}) {
          FwdCase c;
          c.dt = dt, c.format = f, c.epilogue = epi, c.affine = std::string(epi) != "relu";
          const Whole w = whole_batch(c, offset);
          for (const char* backend : {"auto", "ref"}) {
            auto cg = CompiledGraph::compile(make_graph(c, true), CompileOptions{backend});
            ASSERT_TRUE(cg.ok()) << name_of(c) << ": " << cg.status().to_string();
            std::string kernels;
            for (const auto& p : cg->partitions()) kernels += p->kernel_name() + " ";
            EXPECT_NE(kernels.find("AllReduce"), std::string::npos) << kernels;
            if (std::string(backend) == "auto" && find_backend("jit") && dt != DataType::kF16) {
              EXPECT_NE(kernels.find("+reduce"), std::string::npos) << kernels;
              EXPECT_NE(kernels.find("+apply"), std::string::npos) << kernels;
            }
            auto got = oracle::run_outputs(*cg, w.inputs);
            ASSERT_TRUE(got.ok()) << got.status().to_string();
            for (const auto& [id, want] : w.want) {
              auto v = oracle::check_output(w.ref.lowered_graph(), w.inputs, id, got->at(id), want);
              ASSERT_TRUE(v.ok()) << v.status().to_string();
              EXPECT_TRUE(v->pass) << name_of(c) << " offset " << offset << " " << backend
                                   << " tensor " << id << " rel_l2=" << v->error.rel_l2;
            }
          }
        }
      }
    }
  }
}

// Groups of 2 and 3 ranks (threads), batch 5: slices 2/3 and 1/2/2, and a
// batch of 2 over 3 ranks (rank 0 empty); f32 at 1e4 from zero against the
// targets: statistics within 1e-6, outputs within 1e-5; and every rank's
// per-channel outputs have the same bits.
TEST(SyncForward, ThreadGroupsMatchTheWholeBatch) {
  if (!built_with_mpi()) GTEST_SKIP() << "only the MPI backend sums over a group of several";
  for (const char* f : {"NCX", "NXC"}) {
    for (const auto& split : {std::pair<int, int64_t>{2, 5}, {3, 5}, {3, 2}}) {
      // Plain locals: C++17 lambdas cannot capture structured bindings.
      const int ranks = split.first;
      const int64_t batch = split.second;
      FwdCase c;
      c.format = f;
      c.epilogue = "add_leaky";
      c.shape[0] = batch;
      const Whole w = whole_batch(c, 1e4);
      ThreadGroup group(ranks);
      std::vector<std::map<int64_t, oracle::Buffer>> outs(static_cast<size_t>(ranks));
      std::vector<Status> status(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          const int64_t begin = batch * r / ranks, rows = batch * (r + 1) / ranks - begin;
          CompileOptions options;
          options.communicators["world"] = std::make_shared<ThreadGroup::Rank>(&group, r);
          auto cg = CompiledGraph::compile(make_graph(c, true, rows), options);
          if (!cg.ok()) {
            status[static_cast<size_t>(r)] = cg.status();
            return;
          }
          std::map<int64_t, oracle::Buffer> in;
          for (const auto& [id, b] : w.inputs)
            in.emplace(id, b.desc.rank() >= 2 ? rows_of(b, begin, rows, batch) : b);
          auto got = oracle::run_outputs(*cg, in);
          status[static_cast<size_t>(r)] = got.status();
          if (got.ok()) outs[static_cast<size_t>(r)] = std::move(*got);
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < ranks; ++r) {
        const std::string who = std::string(f) + " " + std::to_string(ranks) + " ranks, batch " +
                                std::to_string(batch) + ", rank " + std::to_string(r);
        ASSERT_TRUE(status[static_cast<size_t>(r)].ok())
            << who << ": " << status[static_cast<size_t>(r)].to_string();
        const int64_t begin = batch * r / ranks, rows = batch * (r + 1) / ranks - begin;
        for (const auto& [id, want] : w.want) {
          const oracle::Buffer& got = outs[static_cast<size_t>(r)].at(id);
          const bool data = want.desc.rank() >= 2;
          const oracle::Buffer expect = data ? rows_of(want, begin, rows, batch) : want;
          const oracle::ErrorStats e = oracle::compare(got, expect);
          EXPECT_LE(e.rel_l2, data ? 1e-5 : 1e-6) << who << " tensor " << id;
          if (!data && r > 0) {
            EXPECT_TRUE(got.bytes == outs[0].at(id).bytes) << who << " tensor " << id;
          }
        }
      }
    }
  }
}

// The same bits for any thread count, and a clear error when every
// process's batch is empty.
TEST(SyncForward, SameBitsForAnyThreadCountAndEmptyGroupsRefused) {
  FwdCase c;
  c.shape = {8, 64, 28, 28};
  for (const char* f : {"NCX", "NXC"}) {
    c.format = f;
    const Whole w = whole_batch(c, 0.0);
    auto cg = CompiledGraph::compile(make_graph(c, true), CompileOptions{});
    ASSERT_TRUE(cg.ok()) << cg.status().to_string();
    set_num_threads(1);
    auto one = oracle::run_outputs(*cg, w.inputs);
    set_num_threads(2);
    auto two = oracle::run_outputs(*cg, w.inputs);
    set_num_threads(0);
    ASSERT_TRUE(one.ok() && two.ok());
    for (const auto& [id, b] : *one) EXPECT_TRUE(b.bytes == two->at(id).bytes) << f << " " << id;
  }
  c.shape[0] = 0;
  for (const char* backend : {"auto", "ref"}) {
    auto cg = CompiledGraph::compile(make_graph(c, true), CompileOptions{backend});
    ASSERT_TRUE(cg.ok()) << cg.status().to_string();
    auto inputs = oracle::make_inputs(cg->graph(), cg->lowered_graph(), "", 1, nullptr);
    ASSERT_TRUE(inputs.ok());
    EXPECT_STATUS_HAS(oracle::run_outputs(*cg, *inputs).status(), "every process's batch is empty");
  }
}

}  // namespace
}  // namespace testing_util
}  // namespace normgrad
