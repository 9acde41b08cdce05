# `cmake --install` puts the library, its public headers and a CMake package
# (find_package(tpdecode CONFIG) -> tpdecode::tpdecode) under the prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tpdecode EXPORT tpdecodeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tpdecode DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tpdecodeTargets NAMESPACE tpdecode:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tpdecodeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tpdecodeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tpdecodeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tpdecodeConfig.cmake ${PROJECT_BINARY_DIR}/tpdecodeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)
