# The fuzz tests (label `fuzz`), included by tests/CMakeLists.txt. They run in the main tree
# only: the fuzzers carry ASan and UBSan themselves, so the sanitizer trees would run the same
# thing again. Without clang++-14 and libFuzzer they are skipped, saying why (configure output,
# and a `fuzz.skipped` test that reports itself skipped).
set(STRATA_FUZZ_SECONDS 30 CACHE STRING "Seconds each fuzz test fuzzes (ctest -L fuzz)")
option(STRATA_BUILD_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang++ and libFuzzer)" ON)

set(fuzz_skip "")
if(NOT STRATA_BUILD_FUZZ)
  set(fuzz_skip "STRATA_BUILD_FUZZ is OFF")
elseif(NOT STRATA_SANITIZE STREQUAL "")
  message(STATUS "strata: fuzz tests run in the main (unsanitized) tree only")
  return()
else()
  find_program(STRATA_FUZZ_CXX NAMES clang++-14 clang++)
  if(NOT STRATA_FUZZ_CXX)
    set(fuzz_skip "clang++-14 not found (scripts/install_deps.sh installs clang-14 and libfuzzer-14-dev)")
  else()
    # Probe once per compiler: can it link a fuzzer with the sanitizers?
    if(NOT STRATA_FUZZ_PROBED STREQUAL STRATA_FUZZ_CXX)
      set(probe_dir ${CMAKE_BINARY_DIR}/fuzz-probe)
      file(MAKE_DIRECTORY ${probe_dir})
      file(WRITE ${probe_dir}/probe.cpp
           "#include <cstddef>\n#include <cstdint>\n#include <string>\n"
           "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) { return std::string(reinterpret_cast<const char*>(d), n).empty(); }\n")
      execute_process(COMMAND ${STRATA_FUZZ_CXX} -std=c++20 -fsanitize=fuzzer,address,undefined probe.cpp -o probe
                      WORKING_DIRECTORY ${probe_dir} RESULT_VARIABLE probe_rc OUTPUT_VARIABLE probe_out
                      ERROR_VARIABLE probe_out)
      if(probe_rc EQUAL 0)
        set(STRATA_FUZZ_WORKS ON CACHE INTERNAL "")
      else()
        set(STRATA_FUZZ_WORKS OFF CACHE INTERNAL "")
      endif()
      set(STRATA_FUZZ_PROBED ${STRATA_FUZZ_CXX} CACHE INTERNAL "")
    endif()
    if(NOT STRATA_FUZZ_WORKS)
      set(fuzz_skip "${STRATA_FUZZ_CXX} cannot link -fsanitize=fuzzer (install libfuzzer-14-dev, libclang-rt-14-dev)")
    endif()
  endif()
endif()

# scripts/run_tests.sh prints this file's reason after the main tree's tests.
set(fuzz_skip_file ${CMAKE_BINARY_DIR}/fuzz-skipped.txt)
if(fuzz_skip)
  message(STATUS "strata: fuzz tests skipped: ${fuzz_skip}")
  file(WRITE ${fuzz_skip_file} "${fuzz_skip}\n")
  add_test(NAME fuzz.skipped COMMAND sh -c "echo 'fuzz tests skipped: ${fuzz_skip}'; exit 77")
  set_tests_properties(fuzz.skipped PROPERTIES SKIP_RETURN_CODE 77 LABELS fuzz)
  return()
endif()

file(REMOVE ${fuzz_skip_file})
message(STATUS "strata: fuzz targets with ${STRATA_FUZZ_CXX}, ${STRATA_FUZZ_SECONDS} s each (ctest -L fuzz)")
include(ExternalProject)
set(fuzz_bin ${CMAKE_BINARY_DIR}/fuzz)
ExternalProject_Add(strata_fuzzers
  SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}
  BINARY_DIR ${fuzz_bin}
  CMAKE_ARGS -DCMAKE_CXX_COMPILER=${STRATA_FUZZ_CXX} -DCMAKE_BUILD_TYPE=Release
  INSTALL_COMMAND ""
  BUILD_ALWAYS ON  # its own ninja decides what changed in the library sources it compiles
  USES_TERMINAL_BUILD OFF)
foreach(target store net_descriptor)
  add_test(NAME fuzz.${target}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_fuzzer.sh ${fuzz_bin}/fuzz_${target}
                   ${CMAKE_CURRENT_LIST_DIR}/corpus/${target} ${fuzz_bin}/run-${target} ${STRATA_FUZZ_SECONDS})
  math(EXPR fuzz_timeout "${STRATA_FUZZ_SECONDS} * 2 + 120")
  set_tests_properties(fuzz.${target} PROPERTIES LABELS fuzz TIMEOUT ${fuzz_timeout})
endforeach()
