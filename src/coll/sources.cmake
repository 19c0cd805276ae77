target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/algorithms.cpp
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/membership.cpp
  ${CMAKE_CURRENT_LIST_DIR}/communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/multihost.cpp
)
