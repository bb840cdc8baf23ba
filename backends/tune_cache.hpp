// Kernel choices measured on this host: `normgrad tune` times the JIT's
// variants per shape class and writes the winners here; compile reads them.
//
// A shape class is op (fwd, bwd, from-dst) x layout x dtype x channel
// bucket x reduction-length bucket x whether src and diff_dst (the forward:
// src and dst) fit in half the L3
// (tune_class). The cache is one JSON file,
// $XDG_CACHE_HOME/normgrad/tune.json (~/.cache/normgrad/tune.json without
// XDG_CACHE_HOME), valid for one host: its "host" object records the CPU
// model, the L2 and L3 sizes, the thread count and normgrad's version, and
// every field must match; its entries are per JIT ISA (avx512, avx2, ...),
// and compile reads only the running ISA's. A file that is unreadable,
// corrupt, or another host's or version's is ignored with one warning on
// stderr naming the field that differs, and compile keeps the JIT's rules.
// NORMGRAD_TUNE=0 turns the cache off. Every variant is deterministic for
// any thread count; a tuned choice may change the low bits within the
// dtype's tolerance (different walks sum in different orders).
#pragma once

#include <map>
#include <string>

#include <normgrad/graph/status.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>

namespace normgrad {

struct TunedChoice {
  std::string variant;   // a JIT variant name (CompileOptions::jit_variant)
  double speedup = 1.0;  // the JIT's own choice's median time over the variant's
};

// "bwd/NXC/f32/c<=256/m<=4096/dram": the shape class of a problem (a
// forward, a backward or a backward from dst).
std::string tune_class(const BatchNormDesc& d);

// The host the cache is valid for, in one line (the file records it field by field).
std::string tune_host_key();

// Where the cache lives (it may not exist).
std::string tune_cache_path();

// The tuned choice for `tune_class` on JIT ISA `isa`, or nullptr: no cache,
// NORMGRAD_TUNE=0, or no entry. The file is read once per process.
const TunedChoice* find_tuned_choice(const std::string& isa, const std::string& tune_class);

// Replaces the entries of `isa` in the cache file (keeping other ISAs'
// entries of the same host) and reloads it. An error names the path when
// the folder or the file cannot be written.
Status write_tuned_choices(const std::string& isa,
                           const std::map<std::string, TunedChoice>& choices);

// Reads the cache file again (after NORMGRAD_TUNE or XDG_CACHE_HOME changed).
void reload_tune_cache();

}  // namespace normgrad
