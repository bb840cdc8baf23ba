// The bench's traffic bound (two_pass_traffic) against closed-form values, and
// `normgrad bench` reporting it per case at the case's own probe.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "tests/cli_test_util.hpp"
#include "tools/bench_probe.hpp"

namespace normgrad {
namespace {

using cli::two_pass_traffic;
using cli::williams_order;

constexpr int64_t kL3 = int64_t{32} << 20;

// T: one tensor's bytes.
double tensor_bytes(int64_t n, int64_t c, int64_t spatial, int64_t elem) {
  return static_cast<double>(n) * static_cast<double>(c) * static_cast<double>(spatial) *
         static_cast<double>(elem);
}

TEST(TwoPassTraffic, ChannelsThatFitTheL3AreReadOnce) {
  // 32x64x112x112 f32 NCX: a channel's src + diff_dst is 3.2 MB: 3 passes.
  const double t = tensor_bytes(32, 64, 112 * 112, 4);
  const auto b = two_pass_traffic("NCX", 32, 64, 112 * 112, 4, kL3);
  EXPECT_DOUBLE_EQ(b.bytes, 3.0 * t);
  EXPECT_DOUBLE_EQ(b.passes, 3.0);
}

TEST(TwoPassTraffic, BlockedUnitsOverTheL3ReReadTheirExcess) {
  // nChw16c: a unit of 16 of 64 channels holds 2T/4 = T/2 of src + diff_dst;
  // the L3 keeps kL3 of it, the rest (T/2 - kL3) is read again.
  const double t = tensor_bytes(32, 64, 112 * 112, 4);
  const auto b = two_pass_traffic("nChw16c", 32, 64, 112 * 112, 4, kL3);
  EXPECT_DOUBLE_EQ(b.bytes, 3.0 * t + 4.0 * (t / 2.0 - static_cast<double>(kL3)));
  EXPECT_NEAR(b.passes, 5.0 - 4.0 * static_cast<double>(kL3) / t, 1e-12);
  // Fewer than 16 channels: the unit is all of them.
  const double t8 = tensor_bytes(64, 8, 112 * 112, 4);
  const auto b8 = two_pass_traffic("nChw16c", 64, 8, 112 * 112, 4, kL3);
  EXPECT_DOUBLE_EQ(b8.bytes, 5.0 * t8 - static_cast<double>(kL3));
}

TEST(TwoPassTraffic, NxcWithPowerOfTwoChannelsReReadsAllButTheL3) {
  // 32x56x56x256 f32 and bf16: the unit is the whole tensor pair.
  for (int64_t elem : {4, 2}) {
    const double t = tensor_bytes(32, 256, 56 * 56, elem);
    const auto b = two_pass_traffic("NXC", 32, 256, 56 * 56, elem, kL3);
    EXPECT_DOUBLE_EQ(b.bytes, 5.0 * t - static_cast<double>(kL3)) << elem;
    EXPECT_NEAR(b.passes, 5.0 - static_cast<double>(kL3) / t, 1e-12) << elem;
  }
  // C = 192 is not a power of two: a slab walk might keep channels cached,
  // so the bound charges no re-read.
  const double t = tensor_bytes(32, 192, 56 * 56, 4);
  EXPECT_DOUBLE_EQ(two_pass_traffic("NXC", 32, 192, 56 * 56, 4, kL3).bytes, 3.0 * t);
}

TEST(TwoPassTraffic, InputsThatFitTheL3AndBadArgumentsBoundNothing) {
  // 1x256x28x28 f32: src + diff_dst 1.6 MB.
  EXPECT_EQ(two_pass_traffic("NXC", 1, 256, 28 * 28, 4, kL3).bytes, 0.0);
  EXPECT_EQ(two_pass_traffic("NCX", 1, 256, 28 * 28, 4, kL3).passes, 0.0);
  // Exactly at the L3: still nothing.
  EXPECT_EQ(two_pass_traffic("NXC", 1, 1024, 4096, 4, kL3).bytes, 0.0);
  EXPECT_EQ(two_pass_traffic("NXC", 0, 256, 28 * 28, 4, kL3).bytes, 0.0);
  EXPECT_EQ(two_pass_traffic("NXC", 32, -1, 28 * 28, 4, kL3).bytes, 0.0);
  EXPECT_EQ(two_pass_traffic("NXC", 32, 256, 28 * 28, 4, 0).bytes, 0.0);
}

// `normgrad bench ARGS --json FILE`: its output and the JSON it wrote (null
// when it wrote none; the exit code is checked).
std::pair<std::string, nlohmann::json> bench_json(const std::string& args,
                                                  const std::string& file) {
  const std::string json = ::testing::TempDir() + "/" + file;
  const auto r = testing_util::run_cli("bench " + args + " --json " + json);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  return {r.output, nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)),
                                                      std::istreambuf_iterator<char>()),
                                          nullptr, false)};
}

// `normgrad bench` gives every preset case over the L3 its bound for the
// case's layout and for nChw16c: the traffic above over the higher of the
// case's two probes, and no bound to the cases that fit the L3. Checked
// against the host the JSON records, so it holds whatever the L3 is.
TEST(CliBench, ReportsTheTrafficBoundPerCase) {
  const auto [output, doc] = bench_json(
      "--shapes=resnet50 --dt=bf16 --layouts=NCX,NXC --backends=jit --iters 1 --warmup 0 "
      "--threads 1",
      "ng_bench_bound.json");
  ASSERT_TRUE(doc.is_object()) << output;
  // The bounds use the kernels' cache model (sysfs's L3, an implausible
  // per-CPU share capped), so every host prints them.
  const int64_t l3 = doc.at("host").at("model_l3_bytes");
  EXPECT_LE(l3, doc.at("host").at("l3_bytes").get<int64_t>());
  int bounded = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string layout = c.at("layout");
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    ASSERT_EQ(shape.size(), 4u);
    const int64_t n = shape[0], ch = layout == "NCX" ? shape[1] : shape[3];
    const int64_t spatial = layout == "NCX" ? shape[2] * shape[3] : shape[1] * shape[2];
    const auto plain = two_pass_traffic(layout, n, ch, spatial, 2, l3);
    const auto blocked = two_pass_traffic("nChw16c", n, ch, spatial, 2, l3);
    if (plain.bytes == 0.0) {
      EXPECT_FALSE(c.contains("bound_ms")) << c.at("name");
      continue;
    }
    ++bounded;
    const double before = c.at("roofline_before_gbps"), after = c.at("roofline_after_gbps");
    const double roof = std::max(before, after);
    ASSERT_GT(roof, 0.0);
    const double plain_ms = c.at("bound_ms").at(layout),
                 blocked_ms = c.at("bound_ms").at("nChw16c");
    EXPECT_NEAR(plain_ms, plain.bytes / roof / 1e6, 1e-9 * plain_ms) << c.at("name");
    EXPECT_NEAR(blocked_ms, blocked.bytes / roof / 1e6, 1e-9 * blocked_ms) << c.at("name");
    EXPECT_DOUBLE_EQ(c.at("bound_passes").at(layout).get<double>(), plain.passes);
  }
  // The cache model's L3 decides which cases are bounded: in bf16 the three
  // largest batch-32 layers hold 51-103 MB of src + diff_dst, so below 51 MB
  // (the model caps a VM's implausible L3 at 32 MiB) they are, in both layouts.
  if (l3 < 51'000'000) {
    EXPECT_GE(bounded, 6) << "l3_bytes " << l3;
    EXPECT_NE(output.find("bound at the probe's rate: NXC"), std::string::npos) << output;
  }
}

// --phases times the backward's reduce and apply apart on the JIT, each with
// its own minimal traffic (2 and 3 tensor passes); --jit-variant adds a JIT
// column per named variant, and an unknown name (or a parameter out of
// range) is a usage error with the names, before any case runs.
TEST(CliBench, PhasesAndVariants) {
  for (const char* bad : {"nope", "nxc-blocked-0"}) {
    const auto r = testing_util::run_cli(
        std::string("bench --shapes=small --backends=jit --jit-variant nxc-blocked,") + bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(std::string("JIT variant '") + bad + "'"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("roofline"), std::string::npos) << "cases ran first: " << r.output;
  }
  EXPECT_NE(testing_util::run_cli("bench --jit-variant nope").output.find("nxc-per-pixel"),
            std::string::npos);
  const auto [output, doc] = bench_json(
      "--shapes=small --dt=f32 --layouts=NXC --backends=jit --iters 1 --warmup 0 --threads 1 "
      "--phases --jit-variant nxc-blocked,nxc-per-pixel",
      "ng_bench_phases.json");
  ASSERT_TRUE(doc.is_object()) << output;
  int reduce = 0, apply = 0, blocked_runs = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    const double tensor = 4.0 * shape[0] * shape[1] * shape[2] * shape[3];
    if (c.contains("phase")) {
      const bool is_reduce = c.at("phase") == "reduce";
      (is_reduce ? reduce : apply) += 1;
      EXPECT_DOUBLE_EQ(c.at("bytes_min").get<double>(), tensor * (is_reduce ? 2.0 : 3.0)) << name;
      // The JIT, and its variants (A/B per phase); no other backend runs the halves.
      ASSERT_EQ(c.at("results").size(), 3u) << name;
      EXPECT_EQ(c.at("results")[0].at("backend"), "jit") << name;
      EXPECT_GT(c.at("results")[0].at("median_ms").get<double>(), 0.0) << name;
      continue;
    }
    for (const auto& res : c.at("results")) {
      const std::string b = res.at("backend");
      if (b == "jit[nxc-blocked]" && res.at("median_ms").get<double>() > 0) ++blocked_runs;
    }
  }
  EXPECT_EQ(reduce, apply);
  EXPECT_GE(reduce, 2);
  EXPECT_GE(blocked_runs, 2);
}

// --fused=add-relu-side: Add -> ReLUBackward (its output a result) -> the
// backward runs as one JIT partition against the three apart, with its
// minimal traffic (6 tensor passes) and both columns' outputs written.
TEST(CliBench, GradientAddChainAgainstItsOpsApart) {
  const auto [output, doc] = bench_json(
      "--shapes=small --dt=f32 --layouts=NCX --backends=jit --iters 1 --warmup 0 --threads 1 "
      "--fused=add-relu-side",
      "ng_bench_add_relu.json");
  ASSERT_TRUE(doc.is_object()) << output;
  int cases = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    EXPECT_DOUBLE_EQ(c.at("bytes_min").get<double>(),
                     6.0 * 4.0 * shape[0] * shape[1] * shape[2] * shape[3])
        << name;
    ASSERT_EQ(c.at("results").size(), 2u) << name;
    const auto& fused = c.at("results")[0];
    const auto& apart = c.at("results")[1];
    EXPECT_EQ(fused.at("backend"), "jit") << name;
    EXPECT_NE(fused.at("kernel").get<std::string>().find("add_relu_bwd+side_out"),
              std::string::npos)
        << name;
    EXPECT_EQ(apart.at("backend"), "unfused") << name;
    EXPECT_EQ(apart.at("kernel").get<std::string>().find("side_out"), std::string::npos) << name;
    EXPECT_GT(apart.at("median_ms").get<double>(), 0.0) << name;
    ++cases;
  }
  EXPECT_GE(cases, 2);
}

// --fused=add-relu-siblings: two backwards reading one masked gradient run
// as one sibling partition, against the side output and the plain backward
// (jit[no-siblings]) and the ops apart, with minimal traffic 7 passes; the
// forward's add-siblings likewise (3 passes); a fusion of the other
// direction is a usage error.
TEST(CliBench, SiblingsAgainstTheirPartitionsApart) {
  for (const bool fwd : {false, true}) {
    const auto [output, doc] = bench_json(
        std::string("--shapes=small --dt=f32 --layouts=NCX --backends=jit --iters 1 --warmup 0 "
                    "--threads 1 --jit-variant=no-siblings ") +
            (fwd ? "--dir fwd --fused=add-siblings" : "--fused=add-relu-siblings"),
        fwd ? "ng_bench_fwd_siblings.json" : "ng_bench_siblings.json");
    ASSERT_TRUE(doc.is_object()) << output;
    int cases = 0;
    for (const auto& c : doc.at("cases")) {
      const std::string name = c.at("name");
      const auto shape = c.at("shape").get<std::vector<int64_t>>();
      EXPECT_DOUBLE_EQ(c.at("bytes_min").get<double>(),
                       (fwd ? 3.0 : 7.0) * 4.0 * shape[0] * shape[1] * shape[2] * shape[3])
          << name;
      ASSERT_EQ(c.at("results").size(), 3u) << name;
      for (const auto& res : c.at("results")) {
        const std::string b = res.at("backend"), kernel = res.at("kernel");
        EXPECT_EQ(kernel.find("+sibling") != std::string::npos, b == "jit") << name << " " << b;
        if (b == "jit[no-siblings]" && !fwd) {
          EXPECT_NE(kernel.find("+side_out"), std::string::npos) << name;
        }
        EXPECT_GT(res.at("median_ms").get<double>(), 0.0) << name << " " << b;
      }
      ++cases;
    }
    EXPECT_GE(cases, 2);
  }
  const auto r = testing_util::run_cli("bench --dir fwd --fused=relu-siblings");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a fusion of --dir fwd"), std::string::npos) << r.output;
}

// The forward's side output against the activation apart: with
// --backends=auto the variant column runs every backend with the JIT under
// fwd-no-side-output ("auto[NAME]"), and the bound counts the side output.
TEST(CliBench, ForwardSideOutputAgainstTheActivationApart) {
  const auto [output, doc] = bench_json(
      "--shapes=small --dt=f32 --layouts=NCX,NXC --backends=auto --iters 1 --warmup 0 "
      "--threads 1 --jit-variant=fwd-no-side-output --dir fwd --fused=relu-side,add-relu-side",
      "ng_bench_fwd_side.json");
  ASSERT_TRUE(doc.is_object()) << output;
  int cases = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name");
    const bool add = name.find("+add-relu-side") != std::string::npos;
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    EXPECT_DOUBLE_EQ(c.at("bytes_min").get<double>(),
                     (add ? 4.0 : 3.0) * 4.0 * shape[0] * shape[1] * shape[2] * shape[3])
        << name;
    std::vector<std::string> columns;
    for (const auto& res : c.at("results")) {
      const std::string b = res.at("backend"), kernel = res.at("kernel");
      columns.push_back(b);
      EXPECT_EQ(kernel.find("+side_out") != std::string::npos, b == "auto") << name << " " << b;
      if (b == "auto[fwd-no-side-output]") {
        EXPECT_EQ(kernel.find("+add+") != std::string::npos, add) << name << " " << kernel;
      }
      EXPECT_GT(res.at("median_ms").get<double>(), 0.0) << name << " " << b;
    }
    EXPECT_EQ(columns, (std::vector<std::string>{"auto", "unfused", "auto[fwd-no-side-output]"}))
        << name;
    ++cases;
  }
  EXPECT_GE(cases, 4);
}

// The bench's column order: every row a permutation, and over a full cycle
// of rows each column right after every other one equally often and first
// equally often, for even and odd column counts.
TEST(WilliamsOrder, EachColumnFollowsEveryOtherEquallyOften) {
  for (int64_t n = 1; n <= 9; ++n) {
    const int64_t rows = n % 2 == 0 ? n : 2 * n;
    std::vector<std::vector<int>> follows(n, std::vector<int>(n, 0));
    std::vector<int> first(n, 0);
    for (int64_t it = 0; it < 3 * rows; ++it) {
      const std::vector<int64_t> row = williams_order(n, it);
      ASSERT_EQ(static_cast<int64_t>(row.size()), n);
      std::vector<int64_t> sorted = row;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(sorted[j], j) << "n " << n << " row " << it;
      if (it >= rows) continue;
      ++first[row[0]];
      for (int64_t j = 1; j < n; ++j) ++follows[row[j - 1]][row[j]];
    }
    for (int64_t a = 0; a < n; ++a) {
      EXPECT_EQ(first[a], rows / n) << "n " << n;
      for (int64_t b = 0; b < n; ++b) {
        if (a == b) continue;
        EXPECT_EQ(follows[a][b], rows / n) << "n " << n << " " << a << "->" << b;
      }
    }
  }
  EXPECT_TRUE(williams_order(0, 3).empty());
}

}  // namespace
}  // namespace normgrad
