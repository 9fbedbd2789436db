# The experiments' CI test, for the top-level CMakeLists.txt to include after the
# peertrain target is defined:   include(experiments/ctest.cmake)
#
# Runs experiments/<name>/run.sh --tiny for every experiment (4 peers, 20 steps, a
# 16-unit MLP) into a temporary folder and checks the CSVs, PNGs and README.md they write.
# About 3 minutes on 2 cores. Needs gnuplot and python3 (exit 77, reported as skipped, without
# them). RUN_SERIAL: it starts up to 4 peer processes at a time and times them.
add_test(NAME experiments.tiny
         COMMAND ${CMAKE_COMMAND} -E env PEERTRAIN=$<TARGET_FILE:peertrain>
                 bash ${PROJECT_SOURCE_DIR}/experiments/ci_test.sh)
set_tests_properties(experiments.tiny PROPERTIES
                     TIMEOUT 600
                     SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE
                     LABELS experiments)
