// test/check.h: the CHECK macro of the host-side kernel tests (test_gemm.c, test_attention.c): counts
// every check, prints the first 20 failures with their place, and lets the test go on.
#ifndef LLM4D_TEST_CHECK_H
#define LLM4D_TEST_CHECK_H
#include <stdio.h>

static int failures, checks;

#define CHECK(cond, ...)                                                                                    \
    do {                                                                                                    \
        checks++;                                                                                           \
        if (!(cond)) {                                                                                      \
            failures++;                                                                                     \
            if (failures <= 20) {                                                                           \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                 \
                printf(__VA_ARGS__);                                                                        \
                printf("\n");                                                                               \
            }                                                                                               \
        }                                                                                                   \
    } while (0)

#endif
