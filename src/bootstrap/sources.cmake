target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_server.cpp
  ${CMAKE_CURRENT_LIST_DIR}/job_info.cpp
  ${CMAKE_CURRENT_LIST_DIR}/resolve.cpp
)
