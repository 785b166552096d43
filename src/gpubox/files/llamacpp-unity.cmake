# gpubox: llama.cpp's slowest C++ targets compiled as unity builds (several .cpp files per
# compiler run), given to CMake with -DCMAKE_PROJECT_INCLUDE=<this file>; no llama.cpp source
# is changed. CMake includes it after every project() call: the guard acts once, and the
# deferred call runs at the end of the top-level CMakeLists, when every target exists.
#
# Why: a cold build of llama-server and llama-bench is about 200 compiles; the common library,
# the server and mtmd repeat the same heavy headers (nlohmann/json, cpp-httplib, the standard
# library) in every file. Batched by 8, those three need a third fewer compiler runs' worth of
# CPU. Measured on a 2-core machine at build 11312: 757 s of compiles in 6 min 19 s, against
# about 500 s in about 4 min 10 s (docs/llamacpp-build.md).
#
# What is left out, and why (each a compile error, or a silent change, in one unity file):
# - common/json.cpp: it specializes common_json::get<T> after another file of the batch has
#   instantiated it ("specialization after instantiation");
# - tools/mtmd/mtmd-helper.cpp and mtmd-helper-gen.cpp: they #error when they see mtmd's
#   internal headers, which a batch with mtmd.cpp includes;
# - common/jinja/*.cpp: each defines its own FILENAME macro for its log lines; batched, one
#   file's would label another's logs;
# - the llama library (src/): upstream builds only src/models/ as unity, on purpose; kept so;
# - ggml and every CUDA target: ggml-cpu's x86 repack files define the same helper twice, and
#   CMake before 3.31 never batches CUDA sources anyway.
#
# A future pin whose files clash in a batch fails to compile: set "llamacpp_unity": False for
# that pin (the build is then upstream's own, one compile per file) and adjust the lists here.
include_guard(GLOBAL)

function(gpubox_llamacpp_unity)
  foreach(target llama-common server-context llama-server-impl mtmd)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    endif()
  endforeach()
  set(top ${CMAKE_SOURCE_DIR})
  file(GLOB jinja RELATIVE ${top}/common ${top}/common/jinja/*.cpp)
  foreach(file json.cpp ${jinja})
    if(EXISTS ${top}/common/${file})
      set_source_files_properties(${top}/common/${file} DIRECTORY ${top}/common
        PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endforeach()
  foreach(file mtmd-helper.cpp mtmd-helper-gen.cpp)
    if(EXISTS ${top}/tools/mtmd/${file})
      set_source_files_properties(${top}/tools/mtmd/${file} DIRECTORY ${top}/tools/mtmd
        PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endforeach()
  message(STATUS "gpubox: unity builds for llama-common, server-context, llama-server-impl, mtmd")
endfunction()

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL gpubox_llamacpp_unity)
