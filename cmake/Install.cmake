# `cmake --install build --prefix P` installs the headers, one static library per module,
# the peertrain program and a CMake package:
#   find_package(peertrain 0.1 REQUIRED)
#   target_link_libraries(my_program PRIVATE peertrain::topology)   # or ::algo, ::peertrain …
# With CUDA the package also holds peertrain::kernels and peertrain::device (and
# peertrain::nccl with NCCL); peertrain_WITH_CUDA says which.
# (examples/spectral_gap is such a program; tests/install/install_test.sh builds it.)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS peertrain_all EXPORT peertrainTargets)
install(TARGETS peertrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# kernels/ and device/ (and the NCCL group) only where their libraries were built.
set(_without_cuda "")
if(NOT PEERTRAIN_HAVE_CUDA)
  set(_without_cuda PATTERN kernels EXCLUDE PATTERN device EXCLUDE)
endif()
if(NOT PEERTRAIN_HAVE_NCCL)
  list(APPEND _without_cuda PATTERN nccl_group.h EXCLUDE)
endif()
install(DIRECTORY include/peertrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h"
        ${_without_cuda})
install(FILES ${CMAKE_BINARY_DIR}/generated/peertrain/config.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/peertrain)

set(PEERTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/peertrain)
install(EXPORT peertrainTargets NAMESPACE peertrain:: DESTINATION ${PEERTRAIN_CMAKE_DIR})
configure_package_config_file(cmake/peertrainConfig.cmake.in ${CMAKE_BINARY_DIR}/peertrainConfig.cmake
                              INSTALL_DESTINATION ${PEERTRAIN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/peertrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/peertrainConfig.cmake ${CMAKE_BINARY_DIR}/peertrainConfigVersion.cmake
        DESTINATION ${PEERTRAIN_CMAKE_DIR})
