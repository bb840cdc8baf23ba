// TensorFlow's gradient ops, run end to end (canonicalize pass + ref backend),
// against TensorFlow's formulas written out here in float64:
//   training: x_backprop = scale rsqrt(var + eps) (dy - mean(dy)
//                          - (x - mean) mean(dy (x - mean)) / (var + eps))
//   frozen:   x_backprop = scale rsqrt(var + eps) dy
//   scale_backprop = sum dy (x - mean) rsqrt(var + eps), offset_backprop = sum dy
#include <cmath>
#include <random>

#include <normgrad/compile/compiler.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::lt;

struct TfCase {
  OpKind kind;
  bool training;
  std::string format;
  DataType t;
  Dims shape;
  bool inv_std = false;
};

struct TfResult {
  std::vector<double> dx, dscale, doffset;
};

// Runs the case on inputs given in memory order; returns the three gradients.
TfResult run_tf(const TfCase& k, const std::vector<double>& dy, const std::vector<double>& x,
                const std::vector<double>& scale, const std::vector<double>& mean,
                const std::vector<double>& rs2, float eps, const std::string& backend = "ref") {
  const int64_t c = static_cast<int64_t>(scale.size());
  Op op(0, k.kind, "g");
  op.set_attr("data_format", k.format).set_attr("is_training", k.training).set_attr("epsilon", eps);
  if (k.inv_std) op.set_attr("reserve_space_2_is_inv_std", true);
  op.add_input(lt(0, k.t, k.shape)).add_input(lt(1, k.t, k.shape));
  for (int i = 2; i <= 4; ++i) op.add_input(lt(i, DataType::kF32, {c}));
  if (k.kind == OpKind::kFusedBatchNormGradV3) op.add_input(lt(5, DataType::kF32, {0}));
  op.add_output(lt(10, k.t, k.shape))
      .add_output(lt(11, DataType::kF32, {c}))
      .add_output(lt(12, DataType::kF32, {c}));
  op.add_output(lt(13, DataType::kF32, {0})).add_output(lt(14, DataType::kF32, {0}));
  Graph g;
  Status added = g.add_op(op);
  EXPECT_TRUE(added.ok()) << added.to_string();
  auto cg = CompiledGraph::compile(g, CompileOptions{backend});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  auto pack = [](const std::vector<double>& v, DataType dt) {
    std::vector<char> b(v.size() * static_cast<size_t>(dtype_size(dt)) + 1);
    for (size_t i = 0; i < v.size(); ++i)
      store_from_double(b.data(), static_cast<int64_t>(i), dt, v[i]);
    return b;
  };
  auto bdy = pack(dy, k.t), bx = pack(x, k.t), bs = pack(scale, DataType::kF32),
       bm = pack(mean, DataType::kF32), bv = pack(rs2, DataType::kF32);
  std::vector<char> dx(x.size() * static_cast<size_t>(dtype_size(k.t)) + 1),
      ds(static_cast<size_t>(c) * 4 + 1), doff(static_cast<size_t>(c) * 4 + 1);
  std::map<int64_t, const void*> in = {
      {0, bdy.data()}, {1, bx.data()}, {2, bs.data()}, {3, bm.data()}, {4, bv.data()}};
  if (k.kind == OpKind::kFusedBatchNormGradV3) in[5] = nullptr;  // empty reserve_space_3
  Status s = cg->execute(
      in, {{10, dx.data()}, {11, ds.data()}, {12, doff.data()}, {13, nullptr}, {14, nullptr}});
  EXPECT_TRUE(s.ok()) << s.to_string();
  TfResult r;
  for (size_t i = 0; i < x.size(); ++i)
    r.dx.push_back(load_as_double(dx.data(), static_cast<int64_t>(i), k.t));
  for (int64_t i = 0; i < c; ++i) {
    r.dscale.push_back(load_as_double(ds.data(), i, DataType::kF32));
    r.doffset.push_back(load_as_double(doff.data(), i, DataType::kF32));
  }
  return r;
}

double ulp_rel(DataType dt) {
  return dt == DataType::kF32 ? 0x1p-23 : dt == DataType::kF16 ? 0x1p-10 : 0x1p-7;
}

void check_case(const TfCase& k, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(op_kind_name(k.kind)) + " " + k.format + " " + dtype_name(k.t) +
               (k.training ? " training " : " frozen ") + dims_to_string(k.shape) +
               (k.inv_std ? " inv_std" : ""));
  const bool last = k.format.back() == 'C';
  const int rank = static_cast<int>(k.shape.size());
  const int64_t c = last ? k.shape[rank - 1] : k.shape[1];
  int64_t total = 1, inner = 1;
  for (int64_t d : k.shape) total *= d;
  for (int i = 2; i < rank; ++i) inner *= k.shape[i];
  auto chan = [&](int64_t i) { return last ? i % c : (i / inner) % c; };
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(total), dy(total), scale(c), mean(c, 0.0), var(c, 0.0), rs2(c);
  for (int64_t i = 0; i < total; ++i) {
    x[i] = round_to_dtype(2.0 + u(rng), k.t);
    dy[i] = round_to_dtype(u(rng), k.t);
  }
  const double m = static_cast<double>(c ? total / c : 0);
  for (int64_t i = 0; i < total; ++i) mean[chan(i)] += x[i] / m;
  for (int64_t i = 0; i < total; ++i)
    var[chan(i)] += (x[i] - mean[chan(i)]) * (x[i] - mean[chan(i)]) / m;
  const float eps = 0.001f;
  for (int64_t j = 0; j < c; ++j) {
    scale[j] = round_to_dtype(1.0 + 0.5 * u(rng), DataType::kF32);
    mean[j] = round_to_dtype(mean[j], DataType::kF32);
    var[j] = round_to_dtype(var[j], DataType::kF32);
    rs2[j] = k.inv_std ? round_to_dtype(1.0 / std::sqrt(var[j] + eps), DataType::kF32) : var[j];
  }
  for (const char* backend : {"ref", "auto"}) {
    SCOPED_TRACE(backend);
    // ref rounds a float64 result once; other backends compute in f32.
    const double f32_slack = std::string(backend) == "ref" ? 0.0 : 64 * 0x1p-24;
    const TfResult r = run_tf(k, dy, x, scale, mean, rs2, eps, backend);
    // TensorFlow's formulas; in the inverse-std convention var + eps is recovered from rs2.
    std::vector<double> mean_dy(c, 0.0), mean_dyxm(c, 0.0), sum_dy(c, 0.0), sum_dyxm(c, 0.0);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t j = chan(i);
      sum_dy[j] += dy[i];
      sum_dyxm[j] += dy[i] * (x[i] - mean[j]);
    }
    const double tol_stat = k.inv_std ? 1e-6 : 1e-12;
    for (int64_t j = 0; j < c; ++j) {
      const double var_eps = k.inv_std ? 1.0 / (rs2[j] * rs2[j]) : var[j] + eps;
      const double rsq = 1.0 / std::sqrt(var_eps);
      mean_dy[j] = sum_dy[j] / m;
      mean_dyxm[j] = sum_dyxm[j] / m;
      EXPECT_NEAR(r.dscale[j], sum_dyxm[j] * rsq,
                  2e-7 * (std::fabs(sum_dyxm[j] * rsq) + m * rsq) + tol_stat);
      EXPECT_NEAR(r.doffset[j], sum_dy[j], 2e-7 * (std::fabs(sum_dy[j]) + m));
    }
    for (int64_t i = 0; i < total; ++i) {
      const int64_t j = chan(i);
      const double var_eps = k.inv_std ? 1.0 / (rs2[j] * rs2[j]) : var[j] + eps;
      const double rsq = 1.0 / std::sqrt(var_eps);
      const double want =
          k.training
              ? scale[j] * rsq * (dy[i] - mean_dy[j] - (x[i] - mean[j]) * mean_dyxm[j] / var_eps)
              : scale[j] * rsq * dy[i];
      const double terms = std::fabs(scale[j]) * rsq *
                           (std::fabs(dy[i]) + std::fabs(mean_dy[j]) +
                            std::fabs((x[i] - mean[j]) * mean_dyxm[j] / var_eps));
      ASSERT_NEAR(r.dx[i], want, ulp_rel(k.t) * std::fabs(want) + 1e-9 * rsq + f32_slack * terms)
          << "element " << i;
    }
  }
}

TEST(TfBatchNormGrad, EveryVersionModeLayoutAndDtype) {
  std::mt19937_64 rng(41223);
  int n = 0;
  for (OpKind kind : {OpKind::kFusedBatchNormGrad, OpKind::kFusedBatchNormGradV2,
                      OpKind::kFusedBatchNormGradV3}) {
    for (bool training : {true, false}) {
      for (const char* fmt : {"NHWC", "NCHW"}) {
        for (DataType t : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
          if (kind == OpKind::kFusedBatchNormGrad && t != DataType::kF32) continue;
          const Dims shape = fmt[1] == 'H' ? Dims{2, 3, 5, 6} : Dims{2, 6, 3, 5};
          check_case({kind, training, fmt, t, shape}, rng);
          ++n;
        }
      }
    }
  }
  EXPECT_EQ(n, 2 * 2 * 1 + 2 * (2 * 2 * 3));
}

TEST(TfBatchNormGrad, OneChannelAndFiveD) {
  std::mt19937_64 rng(29583);
  for (bool training : {true, false}) {
    check_case({OpKind::kFusedBatchNormGradV2, training, "NCHW", DataType::kF32, {3, 1, 4, 4}},
               rng);
    check_case({OpKind::kFusedBatchNormGradV3, training, "NDHWC", DataType::kBF16, {2, 3, 2, 4, 5}},
               rng);
    check_case({OpKind::kFusedBatchNormGradV3, training, "NCDHW", DataType::kF16, {2, 5, 3, 2, 4}},
               rng);
  }
}

TEST(TfBatchNormGrad, InverseStdConventionGivesTheSameGradients) {
  std::mt19937_64 rng(7);
  for (bool training : {true, false}) {
    check_case(
        {OpKind::kFusedBatchNormGradV3, training, "NHWC", DataType::kF32, {2, 3, 3, 4}, true}, rng);
    check_case(
        {OpKind::kFusedBatchNormGradV2, training, "NCHW", DataType::kF32, {2, 4, 3, 3}, true}, rng);
  }
  // Same inputs, the two conventions side by side.
  std::vector<double> x = {1, 2, 4, 7, 0.5, -1}, dy = {0.5, -0.25, 1, 0.125, -2, 0.75};
  const TfCase var_case{OpKind::kFusedBatchNormGradV2, true, "NHWC", DataType::kF32, {1, 1, 3, 2}};
  TfCase inv_case = var_case;
  inv_case.inv_std = true;
  const std::vector<double> scale = {1.5, 0.75}, mean = {7.0 / 3, 0.5}, var = {14.0 / 9, 1.5};
  std::vector<double> inv = {1 / std::sqrt(var[0] + 0.001), 1 / std::sqrt(var[1] + 0.001)};
  for (double& v : inv) v = round_to_dtype(v, DataType::kF32);
  std::vector<double> var_r = var, mean_r = mean;
  for (double& v : var_r) v = round_to_dtype(v, DataType::kF32);
  for (double& v : mean_r) v = round_to_dtype(v, DataType::kF32);
  const TfResult a = run_tf(var_case, dy, x, scale, mean_r, var_r, 0.001f);
  const TfResult b = run_tf(inv_case, dy, x, scale, mean_r, inv, 0.001f);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(a.dx[i], b.dx[i], 1e-6 * (1 + std::fabs(a.dx[i])));
  for (size_t j = 0; j < 2; ++j)
    EXPECT_NEAR(a.dscale[j], b.dscale[j], 1e-6 * (1 + std::fabs(a.dscale[j])));
}

TEST(TfBatchNormGrad, EmptyBatchGivesZeroBackprops) {
  for (bool training : {true, false}) {
    const TfCase k{OpKind::kFusedBatchNormGradV3, training, "NHWC", DataType::kF32, {0, 3, 3, 2}};
    const TfResult r = run_tf(k, {}, {}, {1.0, 2.0}, {0.0, 0.0}, {1.0, 1.0}, 0.001f);
    EXPECT_TRUE(r.dx.empty());
    EXPECT_EQ(r.dscale, (std::vector<double>{0.0, 0.0}));
    EXPECT_EQ(r.doffset, (std::vector<double>{0.0, 0.0}));
  }
}

}  // namespace
}  // namespace normgrad
