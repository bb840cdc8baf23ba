// JIT variants: named departures from make_conf's choice, for A/B timing.
//
// CompileOptions::jit_variant (and `normgrad bench --jit-variant`) names one
// of the variants below, or "A+B" for both in turn. Each is one row of
// kVariants: its name, the number it may take after a dash (pixels, KiB) and
// the change it makes to the conf. The help text and the error for an
// unknown name are printed from the same table, so a new variant is one row.
// A variant that does not apply to a conf (an NXC walk on an NCX case) leaves
// it as make_conf chose it: the bench times every column on every case. A
// row may also change the forward's conf (bf16-single-vectors,
// fwd-channel-blocks, fwd-ungrouped, fwd-bounce, fwd-no-bounce, fwd-no-nt,
// fwd-strips, fwd-no-strips, fwd-stats-groups, fwd-stats-sweeps,
// bf16-integer-rounding); the forward ignores the rows that do not.
#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>

#include <cstdint>
#include <string>

namespace normgrad {
namespace jit {
namespace {

struct Variant {
  const char* name;
  const char* arg;  // the number's meaning ("PIXELS"), or nullptr when it takes none
  int64_t fallback, lo, hi;
  void (*apply)(BnConf* c, int64_t n);
  void (*forward)(FwdConf* c, int64_t n) = nullptr;  // the change to a forward conf, if any
};

// The pixels walk over all C channels instead of strips (WalkConf::strips),
// so that a variant naming another NXC walk times that walk.
void unstrip(BnConf* c) {
  if (c->walk.strips) choose_pixels_walk(c);
}

// NXC's wide pixel walk on AVX-512, where the blocked and swept walks apply.
bool wide_pixels(const BnConf& c) {
  return c.walk.kind == Walk::kPixels && c.isa == Isa::kAvx512 && c.walk.cols > 64 && !c.empty;
}

const Variant kVariants[] = {
    {"default", nullptr, 0, 0, 0, [](BnConf*, int64_t) {}},  // make_conf's own: a control column
    {"nxc-per-pixel", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) {
       unstrip(c);
       c->walk.pixel_group = 0;
       c->walk.sweep_rows = 0;
       c->prefetch.sweep_ahead = 0;
     }},
    {"nxc-blocked", "PIXELS", kPixelGroup, 1, 16,
     [](BnConf* c, int64_t g) {
       unstrip(c);
       c->walk.sweep_rows = 0;
       c->prefetch.sweep_ahead = 0;
       if (wide_pixels(*c)) c->walk.pixel_group = static_cast<int>(g);
     }},
    {"nxc-swept", "KIB", kSweepCallBytes >> 10, 1, 65536,
     [](BnConf* c, int64_t kib) {
       unstrip(c);
       c->walk.pixel_group = 0;
       c->prefetch.sweep_ahead = 0;
       if (wide_pixels(*c)) c->walk.sweep_rows = sweep_call_rows(*c, kib << 10);
     }},
    {"nxc-swept-ahead", "PIXELS", 8, 1, 4096,
     [](BnConf* c, int64_t ahead) {
       unstrip(c);
       c->walk.pixel_group = 0;
       c->prefetch.sweep_ahead = 0;
       // The prefetches' displacement is a 32-bit immediate.
       if (wide_pixels(*c) &&
           (ahead * c->walk.row_stride + c->walk.cols) * dtype_size(c->d.data_dt) <= INT32_MAX) {
         c->walk.sweep_rows = sweep_call_rows(*c, kSweepCallBytes);
         c->prefetch.sweep_ahead = ahead;
       }
     }},
    {"nxc-contiguous-split", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->walk.contiguous_split = true; }},
    {"nxc-adaptive-split", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->walk.contiguous_split = false; }},
    {"nxc-last-first-apply", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->walk.apply_last_first = true; }},
    {"nxc-forward-apply", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->walk.apply_last_first = false; }},
    {"nxc-strips", "CHANNELS", 0, 0, 1 << 20,
     [](BnConf* c, int64_t w) {
       // Strips of CHANNELS (0 or none: kBwdStripChannels) wherever the walk
       // can take them; the JIT has no rule that takes them by itself.
       if (w == 0) w = kBwdStripChannels;
       if (!bwd_strips_possible(*c, w)) return;
       choose_pixels_walk(c);
       c->walk.cols = w;
       c->walk.strips = true;
       c->walk.sweep_rows = 0;
       c->walk.pixel_group = 0;
       c->prefetch.sweep_ahead = 0;
     }},
    {"ncx-forward-apply", nullptr, 0, 0, 0, [](BnConf* c, int64_t) { c->stream.reverse_rows = 0; }},
    {"ncx-reverse-apply", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->stream.reverse_rows = reverse_apply_rows(*c); }},
    {"ncx-no-next-channel", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->prefetch.next_channel = false; }},
    {"ncx-no-next-group", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->prefetch.next_group = false; }},
    {"ncx-reduce-prefetch", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) {
       if (!c->empty && reduce_prefetch_fits(*c)) c->prefetch.reduce_rows = true;
     }},
    {"ncx-no-nt", nullptr, 0, 0, 0, [](BnConf* c, int64_t) { c->stream.nt_stores = false; }},
    // Sibling batch norms as two partitions (the first with the side
    // output): the JIT declines the siblings pattern (variant_names).
    {"no-siblings", nullptr, 0, 0, 0, [](BnConf*, int64_t) {}},
    // A forward's side output (the activation's input read elsewhere too)
    // as two partitions: the JIT declines the side output, so the batch
    // norm runs alone and its activation apart (variant_names).
    {"fwd-no-side-output", nullptr, 0, 0, 0, [](BnConf*, int64_t) {}},
    {"bf16-single-vectors", nullptr, 0, 0, 0,
     [](BnConf* c, int64_t) { c->stream.pair_vectors = false; },
     [](FwdConf* c, int64_t) { c->pair_vectors = false; }},
    {"fwd-channel-blocks", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) { c->line_walk = false; }},
    {"fwd-ungrouped", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) {
       // One channel per call, chunks of whole rows up to kFwdRowPiece
       // elements (grouped rows are far shorter than that).
       if (c->channel_group == 0) return;
       c->channel_group = 0;
       c->chunk_rows = kFwdRowPiece / c->spatial;
       if (c->bounce) c->bounce = c->streaming = false;  // the rows are off lines
     }},
    {"fwd-no-prefetch", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) { c->prefetch_next_channel = false; }},
    {"fwd-bounce", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) {
       if (!fwd_bounce_possible(*c)) return;
       c->bounce = true;
       c->streaming = true;
     }},
    {"fwd-no-bounce", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) {
       // Ordinary dst stores for grouped rows off lines (they streamed only
       // through the bounce buffer).
       if (!c->bounce) return;
       c->bounce = false;
       c->streaming = false;
     }},
    {"fwd-no-nt", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) {
       // Ordinary dst stores everywhere: neither streaming nor the bounce
       // buffer.
       c->bounce = false;
       c->streaming = false;
     }},
    {"fwd-strips", "CHANNELS", 0, 0, 1 << 20, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t w) {
       // Strips of CHANNELS (0 or none: the rule's width) wherever the walk
       // can take them, also within the cache.
       if (w == 0) w = fwd_strip_width(*c);
       if (!fwd_strips_possible(*c, w)) return;
       c->strip_channels = w;
       c->line_walk = fwd_line_walk(*c);  // each pixel's strip whole
     }},
    {"fwd-no-strips", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) {
       c->strip_channels = 0;
       c->line_walk = fwd_line_walk(*c);
     }},
    {"fwd-stats-groups", "PIXELS", 8, 1, 64, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t g) {
       // The NXC statistics in groups of PIXELS pixels, the sums in memory.
       if (!c->ncx_rows && c->isa != Isa::kPortable) c->stats_pixel_group = static_cast<int>(g);
     }},
    {"fwd-stats-sweeps", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) { c->stats_pixel_group = 0; }},
    {"fwd-stats-no-prefetch", nullptr, 0, 0, 0, [](BnConf*, int64_t) {},
     [](FwdConf* c, int64_t) { c->stats_prefetch = false; }},
    {"bf16-integer-rounding", nullptr, 0, 0, 0, [](BnConf* c, int64_t) { c->avx512_bf16 = false; },
     [](FwdConf* c, int64_t) { c->avx512_bf16 = false; }},
};

// The number after `prefix` and a dash ("nxc-blocked-4"), `fallback` when the
// variant is the prefix alone, -1 when it is neither.
int64_t variant_number(const std::string& variant, const std::string& prefix, int64_t fallback) {
  if (variant == prefix) return fallback;
  if (variant.size() <= prefix.size() + 1 || variant.compare(0, prefix.size() + 1, prefix + "-"))
    return -1;
  int64_t n = 0;
  for (size_t i = prefix.size() + 1; i < variant.size(); ++i) {
    if (variant[i] < '0' || variant[i] > '9' || n > 1000000) return -1;
    n = n * 10 + (variant[i] - '0');
  }
  return n;
}

// Runs each(row, n) for every name of `variant` ("A+B": A, then B), or
// returns the error for the first unknown name or number out of range.
template <typename Each>
Status for_each_variant(const std::string& variant, const Each& each) {
  if (variant.empty()) return ok_status();
  if (const size_t plus = variant.find('+'); plus != std::string::npos) {
    NG_RETURN_IF_ERROR(for_each_variant(variant.substr(0, plus), each));
    return for_each_variant(variant.substr(plus + 1), each);
  }
  for (const Variant& v : kVariants) {
    if (v.arg == nullptr) {
      if (variant != v.name) continue;
      each(v, 0);
      return ok_status();
    }
    const int64_t n = variant_number(variant, v.name, v.fallback);
    if (n < 0) continue;  // "nxc-swept-ahead" is no "nxc-swept-N"
    if (n < v.lo || n > v.hi) {
      return invalid_argument("JIT variant '" + variant + "': " + v.arg + " must be in [" +
                              std::to_string(v.lo) + ", " + std::to_string(v.hi) + "]");
    }
    each(v, n);
    return ok_status();
  }
  return invalid_argument("unknown JIT variant '" + variant + "' (known: " + jit_variant_names() +
                          ")");
}

}  // namespace

std::vector<std::string> jit_variant_list() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) names.emplace_back(v.name);
  return names;
}

std::string jit_variant_names() {
  std::string s;
  for (const Variant& v : kVariants) {
    s += (s.empty() ? "" : ", ") + std::string(v.name);
    if (v.arg != nullptr) s += std::string("[-") + v.arg + "]";
  }
  return s + "; A+B for both";
}

Status apply_variant(const std::string& variant, BnConf* c) {
  return for_each_variant(variant, [&](const Variant& v, int64_t n) { v.apply(c, n); });
}

bool variant_names(const std::string& variant, const char* name) {
  bool named = false;
  const Status s = for_each_variant(
      variant, [&](const Variant& v, int64_t) { named = named || std::string(v.name) == name; });
  return s.ok() && named;
}

Status apply_forward_variant(const std::string& variant, FwdConf* c) {
  return for_each_variant(variant, [&](const Variant& v, int64_t n) {
    if (v.forward != nullptr) v.forward(c, n);
  });
}

}  // namespace jit
}  // namespace normgrad
