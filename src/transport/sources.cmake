target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/shm_sync.cpp
)
