# nitro::image: nitro::nitro plus what include/nitro/data/image.hpp (and the image data sets) need:
# libjpeg-turbo's TurboJPEG API (Debian libturbojpeg0-dev; turbojpeg.h and libturbojpeg), libjpeg-turbo's
# libjpeg API (libjpeg-dev, i.e. libjpeg62-turbo-dev; jpeglib.h and libjpeg: decoding a crop's region
# only, which TurboJPEG 2 cannot) and libpng (libpng-dev). Used by the build tree and by the installed
# nitroConfig.cmake alike.
# nitro_define_image(<target>): fills the INTERFACE target <target> (made by the caller); sets
# NITRO_IMAGE to 1 in the caller's scope when all three libraries were found, else 0 (and the target
# stays empty: including data/image.hpp then fails to compile, saying which header is missing).
function(nitro_define_image target)
  find_path(NITRO_TURBOJPEG_INCLUDE_DIR turbojpeg.h DOC "TurboJPEG's header (Debian libturbojpeg0-dev)")
  find_library(NITRO_TURBOJPEG_LIBRARY NAMES turbojpeg libturbojpeg.so.0 DOC "TurboJPEG (Debian libturbojpeg0-dev)")
  find_path(NITRO_JPEGLIB_INCLUDE_DIR jpeglib.h DOC "libjpeg-turbo's libjpeg header (Debian libjpeg-dev)")
  find_library(NITRO_JPEG_LIBRARY NAMES jpeg libjpeg.so.62 DOC "libjpeg-turbo's libjpeg (Debian libjpeg-dev)")
  find_package(PNG QUIET)
  set(found 0)
  if(NITRO_TURBOJPEG_INCLUDE_DIR AND NITRO_TURBOJPEG_LIBRARY AND NITRO_JPEGLIB_INCLUDE_DIR AND NITRO_JPEG_LIBRARY
     AND PNG_FOUND)
    set(found 1)
    target_include_directories(${target} SYSTEM INTERFACE "${NITRO_TURBOJPEG_INCLUDE_DIR}" "${NITRO_JPEGLIB_INCLUDE_DIR}")
    target_link_libraries(${target} INTERFACE "${NITRO_TURBOJPEG_LIBRARY}" "${NITRO_JPEG_LIBRARY}" PNG::PNG)
  endif()
  target_compile_definitions(${target} INTERFACE NITRO_IMAGE=${found})
  set(NITRO_IMAGE ${found} PARENT_SCOPE)
  message(STATUS "nitro::image: TurboJPEG ${NITRO_TURBOJPEG_LIBRARY}, libjpeg ${NITRO_JPEG_LIBRARY}, "
                 "libpng ${PNG_FOUND} -> ${found}")
endfunction()
