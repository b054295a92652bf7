/* The three ggml functions ggml-quants.c calls outside itself, for benches/quality_gguf.py's
 * --ggml library (ggml's reference quantizers alone, no ggml build):
 *
 *   gcc -O2 -shared -fPIC -I ggml/include -I ggml/src -I ggml/src/ggml-cpu \
 *       -o libggmlq.so ggml/src/ggml-quants.c benches/ggml_stubs.c -lm
 *
 * Block geometry of the types the benchmark uses (ggml type number -> values, bytes). */
#include <stddef.h>
#include <stdint.h>

static int block_values(int t) {
    switch (t) {
    case 10: case 11: case 12: case 13: case 14: case 23: return 256; /* K-quants, IQ4_XS */
    case 40: return 64;                                                /* NVFP4 */
    default: return 32;
    }
}

static int block_bytes(int t) {
    switch (t) {
    case 2: return 18;   /* Q4_0 */
    case 3: return 20;   /* Q4_1 */
    case 6: return 22;   /* Q5_0 */
    case 7: return 24;   /* Q5_1 */
    case 8: return 34;   /* Q8_0 */
    case 10: return 84;  /* Q2_K */
    case 11: return 110; /* Q3_K */
    case 12: return 144; /* Q4_K */
    case 13: return 176; /* Q5_K */
    case 14: return 210; /* Q6_K */
    case 20: return 18;  /* IQ4_NL */
    case 23: return 136; /* IQ4_XS */
    case 39: return 17;  /* MXFP4 */
    case 40: return 36;  /* NVFP4 */
    default: return 0;
    }
}

size_t ggml_type_size(int t) { return (size_t)block_bytes(t); }
size_t ggml_row_size(int t, int64_t ne) { return (size_t)(block_bytes(t) * ne / block_values(t)); }
const char * ggml_type_name(int t) { (void)t; return "?"; }
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    (void)file; (void)line; (void)fmt;
    __builtin_trap();
}
