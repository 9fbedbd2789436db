# peertrain_module(NAME SOURCES ... [PUBLIC deps...] [PRIVATE deps...])
# Makes the static library peertrain_NAME, known as peertrain::NAME here and once
# installed, with the public headers of include/peertrain/NAME and the install rules.
# Compile options given with add_compile_options (-march=native among them) apply while
# building it but are not part of its interface: the installed package forces nothing on
# the programs that use it.
include(GNUInstallDirs)

function(peertrain_module name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;PUBLIC;PRIVATE")
  set(target peertrain_${name})
  add_library(${target} STATIC ${arg_SOURCES})
  add_library(peertrain::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME peertrain_${name}
)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
  target_compile_definitions(${target} PRIVATE BOOST_ASIO_NO_DEPRECATED)
  install(TARGETS ${target} EXPORT peertrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
