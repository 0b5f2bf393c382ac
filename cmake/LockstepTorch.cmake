# One interface target that carries everything a translation unit needs to use
# libtorch and c10d's Gloo backend, and a shared precompiled header for torch.

add_library(lockstep_torch INTERFACE)
target_link_libraries(lockstep_torch INTERFACE ${TORCH_LIBRARIES})
# Note [libstdc++ before libtorch]: pip's libtorch exports C++ library
# functions of its own (std::filesystem's among them) that crash when called
# from outside; naming libstdc++ first makes every program bind to the real ones.
target_link_options(lockstep_torch INTERFACE "LINKER:--push-state,--no-as-needed" "-l:libstdc++.so.6" "LINKER:--pop-state")
# TORCH_CXX_FLAGS carries the C++ ABI define libtorch was built with.
separate_arguments(_lockstep_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(lockstep_torch INTERFACE ${_lockstep_torch_flags})
# c10d's Gloo headers are only visible with USE_C10D_GLOO; the backend is in libtorch.
target_compile_definitions(lockstep_torch INTERFACE USE_C10D_GLOO)
set(LOCKSTEP_WITH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(LOCKSTEP_WITH_CUDA ON)
  target_compile_definitions(lockstep_torch INTERFACE LOCKSTEP_WITH_CUDA)
endif()
message(STATUS "lockstep: libtorch ${Torch_VERSION} from ${Torch_DIR}, CUDA ${LOCKSTEP_WITH_CUDA}")
find_path(LOCKSTEP_NCCL_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)

include(${CMAKE_CURRENT_LIST_DIR}/LockstepGloo.cmake)

# The precompiled header is built once (in a tiny static library) and reused by
# every target, so torch's headers are parsed once per build, not once per target.
add_library(lockstep_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(lockstep_pch PUBLIC lockstep_torch)
target_precompile_headers(lockstep_pch PRIVATE ${PROJECT_SOURCE_DIR}/lockstep/core/internal/pch.h)

function(lockstep_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM lockstep_pch)
endfunction()
