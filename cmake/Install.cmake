# Installation: the shared library, public headers under include/normgrad/,
# the CLI, a CMake package (normgrad::normgrad) and a pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS normgrad EXPORT normgrad-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${CMAKE_INSTALL_INCLUDEDIR}/normgrad)
install(TARGETS normgrad_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Public headers keep their folders, so their own includes ("graph/op.hpp") resolve
# against include/normgrad/.
set(ng_public_headers
  graph/status.hpp graph/data_type.hpp graph/logical_tensor.hpp graph/op.hpp graph/op_checks.hpp
  graph/graph.hpp graph/partition.hpp graph/json_io.hpp graph/npy.hpp
  ops/op_kinds.def ops/op_schema.hpp ops/op_registry.hpp ops/batch_norm_desc.hpp ops/tf_batch_norm.hpp
  passes/pass.hpp passes/partitioner.hpp passes/canonicalize.hpp
  backends/backend.hpp backends/compiler.hpp)
foreach(h ${ng_public_headers})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${CMAKE_SOURCE_DIR}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad/${dir})
endforeach()
install(FILES ${CMAKE_BINARY_DIR}/generated/graph/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad/graph)
install(FILES ${CMAKE_SOURCE_DIR}/include/normgrad/normgrad.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad)

install(EXPORT normgrad-targets NAMESPACE normgrad:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/normgrad-config.cmake.in
  ${CMAKE_BINARY_DIR}/normgrad-config.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/normgrad-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/normgrad-config.cmake ${CMAKE_BINARY_DIR}/normgrad-config-version.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
configure_file(${CMAKE_SOURCE_DIR}/cmake/normgrad.pc.in ${CMAKE_BINARY_DIR}/normgrad.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/normgrad.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
