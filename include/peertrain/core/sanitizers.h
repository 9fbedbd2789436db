// Whether this translation unit is built with AddressSanitizer: PEERTRAIN_ADDRESS_SANITIZER.
// GCC says so with __SANITIZE_ADDRESS__, Clang with __has_feature(address_sanitizer).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define PEERTRAIN_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PEERTRAIN_ADDRESS_SANITIZER 1
#endif
#endif
