# The C++ standard lockstep compiles with: the one its libtorch asks for
# (included right after find_package(Torch), before any target exists).
#
#   include(cmake/LockstepCxxStandard.cmake)   # sets LOCKSTEP_CXX_STANDARD, CMAKE_CXX_STANDARD
#
# Note [One C++ standard per libtorch]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# libtorch 2.14's headers need C++20 (a file holding only <torch/torch.h>
# gives 20 errors under -std=c++17: intrusive_ptr != nullptr in autograd's
# edge.h, at::symint::sizes in ExpandUtils.h, ...), while 1.13's and 2.6's
# are C++17 code that GCC 12 compiles as C++20 only with warnings of its own
# (deprecated implicit captures of this, comparisons rewritten as C++20 reads
# them). So lockstep compiles with the standard its libtorch asks for, not one
# for all: libtorch says so itself, as the CXX_STANDARD property of its torch
# target (TorchConfig.cmake, 2.14 and later); without that property, C++17.
# The standard is a property of the build, not of a version number: a
# libtorch built from source that asks for 20 gets 20. lockstep's code is
# written to compile under both. The exported lockstep::lockstep target
# carries it as the compile feature cxx_std_<N>, so a consumer's program is
# compiled with at least the standard liblockstep and its libtorch were, and
# LockstepConfig.cmake sets Lockstep_CXX_STANDARD for a project that wants to
# know.
set(LOCKSTEP_CXX_STANDARD 17)
if(TARGET torch)
  get_target_property(_lockstep_torch_standard torch CXX_STANDARD)
  if(_lockstep_torch_standard AND _lockstep_torch_standard GREATER LOCKSTEP_CXX_STANDARD)
    set(LOCKSTEP_CXX_STANDARD ${_lockstep_torch_standard})
  endif()
endif()
set(CMAKE_CXX_STANDARD ${LOCKSTEP_CXX_STANDARD})
set(CMAKE_CXX_STANDARD_REQUIRED ON)
message(STATUS "lockstep: C++${LOCKSTEP_CXX_STANDARD}, as libtorch ${Torch_VERSION} asks")
