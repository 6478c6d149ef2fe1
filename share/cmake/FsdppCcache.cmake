# Compiler cache for every build of this tree (host, sanitized, fuzz, CUDA, OpenMP; the root project and
# tests/fuzz include this): ccache, when installed, with the checkout as its base directory, so that a clone in
# another folder (CI clones into a new one each run) hits the objects an earlier clone compiled. ccache hashes the
# paths under the base directory relative to the build folder. NOHASHDIR keeps the build folder's own path out of
# the hash of builds with debug information (the sanitized and fuzz ones), whose DWARF then names the folder of
# the clone that compiled first. -ffile-prefix-map makes __FILE__ (error locations, doctest's) and debug paths
# relative to the checkout, the same in every clone, also in the unity batches, which include their sources by
# absolute path; error.cpp's `located` takes off what ccache's relative paths put in front ("../").
# FSDPP_CCACHE=OFF, or a launcher of one's own (CMAKE_CXX_COMPILER_LAUNCHER), turns the cache off or replaces it.
get_filename_component(FSDPP_CHECKOUT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
option(FSDPP_CCACHE "Compile through ccache (when installed), shared by every clone on this machine" ON)
find_program(FSDPP_CCACHE_PROGRAM ccache)
if(FSDPP_CCACHE AND FSDPP_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER env CCACHE_BASEDIR=${FSDPP_CHECKOUT} CCACHE_NOHASHDIR=true ${FSDPP_CCACHE_PROGRAM})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_C_COMPILER_LAUNCHER})
endif()
add_compile_options(-ffile-prefix-map=${FSDPP_CHECKOUT}/=)
