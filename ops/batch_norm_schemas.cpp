// Schemas of the batch-norm family: BatchNormTrainingBackward,
// BatchNormForwardTraining and BatchNormInference, as oneDNN Graph defines them.
//
// Beyond oneDNN: ranks 2 to 6 for every layout, a backward with 4 inputs and 3
// outputs (gamma = 1), and bf16 statistics for bf16 data.
#include <cmath>

#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace {

constexpr int kMinRank = 2;
constexpr int kMaxBnRank = 6;

// Port names copied out of a schema, so rules can be built before the schema is registered.
struct PortNames {
  std::vector<std::string> in, out;
  explicit PortNames(const OpSchema& s) {
    for (const PortSpec& p : s.inputs()) in.push_back(p.name);
    for (const PortSpec& p : s.outputs()) out.push_back(p.name);
  }
  const std::string& of(bool is_input, size_t i) const { return is_input ? in.at(i) : out.at(i); }
};

DataFormat format_of(const Op& op) {
  auto it = op.attrs().find("data_format");
  if (it == op.attrs().end()) return DataFormat::kNXC;  // oneDNN Graph's default
  return std::get<std::string>(it->second) == "NCX" ? DataFormat::kNCX : DataFormat::kNXC;
}

Status check_epsilon(const Op& op) {
  auto eps = op.attr_f32("epsilon");
  if (!eps.ok()) return ok_status();  // missing is reported by the structural check
  if (!std::isfinite(*eps) || *eps < 0.f) {
    return invalid_argument(op.label() + ": attribute 'epsilon' must be finite and >= 0, got " +
                            std::to_string(*eps));
  }
  return ok_status();
}

// A port of fixed dtype and dims outside the T/U classes: the synchronized
// backward's f32 sums and s64 element count.
struct FixedPort {
  bool is_input;
  size_t index;
  DataType dtype;
  bool scalar;  // dims {1} (else 1-D with C elements)
};
using FixedPorts = std::vector<FixedPort>;

const FixedPort* find_fixed(const FixedPorts& fixed, bool is_input, size_t i) {
  for (const FixedPort& f : fixed) {
    if (f.is_input == is_input && f.index == i) return &f;
  }
  return nullptr;
}

// Data ports share T in {f32, bf16, f16}; statistics ports share U, which is
// f32, or bf16 when T is bf16; fixed ports have their own dtype.
OpSchema::Rule bn_dtype_rule(PortNames names, std::vector<size_t> data_in,
                             std::vector<size_t> data_out, FixedPorts fixed = {}) {
  return [names, data_in, data_out, fixed](const Op& op) -> Status {
    const DataType t = op.inputs()[data_in[0]].dtype;
    auto is_data_in = [&](size_t i) {
      return std::find(data_in.begin(), data_in.end(), i) != data_in.end();
    };
    auto is_data_out = [&](size_t i) {
      return std::find(data_out.begin(), data_out.end(), i) != data_out.end();
    };
    std::optional<DataType> u;
    bool u_is_input = false;
    size_t u_index = 0;
    // Labels are built only for a message: this rule runs on every op of a graph.
    auto label = [&](bool is_input, size_t i) {
      return port_label(op, is_input, i, names.of(is_input, i));
    };
    auto check = [&](bool is_input, size_t i, DataType dt) -> Status {
      const bool data = is_input ? is_data_in(i) : is_data_out(i);
      if (const FixedPort* f = find_fixed(fixed, is_input, i)) {
        if (dt != f->dtype)
          return invalid_argument(label(is_input, i) + ": dtype " + dtype_name(dt) + ", expected " +
                                  dtype_name(f->dtype));
        return ok_status();
      }
      if (data) {
        if (dt != t) {
          return invalid_argument(label(is_input, i) + ": dtype " + dtype_name(dt) +
                                  " differs from src's " + dtype_name(t));
        }
        return ok_status();
      }
      if (!u) {
        if (dt != DataType::kF32 && !(t == DataType::kBF16 && dt == DataType::kBF16)) {
          return invalid_argument(label(is_input, i) + ": dtype " + dtype_name(dt) +
                                  " is not allowed with " + dtype_name(t) +
                                  " data (statistics are f32" +
                                  (t == DataType::kBF16 ? " or bf16)" : ")"));
        }
        u = dt;
        u_is_input = is_input;
        u_index = i;
      } else if (dt != *u) {
        return invalid_argument(label(is_input, i) + ": dtype " + dtype_name(dt) +
                                " differs from " + label(u_is_input, u_index) + "'s " +
                                dtype_name(*u) + " (statistics share one dtype)");
      }
      return ok_status();
    };
    for (size_t i = 0; i < op.inputs().size(); ++i)
      NG_RETURN_IF_ERROR(check(true, i, op.inputs()[i].dtype));
    for (size_t i = 0; i < op.outputs().size(); ++i)
      NG_RETURN_IF_ERROR(check(false, i, op.outputs()[i].dtype));
    return ok_status();
  };
}

// Data inputs share the dims of input 0, rank 2..6; statistics ports are 1-D with C elements.
OpSchema::ShapeRule bn_shape_rule(PortNames names, std::vector<size_t> data_in,
                                  std::vector<size_t> data_out, FixedPorts fixed = {}) {
  return [names, data_in, data_out, fixed](Op& op) -> Status {
    const LogicalTensor& src = op.inputs()[data_in[0]];
    auto where = [&](size_t i) { return port_label(op, true, i, names.in.at(i)); };
    if (src.rank() < kMinRank || src.rank() > kMaxBnRank) {
      return invalid_argument(where(data_in[0]) + ": rank " + std::to_string(src.rank()) +
                              " is not supported (expected 2 to 6), shape " +
                              dims_to_string(src.dims));
    }
    const int caxis = format_of(op) == DataFormat::kNCX ? 1 : src.rank() - 1;
    const int64_t c = src.dims[caxis];
    for (size_t i = 0; i < op.inputs().size(); ++i) {
      const LogicalTensor& lt = op.inputs()[i];
      const FixedPort* f = find_fixed(fixed, true, i);
      if (f && f->scalar) {
        if (lt.dims != Dims{1})
          return invalid_argument(where(i) + ": must have shape [1], got " +
                                  dims_to_string(lt.dims));
        continue;
      }
      if (std::find(data_in.begin(), data_in.end(), i) != data_in.end()) {
        if (lt.dims != src.dims) {
          return invalid_argument(where(i) + ": shape " + dims_to_string(lt.dims) +
                                  " differs from src's " + dims_to_string(src.dims));
        }
      } else if (lt.rank() != 1 || lt.dims[0] != c) {
        if (lt.rank() == 1) {
          return invalid_argument(where(i) + " has " + std::to_string(lt.dims[0]) +
                                  " elements, expected C=" + std::to_string(c));
        }
        return invalid_argument(where(i) + ": must be 1-D with C=" + std::to_string(c) +
                                " elements, got shape " + dims_to_string(lt.dims));
      }
    }
    for (size_t i = 0; i < op.outputs().size(); ++i) {
      const bool data = std::find(data_out.begin(), data_out.end(), i) != data_out.end();
      const FixedPort* f = find_fixed(fixed, false, i);
      const Dims want = data ? src.dims : (f && f->scalar) ? Dims{1} : Dims{c};
      NG_RETURN_IF_ERROR(set_or_check_dims(op, i, names.out.at(i), want));
    }
    return ok_status();
  };
}

const std::vector<std::string> kFormats = {"NCX", "NXC"};

void add_bn_rules(OpSchema& s, std::vector<size_t> data_in, std::vector<size_t> data_out,
                  FixedPorts fixed = {}) {
  // Every port that is not data is a per-channel vector (or, fixed and
  // scalar, Reduce's count).
  for (size_t i = 0; i < s.inputs().size(); ++i) {
    const FixedPort* f = find_fixed(fixed, true, i);
    if (std::find(data_in.begin(), data_in.end(), i) == data_in.end() && !(f && f->scalar))
      s.per_channel(true, i);
  }
  for (size_t i = 0; i < s.outputs().size(); ++i) {
    const FixedPort* f = find_fixed(fixed, false, i);
    if (std::find(data_out.begin(), data_out.end(), i) == data_out.end() && !(f && f->scalar))
      s.per_channel(false, i);
  }
  const PortNames names(s);
  s.rule(check_epsilon).rule(bn_dtype_rule(names, data_in, data_out, fixed));
  s.shape_rule(bn_shape_rule(names, data_in, data_out, fixed));
  if (!fixed.empty())
    s.dtypes({DataType::kF32, DataType::kBF16, DataType::kF16, DataType::kF64, DataType::kS64});
}

// The synchronized backward's halves (docs/ops/BatchNormBackwardReduce.md,
// BatchNormBackwardApply.md): Reduce's per-process sums are summed across
// processes (AllReduce) and Apply finishes with the global ones.
void register_split_schemas(OpRegistry& registry) {
  {
    OpSchema s(OpKind::kBatchNormBackwardReduce);
    add_declared_ports(s);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    add_bn_rules(s, {0, 1}, {},
                 {{false, 0, DataType::kF32, false},
                  {false, 1, DataType::kF32, false},
                  {false, 2, DataType::kS64, true}});
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kBatchNormBackwardApply);
    add_declared_ports(s);
    s.output_counts({1, 3});
    s.attr("epsilon", AttrKind::kF32, true);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    s.attr("variance_is_inv_std", AttrKind::kBool, false, false);
    // false: frozen statistics (diff_src = gamma s dy; the sums feed diff_gamma/diff_beta only).
    s.attr("is_training", AttrKind::kBool, false, true);
    add_bn_rules(s, {0, 1}, {0},
                 {{true, 4, DataType::kF32, false},
                  {true, 5, DataType::kF32, false},
                  {true, 6, DataType::kS64, true}});
    registry.add(std::move(s));
  }
}

// The synchronized forward's parts (docs/ops/BatchNormForwardReduce.md,
// BatchNormForwardMerge.md, BatchNormForwardApply.md): each process's sum,
// M2 about its own mean and count; the global sum and count (AllReduce);
// each process's M2 moved to the global mean (Merge), summed (AllReduce);
// and the normalisation with the global statistics. Everything between the
// halves is f64: Chan's merge, without cancellation.
void register_forward_split_schemas(OpRegistry& registry) {
  {
    OpSchema s(OpKind::kBatchNormForwardReduce);
    add_declared_ports(s);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    add_bn_rules(s, {0}, {},
                 {{false, 0, DataType::kF64, false},
                  {false, 1, DataType::kF64, false},
                  {false, 2, DataType::kS64, true}});
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kBatchNormForwardMerge);
    add_declared_ports(s);
    s.dtypes({DataType::kF64, DataType::kS64});
    using P = BatchNormForwardMergePorts;
    for (size_t i : {P::local_sum_port(), P::local_m2_port(), P::sum_port()})
      s.per_channel(true, i);
    s.per_channel(false, P::m2_part_port());
    s.rule([](const Op& op) -> Status {
      const P p(op);
      for (size_t i = 0; i < op.inputs().size(); ++i) {
        const bool count = i == P::local_count_port() || i == P::count_port();
        const DataType want = count ? DataType::kS64 : DataType::kF64;
        if (op.inputs()[i].dtype != want)
          return invalid_argument(
              port_label(op, true, i, op_registry().find(op.kind())->input_name(i)) + ": dtype " +
              dtype_name(op.inputs()[i].dtype) + ", expected " + dtype_name(want));
      }
      if (p.m2_part().dtype != DataType::kF64)
        return invalid_argument(port_label(op, false, 0, "m2_part") + ": dtype " +
                                dtype_name(p.m2_part().dtype) + ", expected f64");
      return ok_status();
    });
    s.shape_rule([](Op& op) -> Status {
      const P p(op);
      const Dims& c = p.local_sum().dims;
      if (c.size() != 1)
        return invalid_argument(port_label(op, true, 0, "local_sum") + ": must be 1-D, got " +
                                dims_to_string(c));
      for (size_t i : {P::local_m2_port(), P::sum_port()}) {
        if (op.inputs()[i].dims != c)
          return invalid_argument(
              port_label(op, true, i, op_registry().find(op.kind())->input_name(i)) + ": shape " +
              dims_to_string(op.inputs()[i].dims) + " differs from local_sum's " +
              dims_to_string(c));
      }
      for (size_t i : {P::local_count_port(), P::count_port()}) {
        if (op.inputs()[i].dims != Dims{1})
          return invalid_argument(
              port_label(op, true, i, op_registry().find(op.kind())->input_name(i)) +
              ": must have shape [1], got " + dims_to_string(op.inputs()[i].dims));
      }
      return set_or_check_dims(op, P::m2_part_port(), "m2_part", c);
    });
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kBatchNormForwardApply);
    add_declared_ports(s);
    s.input_counts({6, 8});
    s.attr("epsilon", AttrKind::kF32, true);
    s.attr("momentum", AttrKind::kF32, false, 0.1f);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    using P = BatchNormForwardApplyPorts;
    add_bn_rules(s, {P::src_port()}, {P::dst_port()},
                 {{true, P::sum_port(), DataType::kF64, false},
                  {true, P::m2_port(), DataType::kF64, false},
                  {true, P::count_port(), DataType::kS64, true}});
    s.inplace(P::src_port(), P::dst_port());
    registry.add(std::move(s));
  }
}

// The activation a BatchNormTrainingBackwardFromDst inverts, and its alpha.
Status check_from_dst_activation(const Op& op) {
  const std::string act = op.has_attr("activation") ? *op.attr_string("activation") : "identity";
  if (act == "relu") {
    return invalid_argument(op.label() +
                            ": attribute 'activation' relu has no inverse (every negative value "
                            "becomes 0, so src cannot be recovered from dst); use leaky_relu, or "
                            "BatchNormTrainingBackward with src");
  }
  if (act != "identity" && act != "leaky_relu") {
    return invalid_argument(op.label() + ": attribute 'activation' is '" + act +
                            "', expected identity or leaky_relu");
  }
  if (act == "identity") {
    if (op.has_attr("alpha"))
      return invalid_argument(op.label() + ": attribute 'alpha' is only read with leaky_relu");
    return ok_status();
  }
  if (!op.has_attr("alpha"))
    return invalid_argument(op.label() + ": attribute 'alpha' is required with leaky_relu");
  NG_ASSIGN_OR_RETURN(float alpha, op.attr_f32("alpha"));
  if (!std::isfinite(alpha) || alpha <= 0.f) {
    return invalid_argument(op.label() + ": attribute 'alpha' must be finite and > 0 (leaky_relu " +
                            "is inverted by dividing by it), got " + std::to_string(alpha));
  }
  return ok_status();
}

// The training backward recomputed from the forward's output (InPlace-ABN;
// docs/ops/BatchNormTrainingBackwardFromDst.md).
void register_from_dst_schema(OpRegistry& registry) {
  OpSchema s(OpKind::kBatchNormTrainingBackwardFromDst);
  add_declared_ports(s);  // residual: dst = act(bn(src) + residual)
  s.output_counts({1, 3});
  s.attr("epsilon", AttrKind::kF32, true);
  s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
  s.attr("activation", AttrKind::kString, false, std::string("identity"));
  s.attr("alpha", AttrKind::kF32, false);
  s.rule(check_from_dst_activation);
  add_bn_rules(s, {0, 1, 5}, {0});
  s.inplace(BatchNormTrainingBackwardFromDstPorts::diff_dst_port(),
            BatchNormTrainingBackwardFromDstPorts::diff_src_port());
  registry.add(std::move(s));
}

}  // namespace

const char* data_format_name(DataFormat f) {
  return f == DataFormat::kNCX ? "NCX" : "NXC";
}

void register_batch_norm_schemas(OpRegistry& registry) {
  register_split_schemas(registry);
  register_forward_split_schemas(registry);
  {
    OpSchema s(OpKind::kBatchNormTrainingBackward);
    add_declared_ports(s);
    s.output_counts({1, 3});
    s.attr("epsilon", AttrKind::kF32, true);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    // normgrad extensions, set by the canonicalisation pass
    // (docs/ops/BatchNormTrainingBackward.md).
    s.attr("is_training", AttrKind::kBool, false);
    s.attr("variance_is_inv_std", AttrKind::kBool, false, false);
    // normgrad extension: the process group whose whole batch the statistics
    // cover; the split-sync-batch-norm pass splits the op around an AllReduce.
    s.attr("sync_group", AttrKind::kString, false);
    add_bn_rules(s, {0, 1}, {0});
    s.inplace(BatchNormTrainingBackwardPorts::diff_dst_port(),
              BatchNormTrainingBackwardPorts::diff_src_port());
    registry.add(std::move(s));
  }
  register_from_dst_schema(registry);
  {
    OpSchema s(OpKind::kBatchNormForwardTraining);
    add_declared_ports(s);
    s.input_counts({3, 5});
    s.attr("epsilon", AttrKind::kF32, true);
    s.attr("momentum", AttrKind::kF32, false, 0.1f);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    // normgrad extension: the statistics cover the group's whole batch
    // (split-sync-batch-norm: Reduce, AllReduce, Merge, AllReduce, Apply).
    s.attr("sync_group", AttrKind::kString, false);
    add_bn_rules(s, {0}, {0});
    s.inplace(BatchNormForwardTrainingPorts::src_port(), BatchNormForwardTrainingPorts::dst_port());
    registry.add(std::move(s));
  }
  {
    OpSchema s(OpKind::kBatchNormInference);
    add_declared_ports(s);
    s.attr("epsilon", AttrKind::kF32, true);
    s.attr("data_format", AttrKind::kString, false, std::string("NXC"), kFormats);
    add_bn_rules(s, {0}, {0});
    s.inplace(BatchNormInferencePorts::src_port(), BatchNormInferencePorts::dst_port());
    registry.add(std::move(s));
  }
}

bool view_channels_last(BatchNormDesc* d, std::initializer_list<const LogicalTensor*> data) {
  if (d->format != DataFormat::kNCX || d->dims.size() < 3) return false;
  bool any_strided = false;  // all dense: the NCX walk as it is
  for (const LogicalTensor* lt : data) {
    if (lt == nullptr) continue;
    const Dims s = lt->effective_strides();
    if (lt->dims != d->dims || !same_layout(lt->dims, s, channels_last_strides(lt->dims)))
      return false;
    any_strided = any_strided || !same_layout(lt->dims, s, dense_strides(lt->dims));
  }
  if (!any_strided) return false;
  Dims nxc = {d->dims[0]};
  nxc.insert(nxc.end(), d->dims.begin() + 2, d->dims.end());
  nxc.push_back(d->dims[1]);
  d->dims = nxc;
  d->format = DataFormat::kNXC;
  d->channel_axis = static_cast<int>(nxc.size()) - 1;
  return true;
}

StatusOr<BatchNormDesc> describe_batch_norm(const Op& op) {
  BatchNormDesc d;
  d.kind = op.kind();
  if (op.kind() != OpKind::kBatchNormTrainingBackward &&
      op.kind() != OpKind::kBatchNormForwardTraining && op.kind() != OpKind::kBatchNormInference &&
      op.kind() != OpKind::kBatchNormBackwardReduce &&
      op.kind() != OpKind::kBatchNormBackwardApply &&
      op.kind() != OpKind::kBatchNormTrainingBackwardFromDst &&
      op.kind() != OpKind::kBatchNormForwardReduce && op.kind() != OpKind::kBatchNormForwardApply) {
    return invalid_argument(op.label() + ": not a batch-norm op");
  }
  d.format = format_of(op);
  d.dims = op.inputs()[0].dims;
  if (d.dims.size() < 2) return invalid_argument(op.label() + ": shapes are not inferred");
  d.channel_axis = d.format == DataFormat::kNCX ? 1 : static_cast<int>(d.dims.size()) - 1;
  d.channels = d.dims[d.channel_axis];
  NG_ASSIGN_OR_RETURN(int64_t total, checked_product(d.dims, op.label()));
  d.reduce_size = d.channels == 0 ? 0 : total / d.channels;
  if (op.kind() != OpKind::kBatchNormBackwardReduce &&
      op.kind() != OpKind::kBatchNormForwardReduce) {
    NG_ASSIGN_OR_RETURN(d.epsilon, op.attr_f32("epsilon"));
  }
  if (op.has_attr("momentum")) {
    NG_ASSIGN_OR_RETURN(d.momentum, op.attr_f32("momentum"));
  }
  d.data_dt = op.inputs()[0].dtype;
  switch (op.kind()) {
    case OpKind::kBatchNormTrainingBackward:
      d.stats_dt = op.inputs()[2].dtype;
      d.has_gamma = op.inputs().size() == 5;
      d.diff_scale_shift = op.outputs().size() == 3;
      if (op.has_attr("is_training")) {
        NG_ASSIGN_OR_RETURN(bool training, op.attr_bool("is_training"));
        d.mode = training ? BackwardMode::kTraining : BackwardMode::kFrozen;
        d.use_gamma = d.has_gamma;
      } else {
        // oneDNN Graph: the single-output form is frozen and ignores gamma.
        d.mode = d.diff_scale_shift ? BackwardMode::kTraining : BackwardMode::kFrozen;
        d.use_gamma = d.has_gamma && d.diff_scale_shift;
      }
      if (op.has_attr("variance_is_inv_std")) {
        NG_ASSIGN_OR_RETURN(d.variance_is_inv_std, op.attr_bool("variance_is_inv_std"));
      }
      break;
    case OpKind::kBatchNormTrainingBackwardFromDst:
      d.stats_dt = op.inputs()[2].dtype;
      d.has_gamma = d.use_gamma = true;
      d.diff_scale_shift = op.outputs().size() == 3;
      d.from_dst = true;
      d.from_dst_residual = op.inputs().size() == 6;
      if (op.has_attr("activation") && *op.attr_string("activation") == "leaky_relu") {
        NG_ASSIGN_OR_RETURN(d.alpha, op.attr_f32("alpha"));
      }
      break;
    case OpKind::kBatchNormForwardTraining:
      d.stats_dt = op.inputs()[1].dtype;
      d.has_gamma = op.inputs().size() == 5;
      break;
    case OpKind::kBatchNormBackwardReduce:
      d.stats_dt = op.inputs()[2].dtype;
      d.phase = BackwardPhase::kReduce;
      break;
    case OpKind::kBatchNormForwardReduce:
      d.stats_dt = DataType::kF32;  // its outputs are f64 sums; no statistics input
      d.phase = BackwardPhase::kReduce;
      break;
    case OpKind::kBatchNormForwardApply: {
      const BatchNormForwardApplyPorts p(op);
      d.stats_dt = p.mean().dtype;
      d.phase = BackwardPhase::kApply;
      d.has_gamma = p.has_gamma();
      break;
    }
    case OpKind::kBatchNormBackwardApply:
      d.stats_dt = op.inputs()[2].dtype;
      d.phase = BackwardPhase::kApply;
      d.has_gamma = d.use_gamma = op.inputs().size() == 8;
      d.diff_scale_shift = op.outputs().size() == 3;
      if (op.has_attr("variance_is_inv_std")) {
        NG_ASSIGN_OR_RETURN(d.variance_is_inv_std, op.attr_bool("variance_is_inv_std"));
      }
      if (op.has_attr("is_training")) {
        NG_ASSIGN_OR_RETURN(bool training, op.attr_bool("is_training"));
        d.mode = training ? BackwardMode::kTraining : BackwardMode::kFrozen;
      }
      break;
    default:
      d.stats_dt = op.inputs()[1].dtype;
      d.has_gamma = true;
      break;
  }
  return d;
}

}  // namespace normgrad

namespace normgrad {

Status check_global_count(const std::string& who, const BatchNormDesc& d, double count) {
  if (count >= static_cast<double>(d.reduce_size)) return ok_status();
  return invalid_argument(who + ": input 6 'count' " + std::to_string(count) +
                          " is below this process's " + std::to_string(d.reduce_size) +
                          " elements per channel (it must be the sum over every process)");
}

Status check_forward_count(const std::string& who, int64_t local, double count) {
  if (count >= static_cast<double>(local) && count > 0) return ok_status();
  return invalid_argument(who + ": input 'count' " + std::to_string(static_cast<int64_t>(count)) +
                          (count <= 0 ? " is 0: every process's batch is empty, so there are "
                                        "no batch statistics"
                                      : " is below this process's " + std::to_string(local) +
                                            " elements per channel (it must be the sum over "
                                            "every process)"));
}

Status check_from_dst_gamma(const std::string& who, int64_t c, double gamma) {
  if (std::isfinite(gamma) && std::fabs(gamma) >= kMinFromDstGamma) return ok_status();
  return invalid_argument(who + ": input 3 'gamma' is " + std::to_string(gamma) + " on channel " +
                          std::to_string(c) + "; x̂ = (y - beta) / gamma needs |gamma| >= 1e-12 " +
                          "(InPlace-ABN keeps gamma as |gamma| + eps)");
}

}  // namespace normgrad
