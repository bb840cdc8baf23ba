// Partition: printing helpers and the roles a match bound.
#include <normgrad/graph/partition.hpp>

namespace normgrad {

const char* fusion_role_name(FusionRole role) {
  switch (role) {
    case FusionRole::kAnchor:
      return "anchor";
    case FusionRole::kSrcProducer:
      return "src";
    case FusionRole::kDiffDstProducer:
      return "diff_dst";
    case FusionRole::kGradientAdd:
      return "gradient_add";
    case FusionRole::kResidualAdd:
      return "residual";
    case FusionRole::kActivation:
      return "activation";
    case FusionRole::kSibling:
      return "sibling";
    case FusionRole::kDequantize:
      return "dequantize";
    case FusionRole::kQuantize:
      return "quantize";
    case FusionRole::kMember:
      return "member";
  }
  return "member";
}

const Op* Partition::bound(FusionRole role) const {
  for (const BoundOp& b : roles) {
    if (b.role != role) continue;
    for (const Op& op : ops) {
      if (op.id() == b.op_id) return &op;
    }
  }
  return nullptr;
}

Partition Partition::without(int64_t op_id) const {
  Partition p = *this;
  p.ops.clear();
  p.roles.clear();
  for (const Op& op : ops) {
    if (op.id() != op_id) p.ops.push_back(op);
  }
  for (const BoundOp& b : roles) {
    if (b.op_id != op_id) p.roles.push_back(b);
  }
  return p;
}

int64_t Partition::anchor() const {
  for (const BoundOp& b : roles) {
    if (b.role == FusionRole::kAnchor) return b.op_id;
  }
  return -1;
}

std::string Partition::ops_string() const {
  std::string s;
  for (const Op& op : ops) s += (s.empty() ? "" : "+") + std::string(op.kind_spelling());
  return s;
}

}  // namespace normgrad
