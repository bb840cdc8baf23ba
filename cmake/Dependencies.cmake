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
# The JIT can run its loops on GCC's OpenMP runtime (libgomp), the one torch's
# and oneDNN's CPU code use, so that a kernel called between two torch ops
# takes the threads still spinning from the last one instead of competing
# with them (set_thread_runtime, docs/python.md). Only libgomp: a second
# OpenMP runtime (clang's libomp) in a process with torch's would be a
# second pool. ThreadSanitizer builds use std::thread throughout.
set(NORMGRAD_OPENMP OFF)
if(NOT NORMGRAD_TSAN)
  find_package(OpenMP COMPONENTS CXX)
  if(OpenMP_CXX_FOUND AND "gomp" IN_LIST OpenMP_CXX_LIB_NAMES)
    set(NORMGRAD_OPENMP ON)
  endif()
endif()
if(NORMGRAD_OPENMP)
  message(STATUS "normgrad: the JIT can run on OpenMP (libgomp) as well as oneTBB")
else()
  message(STATUS "normgrad: no libgomp OpenMP with this compiler: the JIT runs on oneTBB only")
endif()
if(NORMGRAD_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(NORMGRAD_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()

# normgrad_link_root(root FOLDER_OR_HEADER...): an include root holding only
# these paths of the source tree, as <root>/normgrad/<path> links, so code
# built against it cannot include anything else: the compiler finds no header.
function(normgrad_link_root root)
  foreach(path ${ARGN})
    get_filename_component(dir ${root}/normgrad/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${dir})
    if(NOT EXISTS ${root}/normgrad/${path})
      file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${path} ${root}/normgrad/${path} SYMBOLIC)
    endif()
  endforeach()
endfunction()

# One object library per library folder (a layer), compiled against an
# include root with the layers at and below it only:
#   normgrad_object_library(normgrad_ops a.cpp b.cpp LAYERS graph ops)
function(normgrad_object_library name)
  cmake_parse_arguments(ARG "" "" "LAYERS" ${ARGN})
  add_library(${name} OBJECT ${ARG_UNPARSED_ARGUMENTS})
  set(root ${CMAKE_BINARY_DIR}/layer_roots/${name})
  normgrad_link_root(${root} ${ARG_LAYERS})
  target_include_directories(${name} PUBLIC ${root} ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC TBB::tbb nlohmann_json::nlohmann_json)
  add_dependencies(${name} normgrad_layer_check)
endfunction()
