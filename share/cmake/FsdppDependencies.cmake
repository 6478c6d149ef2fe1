# Every dependency is found, none is vendored. Debian 12 packages are named next to each one.

find_package(MPI REQUIRED COMPONENTS C)                       # libopenmpi-dev, openmpi-bin
find_package(Threads REQUIRED)

find_package(Kokkos REQUIRED)                                 # libtrilinos-kokkos-dev (3.4) or Kokkos 4.x
include(FsdppKokkosFix)

set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)                      # libhdf5-openmpi-dev, hdf5-tools
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "fsdpp needs a parallel (MPI) HDF5, but found a serial one (${HDF5_C_LIBRARIES}). "
                      "On Debian install libhdf5-openmpi-dev; elsewhere point HDF5_ROOT at an MPI build of HDF5.")
endif()

find_package(yaml-cpp REQUIRED)                               # libyaml-cpp-dev (target yaml-cpp in 0.7)
find_package(fmt REQUIRED)                                    # libfmt-dev
find_package(CLI11 REQUIRED)                                  # libcli11-dev
find_package(nlohmann_json REQUIRED)                          # nlohmann-json3-dev

find_path(FSDPP_RANDOM123_INCLUDE_DIR Random123/philox.h DOC "Folder holding Random123/")  # librandom123-dev
if(NOT FSDPP_RANDOM123_INCLUDE_DIR)
  message(FATAL_ERROR "Random123/philox.h not found; install librandom123-dev or set FSDPP_RANDOM123_INCLUDE_DIR")
endif()

find_path(FSDPP_XXHASH_INCLUDE_DIR xxhash.h DOC "Folder holding xxhash.h")  # libxxhash-dev
find_library(FSDPP_XXHASH_LIBRARY xxhash DOC "The xxHash library (checkpoint checksums)")
if(NOT FSDPP_XXHASH_INCLUDE_DIR OR NOT FSDPP_XXHASH_LIBRARY)
  message(FATAL_ERROR "xxHash not found (xxhash.h: ${FSDPP_XXHASH_INCLUDE_DIR}, library: ${FSDPP_XXHASH_LIBRARY}); "
                      "install libxxhash-dev")
endif()

# fsdpp tokenize --tokenizer: a tokenizer.json's pre-tokenizer expressions mean what they mean to Oniguruma (the
# engine of Hugging Face tokenizers), which compiles every one; those that translate run on PCRE2's JIT, the others
# on Oniguruma (data/regex_splitter.hpp). SentencePiece reads .model files. Found as plain paths (like xxHash) so
# the installed package needs no extra find module.
find_path(FSDPP_ONIG_INCLUDE_DIR oniguruma.h DOC "Folder holding oniguruma.h")  # libonig-dev
find_library(FSDPP_ONIG_LIBRARY onig DOC "The Oniguruma library (tokenizer.json regular expressions)")
if(NOT FSDPP_ONIG_INCLUDE_DIR OR NOT FSDPP_ONIG_LIBRARY)
  message(FATAL_ERROR "Oniguruma not found (oniguruma.h: ${FSDPP_ONIG_INCLUDE_DIR}, library: ${FSDPP_ONIG_LIBRARY}); "
                      "install libonig-dev")
endif()
find_path(FSDPP_PCRE2_INCLUDE_DIR pcre2.h DOC "Folder holding pcre2.h")  # libpcre2-dev
find_library(FSDPP_PCRE2_LIBRARY pcre2-8 DOC "The 8-bit PCRE2 library (tokenizer.json regular expressions, JIT)")
if(NOT FSDPP_PCRE2_INCLUDE_DIR OR NOT FSDPP_PCRE2_LIBRARY)
  message(FATAL_ERROR "PCRE2 not found (pcre2.h: ${FSDPP_PCRE2_INCLUDE_DIR}, library: ${FSDPP_PCRE2_LIBRARY}); "
                      "install libpcre2-dev")
endif()
find_path(FSDPP_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h DOC "Folder holding sentencepiece_processor.h")
find_library(FSDPP_SENTENCEPIECE_LIBRARY sentencepiece DOC "The SentencePiece library (.model tokenizers)")
if(NOT FSDPP_SENTENCEPIECE_INCLUDE_DIR OR NOT FSDPP_SENTENCEPIECE_LIBRARY)
  message(FATAL_ERROR "SentencePiece not found (sentencepiece_processor.h: ${FSDPP_SENTENCEPIECE_INCLUDE_DIR}, "
                      "library: ${FSDPP_SENTENCEPIECE_LIBRARY}); install libsentencepiece-dev")
endif()
find_path(FSDPP_ICU_INCLUDE_DIR unicode/normalizer2.h DOC "Folder holding ICU's unicode/")
find_library(FSDPP_ICU_UC_LIBRARY icuuc DOC "ICU's common library (NFC for tokenizer.json normalizers)")
if(NOT FSDPP_ICU_INCLUDE_DIR OR NOT FSDPP_ICU_UC_LIBRARY)
  message(FATAL_ERROR "ICU not found (unicode/normalizer2.h: ${FSDPP_ICU_INCLUDE_DIR}, library: "
                      "${FSDPP_ICU_UC_LIBRARY}); install libicu-dev")
endif()

# fsdpp tokenize in corpus mode: zstd-compressed JSON Lines (libzstd's streaming decoder) and JSON Lines (simdjson).
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::FSDPP_ZSTD)
  pkg_check_modules(FSDPP_ZSTD IMPORTED_TARGET GLOBAL libzstd)
endif()
if(NOT TARGET PkgConfig::FSDPP_SIMDJSON)
  pkg_check_modules(FSDPP_SIMDJSON IMPORTED_TARGET GLOBAL simdjson)
endif()
if(NOT TARGET PkgConfig::FSDPP_ZSTD OR NOT TARGET PkgConfig::FSDPP_SIMDJSON)
  message(FATAL_ERROR "libzstd or simdjson not found through pkg-config (libzstd.pc, simdjson.pc); install "
                      "pkg-config, libzstd-dev and libsimdjson-dev")
endif()
# ... and JSON Lines compressed with gzip (Dolma's .json.gz), bzip2 and xz, through CMake's own find modules.
find_package(ZLIB)
find_package(BZip2)
find_package(LibLZMA)
if(NOT TARGET ZLIB::ZLIB OR NOT TARGET BZip2::BZip2 OR NOT TARGET LibLZMA::LibLZMA)
  message(FATAL_ERROR "zlib, libbz2 or liblzma not found (ZLIB_FOUND ${ZLIB_FOUND}, BZIP2_FOUND ${BZIP2_FOUND}, "
                      "LIBLZMA_FOUND ${LIBLZMA_FOUND}); install zlib1g-dev, libbz2-dev and liblzma-dev")
endif()

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)                                   # libopenblas-dev
find_path(FSDPP_CBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
          DOC "Folder holding OpenBLAS's cblas.h")
if(NOT FSDPP_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found; install libopenblas-dev or set FSDPP_CBLAS_INCLUDE_DIR")
endif()

# CUDA + NCCL: optional. AUTO turns the backend on when both are found.
set(FSDPP_HAVE_CUDA OFF)
if(NOT FSDPP_ENABLE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(FSDPP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME ENV NCCL_ROOT
              PATH_SUFFIXES include)
    find_library(FSDPP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME ENV NCCL_ROOT
                 PATH_SUFFIXES lib lib64)
  endif()
  if(CUDAToolkit_FOUND AND FSDPP_NCCL_INCLUDE_DIR AND FSDPP_NCCL_LIBRARY)
    set(FSDPP_HAVE_CUDA ON)
    if(NOT TARGET fsdpp_nccl)
      add_library(fsdpp_nccl INTERFACE)
      target_include_directories(fsdpp_nccl SYSTEM INTERFACE ${FSDPP_NCCL_INCLUDE_DIR})
      target_link_libraries(fsdpp_nccl INTERFACE ${FSDPP_NCCL_LIBRARY} CUDA::cudart)
    endif()
  elseif(FSDPP_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FSDPP_ENABLE_CUDA=ON but CUDA toolkit found: ${CUDAToolkit_FOUND}, "
                        "nccl.h: ${FSDPP_NCCL_INCLUDE_DIR}, libnccl: ${FSDPP_NCCL_LIBRARY}. "
                        "Set CUDAToolkit_ROOT / NCCL_HOME, or configure with -DFSDPP_ENABLE_CUDA=OFF.")
  endif()
endif()
