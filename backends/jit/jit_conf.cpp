// JIT conf: ISA detection, cache sizes from sysfs, and the walk and chunking.
#include <normgrad/backends/jit/jit_conf.hpp>

#include <cstdlib>
#include <fstream>

#include <unistd.h>

#include <xbyak/xbyak_util.h>

namespace normgrad {
namespace jit {
namespace {

int64_t read_cache_size(int index) {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::string s;
  if (!(in >> s) || s.empty()) return 0;
  int64_t v = std::atoll(s.c_str());
  if (s.back() == 'K') v <<= 10;
  if (s.back() == 'M') v <<= 20;
  return v;
}

int read_cache_level(int index) {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/level");
  int level = 0;
  in >> level;
  return level;
}

Isa parse_isa(const std::string& s, Isa best) {
  if (s == "0" || s == "portable") return Isa::kPortable;
  if (s == "avx2") return best == Isa::kPortable ? best : Isa::kAvx2;
  return best;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

Isa detect_isa(const std::string& forced) {
  static const Isa best = [] {
    const Xbyak::util::Cpu cpu;
    using C = Xbyak::util::Cpu;
    if (cpu.has(C::tAVX512F) && cpu.has(C::tAVX512BW) && cpu.has(C::tAVX512VL)) return Isa::kAvx512;
    if (cpu.has(C::tAVX2) && cpu.has(C::tFMA) && cpu.has(C::tF16C)) return Isa::kAvx2;
    return Isa::kPortable;
  }();
  if (!forced.empty()) return parse_isa(forced, best);
  const char* env = std::getenv("NORMGRAD_JIT");
  return env ? parse_isa(env, best) : best;
}

bool cpu_has_avx512_bf16() {
  static const bool has = Xbyak::util::Cpu().has(Xbyak::util::Cpu::tAVX512_BF16);
  return has;
}

const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes c;
    for (int i = 0; i < 8; ++i) {
      const int level = read_cache_level(i);
      const int64_t size = read_cache_size(i);
      if (size <= 0) continue;
      if (level == 2) c.l2_bytes = size;
      if (level == 3) c.l3_bytes = size;
    }
    // A VM may report the host's whole L3 (480 MiB seen here). No x86 core of today
    // gets more than its complex's share, so an implausible per-CPU share is capped.
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    if (c.l3_bytes / cpus > (int64_t{16} << 20)) c.l3_bytes = int64_t{32} << 20;
    return c;
  }();
  return sizes;
}

const char* fuse_name(Fuse f) {
  switch (f) {
    case Fuse::kNone:
      return "none";
    case Fuse::kReluBackward:
      return "relu_bwd";
    case Fuse::kAdd:
      return "add";
  }
  return "?";
}

std::string BnConf::kernel_name() const {
  std::string n = std::string("jit:") + isa_name(isa) + ":" + dtype_name(d.data_dt) + "/" +
                  dtype_name(d.stats_dt) + ":" + (walk == Walk::kRows ? "rows" : "pixels");
  if (x_fuse != Fuse::kNone) n += std::string("+src_") + fuse_name(x_fuse);
  if (dy_fuse != Fuse::kNone) n += std::string("+diff_dst_") + fuse_name(dy_fuse);
  if (!x_strides.empty() || !dy_strides.empty() || !dx_strides.empty()) n += "+repack";
  return n;
}

std::string BnConf::key() const {
  // The generated code depends on the ISA, dtypes, walk, the inner length and strides.
  return kernel_name() + (avx512_bf16 ? "+bf16cvt" : "") + (streaming_stores ? "+nt" : "") +
         ":cols=" + std::to_string(cols) + ":rs=" + std::to_string(row_stride);
}

StatusOr<BnConf> make_conf(const Op& op, Isa isa) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  if (d.reduce_size == 0 || d.channels == 0) return unimplemented("empty tensors are left to ref");
  BnConf c;
  // Strided data is packed into dense scratch by the driver (a copy costs less
  // than a second kernel family, and ref would be ~100x slower).
  auto strided = [](const LogicalTensor& lt) {
    const Dims s = lt.effective_strides();
    return s == dense_strides(lt.dims) ? Dims{} : s;
  };
  c.x_strides = strided(op.inputs()[0]);
  c.dy_strides = strided(op.inputs()[1]);
  c.dx_strides = strided(op.outputs()[0]);
  for (size_t i = 2; i < op.inputs().size(); ++i) {
    if (op.inputs()[i].dims[0] > 1 && op.inputs()[i].effective_strides()[0] != 1)
      return unimplemented("the JIT takes dense statistics; input " + std::to_string(i) +
                           " is strided (ref runs it)");
  }
  c.d = d;
  c.isa = isa;
  c.avx512_bf16 = isa == Isa::kAvx512 && cpu_has_avx512_bf16();
  NG_ASSIGN_OR_RETURN(c.total_elements, checked_product(d.dims, op.label()));
  const int64_t n = d.dims[0];
  const int64_t spatial = d.reduce_size / n;
  if (d.format == DataFormat::kNCX && spatial > 1) {
    c.walk = Walk::kRows;
    c.rows = n;
    c.cols = spatial;
    c.row_stride = d.channels * spatial;
    c.channel_stride = spatial;
  } else {
    c.walk = Walk::kPixels;
    c.rows = d.reduce_size;
    c.cols = d.channels;
    c.row_stride = d.channels;
    c.channel_stride = 1;
  }
  c.needs_reduction = d.mode == BackwardMode::kTraining || d.diff_scale_shift;
  // Pixels per reduction partial: about 1 MiB of src + diff_dst (at least 16
  // pixels), so a chunk stays in L2, partial sums stay few next to the data, and
  // there are many chunks to share out. Depends on the shape only.
  const int64_t bytes_per_row = 2 * c.cols * dtype_size(d.data_dt);
  c.chunk_rows = std::max<int64_t>(16, (int64_t{1024} << 10) / std::max<int64_t>(1, bytes_per_row));
  c.single_thread = c.total_elements < 100000;
  // Streaming stores pay off only when dx would not stay in the cache anyway;
  // the AVX-512 path has them (the AVX2 path keeps ordinary stores).
  const int64_t dx_bytes = c.total_elements * dtype_size(d.data_dt);
  c.streaming_stores = isa == Isa::kAvx512 && dx_bytes > cache_sizes().l3_bytes / 2;
  return c;
}

StatusOr<BnConf> make_conf(const Partition& partition, Isa isa) {
  const Op* bn = nullptr;
  for (const Op& op : partition.ops) {
    if (op.kind() == OpKind::kBatchNormTrainingBackward) {
      if (bn) return unimplemented("the JIT takes one batch-norm backward per partition");
      bn = &op;
    }
  }
  if (bn == nullptr) {
    return unimplemented(std::string(op_kind_name(partition.ops[0].kind())) +
                         " is not in the JIT (only batch-norm backward, with fused producers)");
  }
  NG_ASSIGN_OR_RETURN(BnConf c, make_conf(*bn, isa));
  auto index_of = [&](int64_t id) {
    for (size_t i = 0; i < partition.inputs.size(); ++i) {
      if (partition.inputs[i].id == id) return static_cast<int>(i);
    }
    return -1;
  };
  PortMap& m = c.ports;
  m.x = index_of(bn->inputs()[0].id);
  m.dy = index_of(bn->inputs()[1].id);
  m.mean = index_of(bn->inputs()[2].id);
  m.variance = index_of(bn->inputs()[3].id);
  m.gamma = bn->inputs().size() > 4 ? index_of(bn->inputs()[4].id) : -1;
  if (m.mean < 0 || m.variance < 0 || (bn->inputs().size() > 4 && m.gamma < 0)) {
    return unimplemented("the JIT needs the statistics as partition inputs");
  }
  for (const Op& op : partition.ops) {
    if (&op == bn) continue;
    if (op.kind() != OpKind::kReLUBackward && op.kind() != OpKind::kAdd) {
      return unimplemented(std::string(op_kind_name(op.kind())) +
                           " does not fuse into the JIT's batch-norm backward");
    }
    const int64_t out = op.outputs()[0].id;
    const int port = out == bn->inputs()[0].id ? 0 : out == bn->inputs()[1].id ? 1 : -1;
    if (port < 0)
      return unimplemented(op.label() + " does not feed the batch norm's src or diff_dst");
    if ((port == 0 && !c.x_strides.empty()) || (port == 1 && !c.dy_strides.empty()))
      return unimplemented("the JIT takes dense fused inputs");
    for (const LogicalTensor& lt : op.inputs()) {
      if (lt.effective_strides() != dense_strides(lt.dims))
        return unimplemented("the JIT takes dense fused inputs");
      if (lt.dims != op.outputs()[0].dims || lt.dtype != op.outputs()[0].dtype)
        return unimplemented("the JIT fuses no broadcasting or mixed-dtype producers");
    }
    const int first = index_of(op.inputs()[0].id), second = index_of(op.inputs()[1].id);
    if (first < 0 || second < 0) return unimplemented("fused producers must read partition inputs");
    const Fuse f = op.kind() == OpKind::kReLUBackward ? Fuse::kReluBackward : Fuse::kAdd;
    if (port == 0) {
      c.x_fuse = f, m.x = first, m.x_second = second;
    } else {
      c.dy_fuse = f, m.dy = first, m.dy_second = second;
    }
  }
  if (m.x < 0 || m.dy < 0)
    return unimplemented("the JIT needs src and diff_dst from partition inputs");
  return c;
}

}  // namespace jit
}  // namespace normgrad
