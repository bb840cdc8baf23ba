// The verdict of `--check` on one output: the relative L2 error against ref,
// and, for a batch-norm backward's per-channel sums, a condition-aware error.
//
// A sum's relative error is unbounded when the sum cancels to near zero (a
// single channel whose diff_gamma happens to be ~0), so comparing diff_gamma
// and diff_beta with ref relative to their own size fails correct kernels by
// chance. The classical bound (Higham, probabilistic form) for a sum of M
// terms t_i accumulated with unit roundoff u is
//     |computed - exact| <~ lambda * sqrt(M) * u * sum |t_i|,
// so for those outputs a result passes when either its relative L2 error is
// within the dtype's limit (threshold_for) or
//     ||got - want||_2 / ||(sum_i |t_i|)_c||_2 <= lambda * sqrt(M) * u_f32,
// with the terms t = dy (diff_beta) and t = s * dy * (x - mean) (diff_gamma)
// evaluated in float64 from the case's own inputs, lambda = 4 and u_f32 = 2^-24.
// A forward's batch_mean and running_mean cancel the same way on data centred
// on zero (a backward's diff_src): their terms are x_i / M (and the running
// mean's previous value). A backward's diff_src, s gamma (dy - mean(dy) -
// xhat mean(dy xhat)), cancels when a channel has few elements (with 2 it is
// 0 in exact arithmetic): it passes when its error relative to the L2 norm
// of s |gamma| (|dy| + |mean(dy)| + |xhat| |mean(dy xhat)|), plus the f32
// rounding of the two sums (lambda sqrt(M) u_f32 of mean|dy| and of |xhat|
// mean|dy xhat|), is within the dtype's data limit (twice it for FromDst,
// which first recovers src from dst). A forward's dst, through its ReLU,
// LeakyReLU, TypeCast or same-shape Add, is judged the same way against
// |gamma| s (|x| + |mean|) + |beta| and its statistics' rounding, and any
// other data output against its own size: rel_l2 unchanged where nothing
// cancels.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/graph/graph.hpp>
#include <normgrad/testing/oracle.hpp>

namespace normgrad {
namespace oracle {

struct OutputVerdict {
  bool pass = false;
  ErrorStats error;
  double limit = 0.0;        // threshold_for(dtype, M)
  double cond_error = -1.0;  // < 0: not a conditioned sum
  double cond_limit = 0.0;
};

// How the kernel under test adds a channel's m terms, which sets the bound
// its per-channel sums are held to.
enum class SumOrder {
  // Vector lanes and per-call partial sums (normgrad's kernels, oneDNN's JIT
  // kernels): roundings of random sign, kLambda sqrt(m) u.
  kBlocked,
  // One running f32 sum over the m terms (oneDNN's reference kernels). On
  // data of few distinct values (a quantizer's lattice, bf16 after a ReLU)
  // its roundings stop cancelling and reach 7-9 sqrt(m) u, so its sums get
  // the bound of any summation order, (m - 1) u, as well.
  kRunning,
};

// The order of the kernel a partition ran on, by the name the compiled
// partition reports: oneDNN names its reference implementations "ref:any",
// "bnorm_ref:any".
SumOrder sum_order_of(const std::string& kernel_name);
// The order of the kernel of the partition in `cg` that writes tensor `id`
// (kBlocked when none does: an input).
SumOrder sum_order_of(const CompiledGraph& cg, int64_t id);

// `lowered` is the compiled graph (canonical ops), `inputs` the graph's input
// buffers by id, `got` and `want` the output under test and ref's, `order`
// that of the kernel which computed `got`.
StatusOr<OutputVerdict> check_output(const Graph& lowered, const std::map<int64_t, Buffer>& inputs,
                                     int64_t id, const Buffer& got, const Buffer& want,
                                     SumOrder order = SumOrder::kBlocked);

}  // namespace oracle
}  // namespace normgrad
