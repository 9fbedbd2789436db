# The NCCL backend of comm::Group, in a library of its own so that peertrain_lib and the
# code above it never link CUDA or NCCL. Included from the top-level CMakeLists.txt only
# when PEERTRAIN_HAVE_NCCL is ON (cmake/Cuda.cmake sets NCCL_INCLUDE_DIR and NCCL_LIBRARY).
add_library(peertrain_nccl STATIC
  ${PROJECT_SOURCE_DIR}/src/comm/nccl_group.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/nccl_member.cpp
  ${PROJECT_SOURCE_DIR}/src/comm/nccl_progress.cpp)
add_library(peertrain::nccl ALIAS peertrain_nccl)
set_target_properties(peertrain_nccl PROPERTIES EXPORT_NAME nccl)
# nccl.h is private: include/peertrain/comm/nccl_group.h keeps CUDA and NCCL types out.
target_include_directories(peertrain_nccl PRIVATE ${NCCL_INCLUDE_DIR})
target_link_libraries(peertrain_nccl PUBLIC peertrain::comm PRIVATE CUDA::cudart ${NCCL_LIBRARY})
install(TARGETS peertrain_nccl EXPORT peertrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

if(PEERTRAIN_TESTS)
  include(GoogleTest)
  add_executable(nccl_group_test ${PROJECT_SOURCE_DIR}/tests/comm/nccl_group_test.cpp)
  target_link_libraries(nccl_group_test PRIVATE peertrain_nccl GTest::gtest_main CUDA::cudart)
  set_target_properties(nccl_group_test PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # Without a GPU every test skips itself, so discovery and the run stay cheap.
  gtest_discover_tests(nccl_group_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endif()
