// emu/emu_internal.h: what emu/runtime.cc and emu/exec.cc share (not seen by the CUDA sources).
#ifndef LLM4D_EMU_INTERNAL_H
#define LLM4D_EMU_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <string>

#include "emu.h"

struct EmuLaunch {
    std::string name;
    const void *func;
    dim3 grid, block;
    size_t smem;
    std::function<void()> body;
};

// Runs every block of a launch (exec.cc). Returns 0, or 1 when the checker reported a failure (the
// report is on stderr); the runtime then makes the error sticky.
int emu_exec(const EmuLaunch &L);

// Device memory (runtime.cc): whether [a, a + n) lies inside one live allocation; if not, `why` says
// what is there instead (for the report).
bool emu_dev_in_arena(uintptr_t a);
bool emu_dev_ok(uintptr_t a, size_t n, char *why, size_t cap);
// the emulated device's compute capability major (9 or 8)
int emu_cc_major(void);

// SIGSEGV/SIGBUS: a kernel's fault is its failure; a host access to device memory is named (exec.cc)
int emu_install_fault_handler(void);

void emu_vreport(const char *prefix, const char *fmt, va_list ap);

#endif
