// embedcli's CPU kernels for AVX-512 machines (float32 also for AVX2 + FMA ones, at the end), called from Python
// with data pointers (no torch headers, so it builds in seconds with any C++ compiler; see setup.py). Two kernels,
// each chosen per call by the Python side (fused_attention.py, fused_norm.py), which also checks every pointer, shape
// and stride it passes:
//
// attention: scores, softmax and values of one block of 8 query rows at a time, each sequence of the packed buffer
//   on its own (no padding, no gather), float32 or bfloat16 (avx512_bf16) inputs, a window (left, right reach) and
//   an additive float32 bias by position (MPNet) optional. The block's score rows stay in a
//   float32 buffer in L1/L2 between the two products; the softmax is taken there (max, exp, sum in float32) and the
//   values are multiplied with the unnormalized probabilities, divided by the sum at the end, as flash attention
//   does. float32: float32 products and sums in another order than SDPA's (max |diff| ~1e-7 on unit-scale data).
//   bfloat16: bf16 products summed in float32 (vdpbf16ps), float32 scores and softmax, probabilities rounded to bf16
//   for the value product, output rounded to bf16.
// add_layer_norm: a post-norm layer's `LayerNorm(h + x)` in one pass over each row (h float32 or bf16, x float32),
//   float32 out, and under bf16 autocast also the bf16 copy the next linear reads (round to nearest even).
//
// The GIL is released while a kernel runs on the calling thread plus `threads - 1` workers of a small persistent
// pool (the caller passes torch's thread count).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define EMBEDCLI_X86 1
#include <immintrin.h>
#else
#define EMBEDCLI_X86 0
#endif

namespace {

// Query rows scored together: their score rows (ROWS x keys float32) stay in L1/L2 between the two products.
constexpr int ROWS = 8;
// Query rows of one task: a long sequence splits into several tasks, so one sequence still uses every thread.
constexpr int64_t TASK_ROWS = 256;

struct Job {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    int64_t ldq, ldk, ldv, ldo;  // row strides, in elements; head h starts at h * dim
    const int64_t* cu;           // [batch + 1] sequence starts
    int64_t batch;
    int heads, kv_heads, dim;
    int64_t left, right;  // a query at i sees keys i - left .. i + right (within its sequence)
    float scale;
    bool bf16;
    // An additive float32 bias by (head, query, key) position within a sequence (MPNet's relative positions), or
    // null: element (h, i, j) at bias + h * bias_head + i * bias_row + j.
    const float* bias;
    int64_t bias_head, bias_row;
    // Tasks: (sequence, first row) pairs, each for every key head.
    const int64_t* task_seq;
    const int64_t* task_row;
    int64_t tasks;  // sequences' chunks x kv_heads
    int64_t chunks;
    int64_t max_len;
    int64_t next;  // the next task to take (atomic)
    int failed;
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void* aligned(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return nullptr;
    return p;
}


// ---- a persistent worker pool: run(fn, arg, n) calls fn(arg) on the caller and n - 1 workers, and returns when all
// are done. Calls are serialized; a forked child starts with no workers (pthread_atfork).

typedef void (*Work)(void*);

struct Pool {
    pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;  // one run at a time
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
    pthread_cond_t done = PTHREAD_COND_INITIALIZER;
    int workers = 0;         // started
    int wanted = 0;          // taking part in this round
    int pending = 0;         // still working in this round
    uint64_t generation = 0;
    Work fn = nullptr;
    void* arg = nullptr;
    bool atfork = false;
    // The generation each worker waits past: read by the worker, written before it starts (so a round published
    // while the new thread is still starting is not missed).
    uint64_t start_generation[256] = {};
};

Pool pool;

void* pool_worker(void* p) {
    const int index = (int)(intptr_t)p;
    pthread_mutex_lock(&pool.mu);
    uint64_t seen = pool.start_generation[index];
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.generation;
        if (index >= pool.wanted) continue;
        Work fn = pool.fn;
        void* arg = pool.arg;
        pthread_mutex_unlock(&pool.mu);
        fn(arg);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return nullptr;
}

void pool_after_fork_child() {
    // The workers were not copied into the child, and a lock may have been held by a thread that is not there either:
    // start afresh.
    pool.workers = 0;
    pool.wanted = 0;
    pool.pending = 0;
    pthread_mutex_init(&pool.run_lock, nullptr);
    pthread_mutex_init(&pool.mu, nullptr);
    pthread_cond_init(&pool.wake, nullptr);
    pthread_cond_init(&pool.done, nullptr);
}

// Runs fn(arg) on `threads` threads (the caller included); fewer if workers cannot be started.
void pool_run(Work fn, void* arg, int threads) {
    if (threads <= 1) {
        fn(arg);
        return;
    }
    pthread_mutex_lock(&pool.run_lock);
    if (!pool.atfork) {
        pthread_atfork(nullptr, nullptr, pool_after_fork_child);
        pool.atfork = true;
    }
    int extra = threads - 1;
    if (extra > 255) extra = 255;
    while (pool.workers < extra) {
        pthread_t id;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_mutex_lock(&pool.mu);
        pool.start_generation[pool.workers] = pool.generation;  // this round is generation + 1
        pthread_mutex_unlock(&pool.mu);
        const int ok = pthread_create(&id, &attr, pool_worker, (void*)(intptr_t)pool.workers);
        pthread_attr_destroy(&attr);
        if (ok != 0) break;
        ++pool.workers;
    }
    if (extra > pool.workers) extra = pool.workers;
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.arg = arg;
    pool.wanted = extra;
    pool.pending = extra;
    ++pool.generation;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(arg);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.run_lock);
}

#if EMBEDCLI_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

inline __mmask16 tail_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

// exp(x) for float32 lanes, x <= 0 (a score minus its row's max): n = round(x / ln 2), r = x - n ln 2 (two parts),
// exp(r) by a polynomial, times 2^n by vscalefps (which also gives 0 where x is past float32's range).
// ACCURATE: Cephes' expf polynomial (~1 ulp), for float32 outputs; else a degree-5 Taylor polynomial (relative
// error < 3e-6), for probabilities that are rounded to bf16 (2^-9) next.
template <bool ACCURATE>
inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p;
    if (ACCURATE) {
        p = _mm512_set1_ps(1.9875691500e-4f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
        p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
        p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    } else {
        p = _mm512_set1_ps(1.0f / 120.0f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    }
    return _mm512_scalef_ps(p, n);
}

inline uint32_t load_u32(const uint16_t* p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return x;
}

// ---- bfloat16: packed operands for vdpbf16ps (pairs along the contracted dimension in each 32-bit lane) ----------

// scores[r][j0 + 16 t + i] = sum_d q[r][d] k[j0 + 16 t + i][d], for R rows and T tiles of 16 keys.
// kp: [dim / 2][lp] key pairs; q rows: `ldq` apart.
template <int R, int T>
inline void qk_bf16(const uint16_t* q, int64_t ldq, const uint32_t* kp, int64_t lp, int pairs, float* s, int64_t lds,
                    int64_t j0) {
    __m512 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; ++p) {
        __m512bh kt[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) kt[t] = (__m512bh)_mm512_loadu_si512(kp + p * lp + j0 + 16 * t);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            __m512bh qb = (__m512bh)_mm512_set1_epi32((int)load_u32(q + r * ldq + 2 * p));
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], qb, kt[t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) _mm512_storeu_ps(s + r * lds + j0 + 16 * t, acc[r][t]);
}

// out[r][d0 + 16 t + i] = inv[r] * sum_j p[r][j] v[j][d0 + 16 t + i], rounded to bf16 (the first `width` lanes kept).
// vp: [pairs][dp] value pairs (keys 2m, 2m + 1 in each lane); p rows: `ldp` apart, pairs from `m0`.
template <int R, int T>
inline void pv_bf16(const uint16_t* pr, int64_t ldp, const uint32_t* vp, int64_t dp, int64_t m0, int64_t m1,
                    const float* inv, uint16_t* o, int64_t ldo, int64_t d0, int64_t width) {
    __m512 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int64_t m = m0; m < m1; ++m) {
        __m512bh vt[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) vt[t] = (__m512bh)_mm512_loadu_si512(vp + m * dp + d0 + 16 * t);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            __m512bh pb = (__m512bh)_mm512_set1_epi32((int)load_u32(pr + r * ldp + 2 * m));
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], pb, vt[t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        __m512 scale = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            int64_t lanes = width - 16 * t;
            if (lanes <= 0) break;
            __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][t], scale));
            _mm256_mask_storeu_epi16(o + r * ldo + d0 + 16 * t, tail_mask(lanes), (__m256i)y);
        }
    }
}

// ---- float32 ----------------------------------------------------------------------------------------------

// kt: [dim][lp] keys transposed.
template <int R, int T>
inline void qk_f32(const float* q, int64_t ldq, const float* kt, int64_t lp, int dim, float* s, int64_t lds,
                   int64_t j0) {
    __m512 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int d = 0; d < dim; ++d) {
        __m512 kv[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) kv[t] = _mm512_loadu_ps(kt + d * lp + j0 + 16 * t);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            __m512 qb = _mm512_set1_ps(q[r * ldq + d]);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(qb, kv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) _mm512_storeu_ps(s + r * lds + j0 + 16 * t, acc[r][t]);
}

// vp: [keys][dp] values (rows zero-padded to dp).
template <int R, int T>
inline void pv_f32(const float* pr, int64_t ldp, const float* vp, int64_t dp, int64_t j0, int64_t j1,
                   const float* inv, float* o, int64_t ldo, int64_t d0, int64_t width) {
    __m512 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int64_t j = j0; j < j1; ++j) {
        __m512 vv[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) vv[t] = _mm512_loadu_ps(vp + j * dp + d0 + 16 * t);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            __m512 pb = _mm512_set1_ps(pr[r * ldp + j]);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(pb, vv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        __m512 scale = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            int64_t lanes = width - 16 * t;
            if (lanes <= 0) break;
            _mm512_mask_storeu_ps(o + r * ldo + d0 + 16 * t, tail_mask(lanes), _mm512_mul_ps(acc[r][t], scale));
        }
    }
}

// Dispatch on the rows left in a block (1..8) and the tiles in a step (1..3), so every accumulator is a register.
#define EMBEDCLI_ROWS_CASES(F, T, ...)  \
    switch (rows) {                     \
        case 1: F<1, T>(__VA_ARGS__); break; \
        case 2: F<2, T>(__VA_ARGS__); break; \
        case 3: F<3, T>(__VA_ARGS__); break; \
        case 4: F<4, T>(__VA_ARGS__); break; \
        case 5: F<5, T>(__VA_ARGS__); break; \
        case 6: F<6, T>(__VA_ARGS__); break; \
        case 7: F<7, T>(__VA_ARGS__); break; \
        default: F<8, T>(__VA_ARGS__); break; \
    }
#define EMBEDCLI_DISPATCH(F, ...)                                \
    switch (tiles) {                                            \
        case 1: EMBEDCLI_ROWS_CASES(F, 1, __VA_ARGS__) break;   \
        case 2: EMBEDCLI_ROWS_CASES(F, 2, __VA_ARGS__) break;   \
        default: EMBEDCLI_ROWS_CASES(F, 3, __VA_ARGS__) break;  \
    }

struct Scratch {
    float* s;       // [ROWS][lp] scores, then (float32) probabilities
    uint16_t* p;    // [ROWS][lp] bf16 probabilities
    void* kp;       // packed keys
    void* vp;       // packed values
};

// Softmax of one query row's scores over keys [a, b) of the row's buffer (which spans keys [k0, k0 + width));
// writes exp(x - max) (float32 into s, or bf16 into p, zero outside [a, b)) and returns 1 / sum.
// `bias` (or null): the row's additive float32 bias, at the same key offsets as s (only [a, b) is read); it is added
// to the scaled scores, as transformers adds MPNet's relative-position bias.
inline float softmax_row(float* s, uint16_t* p, int64_t width, int64_t a, int64_t b, float scale, bool bf16,
                         const float* bias) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    if (bias) {
        const __m512 vs = _mm512_set1_ps(scale);
        for (int64_t j = a; j < b; j += 16) {
            const __mmask16 m = tail_mask(b - j);
            const __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, s + j), vs, _mm512_maskz_loadu_ps(m, bias + j));
            _mm512_mask_storeu_ps(s + j, m, x);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
        }
        scale = 1.0f;  // the scores below are scaled already
    } else {
        for (int64_t j = a; j < b; j += 16) {
            const __mmask16 m = tail_mask(b - j);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, s + j));
        }
    }
    // exp(scale * (x - max)) as one fma: scale * x - scale * max (scale > 0 keeps the max where it was).
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 shift = _mm512_set1_ps(scale * _mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    // Whole 16-lane steps over [0, width): zeros outside [a, b) (width is a multiple of 16).
    for (int64_t j = 0; j < width; j += 16) {
        const int64_t lo = a - j, hi = b - j;
        __mmask16 m = 0;
        if (hi > 0 && lo < 16) m = (__mmask16)(tail_mask(hi) & ~tail_mask(lo > 0 ? lo : 0));
        __m512 e = _mm512_setzero_ps();
        if (bf16) {
            if (m) e = _mm512_maskz_mov_ps(m, exp_ps<false>(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift)));
            _mm256_storeu_si256((__m256i*)(p + j), (__m256i)_mm512_cvtneps_pbh(e));
        } else {
            if (m) e = _mm512_maskz_mov_ps(m, exp_ps<true>(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift)));
            _mm512_storeu_ps(s + j, e);
        }
        vsum = _mm512_add_ps(vsum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(vsum);
}

// Transposes a 16 x 16 block of 32-bit lanes in place: r[i] lane j <-> r[j] lane i.
inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[c + 4] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        t[c + 8] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[c + 12] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    }
    for (int c = 0; c < 4; ++c) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xDD);
        r[c + 4] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(t[c + 4], t[c + 12], 0xDD);
    }
}

// dst[c * ld + i] = src row i (`lds` 32-bit lanes apart), lane c, for i < 16 and c < cols; rows >= `rows` and lanes
// >= `cols` read as zeros. The 32-bit lanes are floats or bf16 pairs.
inline void transpose_block(const uint32_t* src, int64_t lds, int64_t rows, int64_t cols, uint32_t* dst, int64_t ld) {
    __m512 r[16];
    const __mmask16 lanes = tail_mask(cols);
    for (int i = 0; i < 16; ++i)
        r[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(i < rows ? lanes : (__mmask16)0, src + i * lds));
    transpose16(r);
    for (int c = 0; c < 16 && c < cols; ++c) _mm512_storeu_ps((float*)(dst + c * ld), r[c]);
}

// Keys [klo, khi) of key head `kvh` as vdpbf16ps operands: kp[p][j] = (k[j][2p], k[j][2p + 1]) (zero past
// `real`); values as vp[m][d] = (v[2m][d], v[2m + 1][d]) with d zero-padded to dp.
void pack_bf16(const Job& job, Scratch& w, int64_t start, int kvh, int64_t klo, int64_t khi, int64_t real,
               int64_t dp) {
    const int dim = job.dim, pairs = dim / 2;
    const uint16_t* kbase = (const uint16_t*)job.k + (start + klo) * job.ldk + (int64_t)kvh * dim;
    const uint16_t* vbase = (const uint16_t*)job.v + (start + klo) * job.ldv + (int64_t)kvh * dim;
    const int64_t nk = khi - klo, nreal = real - klo;
    uint32_t* kp = (uint32_t*)w.kp;
    uint32_t* vp = (uint32_t*)w.vp;
    for (int64_t j0 = 0; j0 < nk; j0 += 16)
        for (int p0 = 0; p0 < pairs; p0 += 16)
            transpose_block((const uint32_t*)(kbase + j0 * job.ldk) + p0, job.ldk / 2, nreal - j0, pairs - p0,
                            kp + p0 * nk + j0, nk);
    for (int64_t mm = 0; mm < nk / 2; ++mm) {
        const int64_t j = 2 * mm;
        const uint16_t* a = vbase + j * job.ldv;
        const uint16_t* b = a + job.ldv;
        for (int64_t d = 0; d < dp; d += 16) {
            const __mmask16 dm = tail_mask(dim - d > 0 ? dim - d : 0);
            const __mmask16 am = j < nreal ? dm : 0, bm = j + 1 < nreal ? dm : 0;
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(am, a + d));
            __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(bm, b + d));
            _mm512_storeu_si512(vp + mm * dp + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

// float32: keys transposed, kt[d][j] (zero past `real`); values vp[j][d] with d zero-padded to dp.
void pack_f32(const Job& job, Scratch& w, int64_t start, int kvh, int64_t klo, int64_t khi, int64_t real,
              int64_t dp) {
    const int dim = job.dim;
    const float* kbase = (const float*)job.k + (start + klo) * job.ldk + (int64_t)kvh * dim;
    const float* vbase = (const float*)job.v + (start + klo) * job.ldv + (int64_t)kvh * dim;
    const int64_t nk = khi - klo, nreal = real - klo;
    float* kt = (float*)w.kp;
    float* vp = (float*)w.vp;
    for (int64_t j0 = 0; j0 < nk; j0 += 16)
        for (int d0 = 0; d0 < dim; d0 += 16)
            transpose_block((const uint32_t*)(kbase + j0 * job.ldk + d0), job.ldk, nreal - j0, dim - d0,
                            (uint32_t*)(kt + d0 * nk + j0), nk);
    for (int64_t j = 0; j < nk; ++j) {
        const float* src = vbase + j * job.ldv;
        for (int64_t d = 0; d < dp; d += 16) {
            const __mmask16 dm = j < nreal ? tail_mask(dim - d > 0 ? dim - d : 0) : 0;
            _mm512_storeu_ps(vp + j * dp + d, _mm512_maskz_loadu_ps(dm, src + d));
        }
    }
}

// One task: query rows [r0, r1) of sequence `seq`, every query head of key head `kvh`.
void run_task(const Job& job, Scratch& w, int64_t seq, int64_t r0, int kvh) {
    const int64_t start = job.cu[seq], len = job.cu[seq + 1] - start;
    const int64_t r1 = r0 + TASK_ROWS < len ? r0 + TASK_ROWS : len;
    const int dim = job.dim;
    const int group = job.heads / job.kv_heads;
    // Keys any of these rows can reach, widened to whole 16-key tiles.
    const int64_t klo = (r0 - job.left > 0 ? r0 - job.left : 0) / 16 * 16;
    const int64_t khi_real = (r1 - 1 + job.right + 1 < len ? r1 - 1 + job.right + 1 : len);
    const int64_t khi = round_up(khi_real, 16);
    const int64_t nk = khi - klo;   // packed keys (a multiple of 16, zero-padded past the sequence)
    const int64_t dp = round_up(dim, 16);
    if (job.bf16) {
        pack_bf16(job, w, start, kvh, klo, khi, khi_real, dp);
    } else {
        pack_f32(job, w, start, kvh, klo, khi, khi_real, dp);
    }
    float inv[ROWS];
    for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        for (int64_t b0 = r0; b0 < r1; b0 += ROWS) {
            const int rows = (int)(r1 - b0 < ROWS ? r1 - b0 : ROWS);
            // This block's key span (whole tiles), within the task's packed keys.
            const int64_t a_lo = (b0 - job.left > 0 ? b0 - job.left : 0);
            const int64_t a_hi = (b0 + rows - 1 + job.right + 1 < len ? b0 + rows - 1 + job.right + 1 : len);
            const int64_t t_lo = a_lo / 16 * 16 - klo;      // relative to klo
            const int64_t t_hi = round_up(a_hi, 16) - klo;
            const int64_t lds = nk;
            // Scores of the block over [t_lo, t_hi).
            for (int64_t j0 = t_lo; j0 < t_hi;) {
                const int64_t left_tiles = (t_hi - j0) / 16;
                const int tiles = left_tiles >= 3 ? 3 : (int)left_tiles;
                if (job.bf16) {
                    const uint16_t* q = (const uint16_t*)job.q + (start + b0) * job.ldq + (int64_t)h * dim;
                    EMBEDCLI_DISPATCH(qk_bf16, q, job.ldq, (const uint32_t*)w.kp, nk, dim / 2, w.s, lds, j0)
                } else {
                    const float* q = (const float*)job.q + (start + b0) * job.ldq + (int64_t)h * dim;
                    EMBEDCLI_DISPATCH(qk_f32, q, job.ldq, (const float*)w.kp, nk, dim, w.s, lds, j0)
                }
                j0 += 16 * tiles;
            }
            for (int r = 0; r < rows; ++r) {
                const int64_t i = b0 + r;
                const int64_t a = (i - job.left > 0 ? i - job.left : 0) - klo;
                const int64_t b = (i + job.right + 1 < len ? i + job.right + 1 : len) - klo;
                // Only [t_lo, t_hi) of the row is used below; zero the rest of it there.
                const float* bias =
                    job.bias ? job.bias + h * job.bias_head + i * job.bias_row + klo + t_lo : nullptr;
                inv[r] = softmax_row(w.s + r * lds + t_lo, w.p + r * lds + t_lo, t_hi - t_lo, a - t_lo, b - t_lo,
                                     job.scale, job.bf16, bias);
            }
            // Values: over d in steps of up to 3 tiles of 16.
            for (int64_t d0 = 0; d0 < dim;) {
                const int64_t width = dim - d0;
                const int tiles = width > 32 ? 3 : (width > 16 ? 2 : 1);
                if (job.bf16) {
                    uint16_t* o = (uint16_t*)job.o + (start + b0) * job.ldo + (int64_t)h * dim;
                    EMBEDCLI_DISPATCH(pv_bf16, w.p, lds, (const uint32_t*)w.vp, dp, t_lo / 2, t_hi / 2, inv, o, job.ldo,
                                      d0, width)
                } else {
                    float* o = (float*)job.o + (start + b0) * job.ldo + (int64_t)h * dim;
                    EMBEDCLI_DISPATCH(pv_f32, w.s, lds, (const float*)w.vp, dp, t_lo, t_hi, inv, o, job.ldo, d0, width)
                }
                d0 += 16 * tiles;
            }
        }
    }
}

void attention_worker(void* arg) {
    Job& job = *(Job*)arg;
    const int64_t lp = round_up(job.max_len, 16) + 16;
    const int64_t dp = round_up(job.dim, 16);
    Scratch w;
    w.s = (float*)aligned(sizeof(float) * ROWS * lp);
    w.p = (uint16_t*)aligned(sizeof(uint16_t) * ROWS * lp);
    w.kp = aligned(sizeof(float) * lp * dp);
    w.vp = aligned(sizeof(float) * lp * dp);
    if (!w.s || !w.p || !w.kp || !w.vp) {
        __atomic_store_n(&job.failed, 1, __ATOMIC_RELAXED);
    } else {
        for (;;) {
            const int64_t t = __atomic_fetch_add(&job.next, 1, __ATOMIC_RELAXED);
            if (t >= job.tasks || __atomic_load_n(&job.failed, __ATOMIC_RELAXED)) break;
            const int64_t c = t / job.kv_heads;
            run_task(job, w, job.task_seq[c], job.task_row[c], (int)(t % job.kv_heads));
        }
    }
    free(w.s);
    free(w.p);
    free(w.kp);
    free(w.vp);
}

// ---- add_layer_norm ------------------------------------------------------------------------------------------

struct NormJob {
    const void* h;
    bool h_bf16;
    const float* x;
    float* out;
    uint16_t* low;  // bf16 copy of out, or null
    const float* weight;
    const float* bias;  // or null
    int64_t rows, cols, ldh, ldx;
    float eps;
    int64_t next;  // next block of rows (atomic)
};

constexpr int64_t NORM_BLOCK = 32;

inline __m512 load_row(const void* base, bool bf16, int64_t i, __mmask16 m) {
    if (bf16) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t*)base + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(m, (const float*)base + i);
}

void norm_worker(void* arg) {
    NormJob& job = *(NormJob*)arg;
    const int64_t n = job.cols;
    for (;;) {
        const int64_t r0 = __atomic_fetch_add(&job.next, NORM_BLOCK, __ATOMIC_RELAXED);
        if (r0 >= job.rows) break;
        const int64_t r1 = r0 + NORM_BLOCK < job.rows ? r0 + NORM_BLOCK : job.rows;
        for (int64_t r = r0; r < r1; ++r) {
            const void* h = job.h_bf16 ? (const void*)((const uint16_t*)job.h + r * job.ldh)
                                       : (const void*)((const float*)job.h + r * job.ldh);
            const float* x = job.x + r * job.ldx;
            float* out = job.out + r * n;
            // The residual sum (float32, as torch's add), and its mean.
            __m512 vsum = _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i += 16) {
                const __mmask16 m = tail_mask(n - i);
                const __m512 y = _mm512_add_ps(load_row(h, job.h_bf16, i, m), _mm512_maskz_loadu_ps(m, x + i));
                _mm512_mask_storeu_ps(out + i, m, y);
                vsum = _mm512_add_ps(vsum, y);  // masked lanes are 0
            }
            const float mean = _mm512_reduce_add_ps(vsum) / (float)n;
            const __m512 vmean = _mm512_set1_ps(mean);
            __m512 vvar = _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i += 16) {
                const __mmask16 m = tail_mask(n - i);
                const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, out + i), vmean);
                vvar = _mm512_fmadd_ps(d, d, vvar);
            }
            const float var = _mm512_reduce_add_ps(vvar) / (float)n;
            const __m512 rstd = _mm512_set1_ps(1.0f / sqrtf(var + job.eps));
            for (int64_t i = 0; i < n; i += 16) {
                const __mmask16 m = tail_mask(n - i);
                __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, out + i), vmean), rstd);
                y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, job.weight + i));
                if (job.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, job.bias + i));
                _mm512_mask_storeu_ps(out + i, m, y);
                if (job.low) _mm256_mask_storeu_epi16(job.low + r * n + i, m, (__m256i)_mm512_cvtneps_pbh(y));
            }
        }
    }
}

#pragma GCC pop_options
#endif  // EMBEDCLI_X86

// ---- AVX2 + FMA, float32 only: the same two kernels at 8 lanes, for x86-64 CPUs without AVX-512 -----------------
// (AMD Zen 2/3, Intel client cores). Same layout, tasks and scratch as above; 8-key and 8-column tiles, and query
// rows 4 at a time (16 ymm registers: 4 x 3 accumulators, 3 tiles, 1 broadcast). Numerics as the AVX-512 float32
// path (float32 products and sums, Cephes' expf), in 8-lane order; a probability under 2^-126 (a score more than
// 87 below its row's max) is 0 here, a denormal there.

#if EMBEDCLI_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

constexpr int QROWS = 4;  // query rows per register block

// Lanes i < n set (n clamped to 0..8), for maskload / maskstore.
inline __m256i lanes_below(int64_t n) {
    const int k = n <= 0 ? 0 : n >= 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256 load8(const float* p, int64_t n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n));
}

inline void store8(float* p, int64_t n, __m256 x) {
    if (n >= 8)
        _mm256_storeu_ps(p, x);
    else
        _mm256_maskstore_ps(p, lanes_below(n), x);
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

// exp(x) for x <= 0: the AVX-512 kernel's reduction and Cephes polynomial; 2^n is built in the exponent bits, which
// hold n >= -126 only, so x below -87.3 gives 0.
inline __m256 exp_ps(__m256 x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// scores[r][j0 + 8 t + i] = sum_d q[r][d] kt[d][j0 + 8 t + i], for R rows and T tiles of 8 keys.
template <int R, int T>
inline void qk_f32(const float* q, int64_t ldq, const float* kt, int64_t lp, int dim, float* s, int64_t lds,
                   int64_t j0) {
    __m256 acc[R][T];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int d = 0; d < dim; ++d) {
        __m256 kv[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) kv[t] = _mm256_loadu_ps(kt + d * lp + j0 + 8 * t);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m256 qb = _mm256_broadcast_ss(q + r * ldq + d);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(qb, kv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) _mm256_storeu_ps(s + r * lds + j0 + 8 * t, acc[r][t]);
}

// out[r][d0 + 8 t + i] = inv[r] * sum_j p[r][j] vp[j][d0 + 8 t + i] (the first `width` columns kept).
template <int R, int T>
inline void pv_f32(const float* pr, int64_t ldp, const float* vp, int64_t dp, int64_t j0, int64_t j1,
                   const float* inv, float* o, int64_t ldo, int64_t d0, int64_t width) {
    __m256 acc[R][T];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t j = j0; j < j1; ++j) {
        __m256 vv[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) vv[t] = _mm256_loadu_ps(vp + j * dp + d0 + 8 * t);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m256 pb = _mm256_broadcast_ss(pr + r * ldp + j);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(pb, vv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            const int64_t lanes = width - 8 * t;
            if (lanes <= 0) break;
            store8(o + r * ldo + d0 + 8 * t, lanes, _mm256_mul_ps(acc[r][t], scale));
        }
    }
}

// Dispatch on the rows of a register block (1..4) and the tiles of a step (1..3).
#define EMBEDCLI_ROWS4_CASES(F, T, ...)      \
    switch (rows) {                          \
        case 1: F<1, T>(__VA_ARGS__); break; \
        case 2: F<2, T>(__VA_ARGS__); break; \
        case 3: F<3, T>(__VA_ARGS__); break; \
        default: F<4, T>(__VA_ARGS__); break; \
    }
#define EMBEDCLI_DISPATCH4(F, ...)                               \
    switch (tiles) {                                            \
        case 1: EMBEDCLI_ROWS4_CASES(F, 1, __VA_ARGS__) break;  \
        case 2: EMBEDCLI_ROWS4_CASES(F, 2, __VA_ARGS__) break;  \
        default: EMBEDCLI_ROWS4_CASES(F, 3, __VA_ARGS__) break; \
    }

// The AVX-512 softmax_row's float32 case: exp(x - max) over [a, b) of the row (zeros elsewhere in [0, width)),
// returns 1 / sum; `bias` (or null) is added to the scaled scores first.
inline float softmax_row(float* s, int64_t width, int64_t a, int64_t b, float scale, const float* bias) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    if (bias) {
        const __m256 vs = _mm256_set1_ps(scale);
        for (int64_t j = a; j < b; j += 8) {
            const __m256i m = lanes_below(b - j);
            const __m256 x = _mm256_fmadd_ps(_mm256_maskload_ps(s + j, m), vs, _mm256_maskload_ps(bias + j, m));
            _mm256_maskstore_ps(s + j, m, x);
            vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, x), _mm256_castsi256_ps(m));
        }
        scale = 1.0f;  // the scores below are scaled already
    } else {
        for (int64_t j = a; j < b; j += 8) {
            const __m256i m = lanes_below(b - j);
            vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, _mm256_maskload_ps(s + j, m)), _mm256_castsi256_ps(m));
        }
    }
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256 shift = _mm256_set1_ps(scale * hmax(vmax));
    __m256 vsum = _mm256_setzero_ps(), vsum2 = _mm256_setzero_ps();
    // Whole vectors inside [a, b) two at a time (two independent exp chains); the edges lane-masked.
    const int64_t inner_lo = round_up(a, 8), inner_hi = b / 8 * 8;
    for (int64_t j = 0; j < width; j += 8) {  // width is a multiple of 16
        if (j >= inner_lo && j + 16 <= inner_hi) {
            const __m256 e0 = exp_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, shift));
            const __m256 e1 = exp_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + j + 8), vscale, shift));
            _mm256_storeu_ps(s + j, e0);
            _mm256_storeu_ps(s + j + 8, e1);
            vsum = _mm256_add_ps(vsum, e0);
            vsum2 = _mm256_add_ps(vsum2, e1);
            j += 8;
            continue;
        }
        const int64_t lo = a - j, hi = b - j;
        __m256 e = _mm256_setzero_ps();
        if (hi > 0 && lo < 8) {
            const __m256i m = _mm256_andnot_si256(lanes_below(lo), lanes_below(hi));
            e = _mm256_and_ps(exp_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, shift)), _mm256_castsi256_ps(m));
        }
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    return 1.0f / hsum(_mm256_add_ps(vsum, vsum2));
}

// Transposes an 8 x 8 block of floats in registers: r[i] lane j <-> r[j] lane i.
inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// dst[c * ld + i] = src row i (`lds` apart), column c, for i < 8 and c < cols; rows >= `rows` and columns >= `cols`
// read as zeros.
inline void transpose_block(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ld) {
    __m256 r[8];
    const __m256i lanes = lanes_below(cols);
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_maskload_ps(src + i * lds, lanes) : _mm256_setzero_ps();
    transpose8(r);
    for (int c = 0; c < 8 && c < cols; ++c) _mm256_storeu_ps(dst + c * ld, r[c]);
}

// Keys transposed, kt[d][j] (`ldt` apart, zero past `real`); values vp[j][d] with d zero-padded to dp.
void pack_f32(const Job& job, Scratch& w, int64_t start, int kvh, int64_t klo, int64_t khi, int64_t real,
              int64_t dp, int64_t ldt) {
    const int dim = job.dim;
    const float* kbase = (const float*)job.k + (start + klo) * job.ldk + (int64_t)kvh * dim;
    const float* vbase = (const float*)job.v + (start + klo) * job.ldv + (int64_t)kvh * dim;
    const int64_t nk = khi - klo, nreal = real - klo;
    float* kt = (float*)w.kp;
    float* vp = (float*)w.vp;
    for (int64_t j0 = 0; j0 < nk; j0 += 8)
        for (int d0 = 0; d0 < dim; d0 += 8)
            transpose_block(kbase + j0 * job.ldk + d0, job.ldk, nreal - j0, dim - d0, kt + d0 * ldt + j0, ldt);
    for (int64_t j = 0; j < nk; ++j) {
        const float* src = vbase + j * job.ldv;
        for (int64_t d = 0; d < dp; d += 8)
            _mm256_storeu_ps(vp + j * dp + d, _mm256_maskload_ps(src + d, lanes_below(j < nreal ? dim - d : 0)));
    }
}

// One task (float32): query rows [r0, r1) of sequence `seq`, every query head of key head `kvh`.
void run_task(const Job& job, Scratch& w, int64_t seq, int64_t r0, int kvh) {
    const int64_t start = job.cu[seq], len = job.cu[seq + 1] - start;
    const int64_t r1 = r0 + TASK_ROWS < len ? r0 + TASK_ROWS : len;
    const int dim = job.dim;
    const int group = job.heads / job.kv_heads;
    const int64_t klo = (r0 - job.left > 0 ? r0 - job.left : 0) / 16 * 16;
    const int64_t khi_real = (r1 - 1 + job.right + 1 < len ? r1 - 1 + job.right + 1 : len);
    const int64_t khi = round_up(khi_real, 16);
    const int64_t nk = khi - klo;
    const int64_t dp = round_up(dim, 16);
    // Rows of keys and of scores 16 floats longer than the keys: a power-of-two row (256 keys: 1 KB) maps every
    // row of a tile to the same few L1 sets, and the key tiles evicted each other (256 keys ran 1.3x slower).
    const int64_t ld = nk + 16;
    avx2::pack_f32(job, w, start, kvh, klo, khi, khi_real, dp, ld);
    const float* kt = (const float*)w.kp;
    const float* vp = (const float*)w.vp;
    float inv[ROWS];
    for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        for (int64_t b0 = r0; b0 < r1; b0 += ROWS) {
            const int block = (int)(r1 - b0 < ROWS ? r1 - b0 : ROWS);
            const int64_t a_lo = (b0 - job.left > 0 ? b0 - job.left : 0);
            const int64_t a_hi = (b0 + block - 1 + job.right + 1 < len ? b0 + block - 1 + job.right + 1 : len);
            const int64_t t_lo = a_lo / 16 * 16 - klo;
            const int64_t t_hi = round_up(a_hi, 16) - klo;
            const int64_t lds = ld;
            const float* q = (const float*)job.q + (start + b0) * job.ldq + (int64_t)h * dim;
            // Key tiles outer, row halves inner: a tile of keys is read from L1 by the second half.
            for (int64_t j0 = t_lo; j0 < t_hi;) {
                const int64_t left_tiles = (t_hi - j0) / 8;
                const int tiles = left_tiles >= 3 ? 3 : (int)left_tiles;
                for (int r4 = 0; r4 < block; r4 += QROWS) {
                    const int rows = block - r4 < QROWS ? block - r4 : QROWS;
                    EMBEDCLI_DISPATCH4(qk_f32, q + r4 * job.ldq, job.ldq, kt, ld, dim, w.s + r4 * lds, lds, j0)
                }
                j0 += 8 * tiles;
            }
            for (int r = 0; r < block; ++r) {
                const int64_t i = b0 + r;
                const int64_t a = (i - job.left > 0 ? i - job.left : 0) - klo;
                const int64_t b = (i + job.right + 1 < len ? i + job.right + 1 : len) - klo;
                const float* bias =
                    job.bias ? job.bias + h * job.bias_head + i * job.bias_row + klo + t_lo : nullptr;
                inv[r] = softmax_row(w.s + r * lds + t_lo, t_hi - t_lo, a - t_lo, b - t_lo, job.scale, bias);
            }
            // Value columns outer, row halves inner: the second half reads the same value columns from L1.
            for (int64_t d0 = 0; d0 < dim;) {
                const int64_t width = dim - d0;
                const int tiles = width > 8 ? 2 : 1;
                for (int r4 = 0; r4 < block; r4 += QROWS) {
                    const int rows = block - r4 < QROWS ? block - r4 : QROWS;
                    float* o = (float*)job.o + (start + b0 + r4) * job.ldo + (int64_t)h * dim;
                    EMBEDCLI_DISPATCH4(pv_f32, w.s + r4 * lds, lds, vp, dp, t_lo, t_hi, inv + r4, o, job.ldo, d0, width)
                }
                d0 += 8 * tiles;
            }
        }
    }
}

void attention_worker(void* arg) {
    Job& job = *(Job*)arg;
    const int64_t lp = round_up(job.max_len, 16) + 16;
    const int64_t dp = round_up(job.dim, 16);
    Scratch w;
    w.s = (float*)aligned(sizeof(float) * ROWS * lp);
    w.p = nullptr;  // bf16 probabilities: not on this path
    w.kp = aligned(sizeof(float) * lp * dp);
    w.vp = aligned(sizeof(float) * lp * dp);
    if (!w.s || !w.kp || !w.vp) {
        __atomic_store_n(&job.failed, 1, __ATOMIC_RELAXED);
    } else {
        for (;;) {
            const int64_t t = __atomic_fetch_add(&job.next, 1, __ATOMIC_RELAXED);
            if (t >= job.tasks || __atomic_load_n(&job.failed, __ATOMIC_RELAXED)) break;
            const int64_t c = t / job.kv_heads;
            avx2::run_task(job, w, job.task_seq[c], job.task_row[c], (int)(t % job.kv_heads));
        }
    }
    free(w.s);
    free(w.kp);
    free(w.vp);
}

// The AVX-512 norm_worker's float32 case (h float32, no bf16 copy).
void norm_worker(void* arg) {
    NormJob& job = *(NormJob*)arg;
    const int64_t n = job.cols;
    for (;;) {
        const int64_t r0 = __atomic_fetch_add(&job.next, NORM_BLOCK, __ATOMIC_RELAXED);
        if (r0 >= job.rows) break;
        const int64_t r1 = r0 + NORM_BLOCK < job.rows ? r0 + NORM_BLOCK : job.rows;
        for (int64_t r = r0; r < r1; ++r) {
            const float* h = (const float*)job.h + r * job.ldh;
            const float* x = job.x + r * job.ldx;
            float* out = job.out + r * n;
            __m256 vsum = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 8) {
                const __m256 y = _mm256_add_ps(load8(h + i, n - i), load8(x + i, n - i));
                store8(out + i, n - i, y);
                vsum = _mm256_add_ps(vsum, y);  // lanes past n are 0
            }
            const __m256 vmean = _mm256_set1_ps(hsum(vsum) / (float)n);
            __m256 vvar = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i += 8) {
                const __m256 d = _mm256_and_ps(_mm256_sub_ps(load8(out + i, n - i), vmean),
                                               _mm256_castsi256_ps(lanes_below(n - i)));
                vvar = _mm256_fmadd_ps(d, d, vvar);
            }
            const __m256 rstd = _mm256_set1_ps(1.0f / sqrtf(hsum(vvar) / (float)n + job.eps));
            for (int64_t i = 0; i < n; i += 8) {
                __m256 y = _mm256_mul_ps(_mm256_sub_ps(load8(out + i, n - i), vmean), rstd);
                y = _mm256_mul_ps(y, load8(job.weight + i, n - i));
                if (job.bias) y = _mm256_add_ps(y, load8(job.bias + i, n - i));
                store8(out + i, n - i, y);
            }
        }
    }
}

}  // namespace avx2
#pragma GCC pop_options
#endif  // EMBEDCLI_X86

bool cpu_has(bool bf16) {
#if EMBEDCLI_X86
    __builtin_cpu_init();
    bool base = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return base && (!bf16 || __builtin_cpu_supports("avx512bf16"));
#else
    (void)bf16;
    return false;
#endif
}

bool cpu_has_avx2() {
#if EMBEDCLI_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

// The float32 kernels' instruction set: AVX-512 where the CPU has it (unless `use_avx2(True)` asked for the AVX2
// ones: to test or compare them on such a CPU), else AVX2 + FMA, else none.
enum class Isa { none, avx2, avx512 };
bool prefer_avx2 = false;

Isa f32_isa() {
    if (!prefer_avx2 && cpu_has(false)) return Isa::avx512;
    return cpu_has_avx2() ? Isa::avx2 : Isa::none;
}

PyObject* supported(PyObject*, PyObject*) {
    return Py_BuildValue("(OO)", f32_isa() != Isa::none ? Py_True : Py_False, cpu_has(true) ? Py_True : Py_False);
}

PyObject* float32_isa(PyObject*, PyObject*) {
    const Isa isa = f32_isa();
    return Py_BuildValue("s", isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "none");
}

PyObject* use_avx2(PyObject*, PyObject* arg) {
    const int on = PyObject_IsTrue(arg);
    if (on < 0) return nullptr;
    prefer_avx2 = on != 0;
    Py_RETURN_NONE;
}

PyObject* attention(PyObject*, PyObject* args) {
    unsigned long long q, k, v, o, cu, bias;
    long long ldq, ldk, ldv, ldo, batch, left, right, bias_head, bias_row;
    int heads, kv_heads, dim, bf16, threads;
    double scale;
    if (!PyArg_ParseTuple(args, "KKKKLLLLKLiiiLLdpiKLL", &q, &k, &v, &o, &ldq, &ldk, &ldv, &ldo, &cu, &batch, &heads,
                          &kv_heads, &dim, &left, &right, &scale, &bf16, &threads, &bias, &bias_head, &bias_row))
        return nullptr;
    const Isa isa = bf16 ? (cpu_has(true) ? Isa::avx512 : Isa::none) : f32_isa();
    if (isa == Isa::none) {
        PyErr_SetString(PyExc_RuntimeError, bf16 ? "this CPU lacks the AVX-512 BF16 instructions of the fused attention"
                                                 : "this CPU lacks the AVX2/FMA instructions of the fused attention");
        return nullptr;
    }
    if (heads < 1 || kv_heads < 1 || heads % kv_heads || dim < 2 || dim % 2 || dim > 1024 || batch < 0 || left < 0 ||
        right < 0) {
        PyErr_SetString(PyExc_ValueError, "fused attention: unsupported shape");
        return nullptr;
    }
#if EMBEDCLI_X86
    const int64_t* starts = (const int64_t*)(uintptr_t)cu;
    int64_t chunks = 0, max_len = 0;
    for (int64_t s = 0; s < batch; ++s) {
        const int64_t len = starts[s + 1] - starts[s];
        if (len < 1) {
            PyErr_SetString(PyExc_ValueError, "fused attention: an empty sequence");
            return nullptr;
        }
        chunks += (len + TASK_ROWS - 1) / TASK_ROWS;
        if (len > max_len) max_len = len;
    }
    int64_t* task_seq = (int64_t*)malloc(sizeof(int64_t) * (chunks ? chunks : 1));
    int64_t* task_row = (int64_t*)malloc(sizeof(int64_t) * (chunks ? chunks : 1));
    if (!task_seq || !task_row) {
        free(task_seq);
        free(task_row);
        return PyErr_NoMemory();
    }
    for (int64_t s = 0, c = 0; s < batch; ++s)
        for (int64_t r = 0; r < starts[s + 1] - starts[s]; r += TASK_ROWS, ++c) {
            task_seq[c] = s;
            task_row[c] = r;
        }
    Job job;
    job.q = (const void*)(uintptr_t)q;
    job.k = (const void*)(uintptr_t)k;
    job.v = (const void*)(uintptr_t)v;
    job.o = (void*)(uintptr_t)o;
    job.ldq = ldq;
    job.ldk = ldk;
    job.ldv = ldv;
    job.ldo = ldo;
    job.cu = starts;
    job.batch = batch;
    job.heads = heads;
    job.kv_heads = kv_heads;
    job.dim = dim;
    // A reach past the longest sequence is the whole sequence (and keeps the sums below from overflowing).
    job.left = left < max_len ? left : max_len;
    job.right = right < max_len ? right : max_len;
    job.scale = (float)scale;
    job.bf16 = bf16 != 0;
    job.bias = (const float*)(uintptr_t)bias;
    job.bias_head = bias_head;
    job.bias_row = bias_row;
    job.task_seq = task_seq;
    job.task_row = task_row;
    job.chunks = chunks;
    job.tasks = chunks * kv_heads;
    job.max_len = max_len;
    job.next = 0;
    job.failed = 0;
    int n = threads;
    if (n > job.tasks) n = (int)job.tasks;
    if (n > 256) n = 256;
    Py_BEGIN_ALLOW_THREADS
    pool_run(isa == Isa::avx512 ? attention_worker : avx2::attention_worker, &job, n);
    Py_END_ALLOW_THREADS
    free(task_seq);
    free(task_row);
    if (job.failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "the fused attention is built for x86-64 only");
    return nullptr;
#endif
}

PyObject* add_layer_norm(PyObject*, PyObject* args) {
    unsigned long long h, x, out, low, weight, bias;
    long long rows, cols, ldh, ldx;
    int h_bf16, threads;
    double eps;
    if (!PyArg_ParseTuple(args, "KpLKLKKKKLLdi", &h, &h_bf16, &ldh, &x, &ldx, &out, &low, &weight, &bias, &rows, &cols,
                          &eps, &threads))
        return nullptr;
    const Isa isa = (h_bf16 || low) ? (cpu_has(true) ? Isa::avx512 : Isa::none) : f32_isa();
    if (isa == Isa::none) {
        PyErr_SetString(PyExc_RuntimeError, (h_bf16 || low) ? "this CPU lacks the AVX-512 BF16 instructions of the fused layer norm"
                                                            : "this CPU lacks the AVX2/FMA instructions of the fused layer norm");
        return nullptr;
    }
    if (rows < 0 || cols < 1 || ldh < cols || ldx < cols) {
        PyErr_SetString(PyExc_ValueError, "fused layer norm: unsupported shape");
        return nullptr;
    }
#if EMBEDCLI_X86
    NormJob job;
    job.h = (const void*)(uintptr_t)h;
    job.h_bf16 = h_bf16 != 0;
    job.x = (const float*)(uintptr_t)x;
    job.out = (float*)(uintptr_t)out;
    job.low = (uint16_t*)(uintptr_t)low;
    job.weight = (const float*)(uintptr_t)weight;
    job.bias = (const float*)(uintptr_t)bias;
    job.rows = rows;
    job.cols = cols;
    job.ldh = ldh;
    job.ldx = ldx;
    job.eps = (float)eps;
    job.next = 0;
    // A block of rows is ~tens of microseconds: more threads than blocks would only wait.
    int n = threads;
    const int64_t blocks = (rows + NORM_BLOCK - 1) / NORM_BLOCK;
    if (n > blocks) n = (int)blocks;
    if (n > 256) n = 256;
    if (n < 1) n = 1;
    Py_BEGIN_ALLOW_THREADS
    pool_run(isa == Isa::avx512 ? norm_worker : avx2::norm_worker, &job, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "the fused layer norm is built for x86-64 only");
    return nullptr;
#endif
}

PyMethodDef methods[] = {
    {"supported", supported, METH_NOARGS, "(float32, bfloat16): whether this CPU runs the fused attention."},
    {"float32_isa", float32_isa, METH_NOARGS, "The float32 kernels' instruction set here: avx512, avx2 or none."},
    {"use_avx2", use_avx2, METH_O, "Run the float32 kernels' AVX2 code even on an AVX-512 CPU (True) or not (False)."},
    {"attention", attention, METH_VARARGS, "Fused attention over a packed buffer (see fused_attention.py)."},
    {"add_layer_norm", add_layer_norm, METH_VARARGS, "LayerNorm(h + x) in one pass (see fused_norm.py)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu", "embedcli's AVX-512 / AVX2 CPU kernels (see _cpu.cpp).", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&module); }
