// Reference batch norm against closed-form values and an independent naive
// float64 implementation written here, over dtypes, layouts, ranks and forms.
#include <algorithm>
#include <cmath>
#include <random>

#include <normgrad/compile/compiler.hpp>
#include "tests/test_util.hpp"

namespace normgrad {
namespace {

using testing_util::bn_bwd;

// Runs a one-op graph on the ref backend; buffers by tensor id.
std::map<int64_t, std::vector<char>> run_ref(const Op& op,
                                             const std::map<int64_t, std::vector<double>>& values) {
  Graph g;
  EXPECT_TRUE(g.add_op(op).ok());
  auto cg = CompiledGraph::compile(g, CompileOptions{"ref"});
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  std::map<int64_t, std::vector<char>> bufs;
  std::map<int64_t, const void*> in;
  std::map<int64_t, void*> out;
  for (const LogicalTensor& lt : cg->inputs()) {
    auto& b = bufs[lt.id];
    b.resize(static_cast<size_t>(*lt.buffer_bytes()));
    const auto& v = values.at(lt.id);
    for (size_t i = 0; i < v.size(); ++i)
      store_from_double(b.data(), static_cast<int64_t>(i), lt.dtype, v[i]);
    in[lt.id] = b.data();
  }
  for (const LogicalTensor& lt : cg->outputs()) {
    auto& b = bufs[lt.id];
    b.assign(static_cast<size_t>(*lt.buffer_bytes()),
             0x7f);  // poison: every element must be written
    out[lt.id] = b.data();
  }
  Status s = cg->execute(in, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return bufs;
}

double get(const std::map<int64_t, std::vector<char>>& bufs, int64_t id, DataType dt, int64_t i) {
  return load_as_double(bufs.at(id).data(), i, dt);
}

TEST(RefBatchNormBackward, OneDnnCanonicalVector) {
  // oneDNN's example: NCX 1x1x2x2, mean 2.5, variance 1.25, gamma 2, epsilon 0.
  Op op = bn_bwd({1, 1, 2, 2}, "NCX", DataType::kF32, DataType::kF32, true, 3, 0.0f);
  auto out = run_ref(
      op, {{0, {1, 2, 3, 4}}, {1, {0.1, 0.1, 0.2, 0.2}}, {2, {2.5}}, {3, {1.25}}, {4, {2}}});
  const double expect[4] = {0.01788854, -0.05366563, 0.05366563, -0.01788854};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(get(out, 5, DataType::kF32, i), expect[i], 1e-8);
  EXPECT_NEAR(get(out, 6, DataType::kF32, 0), 0.17888544, 1e-8);
  EXPECT_NEAR(get(out, 7, DataType::kF32, 0), 0.6, 1e-7);
}

TEST(RefBatchNormBackward, SingleOutputIsFrozenStatisticsWithGammaIgnored) {
  // diff_src = dy / sqrt(var + eps); gamma 7 must not matter.
  Op op = bn_bwd({1, 2, 2}, "NCX", DataType::kF32, DataType::kF32, true, 1, 0.25f);
  auto out = run_ref(
      op, {{0, {5, -3, 1, 9}}, {1, {1, -2, 0.5, 4}}, {2, {0, 0}}, {3, {0.75, 3.75}}, {4, {7, 7}}});
  const double expect[4] = {1.0, -2.0, 0.25, 2.0};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(get(out, 5, DataType::kF32, i), expect[i]);
}

TEST(RefBatchNormBackward, FourInputsThreeOutputsMeansGammaOne) {
  // NXC 2x2 (N=2, C=2). Channel 0: x {1, 3}, dy {1, 0}, mean 2, var 1, eps 0 -> s = 1.
  // diff_beta = 1, diff_gamma = sum dy (x - mean) = -1,
  // diff_src = dy - 1/2 - xhat (-1)/2 = {1 - .5 - .5, 0 - .5 + .5} = {0, 0}.
  // Channel 1: x {0, 4}, dy {2, 2}, mean 2, var 4, eps 0 -> s = .5, xhat {-1, 1}.
  // diff_beta = 4, diff_gamma = .5 (2 (-2) + 2 (2)) = 0, diff_src = .5 (2 - 2) = {0, 0}.
  Op op = bn_bwd({2, 2}, "NXC", DataType::kF32, DataType::kF32, false, 3, 0.0f);
  auto out = run_ref(op, {{0, {1, 0, 3, 4}}, {1, {1, 2, 0, 2}}, {2, {2, 2}}, {3, {1, 4}}});
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(get(out, 5, DataType::kF32, i), 0.0);
  EXPECT_DOUBLE_EQ(get(out, 6, DataType::kF32, 0), -1.0);
  EXPECT_DOUBLE_EQ(get(out, 6, DataType::kF32, 1), 0.0);
  EXPECT_DOUBLE_EQ(get(out, 7, DataType::kF32, 0), 1.0);
  EXPECT_DOUBLE_EQ(get(out, 7, DataType::kF32, 1), 4.0);
}

TEST(RefBatchNormBackward, EmptyBatchGivesZeroReductions) {
  Op op = bn_bwd({0, 3, 4}, "NCX", DataType::kF32, DataType::kF32, true, 3);
  auto out = run_ref(op, {{0, {}}, {1, {}}, {2, {0, 0, 0}}, {3, {1, 1, 1}}, {4, {1, 2, 3}}});
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(get(out, 6, DataType::kF32, c), 0.0);
    EXPECT_EQ(get(out, 7, DataType::kF32, c), 0.0);
  }
}

int significand_bits(DataType dt) {
  return dt == DataType::kF32 ? 24 : dt == DataType::kF16 ? 11 : 8;
}

struct SweepCase {
  DataType dt, sdt;
  const char* format;
  int rank;
  int64_t channels;
  bool gamma;
  int outputs;
  double offset;
};

// The naive formulas, on logical [n][c][s] arrays in float64.
void sweep_one(const SweepCase& k, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(dtype_name(k.dt)) + "/" + dtype_name(k.sdt) + " " + k.format + " rank " +
               std::to_string(k.rank) + " C " + std::to_string(k.channels) +
               (k.gamma ? " gamma" : "") + " outputs " + std::to_string(k.outputs) + " offset " +
               std::to_string(k.offset));
  const int64_t n = 2, c = k.channels;
  Dims spatial;
  const int64_t spatial_sizes[] = {5, 3, 2};
  for (int i = 0; i < k.rank - 2; ++i) spatial.push_back(spatial_sizes[i]);
  int64_t sp = 1;
  for (int64_t d : spatial) sp *= d;
  const bool ncx = std::string(k.format) == "NCX";
  Dims shape = {n};
  if (ncx) shape.push_back(c);
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  if (!ncx) shape.push_back(c);
  auto offset_of = [&](int64_t in, int64_t ic, int64_t is) {
    return ncx ? (in * c + ic) * sp + is : (in * sp + is) * c + ic;
  };

  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const int64_t total = n * c * sp;
  std::vector<double> x(static_cast<size_t>(total)), dy(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) {
    x[i] = round_to_dtype(k.offset + u(rng), k.dt);
    dy[i] = round_to_dtype(u(rng), k.dt);
  }
  std::vector<double> mean(c), var(c), gamma(c);
  for (int64_t ic = 0; ic < c; ++ic) {
    double s = 0, q = 0;
    for (int64_t in = 0; in < n; ++in)
      for (int64_t is = 0; is < sp; ++is) s += x[offset_of(in, ic, is)];
    const double m = s / static_cast<double>(n * sp);
    for (int64_t in = 0; in < n; ++in)
      for (int64_t is = 0; is < sp; ++is)
        q += (x[offset_of(in, ic, is)] - m) * (x[offset_of(in, ic, is)] - m);
    mean[ic] = round_to_dtype(m, k.sdt);
    var[ic] = round_to_dtype(q / static_cast<double>(n * sp), k.sdt);
    gamma[ic] = round_to_dtype(0.5 + 0.5 * (u(rng) + 1.0), k.sdt);
  }
  const float eps = 1e-3f;
  Op op = bn_bwd(shape, k.format, k.dt, k.sdt, k.gamma, k.outputs, eps);
  std::map<int64_t, std::vector<double>> values = {{0, x}, {1, dy}, {2, mean}, {3, var}};
  if (k.gamma) values[4] = gamma;
  auto out = run_ref(op, values);

  const double ulp_data = std::ldexp(1.0, 1 - significand_bits(k.dt));
  const double ulp_stat = std::ldexp(1.0, 1 - significand_bits(k.sdt));
  for (int64_t ic = 0; ic < c; ++ic) {
    const double s = 1.0 / std::sqrt(var[ic] + static_cast<double>(eps));
    const double g = k.gamma ? gamma[ic] : 1.0;
    double db = 0, dg = 0;
    for (int64_t in = 0; in < n; ++in) {
      for (int64_t is = 0; is < sp; ++is) {
        db += dy[offset_of(in, ic, is)];
        dg += dy[offset_of(in, ic, is)] * (x[offset_of(in, ic, is)] - mean[ic]) * s;
      }
    }
    const double m = static_cast<double>(n * sp);
    for (int64_t in = 0; in < n; ++in) {
      for (int64_t is = 0; is < sp; ++is) {
        const int64_t o = offset_of(in, ic, is);
        const double want =
            k.outputs == 1 ? s * dy[o] : g * s * (dy[o] - db / m - (x[o] - mean[ic]) * s * dg / m);
        const double got = get(out, 5, k.dt, o);
        // Ref rounds its float64 result once; allow one ulp for float64 ordering.
        ASSERT_NEAR(got, want, ulp_data * std::fabs(want) + 1e-9 * s * (1 + std::fabs(dy[o])))
            << "element " << o;
      }
    }
    if (k.outputs == 3) {
      EXPECT_NEAR(get(out, 6, k.sdt, ic), dg, ulp_stat * std::fabs(dg) + 1e-9 * s * m)
          << "diff_gamma " << ic;
      EXPECT_NEAR(get(out, 7, k.sdt, ic), db, ulp_stat * std::fabs(db) + 1e-9 * m)
          << "diff_beta " << ic;
    }
  }
}

TEST(RefBatchNormBackward, RandomSweepAgainstNaiveFormula) {
  std::mt19937_64 rng(20261122);
  const std::pair<DataType, DataType> dtypes[] = {{DataType::kF32, DataType::kF32},
                                                  {DataType::kBF16, DataType::kF32},
                                                  {DataType::kBF16, DataType::kBF16},
                                                  {DataType::kF16, DataType::kF32}};
  int cases = 0;
  for (auto [dt, sdt] : dtypes) {
    for (const char* fmt : {"NCX", "NXC"}) {
      for (int rank = 2; rank <= 5; ++rank) {
        for (int64_t channels : {1, 3, 17}) {
          for (bool gamma : {true, false}) {
            for (int outputs : {1, 3}) {
              const double offset = (cases % 3 == 0 && dt == DataType::kF32) ? 1e4 : 0.0;
              sweep_one({dt, sdt, fmt, rank, channels, gamma, outputs, offset}, rng);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 2 * 4 * 3 * 2 * 2);
}

TEST(RefBatchNormForward, TrainingAndInferenceClosedForm) {
  // C = 1, x = {1, 3}: batch mean 2, biased variance 1; eps 0, gamma 2, beta 1.
  Op fwd(0, OpKind::kBatchNormForwardTraining, "f");
  fwd.set_attr("epsilon", 0.0f)
      .set_attr("momentum", 0.25f)
      .set_attr("data_format", std::string("NCX"));
  fwd.add_input(testing_util::lt(0, DataType::kF32, {2, 1}));
  for (int i = 1; i <= 4; ++i) fwd.add_input(testing_util::lt(i, DataType::kF32, {1}));
  fwd.add_output(testing_util::lt(5, DataType::kF32, {2, 1}));
  for (int i = 6; i <= 9; ++i) fwd.add_output(testing_util::lt(i, DataType::kF32, {1}));
  auto out = run_ref(fwd, {{0, {1, 3}}, {1, {10}}, {2, {5}}, {3, {2}}, {4, {1}}});
  EXPECT_DOUBLE_EQ(get(out, 5, DataType::kF32, 0), -1.0);
  EXPECT_DOUBLE_EQ(get(out, 5, DataType::kF32, 1), 3.0);
  EXPECT_DOUBLE_EQ(get(out, 6, DataType::kF32, 0), 0.25 * 10 + 0.75 * 2);  // running mean
  EXPECT_DOUBLE_EQ(get(out, 7, DataType::kF32, 0), 0.25 * 5 + 0.75 * 1);   // running variance
  EXPECT_DOUBLE_EQ(get(out, 8, DataType::kF32, 0), 2.0);
  EXPECT_DOUBLE_EQ(get(out, 9, DataType::kF32, 0), 1.0);

  Op inf(1, OpKind::kBatchNormInference, "i");
  inf.set_attr("epsilon", 0.0f);
  inf.add_input(testing_util::lt(0, DataType::kF32, {2, 1}));
  for (int i = 1; i <= 4; ++i) inf.add_input(testing_util::lt(i, DataType::kF32, {1}));
  inf.add_output(testing_util::lt(5, DataType::kF32, {2, 1}));
  // gamma 2, beta 1, mean 1, variance 4: y = 2 (x - 1) / 2 + 1 = x.
  auto y = run_ref(inf, {{0, {-3, 8}}, {1, {2}}, {2, {1}}, {3, {1}}, {4, {4}}});
  EXPECT_DOUBLE_EQ(get(y, 5, DataType::kF32, 0), -3.0);
  EXPECT_DOUBLE_EQ(get(y, 5, DataType::kF32, 1), 8.0);
}

// The reference forward against the textbook formulas, written out naively in
// float64 from the same rounded inputs, over ranks 2-5, both layouts, channel
// counts with and without tails, every data dtype and epsilon/momentum pairs:
// ref is the expected value of every JIT forward test, so it is checked on
// its own here.
TEST(RefBatchNormForward, SweepAgainstNaiveFormulas) {
  std::mt19937 rng(21);
  std::normal_distribution<double> normal(0.0, 1.0);
  int ran = 0;
  for (DataType dt : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (const char* fmt : {"NCX", "NXC"}) {
      for (int rank = 2; rank <= 5; ++rank) {
        for (int64_t c : {1, 3, 17}) {
          const bool nxc = std::string(fmt) == "NXC";
          Dims shape = {3, c};
          for (int i = 2; i < rank; ++i) shape.push_back(2 + i);  // 4, 5, 6
          if (nxc) std::rotate(shape.begin() + 1, shape.begin() + 2, shape.end());
          const int axis = nxc ? rank - 1 : 1;
          const float eps = ran % 2 ? 1e-3f : 0.1f, momentum = ran % 3 ? 0.25f : 0.9f;
          Op op(0, OpKind::kBatchNormForwardTraining, "f");
          op.set_attr("epsilon", eps).set_attr("momentum", momentum);
          op.set_attr("data_format", std::string(fmt));
          op.add_input(testing_util::lt(0, dt, shape));
          for (int i = 1; i <= 4; ++i) op.add_input(testing_util::lt(i, DataType::kF32, {c}));
          op.add_output(testing_util::lt(5, dt, shape));
          for (int i = 6; i <= 9; ++i) op.add_output(testing_util::lt(i, DataType::kF32, {c}));
          int64_t n = 1;
          for (int64_t d : shape) n *= d;
          // Inputs, rounded to their dtypes first: the formulas see what ref sees.
          std::map<int64_t, std::vector<double>> in;
          auto rounded = [](double v, DataType t) {
            std::vector<char> b(8);
            store_from_double(b.data(), 0, t, v);
            return load_as_double(b.data(), 0, t);
          };
          for (int64_t i = 0; i < n; ++i) in[0].push_back(rounded(3 * normal(rng) + 2, dt));
          for (int k = 1; k <= 4; ++k)
            for (int64_t j = 0; j < c; ++j)
              in[k].push_back(
                  rounded(k == 2 ? 1.0 + std::fabs(normal(rng)) : normal(rng), DataType::kF32));
          auto out = run_ref(op, in);
          // The formulas.
          std::vector<double> sum(c, 0.0), sq(c, 0.0);
          std::vector<int64_t> count(c, 0);
          auto channel_of = [&](int64_t i) {
            int64_t stride = 1;
            for (int d = rank - 1; d > axis; --d) stride *= shape[d];
            return (i / stride) % c;
          };
          for (int64_t i = 0; i < n; ++i) {
            sum[channel_of(i)] += in[0][i];
            ++count[channel_of(i)];
          }
          for (int64_t i = 0; i < n; ++i) {
            const double m = sum[channel_of(i)] / count[channel_of(i)];
            sq[channel_of(i)] += (in[0][i] - m) * (in[0][i] - m);
          }
          SCOPED_TRACE(std::string(dtype_name(dt)) + " " + fmt + " " + dims_to_string(shape));
          for (int64_t j = 0; j < c; ++j) {
            const double mean = sum[j] / count[j], var = sq[j] / count[j];
            EXPECT_NEAR(get(out, 8, DataType::kF32, j), mean, 1e-6 * (1 + std::fabs(mean)));
            EXPECT_NEAR(get(out, 9, DataType::kF32, j), var, 1e-6 * var);
            EXPECT_NEAR(get(out, 6, DataType::kF32, j), momentum * in[1][j] + (1 - momentum) * mean,
                        1e-6 * (1 + std::fabs(mean) + std::fabs(in[1][j])));
            EXPECT_NEAR(get(out, 7, DataType::kF32, j), momentum * in[2][j] + (1 - momentum) * var,
                        1e-6 * (var + in[2][j]));
          }
          double worst = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = channel_of(i);
            const double mean = sum[j] / count[j], var = sq[j] / count[j];
            const double y = (in[0][i] - mean) / std::sqrt(var + eps) * in[3][j] + in[4][j];
            // ref rounds its float64 result once: within one rounding of the formula.
            const double ulp = dt == DataType::kF32    ? 0x1p-23
                               : dt == DataType::kBF16 ? 0x1p-7
                                                       : 0x1p-10;
            const double err = std::fabs(get(out, 5, dt, i) - y) / (ulp * (std::fabs(y) + 1e-3));
            worst = std::max(worst, err);
          }
          EXPECT_LE(worst, 1.0);
          ++ran;
        }
      }
    }
  }
  EXPECT_EQ(ran, 3 * 2 * 4 * 3);
}

}  // namespace
}  // namespace normgrad
