// VecEmitter: the loads, stores, conversions, sums and constants that the
// JIT's backward and forward generators share (jit_emitter.hpp).
#include <normgrad/backends/jit/jit_emitter.hpp>

#include <cassert>

namespace normgrad {
namespace jit {

using namespace Xbyak;

VecEmitter::VecEmitter(size_t code_bytes, Isa isa, bool avx512_bf16, DataType dt, int tail)
    : CodeGenerator(code_bytes, DontSetProtectRWE),
      avx512_(isa == Isa::kAvx512),
      native_bf16_(avx512_ && avx512_bf16),
      lanes_(avx512_ ? 16 : 8),
      es_(static_cast<int>(dtype_size(dt))),
      dt_(dt),
      tail_(tail) {}

void VecEmitter::finish() {
  readyRE();           // checks labels (and protects AutoGrow buffers only)
  setProtectModeRE();  // our fixed buffer: read-write until now, read+execute from here on
}

void VecEmitter::zero(int i) {
  if (avx512_) {
    vpxord(Zmm(i), Zmm(i), Zmm(i));
  } else {
    vpxor(Ymm(i), Ymm(i), Ymm(i));
  }
}

void VecEmitter::load_vec(int v, const RegExp& e, bool masked) {
  const Address a = ptr[e];
  const Xmm x = vmm(v);
  if (dt_ == DataType::kF32) {
    if (!masked) {
      vmovups(x, a);
    } else if (avx512_) {
      vmovups(Zmm(v) | k1 | T_z, a);
    } else {
      vmaskmovps(x, vmm(mask_), a);
    }
    return;
  }
  // 16-bit data: an AVX2 tail's words one by one into Xmm(v) (no word
  // masks), an AVX-512 tail through k1.
  const bool words = masked && !avx512_;
  if (words) {
    vpxor(Xmm(v), Xmm(v), Xmm(v));
    for (int i = 0; i < tail_; ++i) vpinsrw(Xmm(v), Xmm(v), ptr[e + i * 2], i);
  }
  if (dt_ == DataType::kBF16) {
    if (masked && avx512_) {
      vpmovzxwd(Zmm(v) | k1 | T_z, a);
    } else if (words) {
      vpmovzxwd(x, Xmm(v));
    } else {
      vpmovzxwd(x, a);
    }
    vpslld(x, x, 16);
  } else if (masked && avx512_) {
    vcvtph2ps(Zmm(v) | k1 | T_z, a);
  } else if (words) {
    vcvtph2ps(x, Xmm(v));
  } else {
    vcvtph2ps(x, a);
  }
}

// x + 0x7fff + (bit 16 of x), then the top word. A NaN stays a NaN: its low
// 16 bits are zero, so nothing carries into its top bits. The kernels only
// meet NaNs loaded from bf16, made by arithmetic (the default NaN or an
// operand's) or from the drivers' kernel_float, which makes any NaN
// 0x7fc00000; a test feeds NaNs with full payloads in every f32 input.
// AVX2 takes bit 16 by two shifts rather than a shift and a mask: the same
// bits without a memory operand, as loads limit the AVX2 16-bit loops.
void VecEmitter::bf16_dwords(int t, int v, bool down) {
  const Xmm tv = vmm(t), vv = vmm(v);
  if (avx512_) {
    vpsrld(tv, vv, 16);
    vpandd(tv, tv, ptr[rip + c_one_]);
    vpaddd(tv, tv, ptr[rip + c_7fff_]);
  } else {
    vpslld(tv, vv, 15);
    vpsrld(tv, tv, 31);
    if (reg_7fff_ >= 0) {
      vpaddd(tv, tv, Ymm(reg_7fff_));
    } else {
      vpaddd(tv, tv, ptr[rip + c_7fff_]);
    }
  }
  vpaddd(tv, tv, vv);
  if (down) vpsrld(tv, tv, 16);
}

void VecEmitter::round_to_dt(int v, int t) {
  if (dt_ == DataType::kF16) {
    vcvtps2ph(half(t), vmm(v), 0);
    vcvtph2ps(vmm(v), half(t));
  } else if (dt_ == DataType::kBF16 && native_bf16_) {
    vcvtneps2bf16(Ymm(t), Zmm(v));
    vpmovzxwd(Zmm(v), Ymm(t));
    vpslld(Zmm(v), Zmm(v), 16);
  } else if (dt_ == DataType::kBF16) {
    bf16_dwords(t, v);
    vpslld(vmm(v), vmm(t), 16);
  }
}

void VecEmitter::to_words(int w, int v, int t1, int t2) {
  if (dt_ == DataType::kF16) {
    vcvtps2ph(half(w), vmm(v), 0);  // round to nearest even
  } else if (native_bf16_) {
    vcvtneps2bf16(Ymm(w), Zmm(v));
  } else {
    bf16_dwords(t1, v);
    if (avx512_) {
      vpmovdw(Ymm(w), Zmm(t1));
    } else {
      vextracti128(Xmm(t2), Ymm(t1), 1);
      vpackusdw(Xmm(w), Xmm(t1), Xmm(t2));
    }
  }
}

void VecEmitter::store_vec(const RegExp& e, int v, bool masked, bool nt, int w, int t1, int t2) {
  const Address a = ptr[e];
  const Xmm x = vmm(v);
  if (dt_ == DataType::kF32) {
    if (masked && avx512_) {
      vmovups(a | k1, Zmm(v));
    } else if (masked) {
      vmaskmovps(a, vmm(mask_), x);
    } else if (nt) {
      vmovntps(a, x);
    } else {
      vmovups(a, x);
    }
    return;
  }
  to_words(w, v, t1, t2);
  if (masked && avx512_) {
    vmovdqu16(a | k1, Ymm(w));
  } else if (masked) {
    for (int i = 0; i < tail_; ++i) vpextrw(ptr[e + i * 2], Xmm(w), i);
  } else if (nt) {
    vmovntdq(a, half(w));
  } else {
    vmovdqu(a, half(w));
  }
}

void VecEmitter::store_exact(const RegExp& e, int v, bool masked, int t) {
  if (dt_ == DataType::kF32) {
    store_vec(e, v, masked, false, t, t, t);  // f32 stores need no scratch
    return;
  }
  if (dt_ == DataType::kF16) {
    vcvtps2ph(half(t), vmm(v), 0);  // exact: the value is an f16
  } else if (native_bf16_) {
    vcvtneps2bf16(Ymm(t), Zmm(v));
  } else {
    // A bf16 value's f32 bits have a zero low word: its high word is the bf16.
    vpsrld(vmm(t), vmm(v), 16);
    if (avx512_) {
      vpmovdw(Ymm(t), Zmm(t));
    } else {
      vpackusdw(Ymm(t), Ymm(t), Ymm(t));  // per 128-bit lane: words 0-3 0-3 | 4-7 4-7
      vpermq(Ymm(t), Ymm(t), 0x08);       // lanes 0 and 2: words 0-7 in the low half
    }
  }
  const Address a = ptr[e];
  if (masked && avx512_) {
    vmovdqu16(a | k1, Ymm(t));
  } else if (masked) {
    for (int i = 0; i < tail_; ++i) vpextrw(ptr[e + i * 2], Xmm(t), i);
  } else {
    vmovdqu(a, half(t));
  }
}

void VecEmitter::load_pair(int even, int odd, const RegExp& e) {
  vmovdqu(Ymm(odd), ptr[e]);
  vpslld(Ymm(even), Ymm(odd), 16);
  if (reg_hi16_ >= 0) {
    vpand(Ymm(odd), Ymm(odd), Ymm(reg_hi16_));
  } else {
    vpand(Ymm(odd), Ymm(odd), ptr[rip + c_hi16_]);
  }
}

void VecEmitter::keep_bf16_constants(int bias, int hi16) {
  assert(!avx512_ && "keep_bf16_constants: AVX2 only (AVX-512 has no spare ymm to name)");
  if (bias >= 0) vmovdqu(Ymm(bias), ptr[rip + c_7fff_]);
  if (hi16 >= 0) vmovdqu(Ymm(hi16), ptr[rip + c_hi16_]);
  reg_7fff_ = bias, reg_hi16_ = hi16;
}

void VecEmitter::drop_bf16_constants() {
  reg_7fff_ = reg_hi16_ = -1;
}

void VecEmitter::store_pair(const RegExp& e, int even, int odd, int t, bool nt) {
  bf16_dwords(t, even);           // the even words, down in each dword's low word
  bf16_dwords(even, odd, false);  // the odd ones left in the high word
  vpblendw(Ymm(t), Ymm(t), Ymm(even), 0xaa);
  if (nt) {
    vmovntdq(ptr[e], Ymm(t));
  } else {
    vmovdqu(ptr[e], Ymm(t));
  }
}

void VecEmitter::hsum(int v, int t) {
  const Xmm xv(v), xt(t);
  if (avx512_) {
    vextractf64x4(Ymm(t), Zmm(v), 1);
    vaddps(Ymm(v), Ymm(v), Ymm(t));
  }
  vextractf128(xt, Ymm(v), 1);
  vaddps(xv, xv, xt);
  vpermilps(xt, xv, 0x4e);
  vaddps(xv, xv, xt);
  vpermilps(xt, xv, 0xb1);
  vaddps(xv, xv, xt);
}

void VecEmitter::fold_chains(int first, int t) {
  vaddps(vmm(first), vmm(first), vmm(first + 1));
  vaddps(vmm(first + 2), vmm(first + 2), vmm(first + 3));
  vaddps(vmm(first), vmm(first), vmm(first + 2));
  hsum(first, t);
}

void VecEmitter::stream_copy(const Reg64& from, const Reg64& to, const Reg64& bytes,
                             const Reg64& head, const Reg64& tmp, int vec) {
  // head: the bytes up to `to`'s first line boundary, at most the block.
  mov(head, to);
  neg(head);
  and_(head, 63);
  cmp(head, bytes);
  cmova(head, bytes);
  Label lines, done;
  if (avx512_) {
    // The partial lines at the two ends with byte-masked stores (their other
    // bytes belong to the neighbouring blocks), the whole lines between streamed.
    const Zmm t(vec);
    sub(bytes, head);  // bytes from that boundary on
    mov(tmp, -1);
    bzhi(tmp, tmp, head);
    kmovq(k4, tmp);
    vmovdqu8(t | k4 | T_z, ptr[from]);
    vmovdqu8(ptr[to] | k4, t);
    L(lines);
    cmp(bytes, 64);
    jb(done, T_NEAR);
    vmovdqu8(t, ptr[from + head]);
    vmovntdq(ptr[to + head], t);
    add(head, 64);
    sub(bytes, 64);
    jmp(lines, T_NEAR);
    L(done);
    mov(tmp, -1);
    bzhi(tmp, tmp, bytes);
    kmovq(k4, tmp);
    vmovdqu8(t | k4 | T_z, ptr[from + head]);
    vmovdqu8(ptr[to + head] | k4, t);
    return;
  }
  // AVX2 has no byte masks: the block's first and last 64 bytes with
  // ordinary 32-byte stores, which cover the partial lines at its two ends
  // (and part of a whole line, which the streaming stores then write again
  // with the same bytes), then the whole lines between streamed. Every store
  // stays inside the block, which must be 128 bytes or more.
  const Ymm t(vec);
  for (int off : {0, 32}) {
    vmovdqu(t, ptr[from + off]);
    vmovdqu(ptr[to + off], t);
  }
  for (int back : {64, 32}) {
    vmovdqu(t, ptr[from + bytes - back]);
    vmovdqu(ptr[to + bytes - back], t);
  }
  sub(bytes, head);  // bytes from the first line boundary on
  L(lines);
  cmp(bytes, 64);
  jb(done, T_NEAR);
  vmovdqu(t, ptr[from + head]);
  vmovntdq(ptr[to + head], t);
  vmovdqu(t, ptr[from + head + 32]);
  vmovntdq(ptr[to + head + 32], t);
  add(head, 64);
  sub(bytes, 64);
  jmp(lines, T_NEAR);
  L(done);
}

void VecEmitter::emit_shared_constants() {
  align(64);
  auto splat = [&](Label& l, uint32_t v) {
    L(l);
    for (int i = 0; i < 16; ++i) dd(v);
  };
  splat(c_one_, 1);
  splat(c_7fff_, 0x7fff);
  splat(c_hi16_, 0xffff0000u);
}

}  // namespace jit
}  // namespace normgrad
