target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cma.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fd_channel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/heap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/segment.cpp
)
