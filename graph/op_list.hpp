// OpList: a graph's ops in order, at stable addresses, edited in O(1).
//
// The ops live in a linked list, so inserting or erasing one moves no other
// op and invalidates no reference to one. Each op has an order key, a number
// that grows along the list (keys leave gaps, so a new op between two takes
// the midpoint; when a gap runs out the whole list is keyed again, which the
// gaps make rare): comparing two ops' places is O(1) without indices, and an
// edit never renumbers the ops after it. Lookup by op id is a hash map.
//
// Range-for, size(), front() and back() read it like the vector it used to
// be. at(k) walks k ops: it is there for tests and small tools, not for
// loops. to_vector() copies the ops.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include <normgrad/graph/op.hpp>

namespace normgrad {

class OpList {
 public:
  using const_iterator = std::list<Op>::const_iterator;
  using iterator = std::list<Op>::iterator;

  OpList() = default;
  OpList(const OpList& other);
  OpList& operator=(const OpList& other);
  OpList(OpList&&) = default;  // std::list keeps its nodes (and our iterators) on a move
  OpList& operator=(OpList&&) = default;

  const_iterator begin() const { return ops_.begin(); }
  const_iterator end() const { return ops_.end(); }
  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  const Op& front() const { return ops_.front(); }
  const Op& back() const { return ops_.back(); }
  const Op& at(size_t k) const;
  std::vector<Op> to_vector() const { return {ops_.begin(), ops_.end()}; }

  // The owner's editing side (Graph). Ids must be unique; the callers check.
  iterator begin() { return ops_.begin(); }
  iterator end() { return ops_.end(); }
  Op* find(int64_t op_id);
  const Op* find(int64_t op_id) const;
  // The op's order key (positive, growing along the list), or -1.
  int64_t order(int64_t op_id) const;
  Op& push_back(Op op);
  // Before op `before_id`, which must be in the list.
  Op& insert(Op op, int64_t before_id);
  // Removes op `op_id` (which must be in the list) and returns it.
  Op erase(int64_t op_id);
  // Puts `op` at op `op_id`'s place and key; returns the op it replaced.
  Op replace(int64_t op_id, Op op);
  // Reorders the ops: `order[k]` is the current place of the op that goes k-th.
  void permute(const std::vector<size_t>& order);
  void assign(std::vector<Op> ops);
  // An id that two ops of the list share (assign() takes any list; the
  // other edits keep ids unique), or -1.
  int64_t repeated_id() const { return repeated_id_; }

 private:
  struct Node {
    iterator it;
    int64_t key = 0;
  };
  void rekey();
  void reindex();

  std::list<Op> ops_;
  std::unordered_map<int64_t, Node> nodes_;
  int64_t repeated_id_ = -1;
};

}  // namespace normgrad
