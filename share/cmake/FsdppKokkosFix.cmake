# Debian's Kokkos 3.4 package (libtrilinos-kokkos-dev) exports Kokkos::kokkos with
# INTERFACE_INCLUDE_DIRECTORIES = <prefix>/lib/include, a folder that does not exist; CMake then refuses to
# generate. The correct folder is in Kokkos_INCLUDE_DIRS. Repair only a listed folder that is missing, so a
# standalone Kokkos 4.x install (whose target is correct) is left untouched. Shared by the build and by
# fsdppConfig.cmake, so consumers of the installed package get the same repair.
if(TARGET Kokkos::kokkos)
  get_target_property(_fsdpp_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_fsdpp_kokkos_fixed "")
  set(_fsdpp_kokkos_changed FALSE)
  foreach(_dir IN LISTS _fsdpp_kokkos_inc)
    if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
      list(APPEND _fsdpp_kokkos_fixed "${_dir}")
    else()
      set(_fsdpp_kokkos_changed TRUE)
    endif()
  endforeach()
  if(_fsdpp_kokkos_changed)
    foreach(_dir IN LISTS Kokkos_INCLUDE_DIRS)
      if(EXISTS "${_dir}")
        list(APPEND _fsdpp_kokkos_fixed "${_dir}")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES _fsdpp_kokkos_fixed)
    set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fsdpp_kokkos_fixed}")
  endif()
  unset(_fsdpp_kokkos_inc)
  unset(_fsdpp_kokkos_fixed)
  unset(_fsdpp_kokkos_changed)
endif()
