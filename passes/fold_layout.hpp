// FoldTransposePass and FoldCastPass: layout and dtype conversions around a
// batch-norm backward become part of it.
//
// Transposes (NCX <-> NXC):
//   before:  src' = StaticTranspose(src, [0,2,3,1]); dy' = StaticTranspose(dy, [0,2,3,1]);
//            BN(src', dy', ...) {data_format=NXC} -> dx'; dx = StaticTranspose(dx', [0,3,1,2])
//   after:   BN(src, dy, ...) {data_format=NCX} -> dx
// and the mirror image (NXC data, NCX batch norm). Any rank 3 to 6.
//
// Casts (bf16 or f16 data computed in f32):
//   before:  src' = TypeCast(src: T -> f32); dy' = TypeCast(dy: T -> f32);
//            BN(src', dy', ...) -> dx' (f32); dx = TypeCast(dx': f32 -> T)
//   after:   BN(src, dy, ...) -> dx (T), statistics unchanged (f32)
// The numbers are the same: the inputs are exact in f32, and the batch norm
// rounds diff_src to T once, as the cast did.
//
// Preconditions, each or nothing is folded: both input conversions exist and
// feed only this op, diff_src is read only by the inverse conversion, none of
// the intermediate tensors is a graph output.
#pragma once

#include <normgrad/passes/pass.hpp>

namespace normgrad {

class FoldTransposePass final : public Pass {
 public:
  const char* name() const override { return "fold-transpose"; }
  StatusOr<bool> run(Graph& graph) const override;
};

class FoldCastPass final : public Pass {
 public:
  const char* name() const override { return "fold-cast"; }
  StatusOr<bool> run(Graph& graph) const override;
};

}  // namespace normgrad
