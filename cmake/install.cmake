# Install rules and the package files consumers use:
#   find_package(strata REQUIRED) + target_link_libraries(app PRIVATE strata::strata)
#   pkg-config --cflags --libs strata
# Everything is relocatable: `cmake --install build --prefix DIR` works for any DIR.

include(CMakePackageConfigHelpers)

set(STRATA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

# Public headers need C++20 (std::span); consumers inherit the requirement from the target.
target_compile_features(strata PUBLIC cxx_std_20)

# The installed CLI finds the installed shared library next to it, wherever the prefix is.
if(BUILD_SHARED_LIBS)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set_target_properties(strata_cli PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_LIBDIR}")
  else()
    set_target_properties(strata_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
endif()

install(TARGETS strata EXPORT strataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS strata_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")

install(EXPORT strataTargets
  NAMESPACE strata::
  FILE strataTargets.cmake
  DESTINATION ${STRATA_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${STRATA_CMAKE_DIR})
# 0.x releases: only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  DESTINATION ${STRATA_CMAKE_DIR})

# pkg-config: the prefix is found relative to the .pc file (${pcfiledir}), so the file stays
# correct whatever --prefix the install used.
set(STRATA_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${STRATA_PC_DIR}")
  set(STRATA_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH STRATA_PC_UP "/prefix/${STRATA_PC_DIR}" "/prefix")
  string(REGEX REPLACE "/$" "" STRATA_PC_UP "${STRATA_PC_UP}")
  set(STRATA_PC_PREFIX "\${pcfiledir}/${STRATA_PC_UP}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(STRATA_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(STRATA_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/strata.pc.in ${PROJECT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata.pc DESTINATION ${STRATA_PC_DIR})
