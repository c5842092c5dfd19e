// Hand-written XLA:CPU kernels (XLA FFI custom calls) for bfloat16-stored weights and float32 activations.
//
// Why: XLA:CPU converts a bfloat16 weight to float32 before a product at about 1.4 GB/s of stored bytes (a chain
// of 100 [4096, 256] products, 2-core Xeon, jax 0.12), 14x slower than the float32 product reads float32 weights,
// so bfloat16 storage cost decode 8x there (the published report's "leak one"). These kernels read each bfloat16
// weight once, widen it in registers (a bfloat16 is the top 16 bits of a float32: exact) and accumulate in float32.
//
//   gemma4_bf16_matvec_nk: y[R, N] = x[R, K] . w[N, K]^T  (the weight output-major: contraction axis minor)
//   gemma4_bf16_matvec_kn: y[R, N] = x[R, K] . w[K, N]    (the weight input-major: contraction axis major)
//   gemma4_bf16_to_f32:    y = float32(w), any shape       (the prefill path: then XLA's float32 product)
//   gemma4_decode_attention: o[B, K, G, H] = softmax(k . q) v over the visible positions of a float32 KV cache
//                            (one query position per row: decode), reading only those positions
//   gemma4_decode_attention_rows: the same, query row b against cache row rows[b] (decode slots' row steps)
//
// Work is cut into chunks (of output rows, output columns, or elements) that the calling thread and up to
// `num_threads` - 1 tasks of XLA's intra-op thread pool claim from one atomic counter. The caller waits only for
// chunks that were claimed, so the call completes even when no pool task ever starts; the shared state is reference
// counted, so a task that starts late finds no chunk left and touches nothing of the finished call.
// Built by model/backends/cpu/kernels.py with the machine's C++ compiler (-O3 -march=native); plain loops that the
// compiler vectorizes for the host's SIMD width (AVX2, AVX-512, NEON), no intrinsics.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#define GEMMA4_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float widen(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

struct Shared {
  std::function<void(int64_t)> run;  // runs chunk i
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void work(Shared& s) {
  for (int64_t i = s.next.fetch_add(1); i < s.chunks; i = s.next.fetch_add(1)) {
    s.run(i);
    s.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs chunk(0 .. chunks-1) on the caller and up to `pool.num_threads()` - 1 pool tasks; returns when all are
// done.
void parallel(ffi::ThreadPool& pool, int64_t chunks, std::function<void(int64_t)> chunk) {
  if (chunks <= 1) {
    if (chunks == 1) chunk(0);
    return;
  }
  auto s = std::make_shared<Shared>();
  s->run = std::move(chunk);
  s->chunks = chunks;
  // The caller is one of the participants: with the pool's threads all busy here, one task per other thread
  // (more would share cores with the spinning caller: 1.3-1.6x slower on 2 cores).
  int64_t tasks = std::min<int64_t>(pool.num_threads() - 1, chunks - 1);
  for (int64_t t = 0; t < tasks; ++t) pool.Schedule([s] { work(*s); });
  work(*s);
  for (int spins = 0; s->done.load(std::memory_order_acquire) < s->chunks; ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
}

// GCC/Clang vector extensions: 16 float32 lanes (one AVX-512 register; two AVX2 ones, split by the compiler).
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

inline f32x16 load_f32(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline f32x16 load_widened(const uint16_t* p) {  // 16 bfloat16 -> 16 float32, exact
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  u32x16 bits = __builtin_convertvector(h, u32x16) << 16;
  f32x16 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

inline float lane_sum(f32x16 v) {
  float sum = 0.f;
  for (int j = 0; j < 16; ++j) sum += v[j];
  return sum;
}

constexpr int64_t kChunkBytes = 64 << 10;    // weight bytes per claimed chunk
constexpr int64_t kSerialBytes = 128 << 10;  // below this many weight bytes one thread does it all

// One weight row w_n [K] times activation rows r0 .. r0+RB-1 of x [R, K]: each 16-lane slice of w_n is widened once
// and multiplied into RB partial sums (the rows give the independent chains), so the weight row is read and
// widened once for all of them.
template <int RB>
void rows_block(const float* x, const uint16_t* w_n, float* y, int64_t K, int64_t N, int64_t n, int64_t r0) {
  const int64_t k16 = K / 16 * 16;
  f32x16 acc[RB] = {};
  for (int64_t k = 0; k < k16; k += 16) {
    const f32x16 w16 = load_widened(w_n + k);
    for (int j = 0; j < RB; ++j) acc[j] += w16 * load_f32(x + (r0 + j) * K + k);
  }
  for (int j = 0; j < RB; ++j) {
    float sum = lane_sum(acc[j]);
    for (int64_t k = k16; k < K; ++k) sum += x[(r0 + j) * K + k] * widen(w_n[k]);
    y[(r0 + j) * N + n] = sum;
  }
}

// How far ahead of its reads `row_single` prefetches the weight, in bfloat16 elements (8 KiB): the rows of a chunk
// are contiguous, so this runs into the next rows. Prefetched two lines per 64 elements read, spread over the loop;
// the loop before (a whole row of 2K bytes prefetched eight rows ahead, in one burst before each row) held the
// long-row weights [256, 1024-4096] of decode to 9-14 GB/s. Measured (2-core Xeon, one process, alternating chains
// of 96 distinct weights, medians of 11; same bits): time 0.66x at [256, 4096], 0.75x at [256, 2048], 0.87x at
// [256, 1024], 0.98-1.01x at [256, 256] and [2560-8192, 256]; a decode step on the default preset (bfloat16 weights,
// 41 input tokens, 8 alternating requests) 0.93x with the device loop and 0.91x with the host loop.
constexpr int64_t kRowPrefetch = 4096;

// One weight row times one activation row: four independent 16-lane partial sums (decode at B = 1).
void row_single(const float* x_r, const uint16_t* w_n, float* y_rn, int64_t K) {
  const int64_t k64 = K / 64 * 64, k16 = K / 16 * 16;
  f32x16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t k = 0;
  for (; k < k64; k += 64) {
    __builtin_prefetch(w_n + k + kRowPrefetch);  // a prefetch of an address past the weight does not fault
    __builtin_prefetch(w_n + k + kRowPrefetch + 32);
    a0 += load_widened(w_n + k) * load_f32(x_r + k);
    a1 += load_widened(w_n + k + 16) * load_f32(x_r + k + 16);
    a2 += load_widened(w_n + k + 32) * load_f32(x_r + k + 32);
    a3 += load_widened(w_n + k + 48) * load_f32(x_r + k + 48);
  }
  for (; k < k16; k += 16) a0 += load_widened(w_n + k) * load_f32(x_r + k);
  float sum = lane_sum((a0 + a1) + (a2 + a3));
  for (; k < K; ++k) sum += x_r[k] * widen(w_n[k]);
  *y_rn = sum;
}

// NB weight rows w_n .. w_{n+NB-1} times RB activation rows r0 .. r0+RB-1: NB x RB accumulators, each the sum
// `rows_block` takes for its (row, weight row) pair in the same order (the same result to the bit). Each 16-lane
// slice loads NB weight vectors and RB activation vectors for NB x RB products, where `rows_block` loads RB + 1
// for RB: for many rows (a prefill chunk, a batch) the loads, not the products, bound `rows_block`.
template <int NB, int RB>
void tile(const float* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t n, int64_t r0) {
  const int64_t k16 = K / 16 * 16;
  f32x16 acc[NB][RB] = {};
  for (int64_t k = 0; k < k16; k += 16) {
    f32x16 w16[NB];
    for (int i = 0; i < NB; ++i) w16[i] = load_widened(w + (n + i) * K + k);
    for (int j = 0; j < RB; ++j) {
      const f32x16 x16 = load_f32(x + (r0 + j) * K + k);
      for (int i = 0; i < NB; ++i) acc[i][j] += w16[i] * x16;
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < RB; ++j) {
      float sum = lane_sum(acc[i][j]);
      for (int64_t k = k16; k < K; ++k) sum += x[(r0 + j) * K + k] * widen(w[(n + i) * K + k]);
      y[(r0 + j) * N + n + i] = sum;
    }
}

// Rows r0 .. R-1 (fewer than 8) of one weight row n through `rows_block`.
void rows_rest(const float* x, const uint16_t* w_n, float* y, int64_t R, int64_t K, int64_t N, int64_t n,
               int64_t r0) {
  switch (R - r0) {
    case 7: rows_block<7>(x, w_n, y, K, N, n, r0); break;
    case 6: rows_block<6>(x, w_n, y, K, N, n, r0); break;
    case 5: rows_block<5>(x, w_n, y, K, N, n, r0); break;
    case 4: rows_block<4>(x, w_n, y, K, N, n, r0); break;
    case 3: rows_block<3>(x, w_n, y, K, N, n, r0); break;
    case 2: rows_block<2>(x, w_n, y, K, N, n, r0); break;
    case 1: rows_block<1>(x, w_n, y, K, N, n, r0); break;
    default: break;
  }
}

// Tiles of 4 weight rows by 6 activation rows: 24 accumulators and 4 weight vectors in AVX-512's 32 registers.
// Measured on the default preset's 106 output-major decode weights (77.9 MiB, 2-core Xeon, one process, medians
// of 9): at R = 64, 4 x 6 43-45 ms, 4 x 5 46, 4 x 4 52, 3 x 8 and 2 x 12 48, 6 x 4 51, 2 x 8 49, 8 x 2 75, and
// `rows_block` alone 62-76; at R = 16, 4 x 6 18 ms against 27 for `rows_block`. Without AVX-512 (the same Xeon
// compiled with -mno-avx512f: 16-lane vectors in pairs of 256-bit registers) tiles measured slower than
// `rows_block` (R = 64: 4 x 6 304 ms, 2 x 2 373, `rows_block` 277), so there they are not used.
#if defined(__AVX512F__)
constexpr int kTileN = 4, kTileR = 6;
#else
constexpr int kTileN = 0, kTileR = 0;
#endif

// Rows n0..n1 of y[R, N] = x[R, K] . w[N, K]^T. One activation row (decode): `row_single` per weight row. More:
// tiles of kTileN weight rows by kTileR activation rows (`tile`), the rows left over by `rows_block`.
void matvec_nk_rows(const float* x, const uint16_t* w, float* y, int64_t R, int64_t K, int64_t N, int64_t n0,
                    int64_t n1) {
  constexpr int kNB = kTileN > 0 ? kTileN : 1, kRB = kTileR > 0 ? kTileR : 1;
  int64_t n = n0;
  if (kTileN > 0 && R >= kRB)
    for (; n + kNB <= n1; n += kNB) {
      for (int64_t ahead = 0; ahead < 2 * kNB * K; ahead += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(w + (n + 2 * kNB) * K) + ahead);
      int64_t r0 = 0;
      for (; r0 + kRB <= R; r0 += kRB) tile<kNB, kRB>(x, w, y, K, N, n, r0);
      for (int i = 0; i < kNB; ++i) rows_rest(x, w + (n + i) * K, y, R, K, N, n + i, r0);
    }
  for (; n < n1; ++n) {
    const uint16_t* w_n = w + n * K;
    if (R == 1) {  // prefetches as it reads
      row_single(x, w_n, y + n, K);
      continue;
    }
    for (int64_t ahead = 0; ahead < 2 * K; ahead += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(w_n + 8 * K) + ahead);
    int64_t r0 = 0;
    for (; r0 + 8 <= R; r0 += 8) rows_block<8>(x, w_n, y, K, N, n, r0);
    rows_rest(x, w_n, y, R, K, N, n, r0);
  }
}

// Columns n0..n1 of y[R, N] = x[R, K] . w[K, N]. Eight weight rows at a time: each element of y's slice is loaded
// and stored once per eight rows, its sum taken in the same order as row by row (so the result is the same to the
// bit), and the slices of the rows 16 ahead are prefetched whole (every cache line, not only the first: the rows
// are N apart, too far for the hardware prefetcher to follow). Measured on the default preset's 106 input-major
// decode weights (110.2 MiB, 2-core Xeon, one process, alternating, medians of 45): 11.53 -> 5.56 ms per chain at
// R = 1 (a row at a time with one prefetched line per row and 128-column chunks, against this).
void matvec_kn_cols(const float* x, const uint16_t* w, float* y, int64_t R, int64_t K, int64_t N, int64_t n0,
                    int64_t n1) {
  for (int64_t r = 0; r < R; ++r) std::fill(y + r * N + n0, y + r * N + n1, 0.f);
  const int64_t k8 = K / 8 * 8;
  int64_t k = 0;
  for (; k < k8; k += 8) {
    const uint16_t* w0 = w + k * N;
    if (k + 24 < K)
      for (int64_t j = 16; j < 24; ++j)
        for (int64_t n = n0; n < n1; n += 32) __builtin_prefetch(w + (k + j) * N + n);  // 32 x 2 bytes: a line
    for (int64_t r = 0; r < R; ++r) {
      const float* a = x + r * K + k;
      float* __restrict y_r = y + r * N;
      for (int64_t n = n0; n < n1; ++n)
        y_r[n] = y_r[n] + a[0] * widen(w0[n]) + a[1] * widen(w0[N + n]) + a[2] * widen(w0[2 * N + n]) +
                 a[3] * widen(w0[3 * N + n]) + a[4] * widen(w0[4 * N + n]) + a[5] * widen(w0[5 * N + n]) +
                 a[6] * widen(w0[6 * N + n]) + a[7] * widen(w0[7 * N + n]);
    }
  }
  for (; k < K; ++k) {
    const uint16_t* w_k = w + k * N;
    for (int64_t r = 0; r < R; ++r) {
      const float a = x[r * K + k];
      float* __restrict y_r = y + r * N;
      for (int64_t n = n0; n < n1; ++n) y_r[n] += a * widen(w_k[n]);
    }
  }
}

// n elements of T, uninitialized (`new T[n]`, not `new T[n]()`): scratch that is written whole before it is read.
template <typename T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

// ---- Products of many activation rows on AMX tiles (Intel Advanced Matrix Extensions, BF16) ----
//
// Where the CPU has AMX-BF16 (Sapphire Rapids and later) and Linux grants the process its tile state, products of
// at least kAmxMinRows rows run on the tile unit: TDPBF16PS multiplies a 16 x 32 bfloat16 tile by a 32 x 16 one into
// a 16 x 16 float32 tile (Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 2, TDPBF16PS; Intel
// Architecture Instruction Set Extensions Programming Reference, ch. 3, "Intel AMX"). Both operands are bfloat16,
// so each float32 activation is first split into three bfloat16 parts whose sum is that activation exactly
// (`split3`: each part takes the next 8 significant bits of the 24 a float32 has, by truncation). A bfloat16 times a
// bfloat16 is exact in float32 (8 x 8 significant bits), so every product of a weight and an activation part is
// exact, and the three parts' products add up to the float32 product of the weight and the activation; only the
// order of the float32 additions differs from the other loops. Where they can differ more: the tile unit reads
// bfloat16 inputs below 2^-126 (1.2e-38) as zero, so a weight that small counts as zero, and an activation below
// about 2^-110 (7.7e-34) loses the parts that fall below it (up to 2^-8 of its value below 2^-118); an infinite
// weight gives NaN (it meets a zero part), where the loops give an infinity. Activations and weights of a model
// are far from both. Three parts cost three tile products: measured on the default preset's shapes (2-core
// Xeon, one thread, weights in cache) 220-300 GFLOP/s of float32-equivalent products at 64 rows, against about
// 150 per thread for the AVX-512 tiles above.
//
// The tiles: A is 16 rows x 32 bfloat16 (64 bytes a row, any row stride), B is 16 rows x 16 pairs (the "VNNI"
// layout: row kk holds, for each of 16 output columns, the pair of values at contraction indices 2kk and 2kk+1),
// C is 16 x 16 float32. Eight tile registers: four C (2 x 2 blocks of 16), two A, two B.
//   output-major w [N, K]: A = 16 weight rows read in place (stride 2K bytes), B = the activations' parts arranged
//     as pairs by a gather (`pairs_by_row`, once per call); C holds y^T, written transposed.
//   input-major w [K, N]: A = 16 rows of an activation part (row-major, stride 2K), B = 16 weight columns, pairs of
//     weight rows 2kk and 2kk+1 interleaved (packed by `amx_kn`, once per panel of 32 columns); C holds y, written
//     in place.
#if GEMMA4_AMX
constexpr int64_t kAmxMinRows = 16;

// Whether the tile unit may run in this process: not switched off (GEMMA4_BENCH_CPU_AMX=0, false, off or no, any
// case, ASCII whitespace around it ignored; read once. model/backends/cpu/kernels.py refuses any value but these and 1,
// true, on, yes before it loads this library, stripping the same whitespace), and Linux (5.16+) grants the
// XTILEDATA state on request (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); asked once.
bool amx_ready() {
  static const bool ready = [] {
    if (const char* v = std::getenv("GEMMA4_BENCH_CPU_AMX")) {
      std::string s(v);
      for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      s.erase(0, s.find_first_not_of(" \t\n\r\f\v"));
      s.erase(s.find_last_not_of(" \t\n\r\f\v") + 1);
      if (s == "0" || s == "false" || s == "off" || s == "no") return false;
    }
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }();
  return ready;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {  // eight tiles of 16 rows x 64 bytes (palette 1)
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
}

// x [R, K] float32 -> parts [3][Rp][K] bfloat16 (row-major; rows R .. Rp-1 zero): x = part0 + part1 + part2 exactly.
void split3(const float* x, uint16_t* parts, int64_t R, int64_t Rp, int64_t K, int64_t r0, int64_t r1) {
  const __m512i top = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t r = r0; r < r1; ++r) {
    uint16_t* p0 = parts + r * K;
    uint16_t* p1 = p0 + Rp * K;
    uint16_t* p2 = p1 + Rp * K;
    if (r >= R) {
      std::fill(p0, p0 + K, 0), std::fill(p1, p1 + K, 0), std::fill(p2, p2 + K, 0);
      continue;
    }
    for (int64_t k = 0; k < K; k += 16) {  // K is a multiple of 32
      const __m512 v = _mm512_loadu_ps(x + r * K + k);
      __m512i b0 = _mm512_and_si512(_mm512_castps_si512(v), top);
      const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(b0));  // exact
      __m512i b1 = _mm512_and_si512(_mm512_castps_si512(rest), top);
      __m512i b2 = _mm512_castps_si512(_mm512_sub_ps(rest, _mm512_castsi512_ps(b1)));  // <= 8 bits: exact
      // An infinity is its first part alone (inf - inf would make the others NaN), a NaN a quiet NaN (truncating
      // one whose payload lies in the low 16 bits would leave an infinity).
      const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
      b0 = _mm512_mask_or_epi32(b0, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), b0, _mm512_set1_epi32(0x7FC00000));
      b1 = _mm512_maskz_mov_epi32(finite, b1);
      b2 = _mm512_maskz_mov_epi32(finite, b2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p0 + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b0, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p1 + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b1, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p2 + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b2, 16)));
    }
  }
}

// parts [3][Rp][K] -> pairs [3][Rp/16][K/2][16] (uint32: a pair of bfloat16 at 2kk, 2kk+1 of one row): the B tiles
// of the output-major product, 16 activation rows as its 16 columns.
void pairs_by_row(const uint16_t* parts, uint32_t* pairs, int64_t K, int64_t b0, int64_t b1) {
  const int64_t half = K / 2;
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(int(half)));
  for (int64_t b = b0; b < b1; ++b) {  // b: (part, block of 16 rows)
    const uint32_t* src = reinterpret_cast<const uint32_t*>(parts) + b * 16 * half;
    uint32_t* dst = pairs + b * half * 16;
    for (int64_t kk = 0; kk < half; ++kk)
      _mm512_storeu_si512(dst + kk * 16, _mm512_i32gather_epi32(rows, src + kk, 4));
  }
}

inline void zero_c() {  // C tiles 0-3
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// C tile 2i + j += A tile 4 + i times B tile 6 + j (i, j in 0, 1).
inline void products_2x2() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// Stores C tile t (0-3; the intrinsic takes the register as a literal) to `to`, rows `stride` bytes apart.
inline void store_c(int t, float* to, int64_t stride) {
  switch (t) {
    case 0: _tile_stored(0, to, stride); break;
    case 1: _tile_stored(1, to, stride); break;
    case 2: _tile_stored(2, to, stride); break;
    default: _tile_stored(3, to, stride); break;
  }
}

// Output-major: y[r, n] for weight rows n0 .. n1-1 (32 at a time, n1 - n0 a multiple of 32) and all rows.
void amx_nk(const uint32_t* pairs, const uint16_t* w, float* y, int64_t R, int64_t Rp, int64_t K, int64_t N,
            int64_t n0, int64_t n1) {
  const int64_t half = K / 2, blocks = Rp / 16, part = blocks * half * 16;
  alignas(64) float c[16][16];
  configure_tiles();
  for (int64_t n = n0; n < n1; n += 32) {
    const uint16_t* wa = w + n * K;
    const uint16_t* wb = wa + 16 * K;
    for (int64_t rb = 0; rb < blocks; rb += 2) {
      zero_c();
      for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, wa + k, 2 * K);
        _tile_loadd(5, wb + k, 2 * K);
        for (int s = 0; s < 3; ++s) {
          const uint32_t* b = pairs + s * part + rb * half * 16 + k / 2 * 16;
          _tile_loadd(6, b, 64);
          _tile_loadd(7, b + half * 16, 64);
          products_2x2();
        }
      }
      for (int t = 0; t < 4; ++t) {
        store_c(t, &c[0][0], 64);
        const int64_t nn = n + t / 2 * 16, r0 = (rb + t % 2) * 16;
        for (int64_t j = 0; j < 16 && r0 + j < R; ++j)  // c holds y^T: c[i][j] = y[r0 + j, nn + i]
          for (int i = 0; i < 16; ++i) y[(r0 + j) * N + nn + i] = c[i][j];
      }
    }
  }
  _tile_release();
}

// Input-major: y[r, n] for weight columns n0 .. n1-1 (32 at a time) and all rows, in spans of up to kSpan panels of
// 32 columns: a span is packed first (`panels` holds kSpan * K * 32 bfloat16), reading each weight row's span as
// one contiguous run and prefetching the rows 16 ahead (every line: rows N apart are too far apart for the
// hardware prefetcher, as in `matvec_kn_cols`), then multiplied panel by panel.
constexpr int64_t kSpan = 8;

void amx_kn(const uint16_t* parts, const uint16_t* w, float* y, uint16_t* panels, int64_t R, int64_t Rp, int64_t K,
            int64_t N, int64_t n0, int64_t n1) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                      37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  alignas(64) float c[16][16];
  configure_tiles();
  for (int64_t s0 = n0; s0 < n1; s0 += kSpan * 32) {
    const int64_t span = std::min(n1 - s0, kSpan * 32);  // columns, a multiple of 32
    for (int64_t kk = 0; kk < K / 2; ++kk) {  // panel p: [K/32][2 tiles][16 rows][32], rows 2kk, 2kk+1 interleaved
      if (2 * kk + 16 < K)
        for (int64_t n = s0; n < s0 + span; n += 32) {
          __builtin_prefetch(w + (2 * kk + 16) * N + n);
          __builtin_prefetch(w + (2 * kk + 17) * N + n);
        }
      for (int64_t p = 0; p < span / 32; ++p) {
        const uint16_t* at = w + 2 * kk * N + s0 + 32 * p;
        const __m512i a = _mm512_loadu_si512(at), b = _mm512_loadu_si512(at + N);
        uint16_t* row = panels + p * K * 32 + (kk / 16) * 1024 + (kk % 16) * 32;
        _mm512_storeu_si512(row, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(row + 512, _mm512_permutex2var_epi16(a, hi, b));
      }
    }
    for (int64_t p = 0; p < span / 32; ++p) {
      const uint16_t* panel = panels + p * K * 32;
      const int64_t n = s0 + 32 * p;
      for (int64_t r = 0; r < Rp; r += 32) {
        zero_c();
        for (int64_t k = 0; k < K; k += 32) {
          _tile_loadd(6, panel + k / 32 * 1024, 64);
          _tile_loadd(7, panel + k / 32 * 1024 + 512, 64);
          for (int s = 0; s < 3; ++s) {
            const uint16_t* a = parts + (s * Rp + r) * K + k;
            _tile_loadd(4, a, 2 * K);
            _tile_loadd(5, a + 16 * K, 2 * K);
            products_2x2();
          }
        }
        for (int t = 0; t < 4; ++t) {
          const int64_t r0 = r + t / 2 * 16, nn = n + t % 2 * 16;
          if (r0 + 16 <= R) {  // C holds y's rows r0 .. r0+15, columns nn .. nn+15: stored in place
            store_c(t, y + r0 * N + nn, 4 * N);
            continue;
          }
          store_c(t, &c[0][0], 64);
          for (int64_t i = 0; i < 16 && r0 + i < R; ++i)
            std::memcpy(y + (r0 + i) * N + nn, c[i], 16 * sizeof(float));
        }
      }
    }
  }
  _tile_release();
}


// y = x . w on the tiles where they apply (R >= kAmxMinRows, K a positive multiple of 32, at least 32 output
// columns); false (nothing written) otherwise. Columns past the last multiple of 32 go to `rest(n0, n1)`, the other
// loops, for all rows. Rows go through in blocks of kAmxRowBlock, which bounds the scratch (about 12 bytes per
// row and contraction index: 24 MiB at K = 8192); each output's sum is the same in any block.
constexpr int64_t kAmxRowBlock = 256;

template <bool kOutputMajor>
bool amx_product(ffi::ThreadPool& pool, const float* x, const uint16_t* w, float* y, int64_t R, int64_t K, int64_t N,
                 const std::function<void(int64_t, int64_t)>& rest) {
  if (R < kAmxMinRows || K <= 0 || K % 32 != 0 || N < 32 || !amx_ready()) return false;
  const int64_t N32 = N / 32 * 32, most = (std::min(R, kAmxRowBlock) + 31) / 32 * 32;
  // Scratch left uninitialized (a std::vector would zero it, 6 bytes per row and contraction index each, on every
  // call): each block's `split3` writes all of parts [3][Rp][K] (rows past R as zeros), and `pairs_by_row` all of
  // pairs [3][Rp/16][K/2][16], before anything reads them; nothing reads past a block's Rp (`amx_nk`, `amx_kn`).
  const auto parts = scratch<uint16_t>(3 * most * K);
  const auto pairs = scratch<uint32_t>(kOutputMajor ? 3 * most * K / 2 : 0);
  // Chunks of whole panels of 32 output columns. Output-major: about 64 KiB of weight each (at least one panel per
  // thread). Input-major: one per thread, as wide as that allows (the longer the run read from each weight row,
  // the better memory keeps up; `amx_kn` packs it in spans).
  const int64_t panels = N32 / 32, threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_thread = (panels + threads - 1) / threads;
  const int64_t per = kOutputMajor ? std::max<int64_t>(1, std::min<int64_t>(kChunkBytes / (64 * K), per_thread))
                                   : per_thread;
  const int64_t chunks = (panels + per - 1) / per;
  // Input-major: one span buffer per chunk, for the whole call (`amx_kn` writes each panel whole before reading it).
  const auto packed = scratch<uint16_t>(kOutputMajor ? 0 : chunks * kSpan * K * 32);
  for (int64_t r0 = 0; r0 < R; r0 += kAmxRowBlock) {
    const int64_t rows = std::min(kAmxRowBlock, R - r0), Rp = (rows + 31) / 32 * 32;
    const float* xb = x + r0 * K;
    float* yb = y + r0 * N;
    parallel(pool, Rp / 16, [&](int64_t i) { split3(xb, parts.get(), rows, Rp, K, i * 16, i * 16 + 16); });
    if (kOutputMajor)
      parallel(pool, 3 * Rp / 16, [&](int64_t b) { pairs_by_row(parts.get(), pairs.get(), K, b, b + 1); });
    const bool with_rest = r0 == 0 && N32 < N;  // the leftover columns of all rows, once, beside the first block
    parallel(pool, chunks + (with_rest ? 1 : 0), [&](int64_t i) {
      if (i == chunks) return rest(N32, N);
      const int64_t n0 = i * per * 32, n1 = std::min(N32, (i + 1) * per * 32);
      if (kOutputMajor) {
        amx_nk(pairs.get(), w, yb, rows, Rp, K, N, n0, n1);
      } else {
        amx_kn(parts.get(), w, yb, packed.get() + i * kSpan * K * 32, rows, Rp, K, N, n0, n1);
      }
    });
  }
  return true;
}
#endif

// y[R, N] = x[R, K] . w: w is [N, K] (kOutputMajor, `matvec_nk_rows` over chunks of output rows) or [K, N]
// (`matvec_kn_cols` over chunks of output columns, 64-lane multiples: each chunk reads K contiguous slices).
template <bool kOutputMajor>
ffi::Error Matvec(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> w,
                  ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[kOutputMajor ? 1 : 0])
    return ffi::Error::InvalidArgument(kOutputMajor ? "gemma4_bf16_matvec_nk: expected x [R, K] and w [N, K]"
                                                    : "gemma4_bf16_matvec_kn: expected x [R, K] and w [K, N]");
  const int64_t R = xd[0], K = xd[1], N = wd[kOutputMajor ? 0 : 1];
  const float* xp = x.typed_data();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.untyped_data());
  float* yp = y->typed_data();
#if GEMMA4_AMX
  const auto rest = [=](int64_t n0, int64_t n1) {  // columns the tiles leave: the loops below, on one thread
    if (kOutputMajor)
      matvec_nk_rows(xp, wp, yp, R, K, N, n0, n1);
    else
      matvec_kn_cols(xp, wp, yp, R, K, N, n0, n1);
  };
  if (amx_product<kOutputMajor>(pool, xp, wp, yp, R, K, N, rest)) return ffi::Error::Success();
#endif
  const int64_t per_chunk = kChunkBytes / std::max<int64_t>(1, 2 * K);
  // Input-major chunks are as wide as one per thread allows (at least 64 KiB of weight and 64 lanes): the wider a
  // chunk, the longer the contiguous run it reads from each weight row.
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_thread = ((N + threads - 1) / threads + 63) / 64 * 64;
  // Output-major chunks of many rows hold whole tiles of kTileN weight rows (a chunk of 64 KiB of a long weight
  // row, K > 8192, would hold fewer than 4 rows, and none of them would run in a tile).
  const int64_t tile_rows = kTileN > 0 && R >= kTileR ? kTileN : 1;
  const int64_t size = kOutputMajor ? (std::max<int64_t>(1, per_chunk) + tile_rows - 1) / tile_rows * tile_rows
                                    : std::max<int64_t>({64, per_chunk / 64 * 64, per_thread});
  const int64_t chunks = 2 * N * K < kSerialBytes ? 1 : (N + size - 1) / size;
  const int64_t per = chunks == 1 ? N : size;
  parallel(pool, chunks, [=](int64_t i) {
    const int64_t n0 = i * per, n1 = std::min(N, (i + 1) * per);
    if (kOutputMajor)
      matvec_nk_rows(xp, wp, yp, R, K, N, n0, n1);
    else
      matvec_kn_cols(xp, wp, yp, R, K, N, n0, n1);
  });
  return ffi::Error::Success();
}

ffi::Error ToF32(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> w, ffi::ResultBuffer<ffi::F32> y) {
  const int64_t n = w.element_count();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.untyped_data());
  float* yp = y->typed_data();
  const int64_t per = kChunkBytes / 2;
  const int64_t chunks = 2 * n < kSerialBytes ? 1 : (n + per - 1) / per;
  const int64_t size = chunks == 1 ? n : per;
  parallel(pool, chunks, [=](int64_t i) {
    const int64_t a = i * size, b = std::min(n, a + size);
    for (int64_t j = a; j < b; ++j) yp[j] = widen(wp[j]);
  });
  return ffi::Error::Success();
}

// ---- Decode attention over a float32 KV cache (one query position per row) ----
//
// o[b, kh, g, :] = sum_s p[s, g] v[b, kh, s, :], p = softmax over the visible positions s (mask[b, s]) of the scores
// k[b, kh, s, :] . q[b, kh, g, :] (scale 1.0: Gemma 4 normalizes q and k instead). The positions are cut into chunks
// of kAttnChunk that the threads claim (`parallel`); each chunk reads only its visible keys and values, once, and
// keeps its own softmax state (running max m, sum l, unnormalized output acc), and the chunks are merged at the end
// by rescaling each with exp(m_chunk - m) (the softmax of the whole row, summed in another order: "online softmax",
// Milakov and Gimelshein 2018, arXiv:1805.02867). A row with no visible position gets zeros.
constexpr int64_t kAttnChunk = 256;

struct AttnDims {
  int64_t B, Kh, G, S, H;  // B query rows (and mask rows)
  const int32_t* rows;     // query row b reads cache row rows[b]; nullptr: row b
};

template <int G>
void attn_chunk(const float* q, const float* k, const float* v, const bool* vis, int64_t S, int64_t H, int64_t s0,
                int64_t s1, float* m_out, float* l_out, float* acc) {
  float score[kAttnChunk][G];
  float m[G];
  for (int g = 0; g < G; ++g) m[g] = -INFINITY;
  const int64_t h16 = H / 16 * 16;
  bool seen = false;  // a visible position in this chunk
  for (int64_t s = s0; s < s1; ++s) {
    if (!vis[s]) continue;
    seen = true;
    const float* k_s = k + s * H;
    __builtin_prefetch(k_s + 8 * H);
    f32x16 a[G] = {};
    for (int64_t h = 0; h < h16; h += 16) {
      const f32x16 kv = load_f32(k_s + h);
      for (int g = 0; g < G; ++g) a[g] += kv * load_f32(q + g * H + h);
    }
    for (int g = 0; g < G; ++g) {
      float sum = lane_sum(a[g]);
      for (int64_t h = h16; h < H; ++h) sum += k_s[h] * q[g * H + h];
      score[s - s0][g] = sum;
      if (std::isnan(sum) || sum > m[g]) m[g] = sum;  // a NaN score makes the max NaN, as it makes XLA's softmax
    }
  }
  float l[G] = {};
  for (int64_t s = s0; s < s1; ++s) {
    if (!vis[s]) continue;
    for (int g = 0; g < G; ++g) {
      const float e = std::exp(score[s - s0][g] - m[g]);
      score[s - s0][g] = e;
      l[g] += e;
    }
  }
  for (int g = 0; g < G; ++g) m_out[g] = m[g], l_out[g] = l[g];
  std::fill(acc, acc + G * H, 0.f);
  if (!seen) return;  // nothing visible in this chunk: l = 0 marks it for the merge
  // acc[g, :] = sum_s e[s, g] v[s, :], 32 lanes of H at a time for all G (2G accumulators in registers), over the
  // chunk's visible positions (the chunk's values stay in L2 across the lane blocks).
  int64_t h = 0;
  for (; h + 32 <= H; h += 32) {
    f32x16 o0[G] = {}, o1[G] = {};
    for (int64_t s = s0; s < s1; ++s) {
      if (!vis[s]) continue;
      const f32x16 v0 = load_f32(v + s * H + h), v1 = load_f32(v + s * H + h + 16);
      for (int g = 0; g < G; ++g) {
        const float e = score[s - s0][g];
        o0[g] += e * v0;
        o1[g] += e * v1;
      }
    }
    for (int g = 0; g < G; ++g) {
      std::memcpy(acc + g * H + h, &o0[g], sizeof(f32x16));
      std::memcpy(acc + g * H + h + 16, &o1[g], sizeof(f32x16));
    }
  }
  for (; h < H; ++h)
    for (int64_t s = s0; s < s1; ++s)
      if (vis[s])
        for (int g = 0; g < G; ++g) acc[g * H + h] += score[s - s0][g] * v[s * H + h];
}

template <int G>
void decode_attention(ffi::ThreadPool& pool, const float* q, const float* k, const float* v, const bool* mask,
                      float* o, AttnDims d) {
  const int64_t H = d.H, S = d.S, per_row = (S + kAttnChunk - 1) / kAttnChunk, heads = d.B * d.Kh;
  const int64_t items = heads * per_row;
  const auto m = scratch<float>(items * G), l = scratch<float>(items * G), acc = scratch<float>(items * G * H);
  parallel(pool, items, [&](int64_t i) {
    const int64_t head = i / per_row, c = i % per_row, b = head / d.Kh;
    const int64_t cache_head = (d.rows ? d.rows[b] : b) * d.Kh + head % d.Kh;
    const int64_t s0 = c * kAttnChunk, s1 = std::min(S, s0 + kAttnChunk);
    attn_chunk<G>(q + head * G * H, k + cache_head * S * H, v + cache_head * S * H, mask + b * S, S, H, s0, s1,
                  m.get() + i * G, l.get() + i * G, acc.get() + i * G * H);
  });
  for (int64_t head = 0; head < heads; ++head) {
    for (int g = 0; g < G; ++g) {
      // The chunks with a visible position (l > 0, or NaN) and their max, NaN if any is: NaN or infinite scores
      // give what XLA's softmax gives (NaN), never a silently finite output.
      bool any = false;
      float top = -INFINITY;
      for (int64_t c = 0; c < per_row; ++c) {
        const int64_t i = head * per_row + c;
        if (l[i * G + g] == 0.f) continue;
        any = true;
        if (std::isnan(m[i * G + g]) || m[i * G + g] > top) top = m[i * G + g];
      }
      float* out = o + (head * G + g) * H;
      std::fill(out, out + H, 0.f);
      if (!any) continue;  // no visible position: zeros
      float total = 0.f;
      for (int64_t c = 0; c < per_row; ++c) {
        const int64_t i = head * per_row + c;
        if (l[i * G + g] == 0.f) continue;
        const float scale = std::exp(m[i * G + g] - top);
        total += scale * l[i * G + g];
        const float* part = acc.get() + (i * G + g) * H;
        for (int64_t h = 0; h < H; ++h) out[h] += scale * part[h];
      }
      const float inv = 1.f / total;
      for (int64_t h = 0; h < H; ++h) out[h] *= inv;
    }
  }
}

// q [B, K, G, H], k and v [C, K, S, H] (C cache rows: B, or any number with `rows`), mask [B, S], rows [B] or
// nullptr; o [B, K, G, H].
ffi::Error attention(ffi::ThreadPool& pool, ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k,
                     ffi::Buffer<ffi::F32>& v, ffi::Buffer<ffi::PRED>& mask, const int32_t* rows,
                     ffi::ResultBuffer<ffi::F32>& o) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2 || kd[1] != qd[1] || kd[3] != qd[3] ||
      (rows == nullptr && kd[0] != qd[0]) || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3] ||
      md[0] != qd[0] || md[1] != kd[2])
    return ffi::Error::InvalidArgument(
        "gemma4_decode_attention: expected q [B, K, G, H], k and v [B, K, S, H] (with rows: [C, K, S, H]), "
        "mask [B, S]");
  for (int64_t b = 0; rows != nullptr && b < qd[0]; ++b)
    if (rows[b] < 0 || rows[b] >= kd[0])
      return ffi::Error::InvalidArgument("gemma4_decode_attention_rows: a row index outside the cache's rows");
  const AttnDims d{qd[0], qd[1], qd[2], kd[2], qd[3], rows};
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float* op = o->typed_data();
  switch (d.G) {
    case 1: decode_attention<1>(pool, qp, kp, vp, mp, op, d); break;
    case 2: decode_attention<2>(pool, qp, kp, vp, mp, op, d); break;
    case 4: decode_attention<4>(pool, qp, kp, vp, mp, op, d); break;
    case 8: decode_attention<8>(pool, qp, kp, vp, mp, op, d); break;
    default:
      return ffi::Error::InvalidArgument(
          "gemma4_decode_attention: G (query heads per KV head) must be 1, 2, 4 or 8");
  }
  return ffi::Error::Success();
}

ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> o) {
  return attention(pool, q, k, v, mask, nullptr, o);
}

// Query row b against cache row rows[b] (decode slots stepping some of their rows: no gathered copy of the cache).
ffi::Error DecodeAttentionRows(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                               ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::S32> rows,
                               ffi::ResultBuffer<ffi::F32> o) {
  if (rows.dimensions().size() != 1 || rows.dimensions()[0] != q.dimensions()[0])
    return ffi::Error::InvalidArgument("gemma4_decode_attention_rows: expected rows [B], one per query row");
  return attention(pool, q, k, v, mask, rows.typed_data(), o);
}

}  // namespace

#define GEMMA4_MATVEC_BINDING                                                                       \
  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::BF16>>().Ret< \
      ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(gemma4_bf16_matvec_nk, Matvec<true>, GEMMA4_MATVEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(gemma4_bf16_matvec_kn, Matvec<false>, GEMMA4_MATVEC_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(gemma4_bf16_to_f32, ToF32,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::BF16>>().Ret<
                                  ffi::Buffer<ffi::F32>>());

// q, k, v, mask: the arguments both attention targets take first.
#define GEMMA4_ATTENTION_ARGS                                                                          \
  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Arg< \
      ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::PRED>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(gemma4_decode_attention, DecodeAttention,
                              GEMMA4_ATTENTION_ARGS.Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(gemma4_decode_attention_rows, DecodeAttentionRows,
                              GEMMA4_ATTENTION_ARGS.Arg<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::F32>>());

// How many weight rows `matvec` multiplies at a time in a tile for many activation rows (0: no tiles, this CPU
// has no AVX-512), for `model.backends.cpu.kernels.max_rows`.
extern "C" int gemma4_bf16_tile_rows() { return kTileN; }

// The fewest activation rows `matvec` multiplies on AMX tiles; 0 where it never does (not built with AMX-BF16, or
// Linux refused the tile state). Asks for the tile state (once).
extern "C" int gemma4_bf16_amx_min_rows() {
#if GEMMA4_AMX
  return amx_ready() ? int(kAmxMinRows) : 0;
#else
  return 0;
#endif
}
