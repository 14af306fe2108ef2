/* Int4MatMul (domain "tokenshop"): ONNX Runtime's 4-bit `MatMulNBits`, symmetric, with a kernel
 * that shares each unpacked weight block across every row of the batch.
 *
 * Why: ORT's kernel costs nearly a full row's time for every extra row (896 x 4864, block 128,
 * 2 threads: 62-80 us for 1 row, 354-368 us for 8 on AVX-512 VNNI; 457 and 1149 us on AVX2), so a
 * decode step of 8 streams took 2.2x the step of one. Here a row costs the integer multiplies of
 * its activations against weights already unpacked into registers.
 *
 * Inputs and attributes are MatMulNBits' own (A, B, scales; K, N, block_size, bits), so the
 * engine's graph edit only renames the node; a fourth, optional input is a bias, which the edit
 * takes from an Add behind the node. Supported: bits 4, no zero points (the quantizer's
 * symmetric mode: zero point 8), block_size 64, 128 or 256. The activations are quantized to
 * int8 per block, as ORT's accuracy_level 4 does; everything else is exact integer arithmetic.
 *
 * Layout of B, per column n and block b: block_size / 2 bytes, byte j holding weight 2j in its
 * low nibble and 2j+1 in its high one. The activations are stored to match: for every 64 weights,
 * the 32 even-indexed values, then the 32 odd-indexed ones, so that the low nibbles of 32 bytes
 * of B multiply the first 32 bytes and the high nibbles the next 32.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"

#define CHUNK 64      /* weights per 32 bytes of B */
#define ROW_TILE 4    /* rows that share one unpacked block (the zero-point vector holds 4) */
#define ROW_PANEL 64  /* rows whose activations stay in cache while a column strip passes */
#define COLUMN_STRIP 16
#define PREFETCH_AHEAD 2048 /* bytes of B ahead of the block being read */

static const OrtApi *g_api;

typedef struct {
  int64_t k, n, block;
} Int4Kernel;

/* Block-major, so that one pointer each walks a tile of rows through the blocks: with a
 * pointer per row, a tile's addressing spilled general registers and took ~1.15x the time. */
typedef struct {
  int8_t *q;           /* [blocks][rows][block], in the even/odd order above */
  float *scales;       /* [blocks][rows], then ROW_TILE floats of padding */
  float *corrections;  /* [blocks][rows] scale * 8 * sum(q): the zero point's share; padded */
  int64_t rows, blocks, block;
} QuantizedRows;

typedef struct {
  const float *a;
  QuantizedRows *rows;
  int64_t k;
} QuantizeTask;

typedef struct {
  const QuantizedRows *rows;
  const uint8_t *b;
  const float *scales;
  const float *bias; /* [n], or NULL */
  float *y;
  int64_t n;
} MatMulTask;

/* ---- activations: float rows -> int8 blocks ---- */

__attribute__((target("avx2,fma"))) static inline __m256i quantize8(__m256 v, __m256 inverse) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(v, inverse));
}

/* Four vectors of 8 int32 -> 32 int8 in their original order. */
__attribute__((target("avx2,fma"))) static inline __m256i pack32(__m256i a, __m256i b, __m256i c,
                                                               __m256i d) {
  __m256i ab = _mm256_packs_epi32(a, b);
  __m256i cd = _mm256_packs_epi32(c, d);
  __m256i all = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 16 consecutive floats -> their 8 even-indexed values, then their 8 odd-indexed ones. */
__attribute__((target("avx2,fma"))) static inline void split16(const float *x, __m256 *even,
                                                             __m256 *odd) {
  __m256 lo = _mm256_loadu_ps(x), hi = _mm256_loadu_ps(x + 8);
  __m256 e = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  __m256 o = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

__attribute__((target("avx2,fma"))) static inline int32_t sum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

/* One block of `block` floats (zero-padded past `valid`) -> int8, its scale and correction. */
__attribute__((target("avx2,fma"))) static void quantize_block(const float *x, int64_t valid,
                                                             int64_t block, int8_t *q,
                                                             float *scale, float *correction) {
  float padded[CHUNK];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < valid; i += 8) {
    __m256 v;
    if (valid - i >= 8) {
      v = _mm256_loadu_ps(x + i);
    } else {
      float tail[8] = {0};
      memcpy(tail, x + i, (size_t)(valid - i) * sizeof(float));
      v = _mm256_loadu_ps(tail);
    }
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  float top = _mm_cvtss_f32(m);
  float d = top / 127.0f;
  __m256 inverse = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  __m256i total = _mm256_setzero_si256();
  for (int64_t c = 0; c < block; c += CHUNK) {
    const float *src = x + c;
    if (valid - c < CHUNK) { /* the padded tail of the last block */
      memset(padded, 0, sizeof(padded));
      if (valid > c) memcpy(padded, src, (size_t)(valid - c) * sizeof(float));
      src = padded;
    }
    __m256i even[4], odd[4];
    for (int j = 0; j < 4; j++) {
      __m256 e, o;
      split16(src + 16 * j, &e, &o);
      even[j] = quantize8(e, inverse);
      odd[j] = quantize8(o, inverse);
      total = _mm256_add_epi32(total, _mm256_add_epi32(even[j], odd[j]));
    }
    _mm256_storeu_si256((__m256i *)(q + c), pack32(even[0], even[1], even[2], even[3]));
    _mm256_storeu_si256((__m256i *)(q + c + 32), pack32(odd[0], odd[1], odd[2], odd[3]));
  }
  *scale = d;
  *correction = d * 8.0f * (float)sum_epi32(total);
}

static void quantize_row(void *data, size_t row) {
  QuantizeTask *task = data;
  QuantizedRows *r = task->rows;
  const float *x = task->a + (int64_t)row * task->k;
  for (int64_t b = 0; b < r->blocks; b++) {
    int64_t start = b * r->block;
    int64_t valid = task->k - start < r->block ? task->k - start : r->block;
    int64_t at = b * r->rows + (int64_t)row;
    quantize_block(x + start, valid, r->block, r->q + at * r->block, r->scales + at,
                   r->corrections + at);
  }
}

/* ---- the product: tiles of up to ROW_TILE rows against one column ---- */

__attribute__((target("avx2,fma"))) static inline float sum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* y[m] = sum over blocks of scale_a * scale_b * (q_a . q_b - 8 * sum(q_a)), for `tile` rows.
 * Inlined with constant `tile` and `chunks` (64-weight chunks per block, at most 4 so that the
 * int16 sums cannot overflow) so the loops unroll and the accumulators live in registers. The
 * zero point's share, scale_b * corrections, is summed for the tile's rows in one vector. */
__attribute__((target("avx2,fma"), always_inline)) static inline void column_tile(
    const QuantizedRows *r, int64_t row0, int tile, int chunks, const uint8_t *b,
    const float *bscale, float bias, float *y, int64_t ystride) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t block = r->block, rows = r->rows;
  const int8_t *qa = r->q + row0 * block;
  const float *sa = r->scales + row0, *corrections = r->corrections + row0;
  __m256 acc[ROW_TILE];
  __m128 zero_point = _mm_setzero_ps();
  for (int m = 0; m < tile; m++) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < r->blocks; blk++) {
    const uint8_t *bb = b + blk * (block / 2);
    _mm_prefetch((const char *)(bb + PREFETCH_AHEAD), _MM_HINT_T0);
    __m256i lo[4], hi[4];
    for (int c = 0; c < chunks; c++) {
      __m256i packed = _mm256_loadu_si256((const __m256i *)(bb + 32 * c));
      lo[c] = _mm256_and_si256(packed, low);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
    const __m256 sb = _mm256_set1_ps(bscale[blk]);
    zero_point = _mm_fmadd_ps(_mm256_castps256_ps128(sb), _mm_loadu_ps(corrections), zero_point);
    for (int m = 0; m < tile; m++) {
      const int8_t *a = qa + m * block;
      __m256i dot = _mm256_setzero_si256();
      for (int c = 0; c < chunks; c++) {
        __m256i p = _mm256_maddubs_epi16(lo[c], _mm256_loadu_si256((const __m256i *)(a + 64 * c)));
        __m256i p2 =
            _mm256_maddubs_epi16(hi[c], _mm256_loadu_si256((const __m256i *)(a + 64 * c + 32)));
        dot = _mm256_add_epi16(dot, _mm256_add_epi16(p, p2));
      }
      __m256 v = _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, ones));
      acc[m] = _mm256_fmadd_ps(v, _mm256_mul_ps(sb, _mm256_broadcast_ss(sa + m)), acc[m]);
    }
    qa += rows * block;
    sa += rows;
    corrections += rows;
  }
  float shares[4];
  _mm_storeu_ps(shares, zero_point);
  for (int m = 0; m < tile; m++) y[m * ystride] = sum_ps(acc[m]) - shares[m] + bias;
}

/* Every row from row0 on against one column, in tiles; `chunks` as in column_tile. */
__attribute__((target("avx2,fma"), always_inline)) static inline void column_rows_of(
    const QuantizedRows *r, int64_t row0, int64_t rows, int chunks, const uint8_t *b,
    const float *bscale, float bias, float *y, int64_t ystride) {
  int64_t m = 0;
  for (; m + ROW_TILE <= rows; m += ROW_TILE)
    column_tile(r, row0 + m, ROW_TILE, chunks, b, bscale, bias, y + m * ystride, ystride);
  switch (rows - m) {
    case 3: column_tile(r, row0 + m, 3, chunks, b, bscale, bias, y + m * ystride, ystride); break;
    case 2: column_tile(r, row0 + m, 2, chunks, b, bscale, bias, y + m * ystride, ystride); break;
    case 1: column_tile(r, row0 + m, 1, chunks, b, bscale, bias, y + m * ystride, ystride); break;
    default: break;
  }
}

__attribute__((target("avx2,fma"))) static void column_rows(const QuantizedRows *r,
                                                          int64_t row0, int64_t rows,
                                                          const uint8_t *b, const float *bscale,
                                                          float bias, float *y, int64_t ystride) {
  switch (r->block / CHUNK) {
    case 1: column_rows_of(r, row0, rows, 1, b, bscale, bias, y, ystride); break;
    case 2: column_rows_of(r, row0, rows, 2, b, bscale, bias, y, ystride); break;
    case 4: column_rows_of(r, row0, rows, 4, b, bscale, bias, y, ystride); break;
    default: break; /* refused when the kernel is created */
  }
}

static void multiply_strip(void *data, size_t strip) {
  const MatMulTask *task = data;
  const QuantizedRows *r = task->rows;
  int64_t first = (int64_t)strip * COLUMN_STRIP;
  int64_t last = first + COLUMN_STRIP < task->n ? first + COLUMN_STRIP : task->n;
  int64_t column_bytes = r->blocks * r->block / 2;
  for (int64_t row0 = 0; row0 < r->rows; row0 += ROW_PANEL) {
    int64_t rows = r->rows - row0 < ROW_PANEL ? r->rows - row0 : ROW_PANEL;
    for (int64_t n = first; n < last; n++)
      column_rows(r, row0, rows, task->b + n * column_bytes, task->scales + n * r->blocks,
                  task->bias != NULL ? task->bias[n] : 0.0f, task->y + row0 * task->n + n,
                  task->n);
  }
}

/* ---- ONNX Runtime plumbing ---- */

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    OrtStatus *status_ = (expr);       \
    if (status_ != NULL) return status_; \
  } while (0)

static OrtStatus *attribute(const OrtKernelInfo *info, const char *name, int64_t *out) {
  return g_api->KernelInfoGetAttribute_int64(info, name, out);
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api,
                                             const OrtKernelInfo *info, void **kernel) {
  (void)op;
  (void)api;
  Int4Kernel k;
  int64_t bits = 4;
  RETURN_IF_ERROR(attribute(info, "K", &k.k));
  RETURN_IF_ERROR(attribute(info, "N", &k.n));
  RETURN_IF_ERROR(attribute(info, "block_size", &k.block));
  OrtStatus *missing = attribute(info, "bits", &bits);
  if (missing != NULL) g_api->ReleaseStatus(missing); /* optional: 4 by default */
  int block_ok = k.block == 64 || k.block == 128 || k.block == 256;
  if (bits != 4 || !block_ok || k.k <= 0 || k.n <= 0)
    return g_api->CreateStatus(ORT_INVALID_ARGUMENT,
                               "Int4MatMul: needs bits=4 and block_size 64, 128 or 256");
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
  size_t count;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &count));
  const OrtValue *value = NULL;
  if (index < count) RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &value));
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
                               "Int4MatMul: B, scales or bias does not match K, N, block_size");
  return g_api->GetTensorMutableData((OrtValue *)value, (void **)data);
}

/* aligned_alloc takes a multiple of the alignment */
static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static OrtStatus *allocate_rows(QuantizedRows *r, int64_t rows, const Int4Kernel *k) {
  r->rows = rows;
  r->block = k->block;
  r->blocks = (k->k + k->block - 1) / k->block;
  size_t entries = (size_t)(rows * r->blocks) + ROW_TILE; /* a tile's vector reads past the end */
  r->q = aligned_alloc(64, round64((size_t)(rows * r->blocks * r->block)));
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
  dims[rank - 1] = k->n;
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
  RETURN_IF_ERROR(input_data(context, 1, k->n * blocks * k->block / 2, (const void **)&b));
  RETURN_IF_ERROR(input_data(context, 2, k->n * blocks, (const void **)&scales));
  const float *bias;
  RETURN_IF_ERROR(input_data(context, 3, k->n, (const void **)&bias));

  QuantizedRows r;
  status = allocate_rows(&r, rows, k);
  if (status == NULL) {
    QuantizeTask quantize = {a, &r, k->k};
    status = g_api->KernelContext_ParallelFor(context, quantize_row, (size_t)rows, 0, &quantize);
  }
  if (status == NULL) {
    MatMulTask multiply = {&r, b, scales, bias, y, k->n};
    size_t strips = (size_t)((k->n + COLUMN_STRIP - 1) / COLUMN_STRIP);
    status = g_api->KernelContext_ParallelFor(context, multiply_strip, strips, 0, &multiply);
  }
  free_rows(&r);
  return status;
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *context) {
  return compute_checked(kernel, context);
}

static void ORT_API_CALL destroy_kernel(void *kernel) { free(kernel); }

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) {
  (void)op;
  return "Int4MatMul";
}

static const char *ORT_API_CALL op_provider(const OrtCustomOp *op) {
  (void)op;
  return "CPUExecutionProvider";
}

static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static size_t ORT_API_CALL input_count(const OrtCustomOp *op) {
  (void)op;
  return 4; /* A, B, scales, and an optional bias */
}

static ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

static size_t ORT_API_CALL output_count(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  return index == 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

static OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_characteristic(
    const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return INPUT_OUTPUT_REQUIRED;
}

static OrtMemType ORT_API_CALL memory_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  (void)index;
  return OrtMemTypeDefault;
}

static int ORT_API_CALL start_version(const OrtCustomOp *op) {
  (void)op;
  return 1;
}

static int ORT_API_CALL end_version(const OrtCustomOp *op) {
  (void)op;
  return 1 << 30;
}

static OrtCustomOp g_op;
static OrtCustomOpDomain *g_domain;
static OrtStatus *g_domain_error;
static pthread_once_t g_domain_once = PTHREAD_ONCE_INIT;

/* Whether this CPU runs the kernel: the engine asks before it edits a graph to use it. */
int tokenshop_int4_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Once per process: every session shares the op and its domain, which live as long as it. */
static void make_domain(void) {
  g_op.version = ORT_API_VERSION;
  g_op.GetName = op_name;
  g_op.GetExecutionProviderType = op_provider;
  g_op.GetInputType = input_type;
  g_op.GetInputTypeCount = input_count;
  g_op.GetOutputType = output_type;
  g_op.GetOutputTypeCount = output_count;
  g_op.KernelDestroy = destroy_kernel;
  g_op.GetInputCharacteristic = input_characteristic;
  g_op.GetOutputCharacteristic = output_characteristic;
  g_op.GetInputMemoryType = memory_type;
  g_op.CreateKernelV2 = create_kernel;
  g_op.KernelComputeV2 = compute;
  g_op.GetStartVersion = start_version;
  g_op.GetEndVersion = end_version;
  g_domain_error = g_api->CreateCustomOpDomain("tokenshop", &g_domain);
  if (g_domain_error == NULL) g_domain_error = g_api->CustomOpDomain_Add(g_domain, &g_op);
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == NULL) return NULL; /* an ONNX Runtime older than our header: cannot say why */
  if (!tokenshop_int4_supported())
    return g_api->CreateStatus(ORT_FAIL, "Int4MatMul: this CPU lacks AVX2 and FMA");
  pthread_once(&g_domain_once, make_domain);
  if (g_domain_error != NULL)
    return g_api->CreateStatus(g_api->GetErrorCode(g_domain_error),
                               g_api->GetErrorMessage(g_domain_error));
  return g_api->AddCustomOpDomain(options, g_domain);
}
