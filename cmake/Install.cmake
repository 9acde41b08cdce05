# `cmake --install` puts the library, its public headers and a CMake package
# (find_package(tpdecode CONFIG) -> tpdecode::tpdecode) under the prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tpdecode EXPORT tpdecodeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The installed headers are the API: what an engine calls and the types those calls
# take and return. Kernel helpers, launch shapes and team internals stay in src/
# (tpdecode_internal). Listed one by one, so a new header is public only on purpose;
# scripts/test.sh compiles each installed header on its own (tests/installed_headers).
set(TPDECODE_PUBLIC_HEADERS
  comm.hpp
  cublas_context.hpp
  decode_gemm.hpp
  device_buffer.hpp
  device_info.hpp
  draft_logits.hpp
  error.hpp
  gemm_decision.hpp
  gemm_program.hpp
  gemm_tuner.hpp
  local_team.hpp
  mlp_block_program.hpp
  nccl_team.hpp
  oproj.hpp
  team.hpp
  team_mlp_block.hpp
  team_program.hpp
  tensor.hpp
  tpdecode.hpp
  version.hpp)
# Why the check: include/tpdecode is on every in-tree target's include path, so a
# header there that is not installed would pass in the tree and fail downstream.
file(GLOB _tpdecode_in_folder RELATIVE ${PROJECT_SOURCE_DIR}/include/tpdecode ${PROJECT_SOURCE_DIR}/include/tpdecode/*)
list(SORT _tpdecode_in_folder)
if(NOT _tpdecode_in_folder STREQUAL TPDECODE_PUBLIC_HEADERS)
  message(FATAL_ERROR "include/tpdecode holds ${_tpdecode_in_folder}; cmake/Install.cmake installs ${TPDECODE_PUBLIC_HEADERS}")
endif()
list(TRANSFORM TPDECODE_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/include/tpdecode/)
install(FILES ${TPDECODE_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpdecode)
install(EXPORT tpdecodeTargets NAMESPACE tpdecode:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tpdecodeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tpdecodeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tpdecodeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tpdecodeConfig.cmake ${PROJECT_BINARY_DIR}/tpdecodeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpdecode)
