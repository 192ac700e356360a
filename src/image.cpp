// Nitro's compiled library for images (nitro::compiled_image): JPEG and PNG decoding, the image data
// sets, nvJPEG, the JPEG batches decoded on a device.
#include <nitro/data/image-inl.hpp>
#include <nitro/data/image_folder-inl.hpp>
#include <nitro/data/jpeg_batches-inl.hpp>
#include <nitro/data/nvjpeg-inl.hpp>

extern "C" int nitro_compiled_image_library_is_not_linked__link_nitro_compiled_image() noexcept { return 0; }
