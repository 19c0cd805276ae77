# buffer.cpp: the Buffer object and entry points; windows.cpp: the transport Prefill and Decode
# share; prefill.cpp, decode.cpp, relay.cpp: one schedule each (schedule.hpp: what they share).
target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/windows.cpp
  ${CMAKE_CURRENT_LIST_DIR}/prefill.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/relay.cpp
  ${CMAKE_CURRENT_LIST_DIR}/xhost.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cpp
)
# The combine loops must vectorise whatever the build type (RelWithDebInfo is -O2), and never
# fuse multiply-adds: every clone must give the same bits as a plain float loop.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels.cpp PROPERTIES COMPILE_OPTIONS "-O3;-ffp-contract=off")
