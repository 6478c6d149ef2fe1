# cmake --install: library, headers, the fsdpp executable, and a package config so that another project can
#   find_package(fsdpp) and link fsdpp::fsdpp.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(FSDPP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_DATADIR}/cmake/fsdpp)

install(TARGETS fsdpp EXPORT fsdppTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET fsdpp_nccl)
  install(TARGETS fsdpp_nccl EXPORT fsdppTargets)
endif()
install(TARGETS fsdpp_app RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lib/fsdpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/fsdpp/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdpp)
install(EXPORT fsdppTargets NAMESPACE fsdpp:: DESTINATION ${FSDPP_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/share/cmake/fsdppConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/fsdppConfig.cmake
                              INSTALL_DESTINATION ${FSDPP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fsdppConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fsdppConfig.cmake ${PROJECT_BINARY_DIR}/fsdppConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/share/cmake/FsdppKokkosFix.cmake
        DESTINATION ${FSDPP_INSTALL_CMAKEDIR})
# mpiexec that turns SIGTERM/SIGINT into fsdpp's preemption signal (see the script).
install(PROGRAMS ${PROJECT_SOURCE_DIR}/share/scripts/fsdpp-mpiexec DESTINATION ${CMAKE_INSTALL_BINDIR})
