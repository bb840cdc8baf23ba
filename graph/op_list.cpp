// OpList: the linked list of ops with order keys and an id index.
#include <normgrad/graph/op_list.hpp>

#include <cassert>
#include <iterator>

namespace normgrad {
namespace {

// The spacing of fresh keys: 32 inserts at one place before the list is
// keyed again, and 2^31 ops before a key could overflow.
constexpr int64_t kKeyGap = int64_t{1} << 32;

}  // namespace

OpList::OpList(const OpList& other) : ops_(other.ops_) {
  reindex();
}

OpList& OpList::operator=(const OpList& other) {
  if (this != &other) {
    ops_ = other.ops_;
    reindex();
  }
  return *this;
}

const Op& OpList::at(size_t k) const {
  assert(k < ops_.size() && "OpList::at past the end");
  return *std::next(ops_.begin(), static_cast<std::ptrdiff_t>(k));
}

Op* OpList::find(int64_t op_id) {
  auto it = nodes_.find(op_id);
  return it == nodes_.end() ? nullptr : &*it->second.it;
}

const Op* OpList::find(int64_t op_id) const {
  auto it = nodes_.find(op_id);
  return it == nodes_.end() ? nullptr : &*it->second.it;
}

int64_t OpList::order(int64_t op_id) const {
  auto it = nodes_.find(op_id);
  return it == nodes_.end() ? -1 : it->second.key;
}

Op& OpList::push_back(Op op) {
  const int64_t key = ops_.empty() ? kKeyGap : nodes_.at(ops_.back().id()).key + kKeyGap;
  const int64_t id = op.id();
  ops_.push_back(std::move(op));
  nodes_[id] = Node{std::prev(ops_.end()), key};
  return ops_.back();
}

Op& OpList::insert(Op op, int64_t before_id) {
  Node& before = nodes_.at(before_id);
  auto key_below = [&] {
    return before.it == ops_.begin() ? int64_t{0} : nodes_.at(std::prev(before.it)->id()).key;
  };
  if (before.key - key_below() < 2) rekey();  // no key left between the two
  const int64_t key = key_below() + (before.key - key_below()) / 2;
  const int64_t id = op.id();
  auto it = ops_.insert(before.it, std::move(op));
  nodes_[id] = Node{it, key};
  return *it;
}

Op OpList::erase(int64_t op_id) {
  auto node = nodes_.find(op_id);
  assert(node != nodes_.end() && "OpList::erase of an op not in the list");
  Op gone = std::move(*node->second.it);
  ops_.erase(node->second.it);
  nodes_.erase(node);
  return gone;
}

Op OpList::replace(int64_t op_id, Op op) {
  auto node = nodes_.find(op_id);
  assert(node != nodes_.end() && "OpList::replace of an op not in the list");
  const Node kept = node->second;
  Op old = std::move(*kept.it);
  *kept.it = std::move(op);
  nodes_.erase(node);
  nodes_[kept.it->id()] = kept;
  return old;
}

void OpList::permute(const std::vector<size_t>& order) {
  assert(order.size() == ops_.size() && "OpList::permute needs every op once");
  std::vector<iterator> at;
  at.reserve(ops_.size());
  for (auto it = ops_.begin(); it != ops_.end(); ++it) at.push_back(it);
  for (size_t k : order) ops_.splice(ops_.end(), ops_, at[k]);  // nodes move, iterators hold
  rekey();
}

void OpList::assign(std::vector<Op> ops) {
  ops_.assign(std::make_move_iterator(ops.begin()), std::make_move_iterator(ops.end()));
  reindex();
}

void OpList::rekey() {
  int64_t key = 0;
  for (const Op& op : ops_) nodes_.at(op.id()).key = key += kKeyGap;
}

void OpList::reindex() {
  nodes_.clear();
  nodes_.reserve(ops_.size());
  repeated_id_ = -1;
  int64_t key = 0;
  for (auto it = ops_.begin(); it != ops_.end(); ++it) {
    // The first op of an id keeps the entry; finalize refuses a repeated id.
    if (!nodes_.emplace(it->id(), Node{it, key += kKeyGap}).second && repeated_id_ < 0)
      repeated_id_ = it->id();
  }
}

}  // namespace normgrad
