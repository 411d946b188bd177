#ifndef CFERRYCRC_H
#define CFERRYCRC_H

#include <stddef.h>
#include <stdint.h>

/// 1 when this CPU computes CRC-32C with an instruction (SSE4.2 on x86-64, the ARMv8 CRC
/// extension on arm64) and ferry_crc32c_update may be called; 0 otherwise.
int ferry_crc32c_available(void);

/// Continues a CRC-32C (Castagnoli, reflected) over `count` bytes: `crc` is a finished CRC (0 to
/// start) and so is the result. Call only when ferry_crc32c_available() returned 1.
uint32_t ferry_crc32c_update(uint32_t crc, const void *bytes, size_t count);

#endif
