target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/heap.cpp
)
