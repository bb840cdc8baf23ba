# Installation: the shared library, public headers under include/normgrad/,
# the CLI, a CMake package (normgrad::normgrad) and a pkg-config file.
include(GNUInstallDirs)
include(${CMAKE_SOURCE_DIR}/cmake/PublicHeaders.cmake)
include(CMakePackageConfigHelpers)

install(TARGETS normgrad EXPORT normgrad-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The installed CLI finds the installed library wherever the prefix is moved.
file(RELATIVE_PATH ng_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set_target_properties(normgrad_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${ng_bin_to_lib}")
install(TARGETS normgrad_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Public headers (cmake/PublicHeaders.cmake) keep their folders under
# include/normgrad/ and include each other as <normgrad/graph/op.hpp>: only
# <prefix>/include goes on a consumer's path.
foreach(h ${ng_public_headers})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${CMAKE_SOURCE_DIR}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad/${dir})
endforeach()
install(FILES ${CMAKE_BINARY_DIR}/generated/normgrad/graph/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad/graph)
install(FILES ${CMAKE_SOURCE_DIR}/include/normgrad/normgrad.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/normgrad)

install(EXPORT normgrad-targets NAMESPACE normgrad:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/normgrad-config.cmake.in
  ${CMAKE_BINARY_DIR}/normgrad-config.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/normgrad-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/normgrad-config.cmake ${CMAKE_BINARY_DIR}/normgrad-config-version.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/normgrad)
# Relocatable: the prefix is found from the .pc file's own folder.
file(RELATIVE_PATH NG_PC_UP ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" NG_PC_UP "${NG_PC_UP}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/normgrad.pc.in ${CMAKE_BINARY_DIR}/normgrad.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/normgrad.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
