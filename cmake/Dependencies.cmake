# Dependency lookup: Debian 12 packages only, through their CMake CONFIG files.
#
# oneDNN's config looks for OpenCL headers (ocl-icd-opencl-dev) even on CPU builds;
# the later backends need dnnl and xbyak, so they are found here once for all.
find_package(TBB CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_package(CLI11 2.1 CONFIG REQUIRED)  # the command line's parser (libcli11-dev)
if(NORMGRAD_WITH_DNNL)
  find_package(dnnl CONFIG REQUIRED)
endif()
if(NORMGRAD_WITH_JIT)
  find_package(xbyak CONFIG REQUIRED)
endif()
# MPI is optional (Debian's Open MPI has no CONFIG package: CMake's FindMPI).
# Without it the MPI backend is left out and AllReduce runs only for a
# process alone; the build says so rather than failing.
if(NORMGRAD_WITH_MPI)
  enable_language(C)  # FindMPI probes with the C compiler
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    message(STATUS "normgrad: MPI backend on (${MPI_C_LIBRARIES})")
  else()
    message(STATUS "normgrad: no MPI found (install libopenmpi-dev): the MPI backend and its tests are skipped")
    set(NORMGRAD_WITH_MPI OFF)
  endif()
endif()
if(NORMGRAD_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(NORMGRAD_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()

# Every object library in the tree compiles with the repository root on the include path.
function(normgrad_object_library name)
  add_library(${name} OBJECT ${ARGN})
  target_include_directories(${name} PUBLIC ${CMAKE_BINARY_DIR}/include_root
                             ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC TBB::tbb nlohmann_json::nlohmann_json)
endfunction()
