# Finds Gloo's headers for c10d's Gloo backend and puts them on lockstep_torch's
# include path (included by LockstepTorch.cmake, after find_package(Torch)).
#
# c10d's Gloo backend header (ProcessGroupGloo.hpp, included
# by lockstep/compat/c10d.cpp) includes gloo/*.h: Debian's libtorch has them
# from libgloo-dev, pytorch.org's libtorch archives may not ship them. They are
# looked for in LOCKSTEP_GLOO_INCLUDE_DIR when it is set (and nowhere else),
# else beside torch's headers, else in the system's. A place counts when it
# holds every gloo header ProcessGroupGloo.hpp needs, directly or through other
# gloo headers (gloo/config.h, which configuring gloo generates, among them if
# one includes it). Only liblockstep's sources include it, so the folders go on
# the build's include path, not on the installed package's.
set(LOCKSTEP_GLOO_INCLUDE_DIR "" CACHE STRING
  "Folders holding Gloo's gloo/ headers, for a libtorch that ships none: <pytorch>/third_party/gloo;<gloo build>")
set(_lockstep_c10d_gloo "")
foreach(_lockstep_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(NOT _lockstep_c10d_gloo AND EXISTS "${_lockstep_dir}/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
    set(_lockstep_c10d_gloo "${_lockstep_dir}/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
  endif()
endforeach()
if(NOT _lockstep_c10d_gloo)
  message(FATAL_ERROR "lockstep: the libtorch found (${Torch_DIR}) has no "
    "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp under ${TORCH_INCLUDE_DIRS}: "
    "lockstep needs a libtorch built with distributed support and Gloo")
endif()
file(STRINGS "${_lockstep_c10d_gloo}" _lockstep_lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]gloo/")
string(REGEX REPLACE "[ \t]*#[ \t]*include[ \t]*[<\"](gloo/[^>\"]+)[>\"][^;]*" "\\1" _lockstep_gloo_roots "${_lockstep_lines}")
list(REMOVE_DUPLICATES _lockstep_gloo_roots)

# Sets <missing> to the gloo headers that <roots> need (following #include
# "gloo/..." from header to header) that none of the folders <dirs> holds, and
# <used> to the folders of <dirs> that hold the others.
function(_lockstep_gloo_headers dirs roots missing used)
  set(todo ${roots})
  set(seen "")
  set(not_found "")
  set(found_in "")
  list(LENGTH todo n)
  while(n GREATER 0)
    list(POP_FRONT todo header)
    if(NOT header IN_LIST seen)
      list(APPEND seen ${header})
      set(path "")
      foreach(dir IN LISTS dirs)
        if(NOT path AND EXISTS "${dir}/${header}")
          set(path "${dir}/${header}")
          list(APPEND found_in ${dir})
        endif()
      endforeach()
      if(path)
        file(STRINGS "${path}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]gloo/")
        string(REGEX REPLACE "[ \t]*#[ \t]*include[ \t]*[<\"](gloo/[^>\"]+)[>\"][^;]*" "\\1" includes "${lines}")
        list(APPEND todo ${includes})
      else()
        list(APPEND not_found ${header})
      endif()
    endif()
    list(LENGTH todo n)
  endwhile()
  list(REMOVE_DUPLICATES found_in)
  set(${missing} "${not_found}" PARENT_SCOPE)
  set(${used} "${found_in}" PARENT_SCOPE)
endfunction()

set(_lockstep_gloo_ok FALSE)
if(LOCKSTEP_GLOO_INCLUDE_DIR)
  _lockstep_gloo_headers("${LOCKSTEP_GLOO_INCLUDE_DIR}" "${_lockstep_gloo_roots}" _lockstep_missing _lockstep_used)
  set(_lockstep_gloo_where "LOCKSTEP_GLOO_INCLUDE_DIR")
  set(_lockstep_gloo_looked "LOCKSTEP_GLOO_INCLUDE_DIR=${LOCKSTEP_GLOO_INCLUDE_DIR}")
  foreach(_lockstep_dir IN LISTS LOCKSTEP_GLOO_INCLUDE_DIR)
    if(NOT IS_ABSOLUTE "${_lockstep_dir}" OR NOT IS_DIRECTORY "${_lockstep_dir}")
      string(APPEND _lockstep_gloo_looked " (${_lockstep_dir}: not an existing absolute folder)")
    endif()
  endforeach()
  if(NOT _lockstep_missing)
    set(_lockstep_gloo_ok TRUE)
    set(_lockstep_used ${LOCKSTEP_GLOO_INCLUDE_DIR})  # every folder named, needed or not
  endif()
else()
  _lockstep_gloo_headers("${TORCH_INCLUDE_DIRS}" "${_lockstep_gloo_roots}" _lockstep_missing _lockstep_used)
  set(_lockstep_gloo_where "beside torch")
  string(REPLACE ";" ", " _lockstep_gloo_looked "beside torch (${TORCH_INCLUDE_DIRS})")
  if(NOT _lockstep_missing)
    set(_lockstep_gloo_ok TRUE)
  else()
    # The system: find_path's own search (CMAKE_PREFIX_PATH, /usr/local, /usr),
    # without keeping its answer in the cache.
    list(GET _lockstep_gloo_roots 0 _lockstep_first)
    find_path(_LOCKSTEP_GLOO_SYSTEM_DIR ${_lockstep_first})
    set(_lockstep_system "${_LOCKSTEP_GLOO_SYSTEM_DIR}")
    unset(_LOCKSTEP_GLOO_SYSTEM_DIR CACHE)
    if(NOT _lockstep_system)
      string(APPEND _lockstep_gloo_looked ", then the system (no ${_lockstep_first} found)")
    else()
      string(APPEND _lockstep_gloo_looked ", then the system (${_lockstep_system})")
      _lockstep_gloo_headers("${_lockstep_system}" "${_lockstep_gloo_roots}" _lockstep_missing _lockstep_used)
      set(_lockstep_gloo_where "the system")
      if(NOT _lockstep_missing)
        set(_lockstep_gloo_ok TRUE)
      endif()
    endif()
  endif()
endif()

if(NOT _lockstep_gloo_ok)
  string(REGEX REPLACE "\\+.*" "" _lockstep_torch_tag "${Torch_VERSION}")
  string(REPLACE ";" " " _lockstep_roots_text "${_lockstep_gloo_roots}")
  string(REPLACE ";" " " _lockstep_missing_text "${_lockstep_missing}")
  message(FATAL_ERROR
    "lockstep: Gloo's headers were not found.\n"
    "c10d's Gloo backend header ${_lockstep_c10d_gloo} includes\n"
    "  ${_lockstep_roots_text}\n"
    "(gloo/*.h, and the gloo headers those include); missing: ${_lockstep_missing_text}\n"
    "Looked in: ${_lockstep_gloo_looked}.\n"
    "Use Gloo headers that match this libtorch (${Torch_VERSION}, ${Torch_DIR}):\n"
    "  - Debian's libtorch: apt install libgloo-dev (libgloo-cuda-dev for libtorch-cuda-dev)\n"
    "  - otherwise (pytorch.org's libtorch archives ship c10d's headers but may lack Gloo's), take\n"
    "    PyTorch's own copy of Gloo at the tag of this libtorch and configure it once, which generates\n"
    "    gloo/config.h:\n"
    "      git clone --depth 1 --branch v${_lockstep_torch_tag} https://github.com/pytorch/pytorch\n"
    "      cd pytorch && git submodule update --init third_party/gloo\n"
    "      cmake -S third_party/gloo -B gloo-build     # creates gloo-build/gloo/config.h\n"
    "    then configure lockstep with both folders (absolute paths):\n"
    "      -DLOCKSTEP_GLOO_INCLUDE_DIR=\"<pytorch>/third_party/gloo;<pytorch>/gloo-build\"")
endif()
foreach(_lockstep_dir IN LISTS _lockstep_used)
  # The compiler's own folders stay implicit (an -isystem /usr/include breaks
  # #include_next), and torch's arrive with torch's target.
  if(NOT _lockstep_dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES AND NOT _lockstep_dir IN_LIST TORCH_INCLUDE_DIRS)
    target_include_directories(lockstep_torch SYSTEM INTERFACE $<BUILD_INTERFACE:${_lockstep_dir}>)
  endif()
endforeach()
string(REPLACE ";" ", " _lockstep_used_text "${_lockstep_used}")
message(STATUS "lockstep: Gloo headers from ${_lockstep_used_text} (${_lockstep_gloo_where})")
