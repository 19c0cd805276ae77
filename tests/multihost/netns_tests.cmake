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

# The launcher alone: any build.
foreach(case smoke rank_failure link_down)
  add_test(NAME multihost_launcher_${case}
    COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank> ${case})
  set_tests_properties(multihost_launcher_${case} PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 120)
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
  add_test(NAME multihost_collective_link_down
    COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
            collective_link_down $<TARGET_FILE:mh_linkdown_rank>)
  set_tests_properties(multihost_collective_link_down PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 120)
  add_test(NAME multihost_settings_mismatch
    COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank> settings_mismatch)
  set_tests_properties(multihost_settings_mismatch PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 120)
  if(TARGET train_dp)
    add_test(NAME multihost_options_mismatch
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              options_mismatch $<TARGET_FILE:train_dp>)
    set_tests_properties(multihost_options_mismatch PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 120)
  endif()

  # Recovery across hosts: train_dp under `strata run --ft --nnodes 2`.
  if(TARGET train_dp)
    add_test(NAME multihost_ft
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              ft $<TARGET_FILE:train_dp>)
    set_tests_properties(multihost_ft PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 300)
    add_test(NAME multihost_ft_spare_host
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              ft_spare_host $<TARGET_FILE:train_dp>)
    set_tests_properties(multihost_ft_spare_host PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 300)
    add_test(NAME multihost_ft_store_lost
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              ft_store_lost $<TARGET_FILE:train_dp>)
    set_tests_properties(multihost_ft_store_lost PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 120)
  endif()

  if(TARGET mh_rank)
    foreach(counts 2,2 1,2,2)
      string(REPLACE "," "_" _name ${counts})
      add_test(NAME multihost_matrix_${_name}
        COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
                matrix ${counts} $<TARGET_FILE:mh_rank>)
      set_tests_properties(multihost_matrix_${_name} PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 200)
    endforeach()
  endif()
  # examples/moe_serve across two namespace hosts of two ranks each, every path, --check.
  if(TARGET moe_serve)
    add_test(NAME multihost_moe_serve_2_2
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              moe_serve $<TARGET_FILE:moe_serve>)
    set_tests_properties(multihost_moe_serve_2_2 PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 300)
  endif()
  # moe::Buffer across two namespace hosts of two ranks each (mh_moe_rank.cpp checks itself).
  if(TARGET mh_moe_rank)
    add_test(NAME multihost_moe_2_2
      COMMAND bash ${_mh}/launcher_netns_test.sh $<TARGET_FILE:strata_cli> $<TARGET_FILE:mh_smoke_rank>
              matrix 2,2 $<TARGET_FILE:mh_moe_rank>)
    set_tests_properties(multihost_moe_2_2 PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 200)
  endif()
endif()
