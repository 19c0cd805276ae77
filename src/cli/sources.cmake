# What `strata bench` shares with its peers in bench/peers (the method, the command line, the
# check, the reports): free of libstrata symbols, so the peers compile these files themselves.
set(STRATA_BENCH_SHARED_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/bench_colls.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_args.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_sweep.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_output.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_neighbour.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../common/parse.cpp
)

target_sources(strata_cli PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cli_util.cpp
  # strata run: command line (run), one host (launcher), multi-node agent, --ft
  ${CMAKE_CURRENT_LIST_DIR}/run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/launcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flight_report.cpp
  ${CMAKE_CURRENT_LIST_DIR}/node_agent.cpp
  ${CMAKE_CURRENT_LIST_DIR}/node_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ft_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ft_controller.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rank_groups.cpp
  ${CMAKE_CURRENT_LIST_DIR}/output_queue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_cmd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/info.cpp
  # strata bench: the ranks and the launcher side (bench), MoE (bench_moe), the shared parts
  ${CMAKE_CURRENT_LIST_DIR}/bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_moe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_colls.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_args.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_sweep.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_output.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_neighbour.cpp
)
target_compile_definitions(strata_cli PRIVATE STRATA_VERSION="${PROJECT_VERSION}")
