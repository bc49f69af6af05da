// kvevict CUDA emulator: the cp.async primitives (__pipeline_memcpy_async / _commit /
// _wait_prior), as adversarial as the hardware allows: a copy lands in shared memory only
// when its own thread waits for its group, so a read before the wait, or by another
// thread before the copying thread waited and met it at a barrier, sees the old bytes.
#pragma once

#include "cuda_runtime.h"

static inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size, size_t zfill = 0) {
    kve_emu::async_copy(dst, src, size, zfill);
}
static inline void __pipeline_commit() { kve_emu::async_commit(); }
static inline void __pipeline_wait_prior(size_t prior) { kve_emu::async_wait(prior); }
