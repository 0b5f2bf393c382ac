# Install rules and the find_package(Lockstep) package.
#
#   cmake --install build --prefix /opt/lockstep
#   # in another project:
#   find_package(Lockstep REQUIRED)            # CMAKE_PREFIX_PATH=/opt/lockstep
#   target_link_libraries(app PRIVATE lockstep::lockstep)
#
# lockstep::lockstep carries what a translation unit needs to use lockstep and
# libtorch together: torch's include directories, compile flags (the C++ ABI
# define) and libraries through the exported lockstep::lockstep_torch, the
# USE_C10D_GLOO define c10d's Gloo headers need, and yaml-cpp, spdlog,
# nlohmann_json and Threads, which LockstepConfig.cmake finds again.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOCKSTEP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Lockstep)

# Installed binaries find liblockstep next to them, and libtorch wherever it
# was linked from (a pytorch.org libtorch lives outside the system paths).
set_target_properties(lockstep PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  INSTALL_RPATH_USE_LINK_PATH TRUE)
set_target_properties(lockstep_cli PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}" INSTALL_RPATH_USE_LINK_PATH TRUE)

install(TARGETS lockstep lockstep_torch EXPORT LockstepTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS lockstep_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET lockstep_fortran)
  install(TARGETS lockstep_fortran EXPORT LockstepTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_BINARY_DIR}/fortran_modules/lockstep.mod DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep/fortran)
  set_target_properties(lockstep_fortran PROPERTIES EXPORT_NAME fortran)
endif()

# pkg-config, for programs built with make: `cc app.c $(pkg-config --cflags --libs lockstep)`.
configure_file(${PROJECT_SOURCE_DIR}/cmake/lockstep.pc.in ${PROJECT_BINARY_DIR}/lockstep.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/lockstep.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Headers keep their lockstep/<folder>/ paths. What a folder's own sources
# share but users must not include lives in its internal/ subfolder, which is
# not installed, nor are test helpers, test data and the fuzz targets: what is
# installed is the API (tests/package checks that no installed header reaches
# past it).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lockstep/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep
  FILES_MATCHING PATTERN "*.h"
  PATTERN "internal" EXCLUDE
  PATTERN "testdata" EXCLUDE
  PATTERN "fuzz" EXCLUDE
  PATTERN "*_test.h" EXCLUDE
  PATTERN "*_test_util.h" EXCLUDE)

install(EXPORT LockstepTargets NAMESPACE lockstep:: FILE LockstepTargets.cmake
  DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})

# The Torch found here is the one lockstep was compiled against: the package
# looks there first, so a consumer does not pick up a different libtorch.
set(LOCKSTEP_TORCH_DIR "${Torch_DIR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/LockstepConfig.cmake.in
  ${PROJECT_BINARY_DIR}/LockstepConfig.cmake
  INSTALL_DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LockstepConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/LockstepConfig.cmake ${PROJECT_BINARY_DIR}/LockstepConfigVersion.cmake
  DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
