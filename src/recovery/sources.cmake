target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/init.cpp
  ${CMAKE_CURRENT_LIST_DIR}/monitor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rebuild.cpp
  ${CMAKE_CURRENT_LIST_DIR}/spare.cpp
  ${CMAKE_CURRENT_LIST_DIR}/state.cpp
)
