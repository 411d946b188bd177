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

/// The processors the calling thread may run on (its affinity mask: `taskset`, a container's
/// cpuset), on Linux; 0 when unknown (elsewhere, or when the mask cannot be read). Foundation's
/// `activeProcessorCount` ignores the mask on Linux: under `taskset -c 0` it still counts every
/// processor online.
int ferry_affinity_processors(void);

/// A hint to the CPU that the caller is polling (`pause` on x86-64, `yield` on arm64): less
/// power and less contention with the other hardware thread while the log's writer waits a few
/// microseconds for the next job (GroupCommitWriter's spin).
static inline void ferry_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

#endif
