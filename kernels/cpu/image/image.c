// Image decoding as llama.cpp b1-0c1e570's mtmd-helper does it: stb_image (v2.30, vendored beside
// this file, public domain / MIT), 8-bit RGB out (req_comp = 3). image_info reads the size first
// so that the caller can refuse an image too large to decode.
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_NO_FAILURE_STRINGS
#include "stb_image.h"

int image_info(const unsigned char * buf, int len, int * w, int * h) {
    int c = 0;
    return stbi_info_from_memory(buf, len, w, h, &c);
}

// decodes into a malloc'ed w * h * 3 buffer (freed by image_free); NULL when stb_image fails
unsigned char * image_decode_rgb(const unsigned char * buf, int len, int * w, int * h) {
    int c = 0;
    return stbi_load_from_memory(buf, len, w, h, &c, 3);
}

void image_free(void * p) { stbi_image_free(p); }
