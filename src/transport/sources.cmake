target_sources(strata PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/shm_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/net.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ucx_wire.cpp
)
if(STRATA_WITH_UCX)
  target_sources(strata PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx.cpp)
  target_compile_definitions(strata PRIVATE STRATA_HAVE_UCX=1)
  target_link_libraries(strata PRIVATE PkgConfig::UCX)
endif()
