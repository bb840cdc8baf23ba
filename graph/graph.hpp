// Graph: ops joined by tensor ids, checked as they are added and when finalized.
//
// add_op verifies an op against its schema at once (ports, attributes, dtypes,
// and shapes where they are known). finalize joins producers and consumers by
// tensor id, rejects duplicate producers, conflicting metadata for one id,
// cycles and dangling inputs, orders the ops topologically and infers every
// shape. After finalize every tensor is one Value (its metadata, producer and
// uses with their ports), and the ops' port tensors carry the same complete,
// consistent metadata.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <normgrad/graph/op.hpp>
#include <normgrad/graph/op_list.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {

// A read of a value: op `op_id` takes it on input port `port`.
struct Use {
  int64_t op_id = -1;
  size_t port = 0;
};

// One tensor of a finalized graph, as one object: its metadata (merged from
// every port that names it and completed by shape inference), the op and
// output port that produce it (-1: a graph input), and every use in op order.
struct Value {
  LogicalTensor desc;
  int64_t producer = -1;
  size_t producer_port = 0;
  std::vector<Use> uses;
};

// What the rewriter API reports after each edit it made (an edit that
// failed its checks and was undone reports nothing): how a rewrite driver
// learns which ops to look at again (MLIR's RewriterBase::Listener). Each
// call comes with the graph already edited.
class EditListener {
 public:
  virtual ~EditListener() = default;
  virtual void op_inserted(const Op& op) = 0;
  // `gone` is no longer in the graph.
  virtual void op_erased(const Op& gone) = 0;
  virtual void op_replaced(const Op& old, const Op& now) = 0;
  // Every reader of tensor `from` now reads `to`.
  virtual void uses_replaced(int64_t from, int64_t to) = 0;
};

class Graph {
 public:
  Graph() = default;

  // Checks the op against its schema and the ops already added (op id unique).
  Status add_op(Op op);
  Status finalize();
  bool finalized() const { return finalized_; }

  // Optional explicit ports, as oneDNN's JSON `input_ports` / `output_ports`.
  // Ports may be incomplete, as in oneDNN's dumps; see graph_inputs().
  void set_input_ports(std::vector<int64_t> ids) { input_ports_ = std::move(ids); }
  void set_output_ports(std::vector<int64_t> ids) { output_ports_ = std::move(ids); }
  const std::optional<std::vector<int64_t>>& input_ports() const { return input_ports_; }
  const std::optional<std::vector<int64_t>>& output_ports() const { return output_ports_; }

  // File-level metadata, kept for a faithful JSON round trip.
  std::string version = "3.0.0";
  std::string engine_kind = "cpu";
  std::string fpmath_mode = "strict";
  std::optional<std::string> fpmath_mode_apply_to_int;

  // Ops in insertion order before finalize, topological order after it and
  // after every edit (op_list.hpp: a range; at(k) walks, to_vector() copies).
  const OpList& ops() const { return ops_; }
  // A new, un-finalized graph with these ops and this graph's ports and file
  // metadata (check_against_rebuild's fresh copy). Passes and tools edit in
  // place with the rewriter below instead.
  Graph with_ops(std::vector<Op> ops) const;

  // The rewriter API (graph_rewrite.cpp): edits by op id that keep the ops,
  // the tensor table, producers and consumers consistent and the ops in
  // topological order, so every query stays valid and fast between edits
  // with no re-finalize. Each edit checks the op against its schema and
  // refuses what would break the order; tensors an edit brings in must have
  // their shapes (--verify-each checks the whole graph after every pass).
  // On a graph that is not finalized they edit the ops only.
  // A finalized graph's maps (kept by each edit) against the same ops
  // finalized from scratch: OK, or an internal error naming the first tensor
  // whose producer, uses or shape differ. Linear in the graph; `--verify-each`
  // runs it after every pass.
  Status check_against_rebuild() const;
  // A key that orders the ops as ops() does (a < b: op a comes first), or -1
  // for no such op. O(1); keys are not places (an edit leaves the others'
  // keys as they are, and they are not contiguous).
  int64_t order_of(int64_t op_id) const { return ops_.order(op_id); }
  // Removes an op whose outputs nothing reads.
  Status erase_op(int64_t op_id);
  // Removes an op whose outputs other ops may still read: those outputs
  // become graph inputs (how `run --cut-unsupported` feeds random data in
  // place of ops normgrad cannot run).
  Status cut_op(int64_t op_id);
  // Inserts `op` before op `before_op_id` (-1: at the end).
  Status insert_op(Op op, int64_t before_op_id = -1);
  // Puts `replacement` where op `op_id` is (its outputs' readers read the
  // replacement's outputs of the same ids).
  Status replace_op(int64_t op_id, Op replacement);
  // Every reader of tensor `from` reads `to` instead (produced earlier, or a graph input).
  Status replace_all_uses_with(int64_t from, const LogicalTensor& to);
  // Re-describes tensors: `edit` sees every port of every op (inputs, then
  // outputs) and may change its dtype, dims, strides or property, never its
  // id (benchdnn's --dt and --in-shapes, a process's slice of the batch). A
  // finalized graph is finalized again, as new shapes must be re-inferred.
  // A failed update (an id changed, or shapes that do not finalize) leaves
  // the graph as it was.
  Status update_tensors(const std::function<void(LogicalTensor&)>& edit);

  // The listener told of every edit above from now on (nullptr: none);
  // returns the one it replaces. Not copied with the graph.
  EditListener* set_listener(EditListener* listener) {
    EditListener* was = listener_;
    listener_ = listener;
    return was;
  }

  // Ids no op or port of this graph has ever used (ops a pass removed
  // included, whose tensors may still name a caller's buffer), for passes
  // that create ops and tensors.
  int64_t new_op_id();
  int64_t new_tensor_id();

  // After finalize: what was tolerated rather than refused (ports naming no
  // tensor, an opaque op's declaration contradicting checked metadata), for
  // tools to print. Empty for a clean graph.
  const std::vector<std::string>& notes() const { return notes_; }

  // Every tensor's value, producer and uses: kept by finalize and by every
  // rewriter edit, or, before the first finalize, found by scanning the ops
  // as they are (never stale indices). nullopt for an id no op names.
  std::optional<Value> value(int64_t id) const;
  const LogicalTensor* find_tensor(int64_t id) const;
  // Op `op_id`, or nullptr.
  const Op* op(int64_t op_id) const;
  // The op that writes tensor `tensor_id`, or nullptr for a graph input.
  const Op* producer(int64_t tensor_id) const;
  // The reads of tensor `tensor_id`, in op order (empty when none).
  std::vector<Use> uses(int64_t tensor_id) const;
  // input_ports first (in their order), then every other tensor no op produces,
  // in first-use order.
  std::vector<LogicalTensor> graph_inputs() const;
  // output_ports when given; otherwise produced tensors that no op other than End consumes.
  std::vector<LogicalTensor> graph_outputs() const;

 private:
  Status collect_tensors();
  // Puts the ops in topological order; `reordered` says whether any moved.
  Status sort_topologically(bool* reordered);
  Status infer_shapes();
  Status check_sizes() const;

 public:
  // After finalize: OK when every tensor of `op` has a known shape, else an
  // invalid_graph naming the first unknown one and why (compile needs shapes;
  // partitioning does not).
  Status unknown_shape_error(const Op& op) const;

 private:
  OpList ops_;
  bool finalized_ = false;
  // Copied graphs start without one (a driver listens to the graph it edits).
  struct ListenerSlot {
    EditListener* ptr = nullptr;
    ListenerSlot() = default;
    ListenerSlot(const ListenerSlot&) {}
    ListenerSlot& operator=(const ListenerSlot&) { return *this; }
    ListenerSlot& operator=(EditListener* l) {
      ptr = l;
      return *this;
    }
    operator EditListener*() const { return ptr; }
    EditListener* operator->() const { return ptr; }
  } listener_;
  std::optional<std::vector<int64_t>> input_ports_;
  std::optional<std::vector<int64_t>> output_ports_;
  std::unordered_map<int64_t, Value> values_;
  // Metadata of every input port as last seen with a consumer, so a port that a
  // pass leaves unused still describes the buffer the caller passes.
  std::map<int64_t, LogicalTensor> port_tensors_;
  std::vector<std::string> notes_;
  // The order key of the producer of tensor `id`, or -1 (from values_).
  int64_t producer_order(int64_t id) const;
  // The op that writes `v` (v.producer >= 0).
  const Op& producer_op(const Value& v) const;
  int64_t next_op_id_ = 0, next_tensor_id_ = 0;  // one past every id seen
  void see_ids();
  // After an edit that failed its checks: every map rebuilt from ops_ (the
  // one linear-cost step, taken only to restore a graph).
  Status reindex(const std::string& edit);
  Status check_new_tensors(const Op& op, const std::string& edit) const;
  // The incremental upkeep of a finalized graph's maps (graph.cpp): an op's
  // reads and writes leave the tensor table (unlink) or join it (link, which
  // merges metadata and refuses a second producer or a self-read), and the
  // tensors no op names any longer leave it (prune). Each costs the op's
  // ports (and the uses of the tensors they touch), not the graph.
  void unlink(const Op& op);
  Status link(const Op& op, const std::string& edit);
  void prune(const Op& op);
  // Every read of `op` (in ops_) follows its write and every read of its
  // outputs comes after it.
  Status check_order(const Op& op, const std::string& edit) const;
  static Status merge_tensor(LogicalTensor& known, const LogicalTensor& incoming,
                             const std::string& where);
  void see_op_ids(const Op& op);
  bool ids_seen_ = false;
};

}  // namespace normgrad
