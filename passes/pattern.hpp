// Pattern: a group of ops one backend runs as one kernel, and the matchers
// the backends build their patterns from.
//
// As in oneDNN Graph, fusion is not a rewrite of the graph: each backend
// declares the patterns it has kernels for (Backend::patterns), and the
// partitioner (partitioner.hpp) matches them, highest priority first, and
// records on each partition the backend, pattern and anchor op that won. A
// pattern is anchored at one op kind; its matcher starts from an op of that
// kind and returns the ops it takes with it, or the rule that failed (the
// text `normgrad partitions --explain` prints). The conditions a matcher
// checks are structural and about dtypes and layouts; the backend's
// supports() then judges the candidate partition's sizes and strides.
//
// The matchers below are the shapes of fusion normgrad has kernels for:
//   - match_bn_backward_producers: ReLUBackward or Add feeding a batch-norm
//     backward's src and/or diff_dst (the JIT masks or adds while it loads,
//     so the intermediate is never written);
//   - match_bn_inference_relu: BatchNormInference -> ReLU (oneDNN's
//     fuse_norm_relu);
//   - match_bn_forward_epilogue: BatchNormForwardTraining (or
//     BatchNormInference) -> [Add] -> [ReLU] (the JIT adds the residual and
//     clamps before it stores dst);
//   - match_int8_bn_chain: Dequantize -> BatchNormInference -> ReLU ->
//     Quantize (oneDNN's int8 batch-norm pattern).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>
#include <normgrad/graph/partition.hpp>

namespace normgrad {

// The ops a pattern takes, by id and role, the anchor included; `note` says
// what it left out and why (for --explain), e.g. a port whose producer stays
// apart. The partition keeps the roles (Partition::roles) for the backend.
struct PatternOps {
  std::vector<BoundOp> ops;
  std::string note;
};
using PatternMatcher = std::function<StatusOr<PatternOps>(const Graph&, const Op& anchor)>;

struct Pattern {
  std::string name;             // "bn_bwd_producers", unique within its backend
  std::string backend;          // the backend that declares it and runs its partitions
  std::vector<OpKind> anchors;  // op kinds it starts from; empty: any kind
  bool fused = false;           // takes more than one op (skipped when fusion is off)
  // Runs a collective (AllReduce): it stays available when a user forces a
  // compute backend, since the collective runs where its communicator is.
  bool collective = false;
  PatternMatcher match;

  bool anchored_at(OpKind kind) const;
  // "jit.bn_bwd_producers"
  std::string full_name() const { return backend + "." + name; }
};

// A pattern of one op of the given kinds (every kind when empty), for a
// backend that runs them one by one.
Pattern single_op_pattern(std::string name, std::string backend, std::vector<OpKind> kinds);

// The AllReduce op alone, as a collective pattern.
Pattern collective_pattern(std::string name, std::string backend);

// The batch-norm backward kinds: BatchNormTrainingBackward and its Reduce/Apply halves.
const std::vector<OpKind>& bn_backward_kinds();
// The fusion patterns below under `backend`'s name ("bn_bwd_producers",
// "bn_inference_relu", "int8_bn_chain"), for a backend with kernels for them.
// With `side_output` (the JIT's), the diff_dst producer of a
// BatchNormTrainingBackward may be read elsewhere too, and a diff_dst
// ReLUBackward takes its gradient Add along (match_bn_backward_producers).
// ref and split-sync-batch-norm keep the only-reader form.
Pattern bn_backward_producers_pattern(std::string backend, bool side_output = false);
// The JIT's multi-output form (XLA's sibling fusion): two
// BatchNormTrainingBackwards reading one ReLUBackward's or Add's output as
// diff_dst ("bn_bwd_siblings", match_bn_backward_siblings).
Pattern bn_backward_siblings_pattern(std::string backend);
Pattern bn_inference_relu_pattern(std::string backend);
Pattern int8_bn_chain_pattern(std::string backend);
Pattern bn_forward_epilogue_pattern(std::string backend);
// BatchNormInference alone ("bn_inf"), except in an int8 chain (src from a
// Dequantize), which oneDNN's int8 pattern takes whole.
Pattern bn_inference_pattern(std::string backend);
// The JIT's form with a side output ("bn_fwd_side_output",
// match_bn_forward_side_output), tried before bn_fwd_epilogue: where the
// JIT declines it, the epilogue's only-reader form still takes the Add.
Pattern bn_forward_side_output_pattern(std::string backend);
// The forward's siblings ("bn_fwd_siblings", match_bn_forward_siblings).
Pattern bn_forward_siblings_pattern(std::string backend);

// The one rule for a producer fused into a batch-norm backward's data port
// (0: src, 1: diff_dst): a ReLUBackward or Add whose output is read by this
// op only, on one port, is not a graph output, and neither broadcasts nor
// mixes dtypes with the batch norm's data. OK, or the rule that failed. The
// partitioner's pattern, --explain and the sync split all ask it. With
// `side_output`, a diff_dst producer of a BatchNormTrainingBackward may also
// be read by other ops or be a graph output (the kernel then writes its
// output too), as long as the batch norm reads it on that port alone.
Status fusible_bn_backward_producer(const Graph& graph, const Op& bn, size_t port,
                                    bool side_output = false);

// The Add whose sum a ReLUBackward masks (its diff_dst), when that Add is
// read by the ReLUBackward alone, on one port, is no graph output, and
// neither broadcasts nor mixes dtypes; else nullptr. With side outputs the
// JIT takes it with the ReLUBackward (FusionRole::kGradientAdd): a residual
// network's gradient sum in front of a block's last ReLU.
const Op* gradient_add(const Graph& graph, const Op& relu_backward);

// Batch-norm backward (BatchNormTrainingBackward, BatchNormBackwardReduce or
// BatchNormBackwardApply) with its fusible producers on src and/or diff_dst,
// bound as kSrcProducer / kDiffDstProducer. Fails when no port has one.
// `side_output`: as fusible_bn_backward_producer's, and a diff_dst
// ReLUBackward's gradient_add() is bound as kGradientAdd; the note names a
// producer whose output the partition will also write, and the Add.
StatusOr<PatternOps> match_bn_backward_producers(const Graph& graph, const Op& bn,
                                                 bool side_output = false);

// A BatchNormTrainingBackward whose diff_dst is a fusible producer's output
// (as fusible_bn_backward_producer with side outputs, and a ReLUBackward's
// gradient_add() along) that exactly one other BatchNormTrainingBackward
// reads, also on diff_dst, with the same src dims, dtype and data_format,
// and nothing else reads: a downsampling residual block's gradient, which
// feeds the main branch's last batch norm and the shortcut's. Bound as
// kDiffDstProducer, kAnchor and kSibling: one pass over the gradient for both.
StatusOr<PatternOps> match_bn_backward_siblings(const Graph& graph, const Op& bn);

// BatchNormInference whose dst only a ReLU of the same dtype reads.
StatusOr<PatternOps> match_bn_inference_relu(const Graph& graph, const Op& bn);
// BatchNormForwardTraining whose dst is read by one Add alone (a residual of
// dst's dims and dtype: no broadcast), by one ReLU alone, or by an Add whose
// output one ReLU alone reads (ResNet's BN -> Add -> ReLU). Neither link may
// be a graph output or change the dtype. With `side_output`, the ReLU's
// input (dst, or the Add's output) may also be read by other ops or be a
// graph output: the partition then writes it as well as the ReLU's output
// (a LeakyReLU's backward reads its input, so a captured LeakyReLU network's
// every batch norm has this shape); the note names it.
StatusOr<PatternOps> match_bn_forward_epilogue(const Graph& graph, const Op& bn,
                                               bool side_output = false);
// match_bn_forward_epilogue with side outputs, when it did take an
// activation whose input is read elsewhere too (or is a graph output).
StatusOr<PatternOps> match_bn_forward_side_output(const Graph& graph, const Op& bn);
// match_bn_forward_epilogue with a residual Add whose other operand is the
// dst of another BatchNormForwardTraining (a downsampling block's shortcut),
// read by that Add alone, with the same src dims, dtype and data_format:
// bound as kSibling too. One walk for both: the shortcut's dst is never a
// tensor of its own.
StatusOr<PatternOps> match_bn_forward_siblings(const Graph& graph, const Op& bn);
// Dequantize -> BatchNormInference -> ReLU -> Quantize, each link the only
// reader of the one before and no link a graph output.
StatusOr<PatternOps> match_int8_bn_chain(const Graph& graph, const Op& bn);

}  // namespace normgrad
