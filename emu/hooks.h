// emu/hooks.h: what the emulated GPU's core (emu/exec.cc, emu/runtime.cc) gives its sm_90a module
// (emu/sm90.cc), declared once for both sides: emu/emu.h includes it for the core, emu/sm90.h for the
// module and for the unit test's single-threaded mock (test/test_emu_sm90.cc), which defines them
// itself. emu_block_data must return zeroed bytes the first time a block asks for a key.
#ifndef LLM4D_EMU_HOOKS_H
#define LLM4D_EMU_HOOKS_H

#include <stddef.h>
#include <stdint.h>

[[noreturn]] void emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void emu_yield(void);
unsigned emu_thread_rank(void);
unsigned emu_block_threads(void);
unsigned char *emu_smem(uint32_t addr, size_t bytes);
void emu_smem_pending(uint32_t addr, size_t bytes);
void emu_smem_ready(uint32_t addr, size_t bytes);
void emu_collective(unsigned width, const char *op, void *my_args, void (*exec)(void **args, unsigned n, void *ctx), void *ctx);
void *emu_block_data(const char *key, size_t bytes, void (*fini)(void *));
int emu_regs_per_thread_limit(void);

#endif
