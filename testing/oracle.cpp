// Random valid inputs (with true batch statistics), comparisons and thresholds.
#include <normgrad/testing/oracle.hpp>

#include <cmath>
#include <filesystem>
#include <set>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/indexing.hpp>
#include <normgrad/graph/npy.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace oracle {
namespace {

// splitmix64: the same stream on every platform, unlike std:: distributions.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
};

// The input port name under which `id` is consumed first ("src", "variance", ...).
std::string role_of(const Graph& graph, int64_t id) {
  for (const Use& u : graph.uses(id)) {
    const Op& op = *graph.op(u.op_id);
    const OpSchema* schema = op_registry().find(op.kind());
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      if (op.inputs()[i].id == id && schema) return schema->input_name(i);
    }
  }
  return "";
}

void fill_random(Buffer& b, const std::string& role, Rng& rng, double data_offset) {
  double lo = -1.0, hi = 1.0;
  if (role == "src" || role == "x") lo += data_offset, hi += data_offset;
  if (role == "variance") lo = 0.5, hi = 2.0;
  if (role == "gamma" || role == "scale") lo = 0.5, hi = 1.5;
  if (b.desc.dtype == DataType::kS8) lo = -100.0, hi = 100.0;  // quantized data: many levels
  if (b.desc.dtype == DataType::kU8) lo = 0.0, hi = 200.0;
  const Dims strides = b.desc.effective_strides();
  bool all_one = true;
  for_each_index(b.desc.dims, -1, 0, [&](const std::vector<int64_t>& idx) {
    const int64_t off = offset_of(idx, strides);
    store_from_double(b.data(), off, b.desc.dtype, rng.uniform(lo, hi));
    all_one = all_one && load_as_double(b.data(), off, b.desc.dtype) == 1.0;
  });
  if ((role == "gamma" || role == "scale") && all_one && !b.desc.dims.empty() &&
      b.desc.dims[0] > 0) {
    store_from_double(b.data(), 0, b.desc.dtype, 1.25);  // never all ones, even by chance
  }
}

// Writes the biased batch statistics of `src` into the mean and variance buffers.
Status set_batch_statistics(const Op& op, const Buffer& src, Buffer& mean, Buffer& var) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  const Dims xs = src.desc.effective_strides();
  const int64_t ms = mean.desc.effective_strides()[0], vs = var.desc.effective_strides()[0];
  for (int64_t c = 0; c < d.channels; ++c) {
    double sum = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      sum += load_as_double(src.data(), offset_of(idx, xs), src.desc.dtype);
    });
    const double m = d.reduce_size > 0 ? sum / static_cast<double>(d.reduce_size) : 0.0;
    double sq = 0.0;
    for_each_index(d.dims, d.channel_axis, c, [&](const std::vector<int64_t>& idx) {
      const double t = load_as_double(src.data(), offset_of(idx, xs), src.desc.dtype) - m;
      sq += t * t;
    });
    double v = d.reduce_size > 0 ? sq / static_cast<double>(d.reduce_size) : 0.0;
    if (round_to_dtype(v, var.desc.dtype) <= 0.0) v = 1.0;
    if (d.variance_is_inv_std) v = 1.0 / std::sqrt(v + static_cast<double>(d.epsilon));
    store_from_double(mean.data(), c * ms, mean.desc.dtype, m);
    store_from_double(var.data(), c * vs, var.desc.dtype, v);
  }
  return ok_status();
}

}  // namespace

StatusOr<Buffer> allocate(const LogicalTensor& desc) {
  Buffer b;
  b.desc = desc;
  NG_ASSIGN_OR_RETURN(int64_t bytes, desc.buffer_bytes());
  b.bytes.assign(static_cast<size_t>(bytes), 0);
  return b;
}

StatusOr<std::map<int64_t, Buffer>> make_inputs(const Graph& graph, const Graph& lowered,
                                                const std::string& dir, uint64_t seed,
                                                std::map<int64_t, std::string>* sources,
                                                double data_offset) {
  std::map<int64_t, std::string> unused;
  if (sources == nullptr) sources = &unused;  // the caller does not want them
  std::map<int64_t, Buffer> inputs;
  Rng rng{seed};
  if (!dir.empty()) {
    // A .npy file that names no graph input is a mistake (a wrong id, a wrong
    // folder): say so rather than silently run on random data.
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) return not_found(dir + ": not a directory");
    std::set<std::string> ids;
    for (const LogicalTensor& lt : graph.graph_inputs()) ids.insert(std::to_string(lt.id));
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".npy" && !ids.count(e.path().stem().string())) {
        return invalid_argument(e.path().string() + ": names no input of the graph (inputs: " +
                                [&] {
                                  std::string l;
                                  for (const std::string& id : ids)
                                    l += (l.empty() ? "" : ", ") + id;
                                  return l;
                                }() +
                                ")");
      }
    }
  }
  for (const LogicalTensor& lt : graph.graph_inputs()) {
    NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
    const std::string path = dir.empty() ? "" : dir + "/" + std::to_string(lt.id) + ".npy";
    if (!path.empty() && std::filesystem::exists(path)) {
      if (lt.effective_strides() != dense_strides(lt.dims)) {
        return unimplemented(path + ": tensor " + std::to_string(lt.id) +
                             " is strided; .npy inputs need dense tensors");
      }
      NG_RETURN_IF_ERROR(read_npy_into(path, lt, b.data()));
      (*sources)[lt.id] = "file";
    } else {
      std::string role = role_of(lowered, lt.id);
      if (role.empty()) role = role_of(graph, lt.id);
      fill_random(b, role, rng, data_offset);
      (*sources)[lt.id] = "random";
    }
    inputs.emplace(lt.id, std::move(b));
  }
  // A BatchNormBackwardApply's count must be at least this process's elements
  // per channel: when random, it is exactly that (one process, the sums its own).
  for (const Op& op : lowered.ops()) {
    if (op.kind() != OpKind::kBatchNormBackwardApply || op.inputs().size() < 7) continue;
    const int64_t id = op.inputs()[6].id;
    auto it = inputs.find(id);
    if (it == inputs.end() || (*sources)[id] != "random") continue;
    auto elements = it->second.desc.element_count();
    if (!elements.ok() || *elements != 1) continue;
    NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
    store_from_double(it->second.data(), 0, it->second.desc.dtype,
                      static_cast<double>(d.reduce_size));
    (*sources)[id] = "local-count";
  }
  // Walk the graph with ref so that a batch norm whose src is computed (a fused
  // producer) still gets the statistics of the values it will really see.
  // Only the ops before the last batch norm that needs statistics run; with
  // file inputs or no such batch norm, nothing runs at all.
  // The batch norm's own backward, and the apply half of a synchronized one
  // (split-sync-batch-norm: its reduce half reads the same mean).
  struct StatisticsPorts {
    int64_t src = -1, mean = -1, variance = -1;
  };
  auto statistics_ports = [](const Op& op) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) {
      const BatchNormTrainingBackwardPorts p(op);
      return StatisticsPorts{p.src().id, p.mean().id, p.variance().id};
    }
    if (op.kind() == OpKind::kBatchNormBackwardApply) {
      const BatchNormBackwardApplyPorts p(op);
      return StatisticsPorts{p.src().id, p.mean().id, p.variance().id};
    }
    return StatisticsPorts{};
  };
  auto needs_statistics = [&](const Op& op) {
    const StatisticsPorts p = statistics_ports(op);
    if (p.src < 0) return false;
    return (*sources)[p.mean] == "random" && (*sources)[p.variance] == "random" &&
           inputs.count(p.mean) && inputs.count(p.variance);
  };
  size_t last = 0, k = 0;
  for (const Op& op : lowered.ops()) {
    ++k;
    if (needs_statistics(op)) last = k;
  }
  std::map<int64_t, Buffer> values;
  k = 0;
  for (const Op& op : lowered.ops()) {
    if (k++ == last) break;
    auto buffer_of = [&](int64_t id) -> Buffer* {
      if (auto it = inputs.find(id); it != inputs.end()) return &it->second;
      if (auto it = values.find(id); it != values.end()) return &it->second;
      return nullptr;
    };
    if (needs_statistics(op)) {
      const StatisticsPorts p = statistics_ports(op);
      Buffer* src = buffer_of(p.src);
      if (src == nullptr) return internal_error("src of " + op.label() + " has no value");
      NG_RETURN_IF_ERROR(set_batch_statistics(op, *src, inputs.at(p.mean), inputs.at(p.variance)));
      // Computed from src, not random: say so in `run`'s "inputs:" line.
      (*sources)[p.mean] = "batch-stats";
      (*sources)[p.variance] = "batch-stats";
    }
    if (k == last) break;  // nothing after it needs values
    std::vector<const void*> in;
    std::vector<void*> out;
    for (const LogicalTensor& lt : op.inputs()) {
      Buffer* b = buffer_of(lt.id);
      if (b == nullptr) {
        // Only an empty tensor (a dropped reserve space) may have no buffer.
        NG_ASSIGN_OR_RETURN(int64_t bytes, lt.buffer_bytes());
        if (bytes != 0) return internal_error("tensor " + std::to_string(lt.id) + " has no value");
        in.push_back(nullptr);
        continue;
      }
      in.push_back(b->data());
    }
    for (const LogicalTensor& lt : op.outputs()) {
      NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
      out.push_back(values.emplace(lt.id, std::move(b)).first->second.data());
    }
    NG_RETURN_IF_ERROR(reference_execute(op, in, out));
  }
  return inputs;
}

StatusOr<std::map<int64_t, Buffer>> run_outputs(const CompiledGraph& cg,
                                                const std::map<int64_t, Buffer>& inputs) {
  std::map<int64_t, const void*> in;
  for (const LogicalTensor& lt : cg.inputs()) {
    auto it = inputs.find(lt.id);
    if (it != inputs.end()) in[lt.id] = it->second.data();
  }
  std::map<int64_t, Buffer> out;
  std::map<int64_t, void*> ptrs;
  for (const LogicalTensor& lt : cg.outputs()) {
    NG_ASSIGN_OR_RETURN(Buffer b, allocate(lt));
    ptrs[lt.id] = out.emplace(lt.id, std::move(b)).first->second.data();
  }
  NG_RETURN_IF_ERROR(cg.execute(in, ptrs));
  return out;
}

ErrorStats compare(const Buffer& got, const Buffer& want) {
  ErrorStats e;
  double num = 0.0, den = 0.0;
  const Dims gs = got.desc.effective_strides(), ws = want.desc.effective_strides();
  for_each_index(want.desc.dims, -1, 0, [&](const std::vector<int64_t>& idx) {
    const double g = load_as_double(got.data(), offset_of(idx, gs), got.desc.dtype);
    const double w = load_as_double(want.data(), offset_of(idx, ws), want.desc.dtype);
    if (std::isnan(g) || std::isnan(w)) {
      if (std::isnan(g) != std::isnan(w)) ++e.nan_mismatch;
      return;
    }
    if (std::isinf(g) || std::isinf(w)) {
      if (g != w) ++e.nan_mismatch;
      return;
    }
    const double diff = std::fabs(g - w);
    ++e.elements;
    e.differing += diff > 0.0 ? 1 : 0;
    e.max_abs = std::max(e.max_abs, diff);
    num += diff * diff;
    den += w * w;
  });
  e.rel_l2 = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

double threshold_for(DataType dt, int64_t reduction_length) {
  const bool is_reduction = reduction_length > 0;
  double base = 0.0;
  switch (dt) {
    case DataType::kF32:
    case DataType::kF64:  // f64 results (the synchronized forward's sums) of f32-level arithmetic
      base = is_reduction ? 1e-5 : 6e-7;
      break;
    case DataType::kF16:
      base = is_reduction ? 1e-2 : 4.9e-3;
      break;
    case DataType::kBF16:
      base = is_reduction ? 1e-2 : 3.9e-2;  // reductions: one bf16 rounding on f32-level sums
      break;
    case DataType::kS8:
    case DataType::kU8:
      // Quantized data: x/scale rounded to an integer; a kernel that multiplies by
      // 1/scale may land a tie on the other side, one unit off in a few elements.
      return 1e-2;
    default:
      return 0.0;
  }
  if (!is_reduction) return base;
  // A sum of M terms accumulated in f32 (every backend accumulates at least in
  // f32) carries a relative error that grows like eps * sqrt(M) for data of
  // random sign (a random walk of rounding errors); oneDNN's blocked sums sit
  // within a small factor of it. The limit is the larger of the dtype's base and
  // kReductionSafety * eps_f32 * sqrt(M).
  constexpr double kEpsF32 = 1.1920928955078125e-07;  // 2^-23
  constexpr double kReductionSafety = 4.0;
  return std::max(base,
                  kReductionSafety * kEpsF32 * std::sqrt(static_cast<double>(reduction_length)));
}

double test_threshold_for(DataType dt, int64_t reduction_length) {
  if (reduction_length == 0 && dt == DataType::kF16) return 1e-3;
  if (reduction_length == 0 && dt == DataType::kBF16) return 1e-2;
  return threshold_for(dt, reduction_length);
}

double element_bound_ratio(const Buffer& got, const Buffer& want) {
  const int mantissa_bits = want.desc.dtype == DataType::kBF16  ? 7
                            : want.desc.dtype == DataType::kF16 ? 10
                                                                : 23;
  const double eps = std::ldexp(1.0, -mantissa_bits);
  const Dims gs = got.desc.effective_strides(), ws = want.desc.effective_strides();
  double sum_sq = 0.0;
  int64_t n = 0;
  for_each_index(want.desc.dims, -1, 0, [&](const std::vector<int64_t>& idx) {
    const double w = load_as_double(want.data(), offset_of(idx, ws), want.desc.dtype);
    if (std::isfinite(w)) {
      sum_sq += w * w;
      ++n;
    }
  });
  const double rms = n > 0 ? std::sqrt(sum_sq / static_cast<double>(n)) : 0.0;
  // An all-zero reference (diff_src of one value per channel) has no scale to
  // bound against: its absolute L2 is compare()'s business.
  if (rms == 0.0) return 0.0;
  double worst = 0.0;
  for_each_index(want.desc.dims, -1, 0, [&](const std::vector<int64_t>& idx) {
    const double g = load_as_double(got.data(), offset_of(idx, gs), got.desc.dtype);
    const double w = load_as_double(want.data(), offset_of(idx, ws), want.desc.dtype);
    if (!std::isfinite(g) || !std::isfinite(w)) {
      const bool same = (std::isnan(g) && std::isnan(w)) || g == w;
      if (!same) worst = INFINITY;
      return;
    }
    int e = 0;
    std::frexp(w, &e);  // |w| in [2^(e-1), 2^e)
    const double ulp = w == 0.0 ? 0.0 : std::ldexp(1.0, e - 1 - mantissa_bits);
    const double bound = 2.0 * ulp + 2.0 * eps * rms;
    const double diff = std::fabs(g - w);
    worst = std::max(worst, bound > 0.0 ? diff / bound : (diff > 0.0 ? INFINITY : 0.0));
  });
  return worst;
}

int64_t reduction_length(const Graph& graph, int64_t tensor_id) {
  const Op* producer = graph.producer(tensor_id);
  if (producer == nullptr) return 0;
  const Op& op = *producer;
  if (op.kind() != OpKind::kBatchNormTrainingBackward &&
      op.kind() != OpKind::kBatchNormTrainingBackwardFromDst &&
      op.kind() != OpKind::kBatchNormForwardTraining &&
      op.kind() != OpKind::kBatchNormBackwardReduce &&  // its sum_dy and sum_dy_xm
      op.kind() != OpKind::kBatchNormBackwardApply &&   // a synchronized backward's diff_gamma/beta
      op.kind() != OpKind::kBatchNormForwardReduce &&   // its sum and M2
      op.kind() != OpKind::kBatchNormForwardApply)      // the statistics outputs
    return 0;
  const bool reduce =
      op.kind() == OpKind::kBatchNormBackwardReduce || op.kind() == OpKind::kBatchNormForwardReduce;
  for (size_t i = reduce ? 0 : 1; i < op.outputs().size() && (!reduce || i < 2); ++i) {
    if (op.outputs()[i].id != tensor_id || op.outputs()[i].rank() != 1) continue;
    auto d = describe_batch_norm(op);
    return d.ok() ? std::max<int64_t>(d->reduce_size, 1) : 1;
  }
  return 0;
}

}  // namespace oracle
}  // namespace normgrad
