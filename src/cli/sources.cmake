target_sources(strata_cli PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cli_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ft_controller.cpp
  ${CMAKE_CURRENT_LIST_DIR}/node_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_cmd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/info.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_moe.cpp
)
target_compile_definitions(strata_cli PRIVATE STRATA_VERSION="${PROJECT_VERSION}")
