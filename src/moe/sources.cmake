target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cpp
)
# The combine loops must vectorise whatever the build type (RelWithDebInfo is -O2), and never
# fuse multiply-adds: every clone must give the same bits as a plain float loop.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels.cpp PROPERTIES COMPILE_OPTIONS "-O3;-ffp-contract=off")
