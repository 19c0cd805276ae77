# Open MPI, found once for the peers that use it (bench/peers, tests/examples). Debian ships its
# compiler wrappers with openmpi-bin (which scripts/install_deps.sh installs for the launcher
# tests) and mpi.h only with libopenmpi-dev (scripts/install_bench_deps.sh). FindMPI given a
# wrapper whose include directory is missing stops the whole configure, so the header is
# looked for first: without it the peers are skipped, as where no MPI is installed.
set(STRATA_MPI_FOUND OFF)
find_program(STRATA_MPICXX NAMES mpicxx mpic++ mpiCC)
if(STRATA_MPICXX)
  # Open MPI's wrappers answer --showme, MPICH's -show; both print the compile line.
  set(_strata_mpi_line "")
  foreach(_flag --showme -show)
    execute_process(COMMAND ${STRATA_MPICXX} ${_flag} OUTPUT_VARIABLE _strata_mpi_line RESULT_VARIABLE _rc
                    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0)
      break()
    endif()
    set(_strata_mpi_line "")
  endforeach()
  separate_arguments(_strata_mpi_args UNIX_COMMAND "${_strata_mpi_line}")
  set(_strata_mpi_dirs "")
  foreach(_arg IN LISTS _strata_mpi_args)
    if(_arg MATCHES "^-I(.+)$")
      list(APPEND _strata_mpi_dirs "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  unset(STRATA_MPI_H CACHE)  # looked for again at every configure: the header may come or go
  find_file(STRATA_MPI_H mpi.h HINTS ${_strata_mpi_dirs})
  if(STRATA_MPI_H)
    set(MPI_CXX_SKIP_MPICXX ON)  # the peers call only MPI's C API
    find_package(MPI COMPONENTS CXX QUIET)
    set(STRATA_MPI_FOUND ${MPI_CXX_FOUND})
  else()
    message(STATUS "strata: ${STRATA_MPICXX} found but not mpi.h (libopenmpi-dev): the MPI peers are not built")
  endif()
endif()
