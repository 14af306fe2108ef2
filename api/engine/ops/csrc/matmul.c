/* Int4MatMul (domain "tokenshop"): ONNX Runtime's 4-bit `MatMulNBits`, symmetric, with a kernel
 * that shares each unpacked weight group across the rows of a batch and applies scales once per
 * 8 columns. Int8MatMul: the same kernel over 8-bit weights, for the int8 projections of ONNX
 * Runtime's dynamic quantization (an int4 export's LM head among them; `graph/int8_matmul.py`).
 *
 * Why: ONNX Runtime's kernel costs nearly a full row's time for every extra row of a batch;
 * here a row costs the integer multiplies of its activations against weights already unpacked
 * into registers. Figures: bench/results/2026-11-26-kernel-notes.md.
 *
 * Attributes are MatMulNBits' own (K, N, block_size, bits) and so is the data, rearranged by
 * the engine's graph edit (`graph/int4_matmul.py`, into nodes that ONNX Runtime folds at load):
 *   B       [N / 8][K' / 8][8][4] bytes, K' = K rounded up to the block: for each panel of 8
 *           columns and each group of 8 weights, 4 bytes per column, byte j holding the group's
 *           weight 2j in its low nibble and 2j+1 in its high one (MatMulNBits' bytes, regrouped)
 *   scales  [N / 8][K' / block][8]
 *   bias    [N], optional: the edit takes it from an Add behind the node
 *   residual  [.., N] like Y, optional: added to Y (the residual Add behind a layer's output
 *           projections, taken by the same edit; a separate Add was 48 ops a step)
 * Supported: bits 4, no zero points (the quantizer's symmetric mode: zero point 8), block_size
 * 64, 128 or 256, N a multiple of 8.
 * With `swiglu` = 1 (the edit sets it on a SwiGLU MLP's merged gate/up projection), the panels
 * alternate gate, up (N a multiple of 16) and Y is [.., N / 2] = silu(gate) * up: the MLP's
 * Split, Sigmoid and two Muls run in the kernel's last step instead of as four ops.
 * Int8MatMul takes the same attributes (no `bits`, no `swiglu`) and inputs, with int8 weights:
 *   B       [N / 8][K' / 8][2][8][4]: per panel and group of 8 weights, the 4 even-indexed
 *           weights of each column, then the 4 odd-indexed ones (the activations' order)
 * and the scales per block as above (a per-tensor scale repeated).
 * The activations are quantized to int8 per block, as ORT's
 * accuracy_level 4 does; everything else is exact integer arithmetic. AMX tiles multiply
 * batches of 5 rows or more where the CPU and the OS allow them (matmul_amx.h), AVX-512 VNNI's
 * vpdpbusd the rest where the CPU has it, AVX2 elsewhere; TOKENSHOP_INT4_ISA=vnni or avx2 in
 * the environment of the process forces a lesser path, for tests and benchmarks.
 */
#define _GNU_SOURCE /* syscall(), for AMX's permission */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "onnxruntime_c_api.h"
#include "ops.h"
#include "simd_math.h"

#define ROW_PANEL 64      /* rows whose activations stay in cache while a strip passes */
#define STRIP_PANELS 4    /* 8-column panels per parallel task */

/* Block-major, so that one pointer each walks a tile of rows through the blocks: with a
 * pointer per row, a tile's addressing spilled general registers and took ~1.15x the time. */
typedef struct {
  int8_t *q;           /* [blocks][rows][block], each 8 values as 4 even-indexed, 4 odd */
  float *scales;       /* [blocks][rows] */
  float *corrections;  /* [blocks][rows] scale * zero point * sum(q): the zero point's share */
  int64_t rows, blocks, block;
} QuantizedRows;

typedef struct {
  const float *a;
  QuantizedRows *rows;
  int64_t k;
  float zero_point; /* what the kernel's unsigned weights are offset by (0: signed weights) */
} QuantizeTask;

typedef struct {
  const QuantizedRows *rows;
  const uint8_t *b;
  const float *scales;
  const float *bias;     /* [n], or NULL */
  const float *residual; /* [rows][n], or NULL */
  float *y;
  int64_t n;            /* B's columns */
  int64_t y_stride;     /* Y's: n, or n / 2 with `swiglu` */
  int swiglu;           /* Y = silu(gate panel) * up panel, panels alternating gate, up */
  int64_t panel_bytes;  /* B's bytes per panel of 8 columns */
  int64_t panel_scales; /* scales per panel */
} MatMulTask;

typedef void (*StripFunction)(void *task, size_t strip);

typedef struct {
  int64_t k, n, block, bits, swiglu;
  float zero_point;
  StripFunction multiply_strip;
  const uint8_t *weights; /* a copy of B on huge pages, when B is a constant; else NULL */
  SharedWeights *shared;  /* that copy, which other kernels reading B may hold too */
} Int4Kernel;

/* ---- activations: float rows -> int8 blocks ---- */

__attribute__((target("avx2,fma"))) static inline __m256i quantize8(__m256 v, __m256 inverse) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(v, inverse));
}

/* Four vectors of 8 int32 -> 32 int8, each 8 as 4 even-indexed then 4 odd-indexed (the order
 * of a group's low and high nibbles in B). */
__attribute__((target("avx2,fma"))) static inline __m256i pack32(__m256i a, __m256i b, __m256i c,
                                                               __m256i d) {
  __m256i ab = _mm256_packs_epi32(a, b);
  __m256i cd = _mm256_packs_epi32(c, d);
  __m256i all = _mm256_packs_epi16(ab, cd);
  all = _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m256i even_odd = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                            0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  return _mm256_shuffle_epi8(all, even_odd);
}

__attribute__((target("avx2,fma"))) static inline int32_t sum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

/* 8 floats from x, zero past `valid`. */
__attribute__((target("avx2,fma"))) static inline __m256 load8(const float *x, int64_t valid) {
  if (valid >= 8) return _mm256_loadu_ps(x);
  float tail[8] = {0};
  if (valid > 0) memcpy(tail, x, (size_t)valid * sizeof(float));
  return _mm256_loadu_ps(tail);
}

/* One block of `block` floats (zero-padded past `valid`) -> int8, its scale and correction. */
__attribute__((target("avx2,fma"))) static void quantize_block(const float *x, int64_t valid,
                                                             int64_t block, float zero_point,
                                                             int8_t *q, float *scale,
                                                             float *correction) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < valid; i += 8)
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load8(x + i, valid - i)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  float top = _mm_cvtss_f32(m);
  float d = top / 127.0f;
  __m256 inverse = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m256i total = _mm256_setzero_si256();
  for (int64_t c = 0; c < block; c += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; j++) {
      v[j] = quantize8(load8(x + c + 8 * j, valid - c - 8 * j), inverse);
      total = _mm256_add_epi32(total, v[j]);
    }
    _mm256_storeu_si256((__m256i *)(q + c), pack32(v[0], v[1], v[2], v[3]));
  }
  *scale = d;
  *correction = d * zero_point * (float)sum_epi32(total);
}

static void quantize_row(void *data, size_t row) {
  QuantizeTask *task = data;
  QuantizedRows *r = task->rows;
  const float *x = task->a + (int64_t)row * task->k;
  for (int64_t b = 0; b < r->blocks; b++) {
    int64_t start = b * r->block;
    int64_t valid = task->k - start < r->block ? task->k - start : r->block;
    int64_t at = b * r->rows + (int64_t)row;
    quantize_block(x + start, valid, r->block, task->zero_point, r->q + at * r->block,
                   r->scales + at, r->corrections + at);
  }
}

/* ---- the product: one copy per instruction set (matmul_tile.h) ---- */

#define TILE_TARGET "avx2,fma"
#define TILE(name) name##_avx2
#define TILE_VNNI 0
/* 4 rows x 2 panels: each group unpacked once for 4 rows; 6 or 8 rows spill the 16 ymm
 * registers. Its int4 tiles keep int16 sums over 4 groups (TILE(tile_int16)). Figures:
 * bench/results/2026-11-26-kernel-notes.md. */
#define TILE_ROWS 4
#define TILE_PANELS 2
#define TILE_PANELS_ONE_ROW 4
#define TILE_PANELS_MAX 4
#include "matmul_tile.h"
#undef TILE_TARGET
#undef TILE
#undef TILE_VNNI
#undef TILE_ROWS
#undef TILE_PANELS
#undef TILE_PANELS_ONE_ROW
#undef TILE_PANELS_MAX

#define TILE_TARGET_VNNI "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
#define TILE_TARGET TILE_TARGET_VNNI
#define TILE(name) name##_vnni
#define TILE_VNNI 1
/* 8 rows: a batch of 8 decoding streams in one pass over the weights, each group unpacked once
 * for all 8. Panels go in pairs, one 512-bit vector each (TILE(tile_pairs)); 8 rows x 4 panels
 * pay only written out row by row (TILE(tile8)). Figures:
 * bench/results/2026-11-26-kernel-notes.md. */
#define TILE_ROWS 8
#define TILE_PANELS 4
#define TILE_PANELS_ONE_ROW 4
#define TILE_PANELS_MAX 4
#include "matmul_tile.h"

/* Fewer rows stay on VNNI, where AMX's tile stores cost more than its multiplies save (about
 * even at 4 rows; figures: bench/results/2026-11-26-kernel-notes.md). A build may set it (-D) to
 * time one path alone. */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 5
#endif
#include "matmul_amx.h"

/* ---- which kernel ---- */

typedef enum { ISA_AVX2, ISA_VNNI, ISA_AMX } Isa;

/* Whether this process may use AMX tiles: the CPU has them, the OS saves their state (XCR0) and
 * grants this process the right to (Linux asks each process to request it, once). */
static int g_amx_ready;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

__attribute__((target("xsave"))) static void request_amx(void) {
  enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return;
  int tiles = (edx >> 24) & 1, int8 = (edx >> 25) & 1;
  if (!tiles || !int8 || !((ecx >> 27) & 1)) return; /* ecx bit 27: OSXSAVE, so xgetbv runs */
  unsigned long long xcr0 = _xgetbv(0);
  if (((xcr0 >> 17) & 3) != 3) return;
  g_amx_ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* B's bytes: N columns of K rounded up to the block, `bits` each. */
static size_t weight_bytes(const Int4Kernel *k) {
  return (size_t)(k->n * ((k->k + k->block - 1) / k->block) * k->block * k->bits / 8);
}

static size_t g_copied_bytes; /* weights the live kernels hold in copies (share_weights) */
static int g_huge_pages = 1;  /* whether kernels made from now on copy their weights */

/* Whether kernels made from now on serve their weights from copies on 2 MB pages (on by
 * default). Off, several processes serving one model share its file's pages in the page cache,
 * where each would hold a copy of its own: the engine's ENGINE_HUGE_PAGES setting. */
void tokenshop_use_huge_pages(int on) { __atomic_store_n(&g_huge_pages, on, __ATOMIC_RELAXED); }

/* Bytes of weights the op serves from its copies on 2 MB pages: the engine logs it. */
size_t tokenshop_huge_page_bytes(void) {
  return __atomic_load_n(&g_copied_bytes, __ATOMIC_RELAXED);
}

/* Whether the kernel backs memory that asks for it with 2 MB pages (transparent huge pages on
 * "always" or "madvise", not "never"). */
static int huge_pages_allowed(void) {
  char setting[64] = {0};
  FILE *file = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (file == NULL) return 0;
  size_t got = fread(setting, 1, sizeof(setting) - 1, file);
  fclose(file);
  return got > 0 && strstr(setting, "[never]") == NULL;
}

/* Input `index`'s data when the graph holds it as a constant of `elements` elements; else NULL
 * (a constant of another size is refused by compute, before anything reads it). */
static const void *constant_input(const OrtKernelInfo *info, size_t index, size_t elements) {
  int constant = 0;
  const OrtValue *value = NULL;
  OrtTensorTypeAndShapeInfo *shape = NULL;
  size_t count = 0;
  void *data = NULL;
  OrtStatus *status = g_api->KernelInfoGetConstantInput_tensor(info, index, &constant, &value);
  if (status == NULL && constant && value != NULL)
    status = g_api->GetTensorTypeAndShape(value, &shape);
  if (status == NULL && shape != NULL) status = g_api->GetTensorShapeElementCount(shape, &count);
  if (shape != NULL) g_api->ReleaseTensorTypeAndShapeInfo(shape);
  if (status == NULL && shape != NULL && count == elements)
    status = g_api->GetTensorMutableData((OrtValue *)value, &data);
  if (status != NULL) g_api->ReleaseStatus(status);
  return data;
}

/* The whole pages of [data, data + bytes) handed back to the kernel: file pages are dropped (and
 * read again should anything touch them), anonymous ones stay where there is no swap. */
static void give_back(const void *data, size_t bytes) {
#ifdef MADV_PAGEOUT /* Linux 5.4 and later */
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t first = ((uintptr_t)data + page - 1) & ~(page - 1);
  uintptr_t last = ((uintptr_t)data + bytes) & ~(page - 1);
  if (last > first) madvise((void *)first, last - first, MADV_PAGEOUT);
#else
  (void)data;
  (void)bytes;
#endif
}

/* A copy of one constant on 2 MB pages, held by every kernel that reads that constant: a tied
 * model's LM head (Int8MatMul) and its embedding (HeadEmbedding, embedding.c) share one. */
struct SharedWeights {
  const void *source; /* the constant's data, as ONNX Runtime holds it */
  size_t bytes;
  uint8_t *aligned; /* the copy */
  void *mapping;    /* the copy's mapping, and its size */
  size_t mapping_bytes;
  int users;
  SharedWeights *next;
};

static SharedWeights *g_shared; /* every live copy */
static pthread_mutex_t g_shared_lock = PTHREAD_MUTEX_INITIALIZER;

static SharedWeights *copy_of(const void *data, size_t bytes) {
  size_t mapped = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE + HUGE_PAGE;
  uint8_t *area = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return NULL;
  SharedWeights *copy = calloc(1, sizeof(SharedWeights));
  if (copy == NULL) {
    munmap(area, mapped);
    return NULL;
  }
  uint8_t *aligned = (uint8_t *)(((uintptr_t)area + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  madvise(aligned, bytes, MADV_HUGEPAGE);
  memcpy(aligned, data, bytes);
  *copy = (SharedWeights){.source = data,
                          .bytes = bytes,
                          .aligned = aligned,
                          .mapping = area,
                          .mapping_bytes = mapped};
  __atomic_add_fetch(&g_copied_bytes, bytes, __ATOMIC_RELAXED);
  give_back(data, bytes);
  return copy;
}

/* Input `index` of `bytes` bytes, when the graph holds it as a constant of 2 MB or more, served
 * from a copy on 2 MB pages. ONNX Runtime maps the weights from the model file in 4 KB pages,
 * and streaming them costs a TLB miss every 4 KB and stops the hardware prefetchers at each
 * page's end. The constant's own pages are handed back (give_back), so memory does not double;
 * a kernel reading a constant another kernel copied takes that copy. NULL (and no handle) where
 * the input serves as it is. Figures: bench/results/2026-11-26-kernel-notes.md. */
const uint8_t *tokenshop_share_weights(const OrtKernelInfo *info, size_t index, size_t bytes,
                                       SharedWeights **handle) {
  *handle = NULL;
  if (bytes < HUGE_PAGE || !__atomic_load_n(&g_huge_pages, __ATOMIC_RELAXED)) return NULL;
  if (!huge_pages_allowed()) return NULL;
  const void *data = constant_input(info, index, bytes);
  if (data == NULL) return NULL; /* not a constant: the input serves as it is */
  pthread_mutex_lock(&g_shared_lock);
  SharedWeights *copy = g_shared;
  while (copy != NULL && !(copy->source == data && copy->bytes == bytes)) copy = copy->next;
  if (copy == NULL && (copy = copy_of(data, bytes)) != NULL) {
    copy->next = g_shared;
    g_shared = copy;
  }
  if (copy != NULL) copy->users++;
  pthread_mutex_unlock(&g_shared_lock);
  *handle = copy;
  return copy != NULL ? copy->aligned : NULL;
}

/* A kernel's hold on a copy ends; the last one unmaps it. NULL: nothing held. */
void tokenshop_release_weights(SharedWeights *copy) {
  if (copy == NULL) return;
  pthread_mutex_lock(&g_shared_lock);
  if (--copy->users == 0) {
    SharedWeights **link = &g_shared;
    while (*link != copy) link = &(*link)->next;
    *link = copy->next;
    munmap(copy->mapping, copy->mapping_bytes);
    __atomic_sub_fetch(&g_copied_bytes, copy->bytes, __ATOMIC_RELAXED);
    free(copy);
  }
  pthread_mutex_unlock(&g_shared_lock);
}

/* The best set this CPU has, or a lesser one TOKENSHOP_INT4_ISA names (avx2, vnni), so that
 * tests and benchmarks run every path the machine can. */
static Isa chosen_isa(void) {
  __builtin_cpu_init();
  const char *forced = getenv("TOKENSHOP_INT4_ISA");
  if (forced != NULL && strcmp(forced, "avx2") == 0) return ISA_AVX2;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")))
    return ISA_AVX2;
  if (forced != NULL && strcmp(forced, "vnni") == 0) return ISA_VNNI;
  pthread_once(&g_amx_once, request_amx);
  return g_amx_ready ? ISA_AMX : ISA_VNNI;
}

/* The instruction set a kernel made now multiplies with: the engine logs it. */
const char *tokenshop_matmul_isa(void) {
  static const char *const names[] = {"avx2", "avx512-vnni", "amx"};
  return names[chosen_isa()];
}

/* ---- ONNX Runtime plumbing ---- */

static OrtStatus *attribute(const OrtKernelInfo *info, const char *name, int64_t *out) {
  return g_api->KernelInfoGetAttribute_int64(info, name, out);
}

static int bits_of(const OrtCustomOp *op) { return ((const MatMulOp *)op)->bits; }

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **kernel) {
  (void)api;
  Int4Kernel k;
  int64_t bits = 4;
  RETURN_IF_ERROR(attribute(info, "K", &k.k));
  RETURN_IF_ERROR(attribute(info, "N", &k.n));
  RETURN_IF_ERROR(attribute(info, "block_size", &k.block));
  k.swiglu = 0;
  if (bits_of(op) == 8) {
    bits = 8;
  } else {
    OrtStatus *missing = attribute(info, "bits", &bits);
    if (missing != NULL) g_api->ReleaseStatus(missing); /* optional: 4 by default */
    missing = attribute(info, "swiglu", &k.swiglu);
    if (missing != NULL) g_api->ReleaseStatus(missing); /* optional: 0 by default */
  }
  int block_ok = k.block == 64 || k.block == 128 || k.block == 256;
  int n_ok = k.n > 0 && k.n % (k.swiglu ? 16 : 8) == 0;
  if (bits != bits_of(op) || !block_ok || k.k <= 0 || !n_ok)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                               "Int4MatMul / Int8MatMul: needs bits=4 (Int4MatMul), block_size "
                               "64, 128 or 256, N % 8 == 0 (N % 16 with swiglu)");
  Isa isa = chosen_isa();
  k.bits = bits;
  /* VNNI and AMX multiply unsigned weights: int4's are offset by 8, int8's flipped to offset
   * 128. The AVX2 path multiplies int8 weights as they are (signed): nothing to take off. */
  k.zero_point = bits == 4 ? 8.0f : (isa != ISA_AVX2 ? 128.0f : 0.0f);
  static const StripFunction strips[2][3] = {
      {multiply_strip4_avx2, multiply_strip4_vnni, multiply_strip4_amx},
      {multiply_strip8_avx2, multiply_strip8_vnni, multiply_strip8_amx}};
  k.multiply_strip = strips[bits == 8][isa];
  k.weights = tokenshop_share_weights(info, 1, weight_bytes(&k), &k.shared);
  Int4Kernel *made = malloc(sizeof(Int4Kernel));
  if (made == NULL) return g_api->CreateStatus(ORT_FAIL, "Int4MatMul: out of memory");
  *made = k;
  *kernel = made;
  return NULL;
}

/* Input `index`'s data, after checking it holds `expected` elements (a malformed graph must not
 * make the kernel read past a tensor); NULL data for an optional input the node leaves out. */
static OrtStatus *input_data(OrtKernelContext *context, size_t index, int64_t expected,
                             const void **data) {
  const OrtValue *value;
  RETURN_IF_ERROR(tokenshop_input(context, index, &value));
  *data = NULL;
  if (value == NULL) return NULL;
  OrtTensorTypeAndShapeInfo *info;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  size_t elements = 0;
  OrtStatus *status = g_api->GetTensorShapeElementCount(info, &elements);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (status != NULL) return status;
  if ((int64_t)elements != expected)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                               "Int4MatMul: B, scales, bias or residual does not match K, N, "
                               "block_size, A");
  return g_api->GetTensorMutableData((OrtValue *)value, (void **)data);
}

/* aligned_alloc takes a multiple of the alignment */
static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static OrtStatus *allocate_rows(QuantizedRows *r, int64_t rows, const Int4Kernel *k) {
  r->rows = rows;
  r->block = k->block;
  r->blocks = (k->k + k->block - 1) / k->block;
  size_t entries = (size_t)(rows * r->blocks);
  /* A tile of rows more, zeroed: matmul_amx.h's amx_block2 loads whole tiles past the last */
  size_t bytes = (size_t)(rows * r->blocks * r->block), padding = (size_t)(AMX_ROWS * r->block);
  r->q = aligned_alloc(64, round64(bytes + padding));
  if (r->q != NULL) memset(r->q + bytes, 0, padding);
  r->scales = calloc(entries, sizeof(float));
  r->corrections = calloc(entries, sizeof(float));
  if (r->q == NULL || r->scales == NULL || r->corrections == NULL)
    return g_api->CreateStatus(ORT_FAIL, "Int4MatMul: out of memory");
  return NULL;
}

static void free_rows(QuantizedRows *r) {
  free(r->q);
  free(r->scales);
  free(r->corrections);
}

static OrtStatus *compute_checked(const Int4Kernel *k, OrtKernelContext *context) {
  const OrtValue *a_value;
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, 0, &a_value));
  OrtTensorTypeAndShapeInfo *shape_info;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(a_value, &shape_info));
  size_t rank = 0;
  int64_t dims[8];
  OrtStatus *status = g_api->GetDimensionsCount(shape_info, &rank);
  if (status == NULL && (rank < 1 || rank > 8))
    status = g_api->CreateStatus(ORT_INVALID_ARGUMENT, "Int4MatMul: A must have rank 1 to 8");
  if (status == NULL) status = g_api->GetDimensions(shape_info, dims, rank);
  g_api->ReleaseTensorTypeAndShapeInfo(shape_info);
  if (status != NULL) return status;
  if (dims[rank - 1] != k->k)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT, "Int4MatMul: A's last dim is not K");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; i++) rows *= dims[i];
  dims[rank - 1] = k->swiglu ? k->n / 2 : k->n;
  OrtValue *y_value;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, dims, rank, &y_value));
  float *y;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(y_value, (void **)&y));
  if (rows == 0) return NULL;
  const float *a;
  const uint8_t *b;
  const float *scales;
  int64_t blocks = (k->k + k->block - 1) / k->block;
  RETURN_IF_ERROR(input_data(context, 0, rows * k->k, (const void **)&a));
  RETURN_IF_ERROR(input_data(context, 1, (int64_t)weight_bytes(k), (const void **)&b));
  if (k->weights != NULL) b = k->weights;
  RETURN_IF_ERROR(input_data(context, 2, k->n * blocks, (const void **)&scales));
  const float *bias, *residual;
  RETURN_IF_ERROR(input_data(context, 3, k->n, (const void **)&bias));
  status = input_data(context, 4, rows * k->n, (const void **)&residual);
  if (status != NULL) {
    g_api->ReleaseStatus(status);
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT, "Int4MatMul: the residual does not match "
                                                     "Y's shape (a broadcast is not taken)");
  }
  if ((bias != NULL || residual != NULL) && k->swiglu)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT, "Int4MatMul: swiglu takes no bias");

  QuantizedRows r;
  status = allocate_rows(&r, rows, k);
  if (status == NULL) {
    QuantizeTask quantize = {a, &r, k->k, k->zero_point};
    status = g_api->KernelContext_ParallelFor(context, quantize_row, (size_t)rows, 0, &quantize);
  }
  if (status == NULL) {
    int64_t panel_bytes = r.blocks * k->block * k->bits; /* 8 columns x K' x bits / 8 */
    MatMulTask multiply = {.rows = &r,
                           .b = b,
                           .scales = scales,
                           .bias = bias,
                           .residual = residual,
                           .y = y,
                           .n = k->n,
                           .y_stride = dims[rank - 1],
                           .swiglu = (int)k->swiglu,
                           .panel_bytes = panel_bytes,
                           .panel_scales = r.blocks * 8};
    size_t strips = (size_t)((k->n / 8 + STRIP_PANELS - 1) / STRIP_PANELS);
    status = g_api->KernelContext_ParallelFor(context, k->multiply_strip, strips, 0, &multiply);
  }
  free_rows(&r);
  return status;
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *context) {
  return compute_checked(kernel, context);
}

static void ORT_API_CALL destroy_kernel(void *kernel) {
  tokenshop_release_weights(((Int4Kernel *)kernel)->shared);
  free(kernel);
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) {
  return bits_of(op) == 8 ? "Int8MatMul" : "Int4MatMul";
}

static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t index) {
  if (index != 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  return bits_of(op) == 8 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}

static size_t ORT_API_CALL input_count(const OrtCustomOp *op) {
  (void)op;
  return 5; /* A, B, scales, and an optional bias and residual */
}

static size_t ORT_API_CALL output_count(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  return index >= 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

void tokenshop_fill_matmul(MatMulOp *matmul, int bits) {
  static const OpCallbacks callbacks = {
      .name = op_name,
      .input_type = input_type,
      .input_count = input_count,
      .output_count = output_count,
      .input_characteristic = input_characteristic,
      .create = create_kernel,
      .compute = compute,
      .destroy = destroy_kernel,
  };
  matmul->bits = bits;
  tokenshop_fill_op(&matmul->op, &callbacks);
}
