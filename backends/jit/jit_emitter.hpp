// The vector emitter under the JIT's generators (private).
//
// BnGenerator (the backward) and FwdGenerator (the forward) both derive from
// VecEmitter, which holds what does not depend on the walk: the vector
// registers and their 16-bit halves, loads and stores with dtype conversion
// and tails, the bf16 rounding (written once here), the AVX2 bf16 pairs, the
// horizontal sum and the shared constant pool. The ISA differences of those
// pieces live here, as in oneDNN's jit_generator and its bf16 emulation, so a
// walk asks for "a vector of data at this address" and not for an ISA's
// instructions.
//
// A tail (fewer than lanes_ elements) is masked by k1 on AVX-512, which the
// walk sets up, and on AVX2 by the dword mask in vmm(mask_) for f32 data and
// word by word (tail_ words) for 16-bit data.
#pragma once

#include <cstddef>
#include <cstdint>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/graph/data_type.hpp>

namespace normgrad {
namespace jit {

class VecEmitter : public Xbyak::CodeGenerator {
 protected:
  using Xmm = Xbyak::Xmm;
  using Ymm = Xbyak::Ymm;
  using Zmm = Xbyak::Zmm;
  using Reg64 = Xbyak::Reg64;
  using RegExp = Xbyak::RegExp;
  using Address = Xbyak::Address;
  using Label = Xbyak::Label;

  // Code goes into a fixed read-write buffer of `code_bytes`; the derived
  // generator emits, then calls finish() to make it read+execute.
  VecEmitter(size_t code_bytes, Isa isa, bool avx512_bf16, DataType dt, int tail);

  // Checks the labels and makes the code read+execute (never writable and
  // executable at once).
  void finish();

  Xmm vmm(int i) const { return avx512_ ? Xmm(Zmm(i)) : Xmm(Ymm(i)); }
  // The half-width register holding 16-bit data of a full vector.
  Xmm half(int i) const { return avx512_ ? Xmm(Ymm(i)) : Xmm(i); }
  void zero(int i);

  // vmm(v) = one vector of data at `e`, as f32; `masked`: the tail only
  // (lanes past it are zero and their memory is not read).
  void load_vec(int v, const RegExp& e, bool masked);
  // Stores vmm(v) (f32) at `e` in the data type, streaming if `nt` (a whole
  // vector); `masked`: the tail only. Clobbers w, t1 and t2 (16-bit data);
  // vmm(v) is kept.
  void store_vec(const RegExp& e, int v, bool masked, bool nt, int w, int t1, int t2);
  // store_vec for values the data type holds exactly (loaded from it, and
  // masked or rounded since): 16-bit words by truncation or one conversion,
  // so one scratch register (t) is enough, where a reduce loop has no more.
  void store_exact(const RegExp& e, int v, bool masked, int t);
  // half(w) = vmm(v) (f32) as 16-bit words of the data type, rounded to
  // nearest even; clobbers t1 and t2.
  void to_words(int w, int v, int t1, int t2);
  // vmm(t) = the bf16 bits of vmm(v) rounded to nearest even by integer
  // arithmetic, in each dword's low word (`down`) or left in its high word.
  void bf16_dwords(int t, int v, bool down = true);
  // Rounds vmm(v) to the data type and back, as the unfused graph stores a
  // value before the next op reads it; clobbers t.
  void round_to_dt(int v, int t);

  // AVX2 bf16 in pairs: 16 elements at `e` as f32, the even ones (each
  // dword's low word) in ymm(even) and the odd ones in ymm(odd); the same
  // values the vector-at-a-time load gives, in other lanes.
  void load_pair(int even, int odd, const RegExp& e);
  // The inverse of load_pair, one 32-byte store; clobbers even and t.
  void store_pair(const RegExp& e, int even, int odd, int t, bool nt);

  // The sum of vmm(v)'s lanes in every lane of Xmm(v), in a fixed tree
  // (halves, then quarters, ...: the grouped sums copy it); clobbers t.
  void hsum(int v, int t);
  // The four accumulator chains vmm(first..first + 3) added pairwise, then
  // summed across lanes (hsum); clobbers t.
  void fold_chains(int first, int t);

  // Copies a bounce block of `bytes` bytes (a register) from `from` (an L1
  // buffer at the same offset within a line as `to`) to `to`: the lines wholly
  // inside the block with streaming stores, the partial lines at its two ends
  // with ordinary stores that write only the block's bytes (AVX-512: byte
  // masks; AVX2: 32-byte stores over the block's first and last 64 bytes, so
  // an AVX2 block must be 128 bytes or more). Clobbers bytes, head, tmp
  // (AVX-512), k4 (AVX-512) and vector register `vec`. Shared by the
  // backward's and the forward's grouped rows applies.
  void stream_copy(const Reg64& from, const Reg64& to, const Reg64& bytes, const Reg64& head,
                   const Reg64& tmp, int vec);

  // The constants the helpers above read; the derived generator's pool
  // follows them.
  void emit_shared_constants();
  // AVX2: keeps the bf16 rounding bias (0x7fff per dword) in ymm(bias) and
  // the pairs' high-word mask (0xffff0000) in ymm(hi16) until
  // drop_bf16_constants (-1: that one stays a memory operand), so the helpers
  // above read registers: a pairs apply otherwise spends 4 of its 14 loads
  // per 16 elements on them, and loads are what limits those loops. The
  // caller keeps the registers free meanwhile.
  void keep_bf16_constants(int bias, int hi16);
  void drop_bf16_constants();

  const bool avx512_;
  const bool native_bf16_;  // vcvtneps2bf16 (AVX-512 with avx512_bf16)
  const int lanes_;
  const int es_;  // bytes per data element
  const DataType dt_;
  int tail_;       // the constant tail's elements (AVX2 16-bit word loops)
  int mask_ = 15;  // AVX2: the f32 tail's dword mask register
  Label c_one_, c_7fff_, c_hi16_;
  int reg_7fff_ = -1, reg_hi16_ = -1;  // keep_bf16_constants
};

}  // namespace jit
}  // namespace normgrad
