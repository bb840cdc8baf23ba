#!/usr/bin/env bash
# Installs the build into a temporary prefix, then, as an integrator would:
# builds examples/integrator through find_package and through pkg-config (no prefix
# override: the .pc file is relocatable), builds an app that has its own
# graph/status.hpp, moves the prefix and runs the installed CLI from there.
# Args: BUILD_DIR SOURCE_DIR.
set -euo pipefail
build="$1"; src="$2"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/integrator" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
libdir="$(dirname "$(find "$work/prefix" -name 'libnormgrad.so' | head -n 1)")"
# Both run without LD_LIBRARY_PATH: CMake's build RPATH, and the .pc's -rpath.
"$work/cmake-build/consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
c++ -std=c++17 "$src/examples/integrator/main.cpp" -o "$work/consumer-pc" \
  $(pkg-config --cflags --libs normgrad)
"$work/consumer-pc"
c++ -std=c++17 -I"$src/tests/consumer/app_with_own_graph" \
  "$src/tests/consumer/app_with_own_graph/main.cpp" -o "$work/app" \
  $(pkg-config --cflags --libs normgrad)
"$work/app"
# An out-of-tree pass plugin with its own test, built against the install,
# then loaded by the installed CLI.
cmake -S "$src/examples/pass_plugin" -B "$work/plugin-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/plugin-build" >/dev/null
plugin="$work/plugin-build/libdrop_identity_transpose.so"
LD_LIBRARY_PATH="$libdir" "$work/plugin-build/plugin_test" "$plugin"
"$work/prefix/bin/normgrad" opt "$src/examples/pass_plugin/identity_transpose.json" \
  --load-pass-plugin="$plugin" --passes=drop-identity-transpose > "$work/opt.json"
if grep -q StaticTranspose "$work/opt.json"; then echo "plugin pass did not run"; exit 1; fi
echo "installed opt ran the plugin pass"
# The installed CLI starts on its own (RPATH), also after the prefix moves.
mv "$work/prefix" "$work/moved"
"$work/moved/bin/normgrad" run "$src/examples/graphs/bn_training_backward_f32_nxc.json" --check \
  | tail -n 1 | sed 's/^/installed cli: /'
# The installed Python package imports from the moved prefix (its RPATH is relative).
pydir="$(dirname "$(find "$work/moved" -name '_normgrad*.so' | head -n 1)" 2>/dev/null)"
if [ -n "$pydir" ] && [ -x /usr/bin/python3 ]; then
  PYTHONPATH="$(dirname "$pydir")" /usr/bin/python3 -c \
    "import normgrad; print('installed python:', normgrad.__version__, 'backends', normgrad.backends())"
else
  echo "installed python: skipped (the build has no Python package)"
fi
