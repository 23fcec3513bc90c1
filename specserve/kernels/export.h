// What a kernel library exports. Libraries are compiled with -fvisibility=hidden (build.py), so
// only functions declared with KERNEL_API are visible to ctypes; everything else the units share
// is internal to the library and called directly (no PLT).
#pragma once

#define KERNEL_API __attribute__((visibility("default")))
