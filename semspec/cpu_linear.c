/* y = x @ w.T in float32 for passes of a few rows, with w packed in panels of W output
   columns: p[(n / W) * K * W + k * W + n % W] = w[n, k] (semspec/cpu_linear.py packs it;
   W is the vector width the library was built for, which ``packed_panel`` returns: 16
   with AVX-512, else 8 with AVX2 + FMA).

   A pass over a few rows is bound by how fast the weights stream from memory: each panel
   is read once, contiguously, and used for every row while it is in the L1 cache. The
   loops prefetch the weights they will read a few KB ahead: the hardware prefetcher alone
   left a pass over 4-12 rows at half the memory's speed (docs/batching.md). Past ~10 rows
   the multiply-adds bind, which is where AVX-512's wider vectors pay. Each output element
   is one chain of fused multiply-adds over k in order, whatever the number of rows, however
   they are blocked and whatever the vector width, so a row's result does not depend on the
   other rows of its pass (a sequence's logits are the same alone and in a batch, for passes
   up to the row limit of semspec/cpu_linear.py) nor on which build computed it.

   Built by semspec/cpu_linear.py with: cc -O3 -mavx2 -mfma [-mavx512f] -shared -fPIC */
#include <immintrin.h>

#ifdef __AVX512F__
#define W 16
#define VEC __m512
#define VZERO _mm512_setzero_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VBROADCAST(ptr) _mm512_set1_ps(*(ptr))
#else
#define W 8
#define VEC __m256
#define VZERO _mm256_setzero_ps
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VBROADCAST(ptr) _mm256_broadcast_ss(ptr)
#endif

/* how far ahead (in floats) each stream of weights is prefetched: the one-panel loop reads
   one stream, the four-panel loop four at once (measured best on the development machine:
   16 KB and 4 x 2 KB; 2-4x shorter or longer cost up to 1.3x) */
#define AHEAD_ONE 4096
#define AHEAD_FOUR 512
#define PREFETCH(q, ahead) _mm_prefetch((const char *)((q) + k * W + (ahead)), _MM_HINT_T0);

/* accumulators a<row>_<panel>: up to 12 rows against one panel, 3 against four */
#define R12(OP, j) OP(0, j) OP(1, j) OP(2, j) OP(3, j) OP(4, j) OP(5, j) OP(6, j) OP(7, j) \
                   OP(8, j) OP(9, j) OP(10, j) OP(11, j)
#define R3(OP, j) OP(0, j) OP(1, j) OP(2, j)
#define DECL(i, j) VEC a##i##_##j = VZERO();
#define STEP(i, j) if (mb > i) a##i##_##j = VFMA(VBROADCAST(x + i * ldx + k), w##j, a##i##_##j);
#define STORE(i, j) if (mb > i) VSTORE(y + i * ldy + W * j, a##i##_##j);

/* MB rows (1..12) against one panel */
#define ONE_PANEL(MB)                                                                        \
static void rows_##MB(const float *restrict x, long ldx, const float *restrict p,           \
                      float *restrict y, long ldy, long K) {                                \
    const int mb = MB;                                                                       \
    R12(DECL, 0)                                                                             \
    for (long k = 0; k < K; k++) {                                                           \
        PREFETCH(p, AHEAD_ONE)                                                               \
        VEC w0 = VLOAD(p + k * W);                                                           \
        R12(STEP, 0)                                                                         \
    }                                                                                        \
    R12(STORE, 0)                                                                            \
}

/* MB rows (1..3) against four panels: one or two rows alone would wait on one chain of
   multiply-adds; four panels give four times the independent chains */
#define FOUR_PANELS(MB)                                                                      \
static void rows4_##MB(const float *restrict x, long ldx, const float *restrict p,          \
                       float *restrict y, long ldy, long K) {                               \
    const int mb = MB;                                                                       \
    R3(DECL, 0) R3(DECL, 1) R3(DECL, 2) R3(DECL, 3)                                          \
    const float *p1 = p + W * K, *p2 = p1 + W * K, *p3 = p2 + W * K;                         \
    for (long k = 0; k < K; k++) {                                                           \
        PREFETCH(p, AHEAD_FOUR) PREFETCH(p1, AHEAD_FOUR)                                     \
        PREFETCH(p2, AHEAD_FOUR) PREFETCH(p3, AHEAD_FOUR)                                    \
        VEC w0 = VLOAD(p + k * W), w1 = VLOAD(p1 + k * W);                                   \
        VEC w2 = VLOAD(p2 + k * W), w3 = VLOAD(p3 + k * W);                                  \
        R3(STEP, 0) R3(STEP, 1) R3(STEP, 2) R3(STEP, 3)                                      \
    }                                                                                        \
    R3(STORE, 0) R3(STORE, 1) R3(STORE, 2) R3(STORE, 3)                                      \
}

ONE_PANEL(1) ONE_PANEL(2) ONE_PANEL(3) ONE_PANEL(4) ONE_PANEL(5) ONE_PANEL(6)
ONE_PANEL(7) ONE_PANEL(8) ONE_PANEL(9) ONE_PANEL(10) ONE_PANEL(11) ONE_PANEL(12)
FOUR_PANELS(1) FOUR_PANELS(2) FOUR_PANELS(3)

typedef void (*kernel)(const float *, long, const float *, float *, long, long);
static const kernel ONE[13] = {0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6,
                               rows_7, rows_8, rows_9, rows_10, rows_11, rows_12};
static const kernel FOUR[4] = {0, rows4_1, rows4_2, rows4_3};

/* the output columns per panel this build reads */
int packed_panel(void) { return W; }

/* x [M, K] and y [M, N] row-major and contiguous; N a multiple of W; M >= 1 */
void packed_linear(const float *x, const float *p, float *y, long M, long N, long K) {
    if (M <= 0) return;
    if (M <= 3) { /* four panels at a time, then any left one by one */
        long n = 0;
        for (; n + 4 * W <= N; n += 4 * W) FOUR[M](x, K, p + n * K, y + n, N, K);
        for (; n < N; n += W) ONE[M](x, K, p + n * K, y + n, N, K);
        return;
    }
    long blocks = (M + 11) / 12;
    for (long n = 0; n < N; n += W) {
        const float *pn = p + n * K;
        long m = 0;
        for (long b = 0; b < blocks; b++) {
            long mb = (M - m) / (blocks - b); /* balanced blocks of at most 12 rows */
            ONE[mb](x + m * K, K, pn, y + m * N + n, N, K);
            m += mb;
        }
    }
}
