# Tests between network namespaces (one "host" per namespace, veths to a bridge; see
# netns_lib.sh). Included from tests/CMakeLists.txt after the test subdirectories, so that the
# rank programs of tests/multihost/CMakeLists.txt (mh_rank) exist when there is one. They need
# root and skip (ctest SKIP_RETURN_CODE 77, with the reason in the log) elsewhere. Labelled
# `multihost` so a run can leave them out (ctest -LE multihost) or pick them (-L multihost).

set(_mh ${CMAKE_CURRENT_LIST_DIR})
set(_mh_bin ${CMAKE_CURRENT_BINARY_DIR}/multihost)

add_executable(mh_smoke_rank ${_mh}/mh_smoke_rank.cpp)
target_include_directories(mh_smoke_rank PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(mh_smoke_rank PRIVATE strata)
set_target_properties(mh_smoke_rank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${_mh_bin})

# mh_test(NAME TIMEOUT CASE [ARGS...]): launcher_netns_test.sh's CASE with ARGS after the
# launcher and the smoke rank, labelled multihost, skipped (77) where namespaces cannot be made.
function(mh_test name timeout)
  add_test(NAME ${name}
    COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT ${timeout})
endfunction()

# The launcher alone: any build.
foreach(case smoke rank_failure link_down)
  mh_test(multihost_launcher_${case} 120 ${case})
endforeach()

# Collectives across namespaces need the UCX transport (STRATA_WITH_UCX); the matrix also
# needs mh_rank (tests/multihost/mh_rank.cpp, the collective matrix through the public API).
# By hand:
#   tests/multihost/netns.sh --hosts 2,2 -- build/tests/multihost/mh_rank
#   tests/multihost/netns.sh --hosts 1,2,2 -- build/tests/multihost/mh_rank
if(STRATA_WITH_UCX)
  add_executable(mh_linkdown_rank ${_mh}/mh_linkdown_rank.cpp)
  target_link_libraries(mh_linkdown_rank PRIVATE strata)
  set_target_properties(mh_linkdown_rank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${_mh_bin})
  mh_test(multihost_collective_link_down 120 collective_link_down $<TARGET_FILE:mh_linkdown_rank>)
  mh_test(multihost_settings_mismatch 120 settings_mismatch)
  if(TARGET train_dp)
    mh_test(multihost_options_mismatch 120 options_mismatch $<TARGET_FILE:train_dp>)
  endif()

  # Recovery across hosts: train_dp under `strata run --ft --nnodes 2`.
  if(TARGET train_dp)
    mh_test(multihost_ft 300 ft $<TARGET_FILE:train_dp>)
    mh_test(multihost_ft_spare_host 300 ft_spare_host $<TARGET_FILE:train_dp>)
    mh_test(multihost_ft_store_lost 120 ft_store_lost $<TARGET_FILE:train_dp>)
  endif()

  if(TARGET mh_rank)
    foreach(counts 2,2 1,2,2)
      string(REPLACE "," "_" _name ${counts})
      mh_test(multihost_matrix_${_name} 200 matrix ${counts} $<TARGET_FILE:mh_rank>)
    endforeach()
  endif()
  # examples/moe_serve across two namespace hosts of two ranks each, every path, --check.
  if(TARGET moe_serve)
    mh_test(multihost_moe_serve_2_2 300 moe_serve $<TARGET_FILE:moe_serve>)
  endif()
  # moe::Buffer across two namespace hosts of two ranks each (mh_moe_rank.cpp checks itself).
  if(TARGET mh_moe_rank)
    mh_test(multihost_moe_2_2 200 matrix 2,2 $<TARGET_FILE:mh_moe_rank>)
  endif()
endif()
