# epkit_dep_candidates(<out> <HOME_VAR> [<python module>]): the folders to search for a dependency,
# in order: <HOME_VAR> as a CMake variable, else as an environment variable; then the folder of the
# python3 package <python module> (how NVIDIA's wheels ship headers and libraries). The caller
# appends its own fallbacks and picks the first folder that holds what it needs.
function(epkit_dep_candidates out home_var)
  set(_list "")
  if(DEFINED ${home_var})
    list(APPEND _list "${${home_var}}")
  elseif(DEFINED ENV{${home_var}})
    list(APPEND _list "$ENV{${home_var}}")
  endif()
  if(ARGC GREATER 2)
    find_program(EPKIT_PYTHON3 python3)
    if(EPKIT_PYTHON3)
      execute_process(COMMAND "${EPKIT_PYTHON3}" -c "import ${ARGV2} as m; print(m.__path__[0])"
                      OUTPUT_VARIABLE _py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0 AND _py)
        list(APPEND _list "${_py}")
      endif()
    endif()
  endif()
  set(${out} "${_list}" PARENT_SCOPE)
endfunction()
