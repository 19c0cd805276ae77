#!/usr/bin/env bash
# install_test.sh MODE BUILD_DIR CONSUMER_DIR WORK_DIR
#   MODE find_package: install BUILD_DIR into WORK_DIR/prefix, configure + build the consumer
#                      project with find_package(strata) against it, run it.
#   MODE pkg_config:   same install, compile the consumer with `pkg-config --cflags --libs strata`.
# Both also check that the installed `strata` CLI finds its library without LD_LIBRARY_PATH.
set -euo pipefail

mode=$1
build_dir=$2
consumer_dir=$3
work=$4
cmake=${CMAKE_COMMAND:-cmake}
cxx=${CXX:-c++}

fail() {
  echo "install_test($mode): FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH

echo "--- cmake --install $build_dir --prefix $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install failed"; }

[[ -f $prefix/include/strata/types.hpp ]] || fail "public header strata/types.hpp not installed"
[[ -x $prefix/bin/strata ]] || fail "CLI bin/strata not installed"
lib=$(find "$prefix" -name 'libstrata.so' -o -name 'libstrata.a' | head -n 1)
[[ -n $lib ]] || fail "libstrata not installed"
libdir=$(dirname "$lib")
echo "--- library: $lib"

if [[ $lib == *.so ]]; then
  unresolved=$(ldd "$prefix/bin/strata" | grep 'not found' || true)
  [[ -z $unresolved ]] || fail "installed bin/strata cannot find its libraries: $unresolved"
  # The CLI uses the library (heap, store), so it must load the installed copy.
  loaded=$(ldd "$prefix/bin/strata" | awk '/libstrata\.so/ { print $3 }')
  [[ -n $loaded ]] || fail "installed bin/strata does not load libstrata"
  if [[ -n $loaded ]]; then
    [[ $(dirname "$(realpath "$loaded")") == $(realpath "$libdir") ]] ||
      fail "installed bin/strata loads $loaded, not the installed libstrata in $libdir"
    echo "--- bin/strata loads $loaded"
  fi
fi

# Every installed public header compiles on its own (nothing from src/ leaks into them).
for header in "$prefix"/include/strata/*.hpp; do
  echo "#include <strata/$(basename "$header")>" |
    "$cxx" -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - ||
    fail "installed header $(basename "$header") does not compile on its own"
done

case $mode in
  find_package)
    generator=()
    [[ -n ${CMAKE_GENERATOR:-} ]] && generator=(-G "$CMAKE_GENERATOR")
    echo "--- configure consumer (find_package)"
    "$cmake" -S "$consumer_dir" -B "$work/consumer" "${generator[@]}" \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ||
      fail "consumer configure failed"
    found=$(sed -n 's/^strata_DIR:PATH=//p' "$work/consumer/CMakeCache.txt")
    [[ $found == "$prefix"/* ]] || fail "find_package picked $found, not the scratch prefix"
    "$cmake" --build "$work/consumer" || fail "consumer build failed"
    echo "--- run consumer"
    "$work/consumer/consumer" || fail "consumer exited with $?"
    ;;
  pkg_config)
    pc=$(find "$prefix" -name strata.pc | head -n 1)
    [[ -n $pc ]] || fail "strata.pc not installed"
    export PKG_CONFIG_PATH
    PKG_CONFIG_PATH=$(dirname "$pc")
    pkg-config --exists --print-errors strata || fail "pkg-config does not accept strata.pc"
    static=()
    [[ $lib == *.a ]] && static=(--static)
    flags=$(pkg-config --cflags --libs "${static[@]}" strata)
    echo "--- pkg-config --cflags --libs ${static[*]} strata: $flags"
    grep -q -- -lpthread <<<"$(pkg-config --static --libs strata)" || fail "Libs.private lacks -lpthread"
    pc_libdir=$(pkg-config --variable=libdir strata)
    [[ $(cd "$pc_libdir" && pwd -P) == $(cd "$libdir" && pwd -P) ]] ||
      fail "pkg-config libdir $pc_libdir is not where the library is ($libdir)"
    # shellcheck disable=SC2086
    "$cxx" -std=c++20 "$consumer_dir/main.cpp" $flags -o "$work/consumer_pc" ||
      fail "compiling with pkg-config flags failed"
    echo "--- run consumer"
    LD_LIBRARY_PATH=$pc_libdir "$work/consumer_pc" || fail "consumer exited with $?"
    ;;
  *)
    fail "unknown mode (find_package, pkg_config)"
    ;;
esac
echo "install_test($mode): OK"
