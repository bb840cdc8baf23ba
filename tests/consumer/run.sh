#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer
# through CMake's find_package and through pkg-config. Args: BUILD_DIR SOURCE_DIR.
set -euo pipefail
build="$1"; src="$2"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
libdir="$(dirname "$(find "$work/prefix" -name 'libnormgrad.so' | head -n 1)")"
LD_LIBRARY_PATH="$libdir" "$work/cmake-build/consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# The .pc file names the configured prefix; point pkg-config at the temporary one.
c++ -std=c++17 "$src/tests/consumer/main.cpp" -o "$work/consumer-pc" \
  $(pkg-config --define-variable=prefix="$work/prefix" --cflags --libs normgrad)
LD_LIBRARY_PATH="$libdir" "$work/consumer-pc"
